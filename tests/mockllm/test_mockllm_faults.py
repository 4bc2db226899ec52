"""The fault draw: deterministic in (seed, content, attempt), business faults fixed per content, rates kept."""

from __future__ import annotations

from collections import Counter

import pytest

from streamproc.core.vocabulary import FailureLayer
from streamproc.mockllm.injected_faults import (
    FaultKind,
    FaultRatesError,
    FaultTable,
    ForcedFault,
    ForcedFaultError,
    RequestTraits,
    applies,
    draw,
    find_marker,
)
from streamproc.mockllm.profiles import BUILTIN_PROFILES

PLAIN = RequestTraits()
EVERYTHING = RequestTraits(stream=True, wants_json=True, has_required_fields=True)


def keys(count: int) -> list[bytes]:
    return [i.to_bytes(16, "big") for i in range(count)]


def test_draw_is_a_pure_function_of_seed_content_and_attempt() -> None:
    assert draw(7, b"request-a", 0) == draw(7, b"request-a", 0)
    assert draw(7, b"request-a", 0) != draw(8, b"request-a", 0)
    assert draw(7, b"request-a", 0) != draw(7, b"request-b", 0)
    assert draw(7, b"request-a", 0).per_attempt != draw(7, b"request-a", 1).per_attempt


def test_per_content_number_ignores_the_attempt() -> None:
    assert {draw(3, b"same content", attempt).per_content for attempt in range(10)} == {
        draw(3, b"same content", 0).per_content
    }


def test_draws_are_uniform_enough() -> None:
    values = [draw(1, key, 0).per_attempt for key in keys(20_000)]
    assert all(0.0 <= v < 1.0 for v in values)
    deciles = Counter(int(v * 10) for v in values)
    assert all(1_800 < deciles[d] < 2_200 for d in range(10)), deciles


def test_every_kind_has_its_layer() -> None:
    assert FaultKind.HANG.layer is FailureLayer.TRANSPORT
    assert FaultKind.OVERLOADED.layer is FailureLayer.SERVICE
    assert FaultKind.SCHEMA_MISMATCH.layer is FailureLayer.SEMANTIC
    assert FaultKind.CONTENT_POLICY.layer is FailureLayer.BUSINESS
    assert FaultKind.HUGE_ANSWER.layer is FailureLayer.BUSINESS  # a 200 no Kafka record carries: response_too_large
    assert FaultKind.INSUFFICIENT_QUOTA.layer is None  # an account problem, not a request's layer
    assert {k for k in FaultKind if k.per_content} == {
        FaultKind.INVALID_REQUEST,
        FaultKind.CONTENT_POLICY,
        FaultKind.HUGE_ANSWER,
        FaultKind.INSUFFICIENT_QUOTA,
    }


def test_a_rate_of_one_always_picks_that_fault() -> None:
    table = FaultTable.from_rates({FaultKind.SERVER_ERROR: 1.0})
    assert {table.pick(draw(0, key, 0), PLAIN) for key in keys(200)} == {FaultKind.SERVER_ERROR}


def test_no_rates_means_no_faults() -> None:
    table = FaultTable.from_rates({})
    assert table.empty
    assert {table.pick(draw(0, key, 0), EVERYTHING) for key in keys(200)} == {None}


def test_rates_are_kept_over_many_requests() -> None:
    rates = {FaultKind.RESET: 0.05, FaultKind.RATE_LIMIT: 0.10, FaultKind.CONTENT_POLICY: 0.02}
    table = FaultTable.from_rates(rates)
    picks = Counter(table.pick(draw(5, key, 0), PLAIN) for key in keys(40_000))
    assert picks[FaultKind.CONTENT_POLICY] / 40_000 == pytest.approx(0.02, abs=0.004)
    # the other group is drawn only when the business draw missed: rate * (1 - 0.02)
    assert picks[FaultKind.RESET] / 40_000 == pytest.approx(0.05 * 0.98, abs=0.006)
    assert picks[FaultKind.RATE_LIMIT] / 40_000 == pytest.approx(0.10 * 0.98, abs=0.008)


