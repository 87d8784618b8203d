"""The node cache's decisions, as pure functions: which files an engine reads, what to evict, which
labels a node gets, and the fetch's settings and result as the operator renders and reads them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from harness.testdata import model_server
from modelserve.api import manifests
from modelserve.contracts.env import byte_quantity
from modelserve.contracts.names import SELECTOR_LABEL
from modelserve.contracts.nodecache import (
    NODE_LABEL_PREFIX,
    POD_MODEL_LABEL,
    FetchResult,
    FetchSettings,
    Layout,
    Source,
    model_key,
    node_label,
)
from modelserve.contracts.operator_settings import Settings
from modelserve.nodecache.fetch import snapshot_link
from modelserve.nodecache.hub import (
    Digest,
    RepoFile,
    gguf_files,
    hub_api_path,
    next_page,
    safe_path,
    select,
    tree_files,
    weight_files,
)
from modelserve.nodecache.node import Pin, ServerModels, keys_in_use, label_changes, pod_pins, server_models
from modelserve.nodecache.store import ModelRecord, plan_eviction


def _files(*paths: str) -> list[RepoFile]:
    return [RepoFile(path, 10, hashlib.sha256(path.encode()).hexdigest(), True) for path in paths]


def _paths(files: list[RepoFile]) -> list[str]:
    return [f.path for f in files]


def test_a_gguf_tag_picks_the_file_llama_cpp_loads() -> None:
    repo = _files("README.md", "m.Q4_K_M.gguf", "m.Q4_1.gguf", "m-q8_0.gguf", "m.Q4_1.imatrix.gguf")
    assert _paths(gguf_files(repo, "Q4_1")) == ["m.Q4_1.gguf"]
    assert _paths(gguf_files(repo, "Q8_0")) == ["m-q8_0.gguf"]  # case-insensitive, '-' before the tag
    assert _paths(gguf_files(repo, "")) == ["m.Q4_K_M.gguf"]  # llama.cpp's default tag first
    assert gguf_files(repo, "Q2_K") == []
    # b11434's speculative decoding sidecars are never the model, even listed first.
    sidecars = _files("mtp-m-Q4_K_M.gguf", "eagle3-m-Q4_K_M.gguf", "dflash-m.Q4_K_M.gguf", "dspark-m.Q4_K_M.gguf")
    assert _paths(gguf_files([*sidecars, *repo], "")) == ["m.Q4_K_M.gguf"]


def test_a_split_gguf_comes_whole_with_its_nearest_projector() -> None:
    repo = _files(
        "Q8_0/m-Q8_0-00002-of-00002.gguf",
        "Q8_0/m-Q8_0-00001-of-00002.gguf",
        "m-Q4_K_M.gguf",
        "mmproj-m-f16.gguf",
        "Q8_0/mmproj-m-Q8_0.gguf",
    )
    assert _paths(gguf_files(repo, "Q8_0")) == [
        "Q8_0/m-Q8_0-00002-of-00002.gguf",
        "Q8_0/m-Q8_0-00001-of-00002.gguf",
        "Q8_0/mmproj-m-Q8_0.gguf",  # in the model's own directory: deeper wins
    ]
    assert _paths(gguf_files(repo, "Q4_K_M")) == ["m-Q4_K_M.gguf", "mmproj-m-f16.gguf"]


def test_vllm_reads_one_weight_format() -> None:
    repo = _files("config.json", "model.safetensors", "pytorch_model.bin", "original/consolidated.pth", "tok.json")
    assert _paths(weight_files(repo)) == ["config.json", "model.safetensors", "tok.json"]
    bins = _files("config.json", "pytorch_model.bin")
    assert _paths(weight_files(bins)) == ["config.json", "pytorch_model.bin"]  # no safetensors: what there is
    assert _paths(select(repo, Layout.ALL, "")) == _paths(repo)


def test_the_hubs_listing_and_hashes_as_the_cache_names_files() -> None:
    listing = [
        {"type": "directory", "path": "sub"},
        {"type": "file", "path": "w.gguf", "size": 134, "oid": "a" * 40, "lfs": {"oid": "B" * 64, "size": 999}},
        {"type": "file", "path": "config.json", "size": 2, "oid": "c" * 40},
        {"type": "file", "path": "bad", "size": 2, "oid": "not-a-hash"},
    ]
    assert tree_files(listing) == [
        RepoFile("w.gguf", 999, "b" * 64, True),
        RepoFile("config.json", 2, "c" * 40, False),
    ]
    # A small file is named by git's blob sha1, as the hub's ETag names it.
    content = b"{}"
    git_oid = hashlib.sha1(b"blob 2\0" + content).hexdigest()
    digest = Digest(git_oid, len(content))
    digest.update(content)
    assert digest.matches()
    assert (
        next_page('<https://hub/api/models/a/b/tree/c?cursor=x>; rel="next"')
        == "https://hub/api/models/a/b/tree/c?cursor=x"
    )
    assert next_page(None) is None


def test_snapshot_links_point_at_the_blob_from_any_depth() -> None:
    assert snapshot_link("model.gguf", "x") == "../../blobs/x"
    assert snapshot_link("Q8_0/part.gguf", "x") == "../../../blobs/x"


def _record(key: str, *oids: str) -> ModelRecord:
    return ModelRecord(key, f"acme/{key}", "main", "c" * 40, tuple((oid, 10) for oid in oids))


def test_eviction_takes_whole_models_no_pod_uses_least_recently_used_first() -> None:
    blobs = {"a": (10, 1.0), "b": (10, 2.0), "c": (10, 3.0), "orphan": (10, 5.0)}
    models = {"old": _record("old", "a"), "new": _record("new", "b"), "used": _record("used", "c")}
    plan = plan_eviction(blobs, models, in_use={"used"}, busy=set(), need=15, room=0)
    assert plan is not None and plan.oids == ("orphan", "a") and plan.models == ("old",)
    plan = plan_eviction(blobs, models, in_use={"used"}, busy=set(), need=25, room=0)
    assert plan is not None and set(plan.models) == {"old", "new"}
    # Not enough even so: nothing is cached, nothing evicted for it.
    assert plan_eviction(blobs, models, in_use={"used"}, busy=set(), need=35, room=0) is None
    # Unknown pods (the API server unreachable): keep everything.
    assert plan_eviction(blobs, models, in_use=None, busy=set(), need=5, room=0) is None
    # A file being served or written stays.
    plan = plan_eviction(blobs, models, in_use=set(), busy={"orphan"}, need=5, room=0)
    assert plan is not None and plan.oids == ("a",)


def test_a_file_two_models_share_goes_only_with_the_last_of_them() -> None:
    blobs = {"shared": (10, 1.0), "own": (10, 1.0)}
    models = {"one": _record("one", "shared", "own"), "two": _record("two", "shared")}
    plan = plan_eviction(blobs, models, in_use={"two"}, busy=set(), need=10, room=0)
    assert plan is not None and plan.oids == ("own",) and plan.models == ("one",)


def test_a_model_record_reads_back_as_the_node_wrote_it_and_an_older_one_without_paths() -> None:
    # A record as the node cache has written it to <root>/models/<key>.json since it kept paths.
    written = {
        "key": "k",
        "model": "acme/m",
        "revision": "main",
        "commit": "c" * 40,
        "files": [{"oid": "a" * 64, "size": 9}],
        "paths": [
            {"path": "config.json", "oid": "b" * 40, "size": 2, "lfs": False},
            {"path": "w.gguf", "oid": "a" * 64, "size": 9, "lfs": True},
        ],
        "public": True,
    }
    text = json.dumps(written, separators=(",", ":"))
    record = ModelRecord.parse(text)
    assert record.paths == (RepoFile("config.json", 2, "b" * 40, False), RepoFile("w.gguf", 9, "a" * 64, True))
    assert record.public and record.to_json() == text
    older = ModelRecord.parse(json.dumps({k: v for k, v in written.items() if k not in ("paths", "public")}))
    assert older.paths == () and not older.public and older.files == (("a" * 64, 9),)


def test_a_nodes_labels_follow_what_it_holds_and_leave_the_rest() -> None:
    current = {"kubernetes.io/hostname": "n", f"{NODE_LABEL_PREFIX}/m-old": "true", f"{NODE_LABEL_PREFIX}/m-k": "true"}
    assert label_changes(current, {"k", "new"}) == {
        f"{NODE_LABEL_PREFIX}/m-new": "true",
        f"{NODE_LABEL_PREFIX}/m-old": None,
    }
    assert label_changes(current, {"k", "old"}) == {}
    assert node_label("acme/m:Q4_1") == f"{NODE_LABEL_PREFIX}/m-{model_key('acme/m:Q4_1')}"
    assert len(node_label("acme/m:Q4_1").split("/")[1]) <= 63  # a label key's name


def _pod(namespace: str, labels: dict[str, str], deleting: bool = False) -> dict[str, Any]:
    """A pod as the agent's metadata list has it."""
    metadata: dict[str, Any] = {"name": "p", "namespace": namespace, "labels": labels}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata}


