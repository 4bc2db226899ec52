"""The shares of a fleet's workers (design §5.8): the max-min split, the reserve, stale beats, newcomers.

Standard library and hypothesis only: this runs in the bare core virtualenv (scripts/check-core).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.fleet_share import (
    BEAT_S,
    IDLE,
    MAX_BEAT_MODELS,
    MIN_SHARE,
    Beat,
    FleetView,
    ModelDemand,
    Round,
    SentCounter,
    allocate,
    shares,
    starting_share,
    told_limits,
)
from streamproc.core.guards.rate_limits import RateLimiter, RateLimits

LIMIT = 3000.0
FIRST = Round(0, 0.0)  # the reader's group round, in tests that do not turn on it
EPSILON = 1e-9


def busy(waiting: float = 100.0, sent: float = 1000.0) -> ModelDemand:
    return ModelDemand(waiting_calls=waiting, sent_rpm=sent, limit_rpm=LIMIT)


def light(sent: float) -> ModelDemand:
    return ModelDemand(sent_rpm=sent, limit_rpm=LIMIT)




@st.composite
def demands(draw: st.DrawFn, rpm: float | None = 3000.0, tpm: float | None = 1e6) -> ModelDemand:
    """A worker's demand on a model of the account's limits ``rpm`` and ``tpm``, which it may or may not know;
    calls or tokens wait only at a limit it knows (its buckets pace to one)."""
    limit_rpm = draw(st.sampled_from([rpm, None]))
    limit_tpm = draw(st.sampled_from([tpm, None]))
    amount = st.one_of(st.just(0.0), st.floats(0.01, 1000))
    return ModelDemand(
        waiting_calls=draw(amount) if limit_rpm is not None else 0.0,
        waiting_tokens=draw(amount) * 1000 if limit_tpm is not None else 0.0,
        sent_rpm=draw(amount) * 10, sent_tpm=draw(amount) * 10_000, limit_rpm=limit_rpm, limit_tpm=limit_tpm)


@st.composite
def fleet_demands(draw: st.DrawFn, min_size: int = 1) -> list[ModelDemand]:
    """The demands of a fleet on one account's limits (the same for all of them, known to some)."""
    rpm = draw(st.one_of(st.none(), st.floats(1, 100_000)))
    tpm = draw(st.one_of(st.none(), st.floats(100, 1e8)))
    return draw(st.lists(demands(rpm, tpm), min_size=min_size, max_size=12))


fleets = fleet_demands()


def uses(demand: ModelDemand, share: float, limit: float, unit: str) -> float:
    """The fraction of the limit of ``unit`` (``rpm`` or ``tpm``) a worker sends at ``share``: at most all of it
    while calls wait, else what it sends."""
    if demand.waits:
        return share
    return min(share, (demand.sent_rpm if unit == "rpm" else demand.sent_tpm) / limit)


