"""The pace: cut on congestion, quickly back to the last good pace, slowly above it; and the limiter's pace
against simulated servers (a limiter that announces its buckets, one that does not, noise 429s)."""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamproc.core.guards.pace import BACKOFF, COOLDOWN_S, DEEPER, MIN_PACE, RECOVERY_PER_S, Pace
from streamproc.core.guards.rate_limits import NO_LIMITS, ModelRateLimiter, RateLimits

BACK_S = math.log(1 / BACKOFF) / math.log(RECOVERY_PER_S)  # from one cut back to the pace before it


# -- the pace alone ------------------------------------------------------------------------------------------
def test_a_cut_climbs_back_to_the_pace_before_it_in_about_a_second() -> None:
    pace = Pace(now=0.0)
    assert pace.cut(10.0)
    assert pace.value == pytest.approx(BACKOFF)
    pace.step(10.5)
    assert BACKOFF < pace.value < 1.0
    pace.step(10.0 + BACK_S)
    assert pace.value == pytest.approx(1.0)
    assert BACK_S < 1.2


def test_one_cut_per_cooldown() -> None:
    pace = Pace(now=0.0)
    assert pace.cut(1.0)
    assert not pace.cut(1.0 + COOLDOWN_S / 2)
    assert pace.value == pytest.approx(BACKOFF)


def test_the_climb_starts_when_the_pause_ends() -> None:
    pace = Pace(now=0.0)
    pace.cut(0.0, resume_at=5.0)
    assert pace.step(4.0) is None and pace.value == pytest.approx(BACKOFF)
    pace.step(6.0)
    assert pace.value == pytest.approx(BACKOFF * RECOVERY_PER_S)


def test_above_the_good_pace_it_probes_one_percent_of_the_limit_a_second() -> None:
    pace = Pace(now=0.0)
    pace.cut(0.0)
    pace.cut(2.0)  # again within GOOD_FOR_S: the good pace was not good
    assert pace.good == pytest.approx(BACKOFF * 0.95)
    back = math.log(pace.good / pace.value) / math.log(RECOVERY_PER_S)
    pace.step(2.0 + back + 5.0)
    assert pace.value == pytest.approx(BACKOFF * 0.95 + 0.05)


def test_a_learnt_limit_grows_while_the_pace_probes_beyond_it() -> None:
    pace = Pace(now=0.0)
    assert pace.step(1.0) is None  # at the limit, nothing to do
    assert pace.step(10.0, beyond=True) == pytest.approx(1.1)  # 1 % a second, since it was made
    assert pace.value == 1.0


def test_the_pace_never_falls_below_its_floor() -> None:
    pace = Pace(now=0.0)
    for second in range(50):
        pace.cut(float(second))
    assert pace.value == MIN_PACE


def test_a_test_cut_is_undone_with_the_deeper_one() -> None:
    pace = Pace(now=0.0)
    pace.test(1.0, to=0.5)
    assert pace.value == pytest.approx(0.5)
    pace.test(1.1, deeper=True)  # no cooldown: a window of calls is a round trip
    assert pace.value == pytest.approx(0.5 * DEEPER)
    pace.undo()
    assert pace.value == 1.0 and pace.good == 1.0


def test_a_kept_test_cut_is_the_good_pace() -> None:
    pace = Pace(now=0.0)
    pace.test(1.0)
    pace.keep()
    assert pace.good == pytest.approx(BACKOFF)
    pace.undo()  # nothing left to undo
    assert pace.value == pytest.approx(BACKOFF)


# -- the limiter's pace against a simulated server -----------------------------------------------------------
@dataclass
class Server:
    """A server's requests bucket; refusals announce the empty bucket (``announces``) or name none, and
    ``noise`` of all calls are refused with a bare 429 whatever the rate."""

    rate: float
    capacity: float
    announces: bool = True
    noise: float = 0.0
    level: float = field(init=False)
    stamp: float = 0.0

    def __post_init__(self) -> None:
        self.level = self.capacity

    def answer(self, at: float, rng: random.Random) -> str:
        if rng.random() < self.noise:
            return "noise"
        self.level = min(self.capacity, self.level + (at - self.stamp) * self.rate)
        self.stamp = at
        if self.level >= 1:
            self.level -= 1
            return "ok"
        return "limiter" if self.announces else "noise"


@dataclass
class Run:
    outcomes: Counter[str]
    seconds: float
    paces: list[tuple[float, float]]  # (time, pace) after each send

    def share(self, outcome: str) -> float:
        return self.outcomes[outcome] / sum(self.outcomes.values())