MODEL, ADAPTER = "acme/base", "acme/pirate-lora"
BASE = ServerModels(MODEL, (ADAPTER,))


def test_a_pin_counts_only_where_its_modelserver_names_the_model() -> None:
    """Issue 57 L7: any pod's model label pinned any model, and adapters in use were never pinned."""
    own = {SELECTOR_LABEL: "base", POD_MODEL_LABEL: model_key(MODEL)}
    pins = pod_pins(
        [
            _pod("team-a", own),
            _pod("team-a", {**own, "other": "label"}),  # a second replica: one pin
            _pod("team-a", {SELECTOR_LABEL: "base", POD_MODEL_LABEL: model_key("acme/other")}),  # not its model
            _pod("team-b", {POD_MODEL_LABEL: model_key("acme/rogue")}),  # no ModelServer named
            _pod("team-b", own),  # the name of a ModelServer of another namespace
            _pod("team-c", {SELECTOR_LABEL: "gone", POD_MODEL_LABEL: model_key(MODEL)}),
            _pod("team-a", {SELECTOR_LABEL: "..", POD_MODEL_LABEL: model_key(MODEL)}),  # no object name
            _pod("team-a", {SELECTOR_LABEL: "base"}),  # no model label: claims nothing
            _pod("team-d", {SELECTOR_LABEL: "base", POD_MODEL_LABEL: model_key(MODEL)}, deleting=True),
        ]
    )
    assert pins == {
        Pin("team-a", "base", model_key(MODEL)),
        Pin("team-a", "base", model_key("acme/other")),
        Pin("team-b", "base", model_key(MODEL)),
        Pin("team-c", "gone", model_key(MODEL)),
    }
    servers = {("team-a", "base"): BASE, ("team-c", "gone"): None}  # team-b has no `base`: absent
    assert keys_in_use(pins, servers) == {model_key(MODEL), model_key(ADAPTER)}
    # The adapters ride on a pin that counts, never on their own.
    assert keys_in_use({Pin("team-a", "base", model_key(ADAPTER))}, servers) == set()
    assert keys_in_use(set(), servers) == set()
    assert keys_in_use(pins, {("team-a", "base"): ServerModels("")}) == set()


