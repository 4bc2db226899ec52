"""Systematic failures stop early, per model: a model whose first calls all fail the same way is paused.

A refused header, an unsupported parameter, a model the endpoint does not serve: the first calls of a model
fail with the same non-retryable answer (same status, code and message), and every later call would too.
Failing the batch one request at a time spends a call per request and buries the one cause under
thousands of failure records. So once the first ``threshold`` calls of a model end in that same failure,
the model is *paused*: its calls are parked (like those of an open breaker) while other models go on, and
one probe call per ``probe_interval_s`` checks whether it was fixed. A model that has answered even once
is never paused by this rule: later failures are the requests' own.

"First" is in the order the calls were sent, not answered: a refusal comes back at once while an answer
takes seconds, so with 16 calls in flight the first three to come back were refusals of one unsupported
parameter (a real llama.cpp server and ``json_schema``), and the model was paused although the calls sent
before them were being answered. A call that ends without an answer (refused before it went, cancelled)
is skipped.

Time is passed in; the caller logs, counts and parks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from streamproc.core.guards.bounded import MAX_MODELS, LruDict
from streamproc.core.guards.sent_order import SentOrder
from streamproc.core.outcome import ConfigurationProblem, Failure, Outcome, Success
from streamproc.core.vocabulary import FailureLayer

# Setup problems that concern one model, not the account: the rest of the batch can go on.
MODEL_SCOPED_PROBLEMS = frozenset({"model_not_found", "permission_denied"})

Signature = tuple[int | None, str, str]  # (HTTP status, code, message)


@dataclass(frozen=True)
class Pause:
    """Why a model is paused, since when, and when its next probe may go."""

    reason: str
    since: float
    probe_at: float


@dataclass
class _Model:
    proven: bool = False  # answered once: never paused by this rule
    first: Signature | None = None  # the failure its first calls all gave
    repeats: int = 0
    pause: Pause | None = None
    order: SentOrder[Signature] = field(default_factory=SentOrder)  # calls judged in the order sent


REQUEST_SCOPED = frozenset({"context_length_exceeded", "content_policy_violation", "refusal"})
"""Business failures about the request's own input: alike for alike inputs (a batch of equally long prompts
gets the same context-length message, a safety-tuned model the same refusal text), and proof that the model
read the request, like an answer."""


def answered(outcome: Outcome) -> bool:
    """Whether the model itself answered: a success, a semantic failure (a cut answer, JSON that does not fit:
    the model worked, the answer did not), or a request-scoped business failure."""
    if isinstance(outcome, Success):
        return True
    return isinstance(outcome, Failure) and (outcome.layer is FailureLayer.SEMANTIC or outcome.code in REQUEST_SCOPED)


def signature(outcome: Outcome) -> Signature | None:
    """What makes two failures "the same": non-retryable ones only (business, or a model-scoped problem)."""
    if isinstance(outcome, Failure) and outcome.layer is FailureLayer.BUSINESS:
        return outcome.http_status, outcome.code, outcome.message
    if isinstance(outcome, ConfigurationProblem) and outcome.code in MODEL_SCOPED_PROBLEMS:
        return outcome.http_status, outcome.code, outcome.message
    return None


class ModelPauses:
    """Per-model detection of systematic failures, and the pause with its probes."""

    def __init__(self, threshold: int = 3, probe_interval_s: float = 60.0,
                 on_change: Callable[[str, Pause | None], None] | None = None) -> None:
        if threshold < 1 or not probe_interval_s > 0:
            raise ValueError("need threshold >= 1 and probe_interval_s > 0")
        self._threshold = threshold
        self._probe_interval_s = probe_interval_s
        self._on_change = on_change
        # the least recently called models go past MAX_MODELS (a paused one among them is forgotten, unpaused)
        self._models: LruDict[str, _Model] = LruDict(MAX_MODELS)

    def paused(self) -> dict[str, Pause]:
        return {name: model.pause for name, model in self._models.items() if model.pause is not None}

    def retry_at(self, model: str, now: float) -> float:
        """When a call to ``model`` may go: now, or its next probe while paused."""
        pause = self._model(model).pause
        return now if pause is None else max(now, pause.probe_at)

    def may_call(self, model: str, now: float) -> bool:
        """Whether a call may go now; while paused, True once per probe interval (that call is the probe)."""
        state = self._model(model)
        if state.pause is None:
            return True
        if now < state.pause.probe_at:
            return False
        state.pause = Pause(state.pause.reason, state.pause.since, now + self._probe_interval_s)
        return True

    def begin(self, model: str) -> int:
        """The number of a call about to go to ``model``; pass it to :meth:`record` or :meth:`abandon`."""
        return self._model(model).order.begin()

    def abandon(self, model: str, call: int, now: float) -> None:
        """Call number ``call`` ended without an answer: it neither counts nor holds the calls after it (whose
        failures may pause the model now)."""
        self._end(model, call, None, now)

    def record(self, model: str, outcome: Outcome, now: float, call: int) -> None:
        """Call number ``call`` (from :meth:`begin`) ended with ``outcome``."""
        state = self._model(model)
        if answered(outcome):
            state.proven = True
            if state.pause is not None:
                state.pause = None
                self._changed(model, None)
            return
        self._end(model, call, signature(outcome), now)

    def _end(self, model: str, call: int, failed_as: Signature | None, now: float) -> None:
        state = self._model(model)
        if state.proven or state.pause is not None:
            return
        for failed in state.order.end(call, failed_as):
            self._judge(model, state, failed, now)

    def _judge(self, model: str, state: _Model, failed_as: Signature | None, now: float) -> None:
        """The next call in the order sent failed (``failed_as``; None: retryable or no answer, which neither
        counts nor clears)."""
        if state.proven or failed_as is None or state.pause is not None:
            return
        if state.first is None:
            state.first = failed_as
        if failed_as != state.first:
            state.proven = True  # its first answers differ: not one systematic cause
            return
        state.repeats += 1
        if state.repeats >= self._threshold:
            status, code, message = failed_as
            state.pause = Pause(f"its first {state.repeats} calls all failed alike: "
                                f"{code} (HTTP {status}): {message}"[:1000], now, now + self._probe_interval_s)
            state.order.skip()
            self._changed(model, state.pause)

    def _model(self, model: str) -> _Model:
        state = self._models.get(model)
        if state is None:
            state = self._models[model] = _Model()
        return state

    def _changed(self, model: str, pause: Pause | None) -> None:
        if self._on_change is not None:
            self._on_change(model, pause)


