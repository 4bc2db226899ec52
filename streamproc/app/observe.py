"""What the handler tells an observer (metrics) about each record, without knowing who listens.

The handler calls these hooks after the corresponding record is on the broker; an observer must be cheap
and synchronous. :func:`guarded` makes a misbehaving observer harmless: the handler never raises, and a
failing metric must not turn a delivered result into an internal error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from streamproc.core.outcome import ConfigurationProblem, Outcome, Success
from streamproc.core.provider_batch_deadline import Way

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LlmCall:
    """One LLM call that came back (every attempt; a parked record made none)."""

    model: str  # the model it was sent to
    outcome: str  # "success", or the failure's layer ("transport", "service", ..., "configuration")
    latency_s: float
    input_tokens: int  # as the provider counted them (0 without an answer)
    output_tokens: int
    deployment: str = ""  # the deployment of the model list that answered ("" without a model list)
    way: Way = Way.CALL  # a call, or a provider batch's line (charged at the batch discount)


def outcome_label(outcome: Outcome) -> str:
    """A call's outcome as a label of few values: ``success``, the failure's layer, or ``configuration``."""
    if isinstance(outcome, Success):
        return "success"
    if isinstance(outcome, ConfigurationProblem):
        return "configuration"
    return outcome.layer.value


class Observer(Protocol):
    """Hooks called by :class:`streamproc.app.handler.Handler`; labels are plain strings."""

    def on_llm_call(self, call: LlmCall) -> None:
        """An LLM call came back, with any outcome."""

    def on_result(self) -> None:
        """A result is on the results topic."""

    def on_failure(self, layer: str, code: str, terminal: bool) -> None:
        """A failure event is on a failure topic (or, for ``unreadable_record``, a dead letter)."""

    def on_retry(self, tier: str) -> None:
        """A retry record is on the topic of ``tier``."""

    def on_skip(self, reason: str) -> None:
        """A record was acked without a call (a duplicate, see :class:`streamproc.core.request_state.SkipReason`)."""

    def on_deferred(self, tier: str) -> None:
        """A record was parked unanswered on the topic of ``tier``: its model's circuit breaker is open."""

    def on_ended(self, tenant: str, priority: str, outcome: str) -> None:
        """A request of ``tenant`` at ``priority`` ended: ``outcome`` is ``succeeded`` or ``failed`` (terminally)."""


class NullObserver:
    """The default: observes nothing."""

    def on_llm_call(self, call: LlmCall) -> None:
        pass

    def on_result(self) -> None:
        pass

    def on_failure(self, layer: str, code: str, terminal: bool) -> None:
        pass

    def on_retry(self, tier: str) -> None:
        pass

    def on_skip(self, reason: str) -> None:
        pass

    def on_deferred(self, tier: str) -> None:
        pass

    def on_ended(self, tenant: str, priority: str, outcome: str) -> None:
        pass


class _Guarded:
    """Forwards every hook to ``inner``, logging (not raising) whatever it raises."""

    def __init__(self, inner: Observer) -> None:
        self._inner = inner

    def on_llm_call(self, call: LlmCall) -> None:
        try:
            self._inner.on_llm_call(call)
        except Exception:
            log.exception("observer failed in on_llm_call")

    def on_result(self) -> None:
        try:
            self._inner.on_result()
        except Exception:
            log.exception("observer failed in on_result")

    def on_failure(self, layer: str, code: str, terminal: bool) -> None:
        try:
            self._inner.on_failure(layer, code, terminal)
        except Exception:
            log.exception("observer failed in on_failure")

    def on_retry(self, tier: str) -> None:
        try:
            self._inner.on_retry(tier)
        except Exception:
            log.exception("observer failed in on_retry")

    def on_skip(self, reason: str) -> None:
        try:
            self._inner.on_skip(reason)
        except Exception:
            log.exception("observer failed in on_skip")

    def on_deferred(self, tier: str) -> None:
        try:
            self._inner.on_deferred(tier)
        except Exception:
            log.exception("observer failed in on_deferred")

    def on_ended(self, tenant: str, priority: str, outcome: str) -> None:
        try:
            self._inner.on_ended(tenant, priority, outcome)
        except Exception:
            log.exception("observer failed in on_ended")


def guarded(observer: Observer | None) -> Observer:
    """``observer`` made safe to call from the handler (a no-op when None)."""
    if observer is None:
        return NullObserver()
    if type(observer) in (NullObserver, _Guarded):  # a subclass may override hooks: guard it
        return observer
    return _Guarded(observer)
