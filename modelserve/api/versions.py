"""Which sidecar and engine images a ModelServer's pods are made with: the pure decision.

An operator upgrade changes the images it would choose (the sidecar is the operator's own release,
engine images are what it pins), and a new image in a pod template rolls every pod, each needing a
spare set of GPUs and a cold start. So the images in use are recorded on the workload, and kept
(upgradePolicy Manual) until the pods are replaced anyway: the ModelServer is new, or the pod
template changed apart from the images (a spec change, or a new operator rendering pods otherwise).
The template is compared by a hash of it rendered with placeholder images, recorded beside them.
The sidecar's workers, when the spec leaves them to the operator, are kept the same way: a default
changed by an upgrade would roll the pods as surely as an image (hashed as 1, what the first operators
rendered for an unset spec.sidecar.workers). So is the node's model cache (its fetch init container):
the hash is of the pods without it, and spec.cache.node counts only where the spec sets it, so an
operator that gains the node cache moves a ModelServer onto it with its next change, or at once when
its owner sets spec.cache.node (or upgradePolicy Automatic).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from modelserve.contracts import sidecar as contract
from modelserve.contracts.names import GROUP, SIDECAR_NAME
from modelserve.contracts.nodecache import FETCH_CONTAINER
from modelserve.contracts.operator_settings import Settings
from modelserve.engines import engine_for

from .spec import ModelServer, Sidecar, UpgradePolicy
from .status import Upgrade, Versions

# On the workload (not its pod template: writing them rolls nothing).
VERSIONS_ANNOTATION = f"{GROUP}/versions"  # JSON: {"sidecar": image, "engine": image, "sidecarWorkers": n}
TEMPLATE_HASH_ANNOTATION = f"{GROUP}/template-sha256"  # the pod template(s) with placeholder images
WORKERS_VARIABLE = contract.Settings.__dataclass_fields__["workers"].metadata["env"]


def placeholder(ms: ModelServer) -> Versions:
    """Stand-ins for what the operator chooses, when hashing: a spec.image and spec.sidecar.workers
    still show as themselves."""
    return Versions(
        sidecar="operator-chosen",
        engine="operator-chosen",
        sidecar_workers=ms.spec.named_sidecar_workers or 1,
        node_cache=False,
    )


def hashed(ms: ModelServer) -> list[dict[str, Any]]:
    """What the template hash covers beside the rendered templates: spec.cache.node where it is set."""
    node = ms.spec.cache.node if ms.spec.cache else None
    return [] if node is None else [{"cache.node": node}]


def node_cache(ms: ModelServer, settings: Settings) -> bool:
    """Whether pods fetch the model through the node cache under these settings: the operator has one,
    the model is a hub id an engine downloads, and the spec does not say otherwise."""
    cache = ms.spec.cache
    return bool(
        settings.node_cache_url
        and not ms.spec.external
        and not ms.spec.model.startswith("/")
        and (cache is None or cache.node is not False)
    )


def operator_versions(ms: ModelServer, settings: Settings) -> Versions:
    """The images (and sidecar workers, and node cache) this operator would run the ModelServer with now."""
    workers = ms.spec.sidecar_workers
    if ms.spec.external:
        return Versions(sidecar=settings.sidecar_image, sidecar_workers=workers, node_cache=False)
    engine = engine_for(ms.spec.profile)
    return Versions(
        sidecar=settings.sidecar_image,
        engine=ms.spec.image or settings.engine_image(engine.name, engine.image),
        sidecar_workers=workers,
        node_cache=node_cache(ms, settings),
    )


def rendering(settings: Settings, ms: ModelServer, versions: Versions) -> tuple[ModelServer, Settings]:
    """The ModelServer and settings under which the builders render `versions`: the spec naming their
    sidecar workers, the settings their images and node cache (the rest of both unchanged)."""
    engine = None if ms.spec.external else engine_for(ms.spec.profile).name
    if versions.sidecar_workers is not None:
        sidecar = (ms.spec.sidecar or Sidecar()).model_copy(update={"workers": versions.sidecar_workers})
        ms = dataclasses.replace(ms, spec=ms.spec.model_copy(update={"sidecar": sidecar}))
    images = settings.with_images(versions.sidecar, engine, versions.engine)
    return ms, images.with_node_cache(bool(versions.node_cache))


def template_hash(templates: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(templates, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def recorded(live: dict[str, Any] | None, template: dict[str, Any] | None) -> Versions | None:
    """What a live workload runs: its annotation, else (a workload made before the annotation
    existed) its serving pod template's containers; the sidecar's workers and the node cache, if the
    annotation does not say (made before they were recorded), from the sidecar's environment and the
    template's init containers."""
    if live is None:
        return None
    pod = (template or {}).get("spec") or {}
    containers = pod.get("containers") or []
    sidecar_container = next((c for c in containers if c.get("name") == SIDECAR_NAME), {})
    workers = _workers(sidecar_container)
    fetched = any(c.get("name") == FETCH_CONTAINER for c in pod.get("initContainers") or [])
    annotation = (live["metadata"].get("annotations") or {}).get(VERSIONS_ANNOTATION)
    if annotation:
        try:
            versions = Versions.model_validate_json(annotation)
        except ValueError:
            pass  # edited by hand: read the containers
        else:
            unrecorded = {"sidecar_workers": workers, "node_cache": fetched}
            return versions.model_copy(
                update={name: value for name, value in unrecorded.items() if getattr(versions, name) is None}
            )
    sidecar = sidecar_container.get("image")
    engine = next((c.get("image") for c in containers if c.get("name") != SIDECAR_NAME), None)
    return Versions(sidecar=sidecar, engine=engine, sidecar_workers=workers, node_cache=fetched) if sidecar else None


