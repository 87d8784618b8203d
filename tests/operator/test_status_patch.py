"""The status merge patch: what the status no longer has is removed, nested fields too."""

from __future__ import annotations

from modelserve.operator.reconcile import merge_patch


def test_a_field_gone_from_a_nested_object_is_nulled_and_the_rest_is_written_whole() -> None:
    previous = {"phase": "Ready", "cache": {"warm": "0/1", "message": "fetching into 1 of 1 nodes"}, "old": 1}
    wanted = {"phase": "Ready", "cache": {"warm": "1/1", "nodes": [{"node": "n", "state": "Held"}]}}
    assert merge_patch(previous, wanted) == {
        "old": None,
        "phase": "Ready",
        "cache": {"message": None, "warm": "1/1", "nodes": [{"node": "n", "state": "Held"}]},
    }


def test_an_object_replacing_a_scalar_and_a_new_object_are_written_as_they_are() -> None:
    assert merge_patch({"a": 1}, {"a": {"b": 2}, "c": {"d": 3}}) == {"a": {"b": 2}, "c": {"d": 3}}
    assert merge_patch({}, {}) == {}