def test_a_modelservers_models_are_read_from_its_two_fields_alone() -> None:
    body = {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "spec": {
            "model": MODEL,
            "adapters": [
                {"name": "pirate", "source": ADAPTER},
                {"name": "poet", "source": "/root/.cache/huggingface/poet"},  # the pod's own volume
            ],
            "chatTemplate": "{{ x }}",
        },
        "status": {"phase": "Ready"},
    }
    assert server_models(body) == BASE
    assert server_models({"spec": {"model": MODEL}}) == ServerModels(MODEL)
    assert server_models({"spec": {"model": MODEL, "adapters": None}}) == ServerModels(MODEL)
    # What no API server returns for a ModelServer names no model, rather than failing the agent.
    for odd in ({}, {"spec": None}, {"spec": {"model": 3, "adapters": "x"}}, [], None):
        assert server_models(odd) == ServerModels(""), odd
    assert server_models({"spec": {"model": MODEL, "adapters": [{"source": 7}, "x", {}]}}) == ServerModels(MODEL)


@pytest.mark.parametrize("profile", ["high-throughput", "cpu"])
def test_the_agent_honours_the_pins_the_operator_renders(profile: str) -> None:
    """The labels the operator puts on a model pod, read back by the agent with the ModelServer it
    came from, keep exactly what that pod's fetch downloads: the model and its hub adapters."""
    adapters = [{"name": "pirate", "source": ADAPTER}, {"name": "poet", "source": "/root/.cache/huggingface/poet"}]
    spec = {"adapters": adapters} if profile != "cpu" else {"model": "acme/tiny-GGUF:Q4_1", "profile": "cpu"}
    ms = model_server("base", "team-a", **spec)
    settings = Settings(sidecar_image="modelserve:test", node_cache_url="http://nodecache:8090")
    template = manifests.serving_pod_template(manifests.workload(ms, settings))
    (fetch,) = template["spec"]["initContainers"]
    fetched = FetchSettings.from_env({var["name"]: var["value"] for var in fetch["env"] if "value" in var})
    pins = pod_pins([_pod("team-a", template["metadata"]["labels"])])
    wire = {"spec": ms.spec.model_dump(mode="json", by_alias=True, exclude_none=True)}
    in_use = keys_in_use(pins, {("team-a", "base"): server_models(wire)})
    assert in_use == {model_key(fetched.model), *(model_key(a) for a in fetched.adapters)}
    assert len(in_use) == (2 if profile != "cpu" else 1)