def lowest(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


# -- the split ----------------------------------------------------------------------------------------------
@given(fleets)
def test_the_split_gives_out_the_whole_limit_and_never_more(fleet: list[ModelDemand]) -> None:
    split = allocate(fleet)
    assert all(part >= 0 for part in split)
    assert math.fsum(split) == pytest.approx(1.0)
    assert math.fsum(split) <= 1.0 + EPSILON


@given(fleets, st.data())
def test_idle_workers_get_nothing_while_others_have_calls_waiting(fleet: list[ModelDemand],
                                                                  data: st.DataObject) -> None:
    fleet = [*fleet, busy()]
    idle_at = data.draw(st.lists(st.integers(0, len(fleet) - 2), unique=True))
    for index in idle_at:
        fleet[index] = ModelDemand(limit_rpm=fleet[index].limit_rpm)
    split = allocate(fleet)
    assert all(split[index] == 0.0 for index in idle_at)


@given(demands(), st.integers(1, 12))
def test_equal_demand_gets_equal_shares(demand: ModelDemand, workers: int) -> None:
    assert allocate([demand] * workers) == pytest.approx([1.0 / workers] * workers)


@given(fleets, st.randoms(use_true_random=False))
def test_the_split_does_not_depend_on_the_order_of_the_workers(fleet: list[ModelDemand], rng: object) -> None:
    order = list(range(len(fleet)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    split, shuffled = allocate(fleet), allocate([fleet[i] for i in order])
    assert [shuffled[order.index(i)] for i in range(len(fleet))] == pytest.approx(split)


@given(fleets, st.floats(0.01, 1000))
def test_more_waiting_never_gets_a_smaller_share(fleet: list[ModelDemand], more: float) -> None:
    before = allocate(fleet)[0]
    grown = ModelDemand(**{**fleet[0].__dict__, "waiting_calls": fleet[0].waiting_calls + more})
    assert allocate([grown, *fleet[1:]])[0] >= before - EPSILON


def wanted(demand: ModelDemand, rpm: float | None, tpm: float | None) -> float:
    """The design's want: what was sent and 10 % more, plus what waits sent within a second, as a fraction of
    the limit, in the unit it is shortest of (without a limit: all while active)."""
    fractions = [(sent * 1.1 + waiting * 60) / limit for sent, waiting, limit in
                 ((demand.sent_rpm, demand.waiting_calls, rpm), (demand.sent_tpm, demand.waiting_tokens, tpm))
                 if limit is not None]
    return max(fractions) if fractions else (1.0 if demand.active else 0.0)


@given(fleets)
def test_a_worker_wanting_less_than_an_equal_part_gets_what_it_wants(fleet: list[ModelDemand]) -> None:
    """Max-min fairness: each gets its want, or an equal part, whichever is less (at least)."""
    rpm, tpm = lowest([d.limit_rpm for d in fleet]), lowest([d.limit_tpm for d in fleet])
    split = allocate(fleet)
    for demand, part in zip(fleet, split, strict=True):
        assert part >= min(wanted(demand, rpm, tpm), 1.0 / len(fleet)) - EPSILON


def test_one_busy_worker_among_four_idle_ones_gets_the_whole_limit() -> None:
    assert allocate([IDLE, IDLE, busy(), IDLE, IDLE]) == [0.0, 0.0, 1.0, 0.0, 0.0]


def test_two_equally_busy_workers_get_half_each_beside_idle_ones() -> None:
    assert allocate([busy(), IDLE, busy(), IDLE]) == pytest.approx([0.5, 0.0, 0.5, 0.0])


def test_a_light_worker_gets_what_it_sends_and_some_room_and_the_busy_ones_the_rest() -> None:
    split = allocate([light(300), busy(), busy()])  # 300 of 3,000 RPM: a tenth, and 10 % room
    assert split == pytest.approx([0.11, 0.445, 0.445])


def test_a_fleet_with_nothing_waiting_splits_the_room_alike() -> None:
    assert allocate([light(300), IDLE, IDLE]) == pytest.approx([0.11 + 0.89 / 3, 0.89 / 3, 0.89 / 3])


def test_the_unit_a_worker_is_shortest_of_decides_its_want() -> None:
    tokens_heavy = ModelDemand(sent_rpm=30, sent_tpm=400_000, limit_rpm=3000, limit_tpm=1_000_000)
    split = allocate([tokens_heavy, busy()])  # wants 44 % of the tokens (1.1 % of the requests)
    assert split == pytest.approx([0.44, 0.56])


def test_without_a_known_limit_the_active_workers_split_it_alike() -> None:
    assert allocate([ModelDemand(sent_rpm=10), ModelDemand(waiting_calls=3), IDLE]) == pytest.approx([0.5, 0.5, 0.0])


def test_the_lowest_limit_any_worker_knows_counts() -> None:
    """A worker that learnt a lower limit (or was given one) makes the others' wants larger fractions."""
    low, high = ModelDemand(sent_rpm=600, limit_rpm=1200), ModelDemand(sent_rpm=600, limit_rpm=6000)
    assert allocate([low, high]) == pytest.approx([0.5, 0.5])  # each wants 55 % of 1,200


@given(fleets, st.data())
def test_a_worker_that_holds_its_part_keeps_an_equal_part_and_the_split_stays_within_the_limit(
        fleet: list[ModelDemand], data: st.DataObject) -> None:
    holding = data.draw(st.lists(st.booleans(), min_size=len(fleet), max_size=len(fleet)))
    split = allocate(fleet, holding)
    assert math.fsum(split) <= 1.0 + EPSILON
    assert all(part >= 1.0 / len(fleet) - EPSILON for part, holds, demand in zip(split, holding, fleet, strict=True)
               if holds and not demand.active)


def test_a_busy_worker_takes_an_idle_one_s_part_only_once_it_no_longer_holds_it() -> None:
    assert allocate([busy(), IDLE], [False, True]) == pytest.approx([0.5, 0.5])
    assert allocate([busy(), IDLE], [False, False]) == pytest.approx([1.0, 0.0])


def test_a_worker_with_a_few_calls_holds_no_more_than_they_ask() -> None:
    """A trickle of calls (retries at a batch's end) is what it says: the busy worker has the rest."""
    assert allocate([busy(), light(30)], [False, True]) == pytest.approx([0.989, 0.011])


# -- this worker's shares -----------------------------------------------------------------------------------
def test_a_worker_with_calls_waiting_paces_at_its_part() -> None:
    others = [Beat("b", {"m": busy()}), Beat("c", {})]
    assert shares({"m": busy()}, others).by_model == {"m": pytest.approx(0.5)}


def test_a_worker_without_calls_waiting_keeps_an_equal_part_in_reserve() -> None:
    """Idle for the split, but its limiter keeps 1/n: calls that come leave at an ordinary pace at once."""
    others = [Beat("b", {"m": busy()}), Beat("c", {"m": busy()}), Beat("d", {})]
    computed = shares({"m": IDLE, "n": light(30)}, others)
    # nobody waits for n: the room is split alike, and it keeps its 1 % and 10 % more besides
    assert computed.by_model == {"m": pytest.approx(0.25), "n": pytest.approx(0.011 + 0.989 / 4)}
    assert computed.default == pytest.approx(0.25)
    assert computed.workers == 4


def test_alone_a_worker_has_the_whole_limit_whatever_it_wants() -> None:
    assert shares({"m": IDLE, "n": busy()}, []).by_model == {"m": 1.0, "n": 1.0}


def test_a_beat_that_cannot_be_read_wants_everything() -> None:
    assert shares({"m": busy()}, [Beat("b", unreadable=True)]).by_model == {"m": pytest.approx(0.5)}


def limits_of(fleet: list[ModelDemand]) -> dict[str, float]:
    """The limits the fleet knows, per unit (a unit without one cannot be exceeded)."""
    limits = {"rpm": lowest([d.limit_rpm for d in fleet]), "tpm": lowest([d.limit_tpm for d in fleet])}
    return {unit: limit for unit, limit in limits.items() if limit is not None}


@given(fleets)
def test_in_a_view_every_worker_has_read_the_shares_in_use_sum_to_at_most_1(fleet: list[ModelDemand]) -> None:
    beats = [Beat(str(i), {"m": demand}) for i, demand in enumerate(fleet)]
    paced = [shares({"m": demand}, beats[:i] + beats[i + 1:]).by_model["m"] for i, demand in enumerate(fleet)]
    for unit, limit in limits_of(fleet).items():
        used = [uses(demand, share, limit, unit) for demand, share in zip(fleet, paced, strict=True)]
        assert math.fsum(used) <= 1.0 + MIN_SHARE * len(fleet) + 1e-6, unit  # a limiter's share is never 0


@given(fleet_demands(min_size=2))
def test_a_newcomer_overshoots_by_its_own_share_at_most_until_the_others_read_its_beat(
        every: list[ModelDemand]) -> None:
    """The others split the limit without it; it takes its part from their beats. Whatever it finds, the fleet
    sends at most the limits the others know and the newcomer's share; and that share is at most 1/(known + 1)
    while every other worker wants at least that much."""
    *fleet, newcomer = every
    beats = [Beat(str(i), {"m": demand}) for i, demand in enumerate(fleet)]
    paced = [shares({"m": demand}, beats[:i] + beats[i + 1:]).by_model["m"] for i, demand in enumerate(fleet)]
    mine = shares({"m": newcomer}, beats).by_model["m"]
    for unit, limit in limits_of(fleet).items():
        old = [uses(demand, share, limit, unit) for demand, share in zip(fleet, paced, strict=True)]
        assert math.fsum(old) + uses(newcomer, mine, limit, unit) <= 1.0 + mine + MIN_SHARE * len(fleet) + 1e-6
    rpm, tpm = limits_of(every).get("rpm"), limits_of(every).get("tpm")
    if all(wanted(demand, rpm, tpm) >= 1.0 / len(every) for demand in fleet):
        assert mine <= 1.0 / len(every) + EPSILON


@given(st.integers(0, 50))
def test_before_reading_any_beat_a_worker_starts_at_one_more_than_it_knows(known: int) -> None:
    assert starting_share(known) == pytest.approx(1.0 / (known + 1))


# -- the view ----------------------------------------------------------------------------------------------
def test_a_worker_not_heard_from_for_three_beats_is_gone() -> None:
    view = FleetView("me")
    view.heard(Beat("a", {"m": busy()}), at=0.0)
    view.heard(Beat("b", {"m": busy()}, every_s=5.0), at=0.0)
    view.heard(Beat("me", {"m": busy()}), at=0.0)  # its own beat, read back: it knows its demand better
    assert [beat.worker for beat in view.live(3 * BEAT_S)] == ["a", "b"]
    assert [beat.worker for beat in view.live(3 * BEAT_S + 0.01)] == ["b"]
    view.heard(Beat("a", {}), at=13.0)  # back: a new beat makes it live again
    assert [beat.worker for beat in view.live(15.0)] == ["b", "a"]
    assert [beat.worker for beat in view.live(15.01)] == ["a"]


def test_a_worker_holds_its_part_from_its_partitions_to_its_first_calls_and_three_beats_after_them() -> None:
    view = FleetView("me")
    view.heard(Beat("new", {}, paused=True), at=0.0)
    assert not view.holds("new", "m", 1.0, FIRST)  # joining its group: the rebalance lets every scheduled call leave
    view.heard(Beat("new", {}), at=2.0)
    assert view.holds("new", "m", 59.9, FIRST)  # its partitions, no calls yet
    view.heard(Beat("new", {}), at=58.0)
    assert not view.holds("new", "m", 60.0, FIRST)  # no calls within a minute: released
    view.heard(Beat("new", {"m": light(60)}), at=70.0)
    view.heard(Beat("new", {"m": IDLE}), at=71.0)
    assert view.holds("new", "m", 72.9, FIRST) and not view.holds("new", "m", 73.0, FIRST)  # three beats after
    assert not view.holds("new", "n", 73.0, FIRST)  # a minute since its first beat, still no calls for n
    assert not view.holds("never-heard", "m", 0.0, FIRST)
    view.gone("new")
    assert not view.holds("new", "m", 72.0, FIRST)


def test_a_worker_whose_rebalance_holds_its_records_holds_its_part_up_to_a_minute() -> None:
    """A rebalance stops every worker until the slowest has drained its calls, then all resume at once: the
    first back must not take the others' parts."""
    view = FleetView("me")
    view.heard(Beat("w", {"m": busy()}, generation=4), at=0.0)
    view.heard(Beat("w", {}, paused=True, generation=5), at=1.0)
    view.heard(Beat("w", {}, paused=True, generation=5), at=50.0)
    assert view.holds("w", "m", 50.0, Round(5, 1.0)) and not view.holds("w", "m", 60.0, Round(5, 1.0))
    view.heard(Beat("w", {}, generation=5), at=51.0)  # its partitions back, and nothing to do: idle
    assert not view.holds("w", "m", 51.0, Round(5, 1.0))


def test_a_worker_out_of_the_reader_s_round_holds_nothing() -> None:
    """Left out of the group (its session expired while it drained its calls): it comes back only through a
    rebalance, which lets the reader's scheduled calls leave first. Just after the reader got its round, the
    others' beats may not say theirs yet: for three beats they hold as if in it."""
    view = FleetView("me")
    view.heard(Beat("w", {"m": busy()}, generation=4), at=0.0)
    view.heard(Beat("w", {}, paused=True, generation=4), at=1.0)
    assert view.holds("w", "m", 2.0, Round(4, 0.0))
    assert view.holds("w", "m", 2.0, Round(5, 1.5))  # the reader got generation 5 half a second ago
    assert not view.holds("w", "m", 5.0, Round(5, 1.5))


def test_a_worker_with_partitions_and_no_calls_yet_keeps_its_part_from_the_busy_ones() -> None:
    view = FleetView("me")
    view.heard(Beat("starting", {}), at=0.0)
    computed = shares({"m": busy()}, view.live(1.0), lambda worker, model: view.holds(worker, model, 1.0, FIRST))
    assert computed.by_model == {"m": pytest.approx(0.5)}
    released = shares({"m": busy()}, view.live(1.0), lambda worker, model: False)
    assert released.by_model == {"m": pytest.approx(1.0)}


def test_a_tombstone_removes_a_worker_at_once() -> None:
    view = FleetView("me")
    view.heard(Beat("a", {"m": busy()}), at=0.0)
    view.gone("a")
    view.gone("never-seen")
    assert view.live(0.0) == []


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.floats(0, 30)), max_size=40), st.floats(0, 40))
def test_the_live_workers_are_exactly_those_heard_within_three_beats(heard: list[tuple[str, float]],
                                                                     now: float) -> None:
    view = FleetView("me")
    last: dict[str, float] = {}
    for worker, at in sorted(heard, key=lambda item: item[1]):
        view.heard(Beat(worker), at)
        last[worker] = at
    assert {beat.worker for beat in view.live(now)} == {w for w, at in last.items() if now - at <= 3 * BEAT_S}


