"""The tenants' shares of a worker's hand and gate (core/tenant_share.py)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.tenant_share import Contender, FairChoice, TenantWeights, hand_quota

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