def test_the_fetch_result_goes_through_a_termination_message() -> None:
    result = FetchResult("acme/m", 1.23456, hub_bytes=5, node_bytes=0, files=2, node_cache="unreachable")
    back = FetchResult.parse(result.to_json())
    assert back == FetchResult("acme/m", 1.235, hub_bytes=5, files=2, node_cache="unreachable")
    assert back.source == Source.HUB
    assert FetchResult("m", 1, node_bytes=3).source == Source.NODE
    assert FetchResult("m", 1, node_bytes=3, hub_bytes=1).source == Source.MIXED
    for garbage in ("", "not json", "[]", '{"seconds": 1}', "llama-server: error: unknown argument"):
        assert FetchResult.parse(garbage) is None


def test_the_fetch_settings_as_the_operator_renders_them() -> None:
    settings = FetchSettings(
        model="acme/m:Q4_1", layout=Layout.GGUF, adapters=("acme/a", "acme/b"), node_cache="http://agent:8090"
    )
    env = settings.to_env()
    assert env == {
        "MODELSERVE_FETCH_MODEL": "acme/m:Q4_1",
        "MODELSERVE_FETCH_LAYOUT": "gguf",
        "MODELSERVE_FETCH_ADAPTERS": "acme/a,acme/b",
        "MODELSERVE_FETCH_NODE_CACHE": "http://agent:8090",
    }
    assert FetchSettings.from_env(env) == settings
    assert FetchSettings.from_env({"MODELSERVE_FETCH_MODEL": "a/b"}).cache_dir == Path("/hub-cache/hub")


@pytest.mark.parametrize(
    ("text", "value"), [("50Gi", 50 * 2**30), ("500M", 500_000_000), ("1073741824", 2**30), ("1.5Ki", 1536)]
)
def test_sizes_read_as_kubernetes_quantities(text: str, value: int) -> None:
    assert byte_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "-1Gi", "0", "5 GB", "5m"])
def test_a_bad_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        byte_quantity(text)


def test_a_path_that_climbs_out_is_refused_however_often_it_is_encoded() -> None:
    assert safe_path("model.safetensors") and safe_path("original/params.json") and safe_path("100%.txt")
    for climbing in ("../x", "a/../../x", "./x", "a//b", "/etc/passwd", "a\\..\\b", ""):
        assert not safe_path(climbing), climbing
    # Once, twice, three times encoded: whoever decodes it next must not find `..` (was: one decoding).
    for encoded in ("%2E%2E/x", "a/%2e%2e/x", "%252E%252E/x", "%25252E%25252E/x", "a%2F..%2Fb"):
        assert not safe_path(encoded), encoded


def test_the_api_pass_through_reaches_a_models_info_and_tree_only() -> None:
    for allowed in (
        "/api/models/acme/tiny",
        "/api/models/acme/tiny/revision/main",
        "/api/models/acme/tiny/revision/refs%2Fpr%2F1",
        "/api/models/acme/tiny/tree/0123abc",
        "/api/models/acme/tiny/tree/main/original",
    ):
        assert hub_api_path(allowed) == allowed, allowed
    for refused in (
        "/api/models/acme/tiny/../../../acme/other/resolve/main/big.gguf",  # out to the download route
        "/api/models/%2E%2E/%2E%2E/whoami-v2",
        "/api/models/acme/%252E%252E/x/y",
        "/api/models/acme",  # no such route: half a repository id
        "/api/models/acme/tiny/refs",  # not a view the fetch or huggingface_hub reads
        "/api/models/acme/tiny/tree",  # a view without its revision
        "/api/datasets/acme/tiny",
        "/api/whoami-v2",
    ):
        assert hub_api_path(refused) is None, refused