def simulate(server: Server, calls: int, seed: int, *, limits: RateLimits = NO_LIMITS, in_flight: int = 64,
             latency_s: float = 0.5, jitter_s: float = 0.05) -> Run:
    """One client sending ``calls`` calls through the limiter, at most ``in_flight`` at once, each answered
    after a lognormal latency; each 429 fed back as the paced layer feeds it."""
    rng = random.Random(seed)
    limiter = ModelRateLimiter(limits, share=1.0, now=0.0)
    limit_header = {"x-ratelimit-limit-requests": f"{server.rate * 60:g}"}
    now = 0.0
    answers: list[tuple[float, float, str]] = []  # (answered at, sent at, outcome)
    outcomes: Counter[str] = Counter()
    paces = []
    for _ in range(calls):
        while answers and (answers[0][0] <= now or len(answers) >= in_flight):
            answered, sent, outcome = heapq.heappop(answers)
            now = max(now, answered)
            if outcome == "ok":
                limiter.on_answer(sent, answered)
            elif outcome == "noise":
                limiter.on_rate_limited({"retry-after": "1"}, 1.0, 1, answered, sent)
            else:
                limiter.observe(limit_header, answered)
                limiter.on_rate_limited({**limit_header, "x-ratelimit-remaining-requests": "0"}, 0.02, 1, answered,
                                        sent)
        now += limiter.reserve(1, now)
        outcome = server.answer(now + rng.uniform(0, jitter_s), rng)
        outcomes[outcome] += 1
        heapq.heappush(answers, (now + latency_s * rng.lognormvariate(0, 0.5), now, outcome))
        paces.append((now, limiter.pace))
    return Run(outcomes, now, paces)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), noise=st.floats(0.0, 0.02))
def test_a_constant_noise_share_of_up_to_two_percent_never_lowers_the_pace(seed: int, noise: float) -> None:
    """A limiter that announces its empty bucket, and the server's own 429s besides: the pace stays within
    one cut of the limit (cuts come from the limiter's own 429s only), and the calls take no longer than
    the limit allows plus its burst."""
    run = simulate(Server(rate=50, capacity=50, noise=noise), calls=3000, seed=seed)
    assert min(pace for _, pace in run.paces) >= BACKOFF * BACKOFF
    assert run.share("limiter") <= 0.01
    assert run.seconds <= (3000 - 50) / 50 * 1.02


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), noise=st.floats(0.0, 0.02))
def test_noise_on_a_server_without_limits_never_makes_a_limit(seed: int, noise: float) -> None:
    run = simulate(Server(rate=10_000, capacity=10_000, noise=noise), calls=3000, seed=seed)
    assert all(pace == 1.0 for _, pace in run.paces)
    assert run.seconds < 3000 / 64 * 0.5 * 1.5  # in-flight bound, not paced


def test_an_empty_bucket_lowers_the_pace_at_the_first_429() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=3000), share=1.0, now=0.0)
    assert limiter.on_rate_limited({"x-ratelimit-remaining-requests": "0"}, 0.02, 1, now=1.0, started=0.5).congestion
    assert limiter.pace == pytest.approx(BACKOFF)


def test_a_limiter_that_names_no_bucket_is_found_within_one_window_and_paced_near_its_rate() -> None:
    """No limit known, the server's refusals are bare 429s: within the first window of calls the share says
    congestion, the limit is learnt from the rate the server admitted, and the refusals stay a small share."""
    run = simulate(Server(rate=50, capacity=50, announces=False), calls=3000, seed=7)
    first_cut = next(at for at, pace in run.paces if pace < 1.0)
    assert first_cut < 2.0
    assert run.share("noise") < 0.10
    assert run.seconds <= 3000 / 50 * 1.15


def test_a_share_of_refusals_that_does_not_fall_with_the_pace_is_left_alone() -> None:
    """A server that refuses a fifth of the calls whatever the rate, with an announced limiter besides: the
    cuts the share asks for are undone, and the pace stays near the limit."""
    run = simulate(Server(rate=50, capacity=50, noise=0.2), calls=3000, seed=3)
    assert sum(pace for _, pace in run.paces) / len(run.paces) > 0.95
    assert run.seconds <= 3000 / 50 * 1.05


def test_recovery_reaches_the_last_good_pace_within_two_seconds_of_a_cut() -> None:
    """The good pace is the one before the cut, or 95 % of it when the cut came soon after another."""
    run = simulate(Server(rate=50, capacity=50, noise=0.01), calls=3000, seed=11)
    steps = list(zip(run.paces, run.paces[1:], strict=False))
    cuts = [(at, before) for (_, before), (at, pace) in steps if pace < before]
    assert cuts  # the first burst met the limiter
    for at, before in cuts:
        if any(at < later < at + 2.0 for later, _ in cuts):
            continue  # cut again before it was back
        after = [pace for when, pace in run.paces if when >= at + 2.0]
        assert not after or after[0] >= 0.95 * before
