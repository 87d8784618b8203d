"""`modelserve key create|list|rotate|revoke` as a user runs them, against the session's real control
plane: what lands in the ModelServer's key Secret (a hash and the limits, one entry patched, the
others left alone), and that no key is ever printed but the new one, once.

The ModelServers name their Secret (auth.secretName): whether the session's operator is running
(it creates only generated Secrets) then changes nothing here."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time

from modelserve.contracts.key_entries import hash_key, parse_time
from modelserve_sandbox.cluster import Cluster

CLI_SECONDS = 60
SECRET = "team-keys"
LEGACY_KEY = "msk-legacy-key-someone-wrote-by-hand"


def model_server(name: str, auth: dict[str, str]) -> dict:
    return {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name},
        "spec": {"model": "unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "profile": "cpu", "auth": auth},
    }


def test_named_keys_are_created_listed_rotated_and_revoked(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    def modelserve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "modelserve.cli.main", "key", *args, "-n", namespace],
            capture_output=True,
            text=True,
            env=cluster.env,  # the control plane's KUBECONFIG
            timeout=CLI_SECONDS,
        )

    def stored() -> dict[str, str]:
        secret = json.loads(cluster.kubectl("get", "secret", SECRET, "-n", namespace, "-o", "json").stdout)
        return {name: base64.b64decode(value).decode() for name, value in secret["data"].items()}

    printed: list[str] = []  # everything the CLI wrote, to check no key is in it but where expected

    def new_key(*args: str) -> str:
        result = modelserve(*args)
        assert result.returncode == 0, result.stderr
        printed.append(result.stderr)
        key = result.stdout.removesuffix("\n")
        assert key.startswith("msk-") and "\n" not in key, result.stdout  # the key alone on stdout
        return key

    for manifest in (
        model_server("keyed", {"mode": "private", "secretName": SECRET}),
        model_server("open", {"mode": "public"}),
    ):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))

    # create: the Secret does not exist yet, so it is made, holding the hash and the limits only.
    limits = ["--max-in-flight", "4", "--requests-per-minute", "60", "--tokens-per-minute", "20000", "--weight", "2"]
    first = new_key("create", "team-a", "--for", "keyed", *limits, "--expires", "30d")
    entry = json.loads(stored()["team-a"])
    expires = entry.pop("expires")
    limited = {"maxInFlight": 4, "requestsPerMinute": 60, "tokensPerMinute": 20000, "weight": 2}
    assert entry == {"keys": [hash_key(first)], **limited}
    assert abs(parse_time(expires) - (time.time() + 30 * 86400)) < 300
    assert first not in json.dumps(stored())

    # Someone else's entry, in the old lines format: every command below leaves it as it is.
    cluster.kubectl(
        "patch", "secret", SECRET, "-n", namespace, "-p", json.dumps({"stringData": {"legacy": LEGACY_KEY}})
    )
    refused = modelserve("create", "team-a", "--for", "keyed")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        f'modelserve key create: the Secret "{SECRET}" already has a key named "team-a": '
        "rotate it, or revoke it first\n"
    )

    listed = modelserve("list", "--for", "keyed")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["NAME", "CREDENTIALS", "MAX-IN-FLIGHT", "REQ/MIN", "TOKENS/MIN", "WEIGHT", "EXPIRES"]
    assert rows[1] == ["legacy", "1", "plaintext", "-", "-", "-", "1", "-"]
    assert rows[2] == ["team-a", "1", "hashed", "4", "60", "20000", "2", expires]
    printed.append(listed.stdout)

    # rotate: a new hash in place of the old, the limits kept; --keep-old keeps both.
    second = new_key("rotate", "team-a", "--for", "keyed")
    entry = json.loads(stored()["team-a"])
    assert entry["keys"] == [hash_key(second)] and (entry["maxInFlight"], entry["expires"]) == (4, expires)
    third = new_key("rotate", "team-a", "--for", "keyed", "--keep-old")
    assert json.loads(stored()["team-a"])["keys"] == [hash_key(third), hash_key(second)]
    assert len({first, second, third}) == 3
    assert stored()["legacy"] == LEGACY_KEY

    # revoke: the entry goes, the other stays; a second time there is nothing to revoke.
    revoked = modelserve("revoke", "team-a", "--for", "keyed")
    assert revoked.returncode == 0, revoked.stderr
    assert stored() == {"legacy": LEGACY_KEY}
    again = modelserve("revoke", "team-a", "--for", "keyed")
    assert (again.returncode, again.stderr) == (
        1,
        f'modelserve key revoke: no key named "team-a" in the Secret "{SECRET}"\n',
    )

    # A public ModelServer checks no keys, and a missing one is said to be missing.
    public = modelserve("create", "team-b", "--for", "open")
    assert public.returncode == 1 and "has auth.mode public" in public.stderr and public.stdout == ""
    missing = modelserve("list", "--for", "nope")
    assert missing.returncode == 1 and missing.stderr == (
        f'modelserve key list: ModelServer "nope" not found in namespace "{namespace}"\n'
    )

    for key in (first, second, third, LEGACY_KEY):
        assert all(key not in text for text in printed), "a key was printed where it must not be"
