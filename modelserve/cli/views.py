"""What `modelserve list` and `modelserve show` print, as pure functions of the objects."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import yaml

from modelserve.api.status import newer_than_running

from .cluster import key_secret

LIST_COLUMNS = ("NAME", "MODEL", "PROFILE", "READY", "REPLICAS", "AGE")
# -o wide, as `kubectl get ms -o wide`: the images the pods run, and whether the operator has newer ones.
WIDE_COLUMNS = ("SIDECAR", "ENGINE", "UPGRADE")
DEFAULT_PROFILE = "high-throughput"  # the spec's default, for objects stored without one


def age(seconds: float) -> str:
    """kubectl's short ages: 45s, 3m12s, 17m, 5h3m, 20h, 3d4h, 12d, 2y."""
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y"


def _ready(ms: dict[str, Any]) -> dict[str, Any]:
    conditions = (ms.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), {})


def wide_cells(ms: dict[str, Any]) -> list[str]:
    status = ms.get("status") or {}
    versions, upgrade = status.get("versions") or {}, status.get("upgrade") or {}
    return [versions.get("sidecar", ""), versions.get("engine", ""), upgrade.get("available", "")]


def list_row(ms: dict[str, Any], now: datetime) -> list[str]:
    spec, status, meta = ms.get("spec") or {}, ms.get("status") or {}, ms["metadata"]
    created = meta.get("creationTimestamp")
    when = age((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()) if created else ""
    replicas = status.get("replicas")
    return [
        meta["name"],
        spec.get("model", ""),
        spec.get("profile", DEFAULT_PROFILE),
        _ready(ms).get("status", "Unknown"),
        "" if replicas is None else str(replicas),
        when,
    ]


def table(header: list[str], rows: list[list[str]]) -> str:
    """kubectl's layout: columns left-aligned, three spaces apart."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def list_table(items: list[dict[str, Any]], now: datetime, all_namespaces: bool, wide: bool = False) -> str:
    header = list(LIST_COLUMNS) + (list(WIDE_COLUMNS) if wide else [])
    items = sorted(items, key=lambda ms: (ms["metadata"].get("namespace", ""), ms["metadata"]["name"]))
    rows = [list_row(ms, now) + (wide_cells(ms) if wide else []) for ms in items]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
        rows = [[ms["metadata"].get("namespace", ""), *row] for ms, row in zip(items, rows, strict=True)]
    return table(header, rows)


def _versions(status: dict[str, Any]) -> list[str]:
    """The images the pods run (and the sidecar's workers), and what an operator upgrade kept back
    (upgradePolicy Manual)."""
    versions, upgrade = status.get("versions") or {}, status.get("upgrade") or {}
    lines = [
        f"{label:<12}{versions[key]}"
        for label, key in (("Sidecar:", "sidecar"), ("Engine:", "engine"))
        if versions.get(key)
    ]
    if versions.get("sidecar") and (versions.get("sidecarWorkers") or 1) > 1:
        lines[0] += f" ({versions['sidecarWorkers']} workers)"
    if upgrade.get("available") == "Yes":
        lines.append(f"Upgrade:    available: {newer_than_running(upgrade)} ({upgrade.get('message', '')})")
    return lines


def show(ms: dict[str, Any]) -> str:
    """The model, how it is served and where, in the order `ollama show` reads; never a key."""
    spec, status, meta = ms.get("spec") or {}, ms.get("status") or {}, ms["metadata"]
    ready = _ready(ms)
    where = key_secret(ms)
    lines = [
        f"Name:       {meta['name']}",
        f"Namespace:  {meta.get('namespace', '')}",
        f"Model:      {spec.get('model', '')}",
        f"Profile:    {spec.get('profile', DEFAULT_PROFILE)}",
    ]
    if spec.get("maxModelLen"):
        lines.append(f"Context:    {spec['maxModelLen']} tokens")
    lines.append(f"Vision:     {'yes' if spec.get('vision') else 'no'}")
    state = status.get("phase") or "Unknown"
    if ready:
        state += f" (Ready={ready.get('status')} {ready.get('reason', '')}: {ready.get('message', '')})"
    lines.append(f"Status:     {state}")
    replicas = f"{status.get('readyReplicas', 0)}/{status.get('replicas', 0)} ready"
    lines.append(f"Replicas:   {replicas}")
    lines.append(f"Endpoint:   {status.get('endpoint') or '(none yet)'}")
    if status.get("gatewayEndpoint"):
        lines.append(f"Gateway:    {status['gatewayEndpoint']}")
    lines += _versions(status)
    if where is None:
        lines.append("API key:    none needed (auth.mode public)")
    else:
        entry = f", data key {where[1]}" if where[1] else ""
        lines.append(f"API key:    in Secret {where[0]}{entry}")
    sampling = spec.get("samplingDefaults")
    if sampling:
        lines.append("Sampling defaults:")
        lines += [f"  {name}: {json.dumps(value)}" for name, value in sampling.items()]
    if spec.get("chatTemplate"):
        lines.append("Chat template:")
        lines += ["  " + line for line in spec["chatTemplate"].splitlines()]
    return "\n".join(lines) + "\n"


def manifest_yaml(manifest: dict[str, Any]) -> str:
    # No line folding: a chat template is one long line.
    return yaml.safe_dump(manifest, sort_keys=False, width=float("inf"), allow_unicode=True)
