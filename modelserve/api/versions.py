"""Which sidecar and engine images a ModelServer's pods are made with: the pure decision.

An operator upgrade changes the images it would choose (the sidecar is the operator's own release,
engine images are what it pins), and a new image in a pod template rolls every pod, each needing a
spare set of GPUs and a cold start. So the images in use are recorded on the workload, and kept
(upgradePolicy Manual) until the pods are replaced anyway: the ModelServer is new, or the pod
template changed apart from the images (a spec change, or a new operator rendering pods otherwise).
The template is compared by a hash of it rendered with placeholder images, recorded beside them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from modelserve.contracts.names import GROUP, SIDECAR_NAME
from modelserve.contracts.operator_settings import Settings
from modelserve.engines import engine_for

from .spec import ModelServer, UpgradePolicy
from .status import Upgrade, Versions

# On the workload (not its pod template: writing them rolls nothing).
VERSIONS_ANNOTATION = f"{GROUP}/versions"  # JSON: {"sidecar": image, "engine": image}
TEMPLATE_HASH_ANNOTATION = f"{GROUP}/template-sha256"  # the pod template(s) with placeholder images
# Stand-ins for the operator's images when hashing: a spec.image still shows as itself.
PLACEHOLDER = Versions(sidecar="operator-chosen", engine="operator-chosen")


def operator_versions(ms: ModelServer, settings: Settings) -> Versions:
    """The images this operator would run the ModelServer with now."""
    if ms.spec.external:
        return Versions(sidecar=settings.sidecar_image)
    engine = engine_for(ms.spec.profile)
    return Versions(
        sidecar=settings.sidecar_image, engine=ms.spec.image or settings.engine_image(engine.name, engine.image)
    )


def rendering(settings: Settings, ms: ModelServer, versions: Versions) -> Settings:
    """Settings under which the builders render `versions` (the operator's other settings unchanged)."""
    engine = None if ms.spec.external else engine_for(ms.spec.profile).name
    return settings.with_images(versions.sidecar, engine, versions.engine)


def template_hash(templates: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(templates, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def recorded(live: dict[str, Any] | None, template: dict[str, Any] | None) -> Versions | None:
    """The images a live workload runs: its annotation, else (a workload made before the annotation
    existed) its serving pod template's containers."""
    if live is None:
        return None
    annotation = (live["metadata"].get("annotations") or {}).get(VERSIONS_ANNOTATION)
    if annotation:
        try:
            return Versions.model_validate_json(annotation)
        except ValueError:
            pass  # edited by hand: read the containers
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    sidecar = next((c.get("image") for c in containers if c.get("name") == SIDECAR_NAME), None)
    engine = next((c.get("image") for c in containers if c.get("name") != SIDECAR_NAME), None)
    return Versions(sidecar=sidecar, engine=engine) if sidecar else None


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
        VERSIONS_ANNOTATION: versions.model_dump_json(exclude_none=True),
        TEMPLATE_HASH_ANNOTATION: spec_hash,
    }


def upgrade(current: Versions, used: Versions) -> Upgrade:
    """Whether the operator would now run other images than the pods do, for status."""
    sidecar = current.sidecar if current.sidecar != used.sidecar else None
    engine = current.engine if current.engine != used.engine else None
    if sidecar is None and engine is None:
        return Upgrade(available="No")
    return Upgrade(
        available="Yes",
        sidecar=sidecar,
        engine=engine,
        message="newer images are kept back (upgradePolicy Manual) until the pods are replaced for a spec "
        "change; set spec.upgradePolicy to Automatic to roll the pods onto them now",
    )
