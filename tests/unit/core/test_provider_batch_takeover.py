"""A provider batch's durable record (issue 31): the states a takeover reads, the custom ids its lines carry,
and the batch a creating record adopts."""

from __future__ import annotations

import pytest

from streamproc.core.provider_batch_objects import BatchPhase, ProviderBatchView
from streamproc.core.provider_batch_takeover import (
    CLOCK_SKEW_MS,
    GATHER_METADATA_KEY,
    ProviderBatchRecord,
    RecordState,
    adoptable,
    line_fate,
    member_custom_id,
    next_step,
)

RECORD = ProviderBatchRecord("g-1", "anthropic", "claude", 2, ("a/1", "b 2", "c"), RecordState.CREATING, 10, 10)


def test_a_takeover_finds_a_creating_batch_polls_an_open_one_and_forgets_an_ended_one() -> None:
    assert next_step(RECORD) == "find"
    opened = RECORD.opened(ProviderBatchView("anthropic", "msgbatch_1", BatchPhase.IN_PROGRESS, 3, 0), 20)
    assert (opened.state, opened.provider_batch_id, opened.updated_ms, opened.created_ms) == (
        RecordState.OPEN, "msgbatch_1", 20, 10)
    assert next_step(opened) == "poll"
    assert next_step(opened.ended(30)) == "forget"


def test_a_batch_of_another_provider_is_not_adopted() -> None:
    with pytest.raises(ValueError, match="openai's"):
        RECORD.opened(ProviderBatchView("openai", "batch_1", BatchPhase.VALIDATING, 3, 0), 20)


def test_custom_ids_are_positions_and_name_their_members_back() -> None:
    assert RECORD.custom_ids() == ["m0", "m1", "m2"]
    assert [RECORD.member(custom_id) for custom_id in RECORD.custom_ids()] == list(RECORD.members)
    for stranger in ("m3", "m01", "m-1", "x0", "m", "", "m1 "):
        assert RECORD.member(stranger) is None, stranger
    assert member_custom_id(41) == "m41"


@pytest.mark.parametrize("broken", [
    {"gather_id": ""}, {"members": ()}, {"partition": -1},
    {"state": RecordState.OPEN},  # an open record without the provider's id
])
def test_a_record_that_cannot_be_taken_over_is_refused(broken: dict[str, object]) -> None:
    fields = {"gather_id": "g", "provider": "openai", "model": "m", "partition": 0, "members": ("r",),
              "state": RecordState.CREATING, "created_ms": 1, "updated_ms": 1, **broken}
    with pytest.raises(ValueError):
        ProviderBatchRecord(**fields)  # type: ignore[arg-type]


def batch(batch_id: str, total: int, created_ms: int | None, provider: str = "anthropic",
          metadata: dict[str, str] | None = None) -> ProviderBatchView:
    return ProviderBatchView(provider, batch_id, BatchPhase.IN_PROGRESS, total, 0,  # type: ignore[arg-type]
                             metadata=metadata, created_ms=created_ms)


def test_openai_adopts_the_batch_carrying_the_gather_id_and_no_other() -> None:
    record = ProviderBatchRecord("g-1", "openai", "m", 0, ("a",), RecordState.CREATING, 10, 10)
    mine = batch("batch_2", 1, 10, "openai", {GATHER_METADATA_KEY: "g-1"})
    candidates = [batch("batch_3", 1, 10, "openai", {GATHER_METADATA_KEY: "g-2"}), mine, batch("batch_1", 1, 10,
                                                                                                 "openai")]
    assert adoptable(record, candidates, taken=set()) == mine
    assert adoptable(record, candidates[:1], taken=set()) is None


@pytest.mark.parametrize(("candidates", "taken", "adopted"), [
    ([batch("b1", 3, 1_000_000)], set(), "b1"),
    ([batch("b1", 3, 1_000_000 + CLOCK_SKEW_MS)], set(), "b1"),
    ([batch("b1", 3, 1_000_000 + CLOCK_SKEW_MS + 1)], set(), None),  # too late to be this create's
    ([batch("b1", 2, 1_000_000)], set(), None),  # another size
    ([batch("b1", 3, None)], set(), None),  # no creation time to match
    ([batch("b1", 3, 1_000_000)], {"b1"}, None),  # another record holds it
    ([batch("b1", 3, 1_000_000), batch("b2", 3, 1_000_100)], set(), None),  # ambiguous
    ([batch("b1", 3, 1_000_000), batch("b2", 3, 1_000_100)], {"b2"}, "b1"),
    ([batch("b1", 3, 1_000_000, "openai")], set(), None),  # another provider's
])
def test_anthropic_adopts_the_one_batch_of_its_size_and_time(candidates: list[ProviderBatchView], taken: set[str],
                                                             adopted: str | None) -> None:
    record = ProviderBatchRecord("g-1", "anthropic", "m", 0, ("a", "b", "c"), RecordState.CREATING, 1_000_000, 0)
    found = adoptable(record, candidates, taken)
    assert (found.batch_id if found else None) == adopted


def test_a_line_answers_only_the_attempt_it_was_gathered_for() -> None:
    assert line_fate(2, 2) == "answer"
    assert line_fate(1, 2) == "drop"  # its attempt's outcome was written before the takeover: the call is gathered anew
    assert line_fate(3, 2) == "keep"  # it waits for its own attempt; the earlier one asking is gathered anew
    assert line_fate(None, 5) == "answer"  # a record written without attempts: matched by request id


def test_a_record_knows_each_members_attempt_and_refuses_attempts_not_one_per_member() -> None:
    record = ProviderBatchRecord("g-1", "openai", "m", 0, ("a", "b"), RecordState.CREATING, 1, 1, attempts=(1, 2))
    assert record.member_attempts() == {"a": 1, "b": 2}
    assert RECORD.member_attempts() == {"a/1": None, "b 2": None, "c": None}
    for attempts in ((1,), (1, 0)):
        with pytest.raises(ValueError, match="one attempt"):
            ProviderBatchRecord("g-1", "openai", "m", 0, ("a", "b"), RecordState.CREATING, 1, 1, attempts=attempts)