def test_a_retry_of_a_transport_fault_can_succeed() -> None:
    table = FaultTable.from_rates({FaultKind.RESET: 0.5})
    failed_first = [key for key in keys(400) if table.pick(draw(9, key, 0), PLAIN) is FaultKind.RESET]
    recovered = [key for key in failed_first if table.pick(draw(9, key, 1), PLAIN) is None]
    assert 0.3 < len(recovered) / len(failed_first) < 0.7


def test_a_business_fault_repeats_on_every_attempt() -> None:
    table = FaultTable.from_rates({FaultKind.CONTENT_POLICY: 0.3, FaultKind.SERVER_ERROR: 0.3})
    refused = [key for key in keys(300) if table.pick(draw(2, key, 0), PLAIN) is FaultKind.CONTENT_POLICY]
    assert refused
    for key in refused:
        assert {table.pick(draw(2, key, attempt), PLAIN) for attempt in range(6)} == {FaultKind.CONTENT_POLICY}


def test_faults_that_cannot_show_in_a_request_count_as_clean() -> None:
    assert not applies(FaultKind.STREAM_BREAK, PLAIN)
    assert applies(FaultKind.STREAM_BREAK, RequestTraits(stream=True))
    assert not applies(FaultKind.TRUNCATED_BODY, RequestTraits(stream=True))
    assert not applies(FaultKind.INVALID_JSON, PLAIN)
    assert not applies(FaultKind.SCHEMA_MISMATCH, RequestTraits(wants_json=True))
    table = FaultTable.from_rates({FaultKind.INVALID_JSON: 1.0})
    assert table.pick(draw(0, b"k", 0), PLAIN) is None
    assert table.pick(draw(0, b"k", 0), RequestTraits(wants_json=True)) is FaultKind.INVALID_JSON


@pytest.mark.parametrize(
    ("rates", "message"),
    [
        ({FaultKind.RESET: 1.5}, "within"),
        ({FaultKind.RESET: -0.1}, "within"),
        ({FaultKind.RESET: 0.6, FaultKind.SERVER_ERROR: 0.6}, "add up"),
    ],
)
def test_impossible_rates_are_refused(rates: dict[FaultKind, float], message: str) -> None:
    with pytest.raises(FaultRatesError, match=message):
        FaultTable.from_rates(rates)


def test_groups_are_checked_separately() -> None:
    """Business faults are drawn apart from the rest, so each group may add up to 1 on its own."""
    FaultTable.from_rates({FaultKind.CONTENT_POLICY: 0.9, FaultKind.RESET: 0.9})


@pytest.mark.parametrize(
    ("spec", "attempts"),
    [
        ("server_error", [FaultKind.SERVER_ERROR] * 4),
        ("server_error*2", [FaultKind.SERVER_ERROR, FaultKind.SERVER_ERROR, None, None]),
        (" reset * 1 ", [FaultKind.RESET, None, None, None]),
        ("none", [None] * 4),
    ],
)
def test_forced_fault_directives(spec: str, attempts: list[FaultKind | None]) -> None:
    forced = ForcedFault.parse(spec)
    assert [forced.on_attempt(a) for a in range(4)] == attempts


@pytest.mark.parametrize("spec", ["", "bogus", "server_error*", "server_error*x", "*2"])
def test_bad_directives_are_refused(spec: str) -> None:
    with pytest.raises(ForcedFaultError):
        ForcedFault.parse(spec)


def test_markers_in_prompt_text() -> None:
    assert find_marker("label this [mock:content_policy] please") == "content_policy"
    assert find_marker("[mock:server_error*2] then fine") == "server_error*2"
    assert find_marker("no marker here") is None
    assert find_marker("[mock: spaced]") is None


@pytest.mark.parametrize("name", ["flaky", "realistic", "strict"])
def test_builtin_tables_are_valid(name: str) -> None:
    assert not BUILTIN_PROFILES[name].fault_table().empty
