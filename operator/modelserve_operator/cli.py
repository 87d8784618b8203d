"""`modelserve`: the operator's builders for people without the operator at hand.

  modelserve render FILE...        the objects the operator would apply (for review, diffs, GitOps)
  modelserve key new NAME [-n NS]  a Secret manifest holding a freshly generated API key

`render` validates with the same spec model the CRD is generated from, so it refuses what
`kubectl apply` refuses and names the same field; it reads the operator's settings from the same
MODELSERVE_* environment variables (e.g. MODELSERVE_SIDECAR_IMAGE).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import yaml

from . import manifests, spec
from .api_keys import new_api_key
from .settings import Settings
from .validation import InvalidManifest, explain

# render never invents a key or a uid: the operator makes the one, the API server the other.
API_KEY_PLACEHOLDER = "<generated once by the operator>"
UID_PLACEHOLDER = "<uid of the ModelServer>"


def parse_model_server(manifest: dict[str, Any], namespace: str) -> spec.ModelServer:
    """Validate one ModelServer manifest; raises InvalidManifest with field-named lines."""
    metadata = {"namespace": namespace, "uid": UID_PLACEHOLDER, **(manifest.get("metadata") or {})}
    try:
        return spec.ModelServer.from_manifest({**manifest, "metadata": metadata})
    except ValueError as error:
        raise InvalidManifest(explain(error)) from None


def _documents(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    for index, document in enumerate(yaml.safe_load_all(text), start=1):
        if document is None:
            continue
        where = f"{path} (document {index})"
        if not isinstance(document, dict):
            raise InvalidManifest(f"{where}: not a Kubernetes object")
        yield where, document


def render(paths: list[str], namespace: str, settings: Settings) -> list[dict[str, Any]]:
    """The objects the operator applies for every ModelServer in the files, in file order."""
    objects: list[dict[str, Any]] = []
    for path in paths:
        for where, document in _documents(path):
            name = (document.get("metadata") or {}).get("name", "")
            try:
                ms = parse_model_server(document, namespace)
            except InvalidManifest as error:
                raise InvalidManifest(f'{where}: {spec.KIND} "{name}" is invalid:\n{error}') from None
            objects += manifests.owned_objects(ms, settings, API_KEY_PLACEHOLDER)
    return objects


def dump(objects: list[dict[str, Any]], out: TextIO) -> None:
    # The layout of the golden files, so render output and reviews diff cleanly.
    yaml.safe_dump_all(objects, out, sort_keys=False, width=1000)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelserve", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render_cmd = commands.add_parser(
        "render",
        help="print the objects the operator would apply for ModelServer manifests",
        description="Print, as YAML, the objects the operator would apply for the ModelServers in FILEs "
        "(the generated key and the owner uid are placeholders). Settings come from the operator's "
        "MODELSERVE_* environment variables.",
    )
    render_cmd.add_argument("files", nargs="+", metavar="FILE", help="ModelServer manifests ('-' reads stdin)")
    render_cmd.add_argument(
        "-n", "--namespace", default="default", help="namespace of manifests that name none (default: default)"
    )
    key_cmd = commands.add_parser("key", help="API keys").add_subparsers(dest="key_command", required=True)
    new_cmd = key_cmd.add_parser(
        "new",
        help="print a Secret manifest holding a freshly generated API key",
        description="Print a Secret holding a new API key; name it in a ModelServer's spec.auth.secretName.",
    )
    new_cmd.add_argument("name", metavar="NAME", help="name of the Secret")
    new_cmd.add_argument("-n", "--namespace", default="default", help="namespace of the Secret (default: default)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "render":
        try:
            objects = render(args.files, args.namespace, Settings.from_env())
        except (InvalidManifest, OSError, yaml.YAMLError) as error:
            print(f"modelserve render: {error}", file=sys.stderr)
            return 1
        dump(objects, sys.stdout)
        return 0
    if not re.match(spec.DNS_SUBDOMAIN_PATTERN, args.name) or len(args.name) > 253:
        print(f"modelserve key new: {args.name!r} is not a valid Secret name (a DNS subdomain)", file=sys.stderr)
        return 1
    # For spec.auth.secretName: the sidecar accepts a key in every data key of the Secret.
    dump([manifests.key_secret({"name": args.name, "namespace": args.namespace}, new_api_key())], sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
