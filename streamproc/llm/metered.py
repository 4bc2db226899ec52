"""The bottom of the guard stack: the HTTP call, and the two counts it feeds that guard nothing by themselves.

A first attempt is counted for the batch's retry budget only here, once every guard above has let the call
go (a parked or refused call was not an attempt); and each answer's ``usage.prompt_tokens`` calibrates the
token estimate that the pre-check and the tokens/min pacing use.
"""

from __future__ import annotations

from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.outcome import Success
from streamproc.llm.client import Caller, CallResult


class MeteredCaller:
    """The :class:`Caller` as a layer: counts first attempts (when there is a budget), calibrates the estimator."""

    def __init__(self, caller: Caller, budget: RetryBudget | None, estimator: TokenEstimator) -> None:
        self._caller = caller
        self._budget = budget
        self._estimator = estimator

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult:
        if first and self._budget is not None:
            self._budget.on_first_attempt(request.batch_id or "")
        called = await self._caller.call(request, body)
        outcome = called.outcome
        if isinstance(outcome, Success) and outcome.prompt_tokens > 0:
            self._estimator.calibrate(self._estimator.raw(body), outcome.prompt_tokens)
        return called
