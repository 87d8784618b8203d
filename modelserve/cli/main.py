"""`modelserve`: the operator's builders for people without the operator at hand.

  modelserve render FILE...        the objects the operator would apply (for review, diffs, GitOps)
  modelserve key new NAME [-n NS]  a Secret manifest holding a freshly generated API key

and Ollama's habits, against the cluster of the current kubeconfig:

  modelserve run NAME ["PROMPT"]   an answer, or a chat (/bye leaves, /image PATH QUESTION)
  modelserve list [-A]             the ModelServers
  modelserve show NAME             model, profile, sampling defaults, template, status, endpoints
  modelserve rm NAME               delete a ModelServer (its pods, Service and key go with it)
  modelserve create NAME -f Modelfile [--apply]   a ModelServer from an Ollama Modelfile

and, in a ModelServer's key Secret on that cluster, named API keys with limits (only a key's hash
is stored: the key is printed once, when made; the model's sidecars reload the Secret):

  modelserve key create NAME --for MS [--max-in-flight N] [--requests-per-minute N]
                 [--tokens-per-minute N] [--expires 30d|12h|90m|RFC3339] [--weight N]
  modelserve key list --for MS     names, credential counts and limits (never a key)
  modelserve key revoke NAME --for MS
  modelserve key rotate NAME --for MS [--keep-old]   a new key; --keep-old: the old one stays valid too

`render` validates with the same spec model the CRD is generated from, so it refuses what
`kubectl apply` refuses and names the same field; it reads the operator's settings from the same
MODELSERVE_* environment variables (e.g. MODELSERVE_SIDECAR_IMAGE).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from modelserve.api import manifests, spec
from modelserve.api.validation import InvalidManifest, explain
from modelserve.contracts.api_keys import new_api_key
from modelserve.contracts.env import settings_or_exit
from modelserve.contracts.names import KIND
from modelserve.contracts.operator_settings import Settings
from modelserve.engines import Profile

from . import keys, modelfile
from . import run as cli_run
from . import views as cli_views
from .chat_client import ChatError
from .cluster import Cluster, ClusterError, KeyStore, key_store, port_forward, read_key, write_key_entry

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


def render(paths: list[str], namespace: str, settings: Settings) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects the operator applies for every ModelServer in the files, in file order, and what
    is wrong with each invalid one (every one is named, as `kubectl apply` names each refusal)."""
    objects: list[dict[str, Any]] = []
    refusals: list[str] = []
    for path in paths:
        for where, document in _documents(path):
            name = (document.get("metadata") or {}).get("name", "")
            try:
                ms = parse_model_server(document, namespace)
            except InvalidManifest as error:
                refusals.append(f'{where}: {KIND} "{name}" is invalid:\n{error}')
                continue
            objects += manifests.owned_objects(ms, settings, API_KEY_PLACEHOLDER)
    return objects, refusals


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
        "MODELSERVE_* environment variables. An invalid manifest prints nothing: every invalid one is "
        "named on stderr, with its fields, and the exit code is 1.",
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
    _named_key_commands(key_cmd)
    _ollama_commands(commands)
    return parser


NAMESPACE_HELP = "namespace (default: the kubeconfig context's)"
KEY_NAME_HELP = "the key's name: its data key in the Secret, what metrics and logs show (never the key)"


