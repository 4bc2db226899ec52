"""The outermost layer: an input the provider says is too long goes on to the model's larger-context fallback.

The pre-check routes what the token estimate already says is too long; this catches the rest, in the same
attempt. The fallback goes through the routing again (its own breaker and fallbacks), so this layer wraps
the routing and takes the model the routing actually called, a breaker fallback perhaps, from its answer.
"""

from __future__ import annotations

import logging
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.routing import CONTEXT_LENGTH_EXCEEDED, Routes
from streamproc.core.outcome import Failure
from streamproc.llm.client import CallResult
from streamproc.llm.layer import Layer
from streamproc.llm.routed import CountFallback, Deferred, Routed

log = logging.getLogger(__name__)


class ContextFallbackLayer:
    """On ``context_length_exceeded`` from a model that has a context fallback, calls that one instead."""

    def __init__(self, inner: Layer[Routed | Deferred], routes: Routes, count_fallback: CountFallback) -> None:
        self._inner = inner
        self._routes = routes
        self._count_fallback = count_fallback

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Deferred:
        routed = await self._inner.call(request, body, first)
        if isinstance(routed, Deferred):
            return routed
        fallback = self._fallback(routed)
        if fallback is None:
            return routed.result
        log.info("%s: %s says the input is too long; sending it to %s", request.request_id, routed.model, fallback)
        self._count_fallback(routed.model, fallback, "context_length")
        return await self.call(request, {**body, "model": fallback}, first=False)

    def _fallback(self, routed: Routed) -> str | None:
        outcome = routed.result.outcome
        if isinstance(outcome, Failure) and outcome.code == CONTEXT_LENGTH_EXCEEDED:
            larger = self._routes.context_fallback(routed.model)
            return larger if larger != routed.model else None
        return None