def _workers(container: dict[str, Any]) -> int:
    """The sidecar's workers as its environment sets them (absent: 1, the sidecar's default)."""
    value = next((v.get("value") for v in container.get("env") or [] if v.get("name") == WORKERS_VARIABLE), None)
    return int(value) if isinstance(value, str) and value.isdigit() and int(value) > 0 else 1


def in_use(
    ms: ModelServer, current: Versions, live: dict[str, Any] | None, running: Versions | None, spec_hash: str
) -> Versions:
    """The images to render: the operator's current ones for a new workload, with policy Automatic,
    or when the template changed anyway (its recorded hash differs); else those `running`."""
    if running is None or ms.spec.upgrade_policy == UpgradePolicy.AUTOMATIC:
        return current
    recorded_hash = ((live or {}).get("metadata", {}).get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
    if recorded_hash is not None and recorded_hash != spec_hash:
        return current  # the pods roll anyway: take the new images with the same restart
    return running


def annotations(versions: Versions, spec_hash: str) -> dict[str, str]:
    return {
        VERSIONS_ANNOTATION: versions.model_dump_json(exclude_none=True, by_alias=True),
        TEMPLATE_HASH_ANNOTATION: spec_hash,
    }


def upgrade(current: Versions, used: Versions) -> Upgrade:
    """Whether the operator would now run other images (or sidecar workers, or the node cache) than the pods
    do, for status."""
    sidecar = current.sidecar if current.sidecar != used.sidecar else None
    engine = current.engine if current.engine != used.engine else None
    workers = current.sidecar_workers if current.sidecar_workers != used.sidecar_workers else None
    cache = current.node_cache if bool(current.node_cache) != bool(used.node_cache) else None
    if sidecar is None and engine is None and workers is None and cache is None:
        return Upgrade(available="No")
    kept = ["newer images"] if sidecar or engine else []
    if workers is not None:
        kept.append("the operator's default sidecar workers")
    if cache is not None:
        kept.append("the node's model cache" if cache else "leaving the node cache")
    listed = kept[0] if len(kept) == 1 else ", ".join(kept[:-1]) + " and " + kept[-1]
    kept_text = f"{listed} {'is' if len(kept) == 1 and cache is not None else 'are'}"
    return Upgrade(
        available="Yes",
        sidecar=sidecar,
        engine=engine,
        sidecar_workers=workers,
        node_cache=cache,
        message=f"{kept_text} kept back (upgradePolicy Manual) until the pods are replaced for a spec "
        "change; set spec.upgradePolicy to Automatic to roll the pods onto them now",
    )