def _named_key_commands(key_cmd: Any) -> None:
    def with_target(command: Any) -> None:
        command.add_argument(
            "--for", dest="model_server", required=True, metavar="MODELSERVER", help="the ModelServer the key is for"
        )
        command.add_argument("-n", "--namespace", help=NAMESPACE_HELP)

    create_cmd = key_cmd.add_parser(
        "create",
        help="a new named key with limits; prints the key once",
        description="Generate a key, store its hash and limits as entry NAME of the ModelServer's key Secret, "
        "and print the key (only this once: the Secret does not hold it). The limits are the ModelServer's "
        "as a whole, shared by its replicas.",
    )
    create_cmd.add_argument("name", metavar="NAME", help=KEY_NAME_HELP)
    with_target(create_cmd)
    create_cmd.add_argument("--max-in-flight", type=int, metavar="N", help="requests of this key at once")
    create_cmd.add_argument("--requests-per-minute", type=int, metavar="N", help="requests a minute")
    create_cmd.add_argument("--tokens-per-minute", type=int, metavar="N", help="tokens a minute")
    create_cmd.add_argument(
        "--expires", metavar="WHEN", help="a lifetime (30d, 12h, 90m) or an RFC 3339 time (2027-01-01T00:00:00Z)"
    )
    create_cmd.add_argument(
        "--weight", type=int, metavar="N", help="its share of a busy engine against other keys' (default: 1)"
    )
    list_cmd = key_cmd.add_parser("list", aliases=["ls"], help="the named keys and their limits (never a key)")
    with_target(list_cmd)
    revoke_cmd = key_cmd.add_parser("revoke", help="remove a named key: its credentials stop working")
    revoke_cmd.add_argument("name", metavar="NAME", help=KEY_NAME_HELP)
    with_target(revoke_cmd)
    rotate_cmd = key_cmd.add_parser(
        "rotate",
        help="a new key in place of a named key's credentials, limits kept; prints it once",
        description="Generate a new key for entry NAME (its limits kept) and print it once. Its old "
        "credentials stop working, or with --keep-old stay valid beside it while clients move over.",
    )
    rotate_cmd.add_argument("name", metavar="NAME", help=KEY_NAME_HELP)
    with_target(rotate_cmd)
    rotate_cmd.add_argument("--keep-old", action="store_true", help="the old credentials stay valid too")


