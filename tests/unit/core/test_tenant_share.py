"""The tenants' shares of a worker's hand and gate (core/tenant_share.py)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.tenancy import PRIORITIES
from streamproc.core.tenant_share import (
    BoundedYield,
    Contender,
    FairChoice,
    Lane,
    TenantWeights,
    hand_quota,
    lane_has_room,
    more_urgent,
    outranked,
    reading_yields,
)

_TENANTS = st.sampled_from(["a", "b", "c", "d"])


@given(_TENANTS, st.integers(1, 500))
def test_a_tenant_alone_gets_the_whole_hand(tenant: str, hand: int) -> None:
    assert hand_quota(tenant, {tenant: hand}, hand, TenantWeights()) == hand
    assert hand_quota(tenant, {}, hand, TenantWeights()) == hand


def test_quotas_follow_the_weights_of_the_tenants_holding_records() -> None:
    weights = TenantWeights({"a": 3.0})
    assert hand_quota("a", {"b": 5}, 320, weights) == 240
    assert hand_quota("b", {"a": 300}, 320, weights) == 80
    assert hand_quota("b", {"a": 300, "c": 0}, 320, weights) == 80  # a tenant holding nothing takes no part
    assert hand_quota("b", {"a": 10_000}, 1, weights) == 1  # never none: a small hand still reaches every tenant


@given(st.dictionaries(_TENANTS, st.integers(0, 300)), _TENANTS, st.integers(1, 400))
def test_quotas_never_exceed_the_hand_together(in_hand: dict[str, int], tenant: str, hand: int) -> None:
    holding = in_hand | {tenant: max(1, in_hand.get(tenant, 0))}  # the asker holds one once admitted
    active = [name for name, count in holding.items() if count > 0]
    quotas = [hand_quota(name, holding, hand, TenantWeights()) for name in active]
    assert sum(quotas) <= max(hand, len(active))


_LANES = st.tuples(_TENANTS, st.sampled_from(PRIORITIES))


@given(_LANES, st.integers(1, 400), st.integers(0, 400))
def test_a_lane_alone_gets_the_whole_budget(lane: Lane, budget: int, holds: int) -> None:
    assert lane_has_room(lane, {lane: holds}, budget, TenantWeights()) == (holds < budget)


def test_a_more_urgent_lane_does_not_count_the_less_urgent_ones_of_its_tenant() -> None:
    flood = {("a", "low"): 8}
    assert lane_has_room(("a", "high"), flood, 8, TenantWeights())
    assert lane_has_room(("a", "normal"), flood, 8, TenantWeights())
    assert not lane_has_room(("a", "low"), flood | {("a", "high"): 1}, 8, TenantWeights())  # low yields
    assert not lane_has_room(("a", "high"), {("a", "high"): 8}, 8, TenantWeights())
    # another tenant's shares are by tenant, whatever the priorities: b's high records do not grow b's part
    assert not lane_has_room(("b", "high"), {("a", "low"): 1, ("b", "high"): 4}, 8, TenantWeights())
    assert lane_has_room(("a", "low"), {("a", "low"): 3, ("b", "high"): 4}, 8, TenantWeights())


@given(st.dictionaries(_LANES, st.integers(0, 50)), _LANES, st.integers(1, 100))
def test_a_lane_with_room_keeps_it_when_less_urgent_records_are_added(counts: dict[Lane, int], lane: Lane,
                                                                         budget: int) -> None:
    less_urgent = [p for p in PRIORITIES if PRIORITIES.index(p) > PRIORITIES.index(lane[1])]
    if not less_urgent or not lane_has_room(lane, counts, budget, TenantWeights()):
        return
    grown = dict(counts)
    grown[(lane[0], less_urgent[-1])] = grown.get((lane[0], less_urgent[-1]), 0) + budget
    assert lane_has_room(lane, grown, budget, TenantWeights())


def test_a_lane_yields_to_its_tenants_more_urgent_records_waiting() -> None:
    assert outranked(("a", "low"), {("a", "high"): 1})
    assert not outranked(("a", "high"), {("a", "low"): 5})
    assert not outranked(("a", "low"), {("b", "high"): 5, ("a", "high"): 0})


def _starts(choice: FairChoice, waiting: list[Contender], rounds: int) -> Counter[str]:
    started: Counter[str] = Counter()
    for now in range(rounds):
        started[waiting[choice.pick(waiting, float(now))].tenant] += 1
    return started


@given(st.integers(1, 300))
def test_two_busy_equal_tenants_start_equally_within_one(rounds: int) -> None:
    choice = FairChoice(ageing_s=1e9)
    waiting = [Contender("a", "normal", 0.0)] * 5 + [Contender("b", "normal", 0.0)]  # a's flood comes first
    started = _starts(choice, waiting, rounds)
    assert abs(started["a"] - started["b"]) <= 1


@given(st.integers(1, 100))
def test_a_tenant_alone_gets_every_start(rounds: int) -> None:
    assert _starts(FairChoice(), [Contender("a", "low", 0.0)] * 3, rounds) == Counter({"a": rounds})


def test_weights_share_the_starts() -> None:
    choice = FairChoice(TenantWeights({"a": 3.0}), ageing_s=1e9)
    started = _starts(choice, [Contender("b", "normal", 0.0), Contender("a", "normal", 0.0)], 400)
    assert (started["a"], started["b"]) == (300, 100)


def test_an_idle_tenant_saves_no_credit() -> None:
    choice = FairChoice(ageing_s=1e9)
    _starts(choice, [Contender("a", "normal", 0.0)], 100)  # b was idle meanwhile
    started = _starts(choice, [Contender("a", "normal", 0.0), Contender("b", "normal", 0.0)], 10)
    assert abs(started["a"] - started["b"]) <= 1  # b does not get 100 starts in a row


def test_priorities_go_first_until_a_lower_one_has_aged() -> None:
    choice = FairChoice(ageing_s=30.0)
    waiting = [Contender("a", "low", 0.0), Contender("b", "high", 0.0), Contender("c", "normal", 0.0)]
    assert choice.pick(waiting, 1.0) == 1
    assert choice.pick(waiting, 2.0) == 1  # b again, though it started last: priority before fairness
    assert choice.pick(waiting[::2], 3.0) == 1  # without b: normal before low
    assert choice.pick(waiting, 30.0) == 0  # low waited 30 s: it goes before high


def test_a_lower_prioritys_reading_yields_only_while_every_slot_is_taken_and_a_more_urgent_record_is_there() -> None:
    assert reading_yields("low", {"high"}, slots_full=True)
    assert reading_yields("normal", {"high", "low"}, slots_full=True)
    assert reading_yields("low", {"normal"}, slots_full=True)
    assert not reading_yields("low", {"high"}, slots_full=False)  # a free slot: read on (work-conserving)
    assert not reading_yields("low", {"low"}, slots_full=True)  # its own priority holds nothing back
    assert not reading_yields("normal", {"normal", "low"}, slots_full=True)
    assert not reading_yields("high", set(PRIORITIES), slots_full=True)  # the most urgent never yields


def test_the_priorities_more_urgent_than_one_come_most_urgent_first() -> None:
    assert more_urgent("low") == ("high", "normal")
    assert more_urgent("normal") == ("high",)
    assert more_urgent("high") == ()


@given(st.sampled_from(PRIORITIES), st.sets(st.sampled_from(PRIORITIES)))
def test_reading_never_yields_with_a_free_slot(priority: str, present: set[str]) -> None:
    assert not reading_yields(priority, present, slots_full=False)


def test_a_yield_is_bounded_from_the_first_time_it_yielded() -> None:
    leaving = BoundedYield(5.0)
    assert leaving.since is None
    assert leaving.still(100.0) and leaving.since == 100.0
    assert leaving.still(104.9)
    assert not leaving.still(105.0)
    assert not leaving.still(200.0)  # once over, it stays over


def test_a_yield_that_never_began_has_its_whole_bound() -> None:
    assert BoundedYield(10.0).still(1e9)
