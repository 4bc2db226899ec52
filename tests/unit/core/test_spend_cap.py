"""Spend caps (design §5.9): the arithmetic of whether a call may start, and the fleet's overshoot bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamproc.core.provider_batch_deadline import Way
from streamproc.core.spend_cap import (
    Cap,
    Charge,
    Exhausted,
    Scope,
    Spend,
    SpendLedger,
    batch_scope,
    day_scope,
    spend_json,
    spend_of,
    tenant_day_scope,
    way_price,
)

BATCH_B = batch_scope("b")
DOLLAR = Cap(max_cost_usd=1.0)


def test_a_call_starts_while_settled_in_flight_and_the_others_spend_leave_room_for_its_estimate() -> None:
    ledger = SpendLedger()
    first = ledger.begin([(BATCH_B, DOLLAR)], Spend(0.4, 100))
    assert isinstance(first, Charge)
    ledger.heard("other", {BATCH_B: Spend(0.3, 50)})
    assert isinstance(ledger.begin([(BATCH_B, DOLLAR)], Spend(0.3, 10)), Charge)  # 0.4 + 0.3 + 0.3: at the cap
    refused = ledger.begin([(BATCH_B, DOLLAR)], Spend(0.01, 1))
    assert refused == Exhausted(BATCH_B, Spend(1.0, 160), DOLLAR)


def test_settling_replaces_the_estimate_with_what_the_call_cost() -> None:
    ledger = SpendLedger()
    charge = ledger.begin([(BATCH_B, DOLLAR)], Spend(0.9, 1000))
    assert isinstance(charge, Charge)
    assert isinstance(ledger.begin([(BATCH_B, DOLLAR)], Spend(0.2, 1)), Exhausted)
    ledger.settle(charge, Spend(0.25, 300))
    assert ledger.spent(BATCH_B) == Spend(0.25, 300) and ledger.own() == {BATCH_B: Spend(0.25, 300)}
    assert isinstance(ledger.begin([(BATCH_B, DOLLAR)], Spend(0.2, 1)), Charge)


def test_every_cap_that_applies_must_admit_the_call_and_the_first_that_does_not_is_named() -> None:
    ledger = SpendLedger()
    day = day_scope(0)
    tokens = Cap(max_tokens=500)
    assert isinstance(ledger.begin([(BATCH_B, tokens), (day, DOLLAR)], Spend(0.1, 400)), Charge)
    refused = ledger.begin([(day, DOLLAR), (BATCH_B, tokens)], Spend(0.1, 200))
    assert isinstance(refused, Exhausted) and refused.scope == BATCH_B
    assert ledger.spent(day) == Spend(0.1, 400)  # a refused call holds nothing


def test_a_gone_worker_s_spend_stays_counted_and_a_later_beat_replaces_an_earlier() -> None:
    ledger = SpendLedger()
    ledger.heard("w2", {BATCH_B: Spend(0.5, 10)})
    ledger.heard("w2", {BATCH_B: Spend(0.7, 20)})  # beats are cumulative: the latest is the worker's spend
    ledger.heard("w3", {})
    assert ledger.spent(BATCH_B) == Spend(0.7, 20)
    assert ledger.own() == {}  # the beat publishes this worker's own spend only


def test_days_are_utc_dates() -> None:
    assert day_scope(0) == Scope("day", "1970-01-01")
    assert day_scope(86_400_000 - 1).name == "1970-01-01" and day_scope(86_400_000).name == "1970-01-02"


def test_prices_are_per_million_tokens_and_a_model_without_one_counts_its_tokens_only() -> None:
    assert spend_of({"m": (1_000_000, 500_000)}, {"m": (0.15, 0.6)}) == Spend(0.45, 1_500_000)
    spent = spend_of({"priced": (2000, 1000), "unpriced": (10, 5)}, {"priced": (1.0, 2.0)})
    assert math.isclose(spent.cost_usd, 0.004) and spent.tokens == 3015
    assert spend_json(spent, Cap(5.0)) == {"cost_usd": 0.004, "tokens": 3015, "max_cost_usd": 5.0, "max_tokens": None}


def test_what_is_left_and_how_a_cap_reads() -> None:
    assert Cap(2.0, 100).left(Spend(0.5, 150)) == (1.5, 0.0)
    assert Cap(max_tokens=10).left(Spend(9.0, 4)) == (math.inf, 6.0)
    assert Cap(2.5, 200_000).describe() == "$2.5, 200,000 tokens" and Cap().describe() == "none"


# -- the bound, for any interleaving ----------------------------------------------------------------------------
E_MAX = 1.0  # the dearest call's estimate
operations = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["start", "start", "settle", "period"]),
                                st.floats(0.01, E_MAX), st.floats(0.0, 1.0)), max_size=400)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.floats(0.5, 30.0), st.integers(1, 4), operations)
def test_the_fleet_overshoots_a_cap_by_at_most_what_the_others_started_within_one_beat_lag(
        workers: int, cap_usd: float, per_period: int,
        steps: list[tuple[int, str, float, float]]) -> None:
    """n workers each start at most k calls per beat period and read the others' beats one period late (the beat
    written at the previous period's start): the fleet's spend, settled and in flight, never passes
    ``cap + (n - 1) * 2k * e``, since what a worker has not seen of another is the calls that one started in the
    current and the previous period. One worker alone never passes the cap."""
    cap = Cap(max_cost_usd=cap_usd)
    ledgers = [SpendLedger() for _ in range(workers)]
    in_flight: list[list[Charge]] = [[] for _ in range(workers)]
    settled = [0.0] * workers
    started = [0] * workers  # calls started this period
    beats: list[dict[Scope, Spend]] = [{} for _ in range(workers)]  # written at the start of this period
    bound = cap_usd + (workers - 1) * 2 * per_period * E_MAX
    for worker, operation, estimate, fraction in steps:
        worker %= workers
        if operation == "start" and started[worker] < per_period:
            charge = ledgers[worker].begin([(BATCH_B, cap)], Spend(estimate, 1))
            if isinstance(charge, Charge):
                in_flight[worker].append(charge)
                started[worker] += 1
        elif operation == "settle" and in_flight[worker]:
            charge = in_flight[worker].pop(0)
            cost = charge.estimate.cost_usd * fraction  # an estimate covers what the call costs
            ledgers[worker].settle(charge, Spend(cost, 1))
            settled[worker] += cost
        elif operation == "period":
            for reader in range(workers):  # the beats of the previous period arrive now
                for writer in range(workers):
                    if reader != writer:
                        ledgers[reader].heard(f"w{writer}", beats[writer])
            beats = [ledger.own() for ledger in ledgers]
            started = [0] * workers
        spent = sum(settled) + sum(charge.estimate.cost_usd for calls in in_flight for charge in calls)
        assert spent <= bound + 1e-9, (spent, bound)
        if workers == 1:
            assert spent <= cap_usd + 1e-9


def test_days_before_a_given_one_are_forgotten_by_this_worker_and_of_the_others() -> None:
    ledger = SpendLedger()
    old, yesterday = day_scope(0), day_scope(86_400_000)
    tenant_old, tenant_yesterday = tenant_day_scope("team-a", 0), tenant_day_scope("team-a", 86_400_000)
    for day in (old, yesterday, tenant_old, tenant_yesterday):
        assert isinstance(ledger.begin([(day, DOLLAR)], Spend(0.1, 1)), Charge)
    ledger.heard("w2", {old: Spend(0.2, 2), BATCH_B: Spend(0.3, 3), tenant_old: Spend(0.2, 2)})
    ledger.forget_days_before(yesterday)
    assert ledger.own() == {yesterday: Spend(0.1, 1), tenant_yesterday: Spend(0.1, 1)}
    assert ledger.spent(tenant_old) == Spend()
    assert ledger.spent(old) == Spend() and ledger.spent(BATCH_B) == Spend(0.3, 3)


def test_a_provider_batch_line_is_charged_half_the_price_and_a_call_the_full_price() -> None:
    assert way_price((0.15, 0.6), Way.PROVIDER_BATCH) == (0.075, 0.3)
    assert way_price((0.15, 0.6), Way.CALL) == (0.15, 0.6)
    prices = {"gpt-4o-mini": (0.15, 0.6), "gpt-4o": (2.5, 10.0)}
    usage = {"gpt-4o-mini": (3_000_000, 3_000_000), "gpt-4o": (1_000_000, 0), "unpriced": (5, 5)}
    assert spend_of(usage, prices).cost_usd == pytest.approx(2.25 + 2.5)  # every answer by a call
    # of gpt-4o-mini's, 2M/2M tokens came from provider batches' lines (half price), 1M/1M from calls
    spent = spend_of(usage, prices, batched={"gpt-4o-mini": (2_000_000, 2_000_000), "unpriced": (5, 5)})
    assert spent.cost_usd == pytest.approx(0.75 + 0.75 + 2.5) and spent.tokens == 7_000_010