def _ollama_commands(commands: Any) -> None:
    run_cmd = commands.add_parser(
        "run",
        help="ask a ModelServer, once or as a chat",
        description="With PROMPT: print the answer as it is generated. Without: a chat reading lines from "
        "stdin, the conversation kept; /bye leaves, /image PATH QUESTION attaches an image. The model is "
        "reached through a kubectl port-forward to its Service, or at --url.",
    )
    run_cmd.add_argument("name", metavar="NAME", help="the ModelServer (its served model name)")
    run_cmd.add_argument("prompt", metavar="PROMPT", nargs="?", help="one prompt; none: a chat")
    run_cmd.add_argument("-n", "--namespace", help=NAMESPACE_HELP)
    run_cmd.add_argument("--url", help="base URL instead of a port-forward (a gateway, a local sidecar)")
    run_cmd.add_argument("--key", help="API key (default: read from the ModelServer's key Secret; '' sends none)")
    list_cmd = commands.add_parser("list", aliases=["ls"], help="list ModelServers")
    scope = list_cmd.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help=NAMESPACE_HELP)
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    list_cmd.add_argument(
        "-o", "--output", choices=["wide"], help="wide: also the images the pods run and whether an upgrade waits"
    )
    show_cmd = commands.add_parser("show", help="a ModelServer's model, settings, status and endpoints")
    show_cmd.add_argument("name", metavar="NAME")
    show_cmd.add_argument("-n", "--namespace", help=NAMESPACE_HELP)
    rm_cmd = commands.add_parser("rm", help="delete a ModelServer and what it owns")
    rm_cmd.add_argument("name", metavar="NAME")
    rm_cmd.add_argument("-n", "--namespace", help=NAMESPACE_HELP)
    create_cmd = commands.add_parser(
        "create",
        help="a ModelServer from an Ollama Modelfile",
        description="Print (or with --apply, server-side apply) the ModelServer an Ollama Modelfile describes: "
        "FROM a Hugging Face repo id, PARAMETERs as samplingDefaults, TEMPLATE as a Jinja chatTemplate.",
    )
    create_cmd.add_argument("name", metavar="NAME", help="name of the ModelServer")
    create_cmd.add_argument("-f", "--file", required=True, metavar="Modelfile", help="the Modelfile ('-': stdin)")
    create_cmd.add_argument(
        "--profile", choices=[p.value for p in Profile], help="engine profile (default: the spec's)"
    )
    create_cmd.add_argument("-n", "--namespace", help=NAMESPACE_HELP)
    create_cmd.add_argument("--apply", action="store_true", help="apply it to the cluster instead of printing it")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in OLLAMA_COMMANDS:
        # SIGTERM unwinds like Ctrl-C, so a port-forward started here is stopped on the way out.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            return OLLAMA_COMMANDS[args.command](args)
        except (ClusterError, ChatError, modelfile.ModelfileError, InvalidManifest, OSError) as error:
            print(f"modelserve {args.command}: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 130
    if args.command == "render":
        try:
            objects, refusals = render(args.files, args.namespace, settings_or_exit(Settings, "modelserve render"))
        except (InvalidManifest, OSError, yaml.YAMLError) as error:
            print(f"modelserve render: {error}", file=sys.stderr)
            return 1
        for refusal in refusals:
            print(f"modelserve render: {refusal}", file=sys.stderr)
        if refusals:  # nothing on stdout: a pipe into `kubectl apply` applies all or none
            return 1
        dump(objects, sys.stdout)
        return 0
    if args.key_command in KEY_COMMANDS:
        try:
            return KEY_COMMANDS[args.key_command](args)
        except (ClusterError, keys.KeyCommandError) as error:
            print(f"modelserve key {args.key_command}: {error}", file=sys.stderr)
            return 1
    if not re.match(spec.DNS_SUBDOMAIN_PATTERN, args.name) or len(args.name) > 253:
        print(f"modelserve key new: {args.name!r} is not a valid Secret name (a DNS subdomain)", file=sys.stderr)
        return 1
    # For spec.auth.secretName: the sidecar accepts a key in every data key of the Secret.
    dump([manifests.key_secret({"name": args.name, "namespace": args.namespace}, new_api_key())], sys.stdout)
    return 0


def _target(args: argparse.Namespace) -> tuple[Cluster, str]:
    cluster = Cluster()
    return cluster, args.namespace or cluster.namespace


def run_command(args: argparse.Namespace) -> int:
    key, namespace = args.key, args.namespace
    if args.url is None or key is None:  # the cluster: for the port-forward, or for the key
        cluster, namespace = _target(args)
        ms = cluster.get(args.name, namespace)
        if key is None:
            key = read_key(cluster, ms)
    if args.url is not None:
        cli_run.run(args.url, args.name, key or None, args.prompt)
        return 0
    with port_forward(args.name, namespace) as url:
        cli_run.run(url, args.name, key or None, args.prompt)
    return 0


def list_command(args: argparse.Namespace) -> int:
    cluster, namespace = _target(args)
    items = cluster.list(None if args.all_namespaces else namespace)
    if not items:
        where = "any namespace" if args.all_namespaces else f'namespace "{namespace}"'
        print(f"No ModelServers in {where}.", file=sys.stderr)
        return 0
    wide = args.output == "wide"
    sys.stdout.write(cli_views.list_table(items, datetime.now(UTC), args.all_namespaces, wide))
    return 0


def show_command(args: argparse.Namespace) -> int:
    cluster, namespace = _target(args)
    sys.stdout.write(cli_views.show(cluster.get(args.name, namespace)))
    return 0


def rm_command(args: argparse.Namespace) -> int:
    cluster, namespace = _target(args)
    cluster.delete(args.name, namespace)
    print(f'deleted ModelServer "{args.name}" in namespace "{namespace}"')
    return 0


def created_manifest(text: str, name: str, profile: str | None, namespace: str | None) -> modelfile.Created:
    """The Modelfile's ModelServer, validated like `kubectl apply` validates it; a refusal names the
    spec field and the Modelfile line it came from."""
    created = modelfile.to_manifest(text, name, profile, namespace)
    try:
        parse_model_server(created.manifest, namespace or "default")
    except InvalidManifest as error:
        lines = [_with_origin(line, created.origins) for line in str(error).splitlines()]
        raise InvalidManifest(f'ModelServer "{name}" is invalid:\n' + "\n".join(lines)) from None
    return created


def _with_origin(line: str, origins: dict[str, int]) -> str:
    path = line.split(": ", 1)[0]
    found = [origin for origin in origins if path == origin or path.startswith((origin + ".", origin + "["))]
    return f"{line} (Modelfile line {origins[found[0]]})" if found else line


def create_command(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    created = created_manifest(text, args.name, args.profile, args.namespace)
    for warning in created.warnings:
        print(f"modelserve create: warning: {warning}", file=sys.stderr)
    if not args.apply:
        sys.stdout.write(cli_views.manifest_yaml(created.manifest))
        return 0
    cluster, namespace = _target(args)
    manifest = {**created.manifest, "metadata": {**created.manifest["metadata"], "namespace": namespace}}
    cluster.apply(manifest)
    print(f'applied ModelServer "{args.name}" in namespace "{namespace}"')
    return 0


# The sidecars see a changed Secret once the kubelet has refreshed its mounted copy: at once for the
# generated one (the operator syncs the pods), on the kubelet's own sync for a named one.
RELOAD_NOTE = "the kubelet has updated the Secret mounted in the model's pods (seconds; a minute for a named Secret)"


def _key_store(args: argparse.Namespace) -> tuple[Cluster, KeyStore, str]:
    """The cluster, the key Secret of `args.model_server` as it is now, and its namespace."""
    cluster, namespace = _target(args)
    return cluster, key_store(cluster, args.model_server, namespace), namespace


def key_create_command(args: argparse.Namespace) -> int:
    # Every refusal of the arguments comes before the cluster is asked anything.
    keys.check_name(args.name)
    expires = keys.parse_expires(args.expires, time.time()) if args.expires is not None else None
    limits = keys.limits(args.max_in_flight, args.requests_per_minute, args.tokens_per_minute, expires, args.weight)
    cluster, store, namespace = _key_store(args)
    if args.name in store.data:
        raise keys.KeyCommandError(
            f'the Secret "{store.secret}" already has a key named "{args.name}": rotate it, or revoke it first'
        )
    key = new_api_key()
    write_key_entry(cluster, store, args.name, keys.new_entry(args.name, key, limits))
    # The key on stdout alone (for `KEY=$(modelserve key create ...)`); it is not stored anywhere.
    print(key)
    print(
        f'modelserve key create: key "{args.name}" stored (as its hash) in Secret "{store.secret}" of namespace '
        f'"{namespace}"; it is printed only this once, and works once {RELOAD_NOTE}.',
        file=sys.stderr,
    )
    return 0


def key_list_command(args: argparse.Namespace) -> int:
    _, store, namespace = _key_store(args)
    if store.resource_version is None:
        raise ClusterError(f'the key Secret "{store.secret}" is not in namespace "{namespace}" (yet)')
    if not store.data:
        print(f'No keys in Secret "{store.secret}": every request is refused.', file=sys.stderr)
        return 0
    sys.stdout.write(keys.list_table(store.data, time.time()))
    return 0


def key_revoke_command(args: argparse.Namespace) -> int:
    cluster, store, namespace = _key_store(args)
    if args.name not in store.data:
        raise keys.KeyCommandError(f'no key named "{args.name}" in the Secret "{store.secret}"')
    write_key_entry(cluster, store, args.name, None)
    print(f'revoked key "{args.name}" of ModelServer "{args.model_server}" in namespace "{namespace}"')
    if len(store.data) == 1:
        print(
            f'modelserve key revoke: that was the last key: "{args.model_server}" refuses every request',
            file=sys.stderr,
        )
    return 0


def key_rotate_command(args: argparse.Namespace) -> int:
    cluster, store, _ = _key_store(args)
    entry = keys.existing_entry(store.data, args.name, store.secret)
    key = new_api_key()
    write_key_entry(cluster, store, args.name, keys.rotated(entry, key, args.keep_old))
    print(key)
    if args.keep_old:
        kept = "its old credentials stay valid beside it"
    else:
        kept = f"its old credentials stop working once {RELOAD_NOTE}"
    print(f'modelserve key rotate: new key for "{args.name}", printed only this once; {kept}.', file=sys.stderr)
    if entry.limits.expires is not None and entry.limits.expires <= time.time():
        # Rotation keeps the limits, the expiry among them: say so rather than hand out a dead key.
        print(
            f'modelserve key rotate: warning: "{args.name}" has expired, and the new key with it: '
            "revoke it and create it again with a new --expires",
            file=sys.stderr,
        )
    return 0


KEY_COMMANDS = {
    "create": key_create_command,
    "list": key_list_command,
    "ls": key_list_command,
    "revoke": key_revoke_command,
    "rotate": key_rotate_command,
}


OLLAMA_COMMANDS = {
    "run": run_command,
    "list": list_command,
    "ls": list_command,
    "show": show_command,
    "rm": rm_command,
    "create": create_command,
}


if __name__ == "__main__":
    raise SystemExit(main())
