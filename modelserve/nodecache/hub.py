"""What the node cache knows of the Hugging Face Hub: model ids, which files an engine reads, the
hub's hashes and how to check them, and huggingface_hub's cache layout (which llama.cpp reads
too). Pure functions, no I/O but the digests' reading of bytes given to them."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from modelserve.contracts.nodecache import Layout

# What the node agent adds to the hub's protocol: where a file came from (node: held on the node;
# hub: this request fetched it), a hub refusal passed on (not the agent's own error), and the route a
# fetch records a model it found whole on.
SOURCE_HEADER = "X-Modelserve-Source"
HUB_STATUS_HEADER = "X-Modelserve-Hub-Status"
FETCHED_ROUTE = "/v1/fetched"
# On an agent's answer given from its records because the hub could not be reached (a public model
# held whole): what the fetch reports, so the start says it began without the hub.
OFFLINE_HEADER = "X-Modelserve-Hub-Unreachable"
# What every request to the hub (and to the agent) asks for: the bytes as stored. The hub gzips text
# files for a client that accepts it, and what is hashed and written must be the raw bytes the tree's
# oid names (huggingface_hub sends the same on its metadata requests).
RAW_BYTES = {"Accept-Encoding": "identity"}
# Weight formats an engine reads one of: with safetensors present the others are never read (vLLM's
# and SGLang's default loaders prefer safetensors; `original/` holds a repository's other release).
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".onnx_data", ".tflite", ".ot", ".gguf")
# llama.cpp's default tags when `-hf` names none, in its order (common/download.cpp).
DEFAULT_GGUF_TAGS = ("Q4_K_M", "Q8_0")
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.IGNORECASE)
_QUANT_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository at a commit, as the hub's tree lists it."""

    path: str
    size: int
    oid: str  # the LFS sha256 (64 hex), else the git blob sha1 (40 hex): what the cache names it by
    lfs: bool


def split_model(model: str) -> tuple[str, str]:
    """`<org>/<repo>[:<tag>]` -> (repo, tag)."""
    repo, _, tag = model.partition(":")
    return repo, tag


def repo_folder(repo: str) -> str:
    """huggingface_hub's folder for a model repository: models--<org>--<name>."""
    return "models--" + repo.replace("/", "--")


def tree_files(listing: list[dict]) -> list[RepoFile]:
    """The files of a tree listing (`/api/models/<repo>/tree/<commit>?recursive=true`), directories
    and entries without a hash left out."""
    files = []
    for item in listing:
        if not isinstance(item, dict) or item.get("type") != "file" or not isinstance(item.get("path"), str):
            continue
        lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else None
        oid = (lfs or {}).get("oid") or item.get("oid")
        size = (lfs or {}).get("size", item.get("size"))
        if isinstance(oid, str) and isinstance(size, int) and is_oid(oid):
            files.append(RepoFile(item["path"], size, oid.lower(), lfs is not None))
    return files


def is_oid(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}", text))


def is_commit(text: str) -> bool:
    """A git commit as the hub names one: 40 lower-case hex."""
    return bool(re.fullmatch(r"[0-9a-f]{40}", text))


# How many times a path is decoded when checked: whoever reads it next (the hub's proxy, a URL library
# normalising `%2E%2E`) may decode it again, so `%252E%252E` must be refused as surely as `..`.
DECODINGS = 3
# The hub's model API routes a fetch and huggingface_hub read through the node agent, after
# /api/models/<org>/<name>: the model's info, at a revision, or its tree (of a path) at a revision.
API_VIEWS = ("revision", "tree")


