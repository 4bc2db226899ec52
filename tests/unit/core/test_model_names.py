"""Bounded model names: what a model name may be (at submit and in the worker), bounded metric labels and
bounded per-model state."""

from __future__ import annotations

import pytest

from streamproc.core.guards.bounded import LruDict
from streamproc.core.model_labels import OTHER, ModelLabels
from streamproc.core.model_names import MAX_MODEL_NAME, model_name_problem


@pytest.mark.parametrize("name", ["gpt-4o-mini-2024-07-18", "meta-llama/Llama-3.1-8B-Instruct", "llama3.1:8b",
                                  "ft:gpt-4o-mini:org:tag:id", "claude-3-5-sonnet@20240620", "a+b=c_d.e",
                                  "m" * MAX_MODEL_NAME])
def test_names_providers_use_are_model_names(name: str) -> None:
    assert model_name_problem(name) is None


@pytest.mark.parametrize(("name", "reason"), [
    ("", "is empty"),
    ("m" * (MAX_MODEL_NAME + 1), "is 257 characters, over the 256-character limit"),
    ("gpt 4o", "has ' ' at position 3"),
    ("gpt\x00", "has '\\x00' at position 3"),
    ("caf\u00e9", "has '\u00e9' at position 3"),
    ('m"', "has '\"' at position 1"),
    ("m\n", "has '\\n' at position 1"),
])
def test_other_names_are_refused_with_the_reason(name: str, reason: str) -> None:
    problem = model_name_problem(name)
    assert problem is not None and problem.startswith(reason)


def test_labels_keep_configured_models_and_the_first_seen_then_say_other() -> None:
    labels = ModelLabels(["configured"], first_seen=2)
    assert [labels.label(name) for name in ("a", "b", "c", "a", "configured", OTHER)] == [
        "a", "b", OTHER, "a", "configured", OTHER]
    labels.configure(["late"])
    assert labels.label("late") == "late" and labels.label("d") == OTHER


def test_the_least_recently_used_key_goes_first_and_reading_does_not_make_one() -> None:
    evicted: list[tuple[str, list[int]]] = []
    lru: LruDict[str, list[int]] = LruDict(2, list, lambda key, value: evicted.append((key, value)))
    lru["a"].append(1)
    lru["b"].append(2)
    assert lru.get("zz") is None and "zz" not in lru and len(lru) == 2  # neither makes a key
    assert lru["a"] == [1]  # a is now the newest: b goes first
    lru["c"] = [3]
    assert evicted == [("b", [2])] and list(lru) == ["a", "c"]
    assert dict(lru.items()) == {"a": [1], "c": [3]} and list(lru) == ["a", "c"]  # iterating reorders nothing
    with pytest.raises(KeyError):
        LruDict[str, int](1)["missing"]
    with pytest.raises(ValueError, match="maxsize"):
        LruDict[str, int](0)
