"""A failure event names the deployment of the model list its call was made to (design §5.10), as a result names
the one that answered: the handler with real guards over a model list of two deployments of one model."""

from __future__ import annotations

import random
from dataclasses import dataclass

from streamproc.app.handler import Handler, HandlerOptions
from streamproc.core.decision import Retries
from streamproc.core.model_list import parse_model_list
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.guarded import Guards
from streamproc.settings import BreakerSettings
from tests.unit.app.test_handler import (
    BODY,
    CONTEXT_TOO_LONG,
    READ_TIMEOUT,
    SEED,
    UNAVAILABLE,
    Rig,
    answer,
    make_request,
    only_failure,
    submission,
)
from tests.unit.app.test_handler_guards import GuardedRig, MonotonicClock

MODEL = BODY["model"]
MODELS = parse_model_list({"model_list": [
    {"model_name": MODEL, "litellm_params": {"model": "openai/east", "api_base": "http://127.0.0.1:1/v1"}},
    {"model_name": MODEL, "litellm_params": {"model": "openai/west", "api_base": "http://127.0.0.1:2/v1"}},
]})


@dataclass
class ListedRig(Rig):
    """The handler rig of test_handler, with real guards routing over :data:`MODELS` in front of the scripted
    caller, which sees each deployment's key as the body's model."""

    def __post_init__(self) -> None:
        super().__post_init__()
        clock = MonotonicClock()
        breakers = BreakerSettings(failure_rate=0.5, window_s=10, min_calls=3, open_s=5, hold_s=0)
        self.guards = Guards(self.caller, models=MODELS, breakers=breakers, clock=clock, sleep=clock.sleep,
                             wait=clock.wait)
        self.handler = Handler(self.guards, self.sink, self.store, Retries(self.policy, random.Random(SEED)),
                               self.problems.append, HandlerOptions(clock_ms=self.clock))

    def called(self) -> list[str]:
        """The deployment keys called, in order."""
        return [body["model"] for _, body in self.caller.calls]


async def test_a_call_that_failed_on_every_deployment_names_the_last_one_it_failed_on() -> None:
    """A 503 goes on to the other deployment within the attempt; the attempt's failure is the last answer."""
    rig = ListedRig([UNAVAILABLE, UNAVAILABLE])

    await rig.handle(submission(make_request()))

    event, _ = only_failure(rig)
    assert sorted(rig.called()) == [f"{MODEL}@1", f"{MODEL}@2"]
    assert (event.http_status, event.terminal, event.deployment) == (503, False, rig.called()[-1])


async def test_a_business_failure_names_the_deployment_that_answered_it() -> None:
    rig = ListedRig([CONTEXT_TOO_LONG])

    await rig.handle(submission(make_request()))

    event, _ = only_failure(rig)
    [called] = rig.called()
    assert (event.layer, event.terminal, event.deployment) == (FailureLayer.BUSINESS, True, called)


async def test_a_call_without_an_http_answer_names_its_deployment_too() -> None:
    rig = ListedRig([READ_TIMEOUT, READ_TIMEOUT])

    await rig.handle(submission(make_request()))

    event, _ = only_failure(rig)
    assert (event.error_code, event.response_body, event.deployment) == ("read_timeout", None, rig.called()[-1])


async def test_the_answer_after_a_failed_deployment_is_a_result_naming_the_other() -> None:
    rig = ListedRig([UNAVAILABLE, answer("ham")])

    await rig.handle(submission(make_request()))

    [result] = rig.sink.results
    assert rig.sink.failures == [] and result.deployment == rig.called()[-1] != rig.called()[0]


async def test_no_model_list_and_no_call_name_no_deployment() -> None:
    single = GuardedRig([UNAVAILABLE])
    await single.handle(submission(make_request()))
    assert only_failure(single)[0].deployment is None  # the single endpoint's deployment has no name

    refused = ListedRig([])
    await refused.handle(submission(make_request(body={**BODY, "model": "not-listed"})))
    assert only_failure(refused)[0].deployment is None  # model_not_listed: refused before any call
