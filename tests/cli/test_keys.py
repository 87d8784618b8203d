"""`modelserve key create|list|revoke|rotate`: the entries they write, the lifetimes they read, the
table they print, and the refusals that come before any cluster is asked (no cluster here: the
commands against a real control plane are in test_keys_cluster.py)."""

from __future__ import annotations

import json
import re

import pytest

from modelserve.cli import keys
from modelserve.cli import main as cli
from modelserve.cli.cluster import first_key
from modelserve.cli.keys import KeyCommandError
from modelserve.contracts.key_entries import KeyEntry, KeyLimits, hash_key, parse_entry, parse_time

NOW = parse_time("2026-03-01T12:00:00Z")
KEY = "msk-test-key"
OTHER = "msk-other-key"


# --- --expires --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", "2026-03-31T12:00:00Z"),
        ("12h", "2026-03-02T00:00:00Z"),
        ("90m", "2026-03-01T13:30:00Z"),
        ("2027-01-01T00:00:00Z", "2027-01-01T00:00:00Z"),
        ("2027-01-01T02:00:00+02:00", "2027-01-01T00:00:00Z"),
    ],
)
def test_expires_is_a_lifetime_or_an_rfc3339_time(text: str, expected: str) -> None:
    assert keys.parse_expires(text, NOW) == parse_time(expected)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("2026-03-01T11:59:59Z", "that time is past"),
        ("2026-03-01T12:00:00Z", "that time is past"),
        ("0d", "a lifetime must be at least 1d"),
        ("tomorrow", "not a lifetime (30d, 12h, 90m) nor an RFC 3339 time"),
        ("30s", "not a lifetime"),
        ("-1d", "not a lifetime"),
        ("2027-01-01T00:00:00", "not a lifetime"),  # no time zone: whose midnight?
    ],
)
def test_an_expiry_past_or_unreadable_is_refused(text: str, said: str) -> None:
    with pytest.raises(KeyCommandError, match=re.escape(said)):
        keys.parse_expires(text, NOW)


# --- building and changing entries ------------------------------------------------------------------


def test_limits_are_whole_numbers_of_at_least_one() -> None:
    assert keys.limits() == KeyLimits()
    assert keys.limits(4, 60, 20000, NOW, 2) == KeyLimits(4, 60, 20000, NOW, 2)
    for flag, arguments in [
        ("--max-in-flight 0", {"max_in_flight": 0}),
        ("--requests-per-minute -1", {"requests_per_minute": -1}),
        ("--tokens-per-minute 0", {"tokens_per_minute": 0}),
        ("--weight 0", {"weight": 0}),
    ]:
        with pytest.raises(KeyCommandError, match=f"^{flag}: must be a whole number of at least 1$"):
            keys.limits(**arguments)


def test_a_name_must_be_a_secret_data_key() -> None:
    keys.check_name("team-a.prod_1")
    for bad in ("", "team/a", "team a", "é", "x" * 254, ".team", "..", "."):
        with pytest.raises(KeyCommandError, match="is not a valid key name"):
            keys.check_name(bad)


def test_a_new_entry_holds_the_hash_and_the_limits_never_the_key() -> None:
    limits = keys.limits(4, 60, 20000, parse_time("2027-01-01T00:00:00Z"), 2)
    text = keys.new_entry("team-a", KEY, limits)
    assert KEY not in text
    assert json.loads(text) == {
        "keys": [hash_key(KEY)],
        "maxInFlight": 4,
        "requestsPerMinute": 60,
        "tokensPerMinute": 20000,
        "expires": "2027-01-01T00:00:00Z",
        "weight": 2,
    }
    assert parse_entry("team-a", text) == KeyEntry("team-a", (hash_key(KEY),), limits)
    # No limits: the hash alone.
    assert json.loads(keys.new_entry("plain", KEY, keys.limits())) == {"keys": [hash_key(KEY)]}


def test_rotation_replaces_the_credentials_and_keeps_the_limits() -> None:
    limits = KeyLimits(max_in_flight=4, tokens_per_minute=100, weight=3)
    entry = parse_entry("team-a", keys.new_entry("team-a", OTHER, limits))
    replaced = parse_entry("team-a", keys.rotated(entry, KEY, keep_old=False))
    assert replaced == KeyEntry("team-a", (hash_key(KEY),), limits)
    overlapping = parse_entry("team-a", keys.rotated(entry, KEY, keep_old=True))
    assert overlapping == KeyEntry("team-a", (hash_key(KEY), hash_key(OTHER)), limits)


def test_rotating_a_legacy_lines_entry_makes_it_json() -> None:
    legacy = parse_entry("api-key", f"{OTHER}\n{hash_key('older')}\n")
    replaced = keys.rotated(legacy, KEY, keep_old=False)
    assert json.loads(replaced) == {"keys": [hash_key(KEY)]}
    kept = parse_entry("api-key", keys.rotated(legacy, KEY, keep_old=True))
    # The old credentials as they were: a plaintext one someone still reads back stays readable.
    assert kept.credentials == (hash_key(KEY), OTHER, hash_key("older"))


