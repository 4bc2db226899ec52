"""What the handler tells an observer (metrics) about each record, without knowing who listens.

The handler calls these hooks after the corresponding record is on the broker; an observer must be cheap
and synchronous. :func:`guarded` makes a misbehaving observer harmless: the handler never raises, and a
failing metric must not turn a delivered result into an internal error.
"""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger(__name__)


class Observer(Protocol):
    """Hooks called by :class:`streamproc.app.handler.Handler`; labels are plain strings."""

    def on_started(self) -> None:
        """A record was admitted and its LLM call was made (every attempt counts)."""

    def on_llm_call(self, latency_s: float) -> None:
        """An LLM call came back (any outcome), after ``latency_s`` seconds."""

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


class NullObserver:
    """The default: observes nothing."""

    def on_started(self) -> None:
        pass

    def on_llm_call(self, latency_s: float) -> None:
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


class _Guarded:
    """Forwards every hook to ``inner``, logging (not raising) whatever it raises."""

    def __init__(self, inner: Observer) -> None:
        self._inner = inner

    def on_started(self) -> None:
        try:
            self._inner.on_started()
        except Exception:
            log.exception("observer failed in on_started")

    def on_llm_call(self, latency_s: float) -> None:
        try:
            self._inner.on_llm_call(latency_s)
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


def guarded(observer: Observer | None) -> Observer:
    """``observer`` made safe to call from the handler (a no-op when None)."""
    if observer is None:
        return NullObserver()
    if type(observer) in (NullObserver, _Guarded):  # a subclass may override hooks: guard it
        return observer
    return _Guarded(observer)