# -- what a beat carries -------------------------------------------------------------------------------------
def test_a_beat_names_its_busiest_models_only() -> None:
    models = {f"m{i}": light(float(i)) for i in range(MAX_BEAT_MODELS + 10)}
    models["idle"] = IDLE
    busiest = Beat("a", models).busiest()
    assert len(busiest) == MAX_BEAT_MODELS
    assert "idle" not in busiest and "m0" not in busiest and f"m{MAX_BEAT_MODELS + 9}" in busiest


def test_what_was_sent_is_counted_per_minute_between_readings() -> None:
    counter = SentCounter(0.0)
    for _ in range(5):
        counter.sent("m", 100)
    counter.sent("n", -3)  # a negative estimate counts no tokens
    assert counter.per_minute(0.5) == {"m": (600.0, 60_000.0), "n": (120.0, 0.0)}
    assert counter.per_minute(1.5) == {}


def test_the_limits_told_to_any_worker_are_the_lowest_told_and_learnt_ones_are_not_passed_on() -> None:
    beats = [Beat("a", {"m": ModelDemand(limit_rpm=3000, limit_tpm=90_000, limit_told=True),
                        "learnt": ModelDemand(limit_rpm=700)}),
             Beat("b", {"m": ModelDemand(limit_rpm=2500, limit_told=True)})]
    assert told_limits(beats) == {"m": RateLimits(rpm=2500, tpm=90_000)}


def test_a_worker_paces_by_a_limit_the_fleet_was_told_until_its_own_are_known() -> None:
    limiter = RateLimiter(RateLimits(), share=0.5)
    limiter.adopt("m", RateLimits(rpm=3000), now=0.0)  # before its first call of m
    assert limiter.for_model("m", 0.0).limits == RateLimits(rpm=1500)  # its half of the account's
    assert limiter.told_by_model() == {"m": True}
    limiter.for_model("m", 1.0).observe({"x-ratelimit-limit-requests": "6000"}, 1.0)  # its own answers rule
    limiter.adopt("m", RateLimits(rpm=3000), now=2.0)
    assert limiter.for_model("m", 2.0).limits == RateLimits(rpm=3000)
    configured = RateLimiter(RateLimits(rpm=600), share=1.0)
    configured.adopt("m", RateLimits(rpm=3000), now=0.0)
    assert configured.for_model("m", 0.0).limits == RateLimits(rpm=600)  # a configured limit stays
