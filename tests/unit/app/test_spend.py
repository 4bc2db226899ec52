"""The handler with spend caps (design §5.9): a call that does not fit its batch's or the day's cap waits, parked
in the shortest tier without an attempt, and goes on once the cap is raised; a call's estimate is settled from the
usage its answer reports."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from streamproc.app.handler import Disposition, Handler, HandlerOptions
from streamproc.app.spend import SpendGate
from streamproc.codec.batch_cap import SPEND_CAP_HEADER, encode_cap
from streamproc.core import headers
from streamproc.core.decision import Retries
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.request_state import BUDGET_EXHAUSTED
from streamproc.core.spend_cap import Cap, Spend, batch_scope, day_scope, tenant_day_scope
from streamproc.core.vocabulary import RequestStatus
from tests.unit.app.test_handler import BODY, NOW, SEED, Rig, answer, make_request, next_hop, submission, text

PRICES = {"gpt-test": (1_000_000.0, 2_000_000.0)}  # a dollar a prompt token, two a completion token
ANSWERED_USD = 9 * 1 + 3 * 2  # the scripted answer's usage: 9 prompt and 3 completion tokens


@dataclass
class CappedRig(Rig):
    """The handler rig of test_handler with a spend gate: ``caps`` stands for the manifests topic."""

    day_cap: Cap | None = None
    tenant_caps: dict[str, Cap] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.caps: dict[str, Cap] = {}
        self.gate = SpendGate(self.caps.get, PRICES, TokenEstimator(), self.day_cap, tenant_caps=self.tenant_caps)
        self.handler = Handler(self.caller, self.sink, self.store, Retries(self.policy, random.Random(SEED)),
                               self.problems.append, HandlerOptions(clock_ms=self.clock, spend=self.gate))


def estimate_usd() -> float:
    estimator = TokenEstimator()
    return estimator.prompt_tokens(BODY) * 1.0 + estimator.max_tokens(BODY) * 2.0


async def test_a_call_past_its_batch_s_cap_waits_parked_and_goes_on_when_the_cap_is_raised() -> None:
    rig = CappedRig([answer("ok"), answer("ok")])
    rig.caps["batch-1"] = Cap(max_cost_usd=estimate_usd() + ANSWERED_USD - 1)  # the first call, not a second
    assert await rig.handle(submission(make_request("first"), offset=1)) is Disposition.ACK
    assert rig.gate.ledger.spent(batch_scope("batch-1")) == Spend(ANSWERED_USD, 12)  # settled from its usage

    held = make_request("held")
    assert await rig.handle(submission(held, offset=2)) is Disposition.ACK
    assert len(rig.caller.calls) == 1  # not called
    parked = rig.sink.retries[-1]
    assert (parked.tier.name, text(parked.headers, headers.ERROR_CODE)) == ("5s", BUDGET_EXHAUSTED)
    assert text(parked.headers, headers.ATTEMPT) == "1" and text(parked.headers, headers.DEFERRED) == "1"
    assert not rig.sink.failures  # waiting is no failure
    state = rig.state("held")
    assert (state.status, state.attempts, state.last_error_code) == (RequestStatus.RETRYING, 1, BUDGET_EXHAUSTED)
    assert rig.gate.held == {"batch": 1}

    assert await rig.handle(next_hop(parked, offset=1)) is Disposition.ACK  # back before a raise: it waits again
    assert len(rig.caller.calls) == 1 and rig.sink.retries[-1].request == held

    rig.caps["batch-1"] = Cap(max_cost_usd=1000.0)  # raise-cap
    assert await rig.handle(next_hop(rig.sink.retries[-1], offset=2)) is Disposition.ACK
    assert len(rig.caller.calls) == 2 and rig.state("held").status is RequestStatus.SUCCEEDED


async def test_the_cap_a_request_was_submitted_with_holds_until_its_record_is_read() -> None:
    rig = CappedRig([answer("ok")])
    capped = {SPEND_CAP_HEADER: encode_cap(Cap(max_tokens=1))}
    assert await rig.handle(submission(make_request("a"), offset=1, hdrs=capped)) is Disposition.ACK
    assert not rig.caller.calls and rig.state("a").last_error_code == BUDGET_EXHAUSTED
    assert await rig.handle(submission(make_request("b"), offset=2)) is Disposition.ACK  # known for its batch now
    assert not rig.caller.calls


async def test_an_uncapped_batch_is_called_and_charged_nothing() -> None:
    rig = CappedRig([answer("ok")])
    assert await rig.handle(submission(make_request("free"), offset=1)) is Disposition.ACK
    assert len(rig.caller.calls) == 1 and rig.gate.published() == {}


async def test_the_day_s_cap_holds_every_batch() -> None:
    rig = CappedRig([answer("ok")], day_cap=Cap(max_cost_usd=estimate_usd()))
    assert await rig.handle(submission(make_request("a"), offset=1)) is Disposition.ACK
    assert rig.gate.published() == {day_scope(NOW): Spend(ANSWERED_USD, 12)}
    assert await rig.handle(submission(make_request("b"), offset=2)) is Disposition.ACK
    assert len(rig.caller.calls) == 1 and rig.gate.held == {"day": 1}
    [(scope, (usd_left, tokens_left))] = rig.gate.left().items()
    assert scope == day_scope(NOW) and usd_left == estimate_usd() - ANSWERED_USD and tokens_left == float("inf")


async def test_a_tenant_s_daily_cap_holds_its_calls_only() -> None:
    rig = CappedRig([answer("ok"), answer("ok")], tenant_caps={"team-a": Cap(max_cost_usd=estimate_usd())})
    first, second = (replace(make_request(name), tenant="team-a") for name in ("a1", "a2"))
    assert await rig.handle(submission(first, offset=1)) is Disposition.ACK
    assert rig.gate.published() == {tenant_day_scope("team-a", NOW): Spend(ANSWERED_USD, 12)}
    assert await rig.handle(submission(second, offset=2)) is Disposition.ACK
    assert len(rig.caller.calls) == 1 and rig.gate.held == {"tenant_day": 1}
    assert text(rig.sink.retries[-1].headers, headers.ERROR_CODE) == BUDGET_EXHAUSTED  # it waits, parked
    assert await rig.handle(submission(make_request("b1"), offset=3)) is Disposition.ACK  # the default tenant's
    assert len(rig.caller.calls) == 2