def _plain_path(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return (
        bool(parts)
        and not path.startswith("/")
        and "\\" not in path
        and all(part not in ("", ".", "..") for part in path.split("/"))
    )


def safe_path(path: str) -> bool:
    """A repository path that stays inside the snapshot: relative, no `..`, no empty part, however
    often it is decoded again (up to DECODINGS times)."""
    for _ in range(DECODINGS + 1):
        if not _plain_path(path):
            return False
        decoded = unquote(path)
        if decoded == path:
            return True
        path = decoded
    return False  # still encoded after that many decodings: nobody's file name


def hub_api_path(raw_path: str) -> str | None:
    """The hub API path to ask for `raw_path` (as the client sent it, still percent-encoded), or None
    for anything that is not a model's info or tree: the pass-through is no way to the hub's other
    routes (no `..` to climb out, decoded or not)."""
    prefix = "/api/models/"
    if not raw_path.startswith(prefix):
        return None
    segments = raw_path[len(prefix) :].split("/")
    if not all(safe_path(segment) for segment in segments):
        return None
    if len(segments) == 2 or (len(segments) >= 4 and segments[2] in API_VIEWS):
        return raw_path
    return None


def path_of(url: str) -> str:
    """A URL's path and query: what the hub names by its full URL (a next page), asked of another host."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def next_page(link_header: str | None) -> str | None:
    """The `rel="next"` URL of a paginated listing's Link header (the hub pages long trees)."""
    for part in (link_header or "").split(","):
        url, _, params = part.partition(";")
        if 'rel="next"' in params.replace(" ", ""):
            return url.strip().strip("<>")
    return None


def _split_info(path: str) -> tuple[str, str, int, int]:
    """(prefix, upper-case quant tag, split index, split count) of a GGUF path, as llama.cpp reads it."""
    prefix = path.removesuffix(".gguf") if path.lower().endswith(".gguf") else path
    index, count = 1, 1
    if match := _SPLIT.match(prefix):
        prefix, index, count = match.group(1), int(match.group(2)), int(match.group(3))
    tag = match.group(1).upper() if (match := _QUANT_TAG.search(prefix)) else ""
    return prefix, tag, index, count


# GGUFs beside a model that llama.cpp never loads as the model: projectors, importance matrices, and
# (since b11434, common/download.cpp's gguf_filename_is_model) speculative decoding's sidecars.
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")


def _is_gguf_model(path: str) -> bool:
    name = PurePosixPath(path).name
    return path.lower().endswith(".gguf") and not any(word in name for word in _NOT_MODELS)


def _quant_bits(path: str) -> int:
    tag = _split_info(path)[1]
    digits = re.search(r"\d+", tag)
    return int(digits.group()) if digits else 0


def gguf_files(files: list[RepoFile], tag: str) -> list[RepoFile]:
    """The files llama.cpp b11434's `-hf <repo>:<tag>` loads (with no --spec-type, as we run it): the
    first GGUF model whose name carries the tag (case-insensitive, followed by `.` or `-`; split parts
    beyond the first skipped), its other split parts, and the multimodal projector nearest to it in
    directory and bits, as llama.cpp picks them; without a tag Q4_K_M, then Q8_0, then the first GGUF
    model. Empty: no GGUF matches."""
    primary = None
    for wanted in (tag,) if tag else DEFAULT_GGUF_TAGS:
        pattern = re.compile(re.escape(wanted) + r"[.-]", re.IGNORECASE)
        primary = next(
            (f for f in files if _is_gguf_model(f.path) and pattern.search(f.path) and _split_info(f.path)[2] == 1),
            None,
        )
        if primary:
            break
    if primary is None and not tag:
        primary = next((f for f in files if _is_gguf_model(f.path) and _split_info(f.path)[2] == 1), None)
    if primary is None:
        return []
    prefix, _, _, count = _split_info(primary.path)
    parts = (
        [f for f in files if _split_info(f.path)[0] == prefix and _split_info(f.path)[3] == count]
        if count > 1
        else [primary]
    )
    return parts + ([projector] if (projector := _projector(files, primary.path)) else [])


def _projector(files: list[RepoFile], model: str) -> RepoFile | None:
    """The mmproj GGUF in the model's directory or above, deepest first, then nearest in bits."""
    model_dir = PurePosixPath(model).parent.parts
    bits = _quant_bits(model)
    best: tuple[int, int] | None = None
    found = None
    for f in files:
        if not f.path.lower().endswith(".gguf") or "mmproj" not in f.path:
            continue
        directory = PurePosixPath(f.path).parent.parts
        if model_dir[: len(directory)] != directory:
            continue
        rank = (-len(directory), abs(_quant_bits(f.path) - bits))
        if best is None or rank < best:
            best, found = rank, f
    return found


def weight_files(files: list[RepoFile]) -> list[RepoFile]:
    """What vLLM and SGLang read of a repository: everything but the other formats' weights when
    safetensors are there (and `original/`, a second release of the same weights)."""
    if not any(f.path.endswith(".safetensors") for f in files):
        return list(files)
    return [
        f
        for f in files
        if not f.path.startswith("original/") and not any(f.path.lower().endswith(ext) for ext in OTHER_WEIGHTS)
    ]


def select(files: list[RepoFile], layout: Layout, tag: str) -> list[RepoFile]:
    """The files to fetch of a repository for `layout` (and the GGUF `tag`)."""
    if layout == Layout.GGUF:
        return gguf_files(files, tag)
    if layout == Layout.SAFETENSORS:
        return weight_files(files)
    return list(files)


class Digest:
    """The hash the hub names a file by, over its bytes as they stream: sha256 for LFS files, else
    git's blob sha1 (`blob <size>\\0` then the content)."""

    def __init__(self, oid: str, size: int) -> None:
        self.oid = oid.lower()
        if len(self.oid) == 64:
            self._hash = hashlib.sha256()
        else:
            self._hash = hashlib.sha1(usedforsecurity=False)
            self._hash.update(f"blob {size}\0".encode())

    def update(self, chunk: bytes) -> None:
        self._hash.update(chunk)

    def matches(self) -> bool:
        return self._hash.hexdigest() == self.oid


def hub_oid(headers: dict[str, str] | object) -> str | None:
    """The file's hash from the hub's answer to HEAD or GET on /resolve/: X-Linked-Etag for LFS files
    (sha256), else the ETag (the git blob sha1); quotes and a weak prefix removed."""
    get = headers.get  # type: ignore[attr-defined]
    for name in ("X-Linked-Etag", "ETag"):
        value = (get(name) or "").strip().removeprefix("W/").strip('"')
        if is_oid(value):
            return value.lower()
    return None


def hub_size(headers: dict[str, str] | object) -> int | None:
    get = headers.get  # type: ignore[attr-defined]
    for name in ("X-Linked-Size", "Content-Length"):
        value = get(name)
        if value is not None and str(value).isdigit():
            return int(value)
    return None