def test_an_entry_to_change_must_be_there_and_readable() -> None:
    data = {"ok": OTHER, "broken": '{"keys": "not a list"}'}
    assert keys.existing_entry(data, "ok", "s").credentials == (OTHER,)
    with pytest.raises(KeyCommandError, match=r'^no key named "gone" in the Secret "s"$'):
        keys.existing_entry(data, "gone", "s")
    with pytest.raises(KeyCommandError, match=r'^the Secret "s": broken: keys must be a list'):
        keys.existing_entry(data, "broken", "s")


# --- key list ---------------------------------------------------------------------------------------


def test_the_list_shows_counts_and_limits_never_a_key() -> None:
    data = {
        "team-a": keys.new_entry("team-a", KEY, keys.limits(4, 60, 20000, parse_time("2027-01-01T00:00:00Z"), 2)),
        "api-key": f"{OTHER}\n",
        "both": json.dumps({"keys": [hash_key(KEY), OTHER], "expires": "2026-03-01T11:00:00Z"}),
        "broken": '{"keys": [], "maxInFlight": 0}',
        "nojson": "{keys",
    }
    table = keys.list_table(data, NOW)
    assert table == (
        "NAME      CREDENTIALS             MAX-IN-FLIGHT   REQ/MIN   TOKENS/MIN   WEIGHT   EXPIRES\n"
        "api-key   1 plaintext             -               -         -            1        -\n"
        "both      1 hashed, 1 plaintext   -               -         -            1        expired\n"
        "broken    invalid: maxInFlight must be a whole number of at least 1\n"
        "nojson    invalid: not JSON (Expecting property name enclosed in double quotes at line 1)\n"
        "team-a    1 hashed                4               60        20000        2        2027-01-01T00:00:00Z\n"
    )
    assert KEY not in table and OTHER not in table and hash_key(KEY) not in table
    assert keys.credentials_summary(KeyEntry("empty", ())) == "none"


# --- the key `modelserve run` reads back ------------------------------------------------------------


def test_run_reads_back_a_plaintext_key_only() -> None:
    hashed = keys.new_entry("a-hashed", KEY, keys.limits())
    # A named Secret: the first entry (in name order) holding a plaintext key; hashes cannot be sent.
    assert first_key({"a-hashed": hashed, "b": OTHER}, "") == OTHER
    assert first_key({"a": json.dumps({"keys": [hash_key(KEY), OTHER]})}, "") == OTHER
    assert first_key({"a": "{broken", "b": OTHER}, "") == OTHER
    assert first_key({"a-hashed": hashed}, "") is None
    # The generated Secret's entry, once rotated, holds only a hash.
    assert first_key({"api-key": keys.rotated(parse_entry("api-key", OTHER), KEY, False)}, "api-key") is None


# --- arguments, and refusals before the cluster -----------------------------------------------------


def test_arguments_of_the_key_commands() -> None:
    parse = cli._parser().parse_args
    limits = ["--max-in-flight", "4", "--requests-per-minute", "60", "--tokens-per-minute", "20000"]
    create = parse(["key", "create", "team-a", "--for", "chatty", "-n", "serving", *limits, "--expires", "30d"])
    assert (create.key_command, create.name, create.model_server, create.namespace) == (
        "create",
        "team-a",
        "chatty",
        "serving",
    )
    assert (create.max_in_flight, create.requests_per_minute, create.tokens_per_minute) == (4, 60, 20000)
    assert (create.expires, create.weight) == ("30d", None)
    assert parse(["key", "create", "team-a", "--for", "chatty", "--weight", "2"]).weight == 2
    bare = parse(["key", "create", "team-a", "--for", "chatty"])
    assert (bare.namespace, bare.max_in_flight, bare.expires, bare.weight) == (None, None, None, None)
    assert parse(["key", "list", "--for", "chatty"]).key_command == "list"
    assert parse(["key", "rotate", "team-a", "--for", "chatty", "--keep-old"]).keep_old
    assert not parse(["key", "rotate", "team-a", "--for", "chatty"]).keep_old
    assert parse(["key", "revoke", "team-a", "--for", "c"]).name == "team-a"
    for wrong in (
        ["key", "create", "team-a"],  # for which ModelServer?
        ["key", "list"],
        ["key", "create", "team-a", "--for", "c", "--weight", "two"],
    ):
        with pytest.raises(SystemExit):
            parse(wrong)


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["team/a"], "'team/a' is not a valid key name"),
        (["t", "--max-in-flight", "0"], "--max-in-flight 0: must be a whole number of at least 1"),
        (["t", "--weight", "-2"], "--weight -2: must be a whole number of at least 1"),
        (["t", "--expires", "2020-01-01T00:00:00Z"], "--expires 2020-01-01T00:00:00Z: that time is past"),
        (["t", "--expires", "soon"], "--expires 'soon': not a lifetime"),
    ],
)
def test_create_refuses_bad_arguments_before_asking_the_cluster(
    arguments: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    assert cli.main(["key", "create", *arguments, "--for", "chatty"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"modelserve key create: {said}"), err
