"""One HTTP call to an OpenAI-compatible endpoint, turned into a classified outcome; it never raises.

The connections (:mod:`streamproc.llm.http_stacks`: aiohttp or httpx, ``STREAMPROC_LLM_HTTP``) are sized to
the in-flight limit in total, so a worker's concurrency is bounded in one place, and the read timeout stays
well below the consumer's rebalance timeout (design §5). The read timeout adapts per model
(:mod:`streamproc.core.guards.timeouts`): ``STREAMPROC_LLM_TIMEOUT_S`` is its ceiling, a few times the
model's p99 latency its value once known. A call slower than that p99 is hedged
(:mod:`streamproc.core.guards.hedging`): sent once more, the first answer wins; the pacing layer above says
whether its rate limiter has room for the copy (:data:`hedge_permit`).

A record's ``url`` only selects a row of the endpoint table (:mod:`streamproc.core.endpoints`); the call goes
to that row's URL, joined under the base URL once (:mod:`streamproc.llm.endpoint_url`). An answer whose decoded
body passes ``STREAMPROC_LLM_MAX_RESPONSE_BYTES`` is not read further: a 200 ends ``response_too_large``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from streamproc.core.endpoints import UNSUPPORTED_URL, Endpoint, UrlRefused, endpoint_for
from streamproc.core.events import InferenceRequest
from streamproc.core.guards.hedging import HedgeBudget, hedge_after_s
from streamproc.core.guards.long_requests import NO_POOL, LongRequests, timing_key
from streamproc.core.guards.own_queue import OwnQueue, Place
from streamproc.core.guards.timeouts import AdaptiveTimeout
from streamproc.core.outcome import Failure, Outcome, Success, truncate
from streamproc.core.record_size import RESPONSE_TOO_LARGE
from streamproc.core.redact import redact, redact_bytes
from streamproc.core.sendable_json import NotSendable, loads_sendable
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.api_key import check_llm_key
from streamproc.llm.endpoint_url import endpoint_urls
from streamproc.llm.http_stacks import Answer, http_stack
from streamproc.llm.repair import completion_budget, repair_messages
from streamproc.llm.schema_check import checked_completion
from streamproc.llm.transport_errors import classify_exception
from streamproc.settings import LLMEndpoint


@dataclass(frozen=True)
class CallResult:
    """The classified outcome and what came back (the raw body feeds results and repair requests, the headers
    the rate limiter)."""

    outcome: Outcome
    response_body: bytes
    latency_ms: int
    headers: Mapping[str, str] = field(default_factory=dict)
    model: str = ""  # the model the call was sent to (after the guards' routing): the metrics' label
    deployment: str = ""  # the deployment of the model list that answered (core.model_list); "" without a list


class Caller(Protocol):
    """Makes one LLM call; never raises."""

    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult: ...


class UnsupportedUrl(ValueError):
    """The request names a url outside the endpoint table: a business failure, and no call."""

    def __init__(self, request: InferenceRequest, refused: UrlRefused) -> None:
        super().__init__(str(refused))
        self.failure = unsupported_url(request, refused)


def unsupported_url(request: InferenceRequest, refused: UrlRefused) -> Failure:
    """The terminal business failure of a request whose url is refused (nothing was sent)."""
    return Failure(FailureLayer.BUSINESS, UNSUPPORTED_URL, truncate(
        f"request {request.request_id!r}: {refused}; not called"))


def request_body(request: InferenceRequest) -> dict[str, Any]:
    """The JSON body to send: the request's own, plus the repair turns on a repair attempt. :class:`UnsupportedUrl`
    when its url names no supported endpoint; ValueError when the body is not a JSON object that can be sent
    (NaN, Infinity or 1e400 in it: httpx refuses to write those; nested deeper than the parser follows)."""
    endpoint = endpoint_for(request.url)
    if isinstance(endpoint, UrlRefused):
        raise UnsupportedUrl(request, endpoint)
    try:
        body: Any = loads_sendable(request.body_json)
    except NotSendable as exc:
        raise ValueError(f"the request body is not JSON that can be sent: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("the request body is not a JSON object")
    return repair_messages(body, request.repair) if request.repair is not None else body


# OpenAI's header for a caller's own correlation id (ASCII, at most 512 characters). Not ``x-request-id``: servers
# set that one themselves, and some refuse a client's value that is not a UUID (llama-cpp-python's server
# answers such a call with an empty 400, so every request would end as a business failure).
CLIENT_REQUEST_ID = "x-client-request-id"
_MAX_CLIENT_REQUEST_ID = 512
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def correlation_headers(request: InferenceRequest) -> dict[str, str]:
    """The request id as ``x-client-request-id``, percent-encoded to printable ASCII (ids are any text)."""
    return {CLIENT_REQUEST_ID: quote(request.request_id, safe=_HEADER_SAFE)[:_MAX_CLIENT_REQUEST_ID]}


def answer_content(response_body: bytes) -> str:
    """``choices[0].message.content`` of a response, or '' (for repair prompts; never raises)."""
    try:
        content = json.loads(response_body)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


TIMEOUT_CHECK_S = 0.5  # how often a running call is held against its model's adaptive timeout

hedge_permit: ContextVar[Callable[[], bool] | None] = ContextVar("hedge_permit", default=None)
"""Set by the pacing layer (:mod:`streamproc.llm.paced`) around the calls it lets go: charges the model's rate
limiter for a hedge and says whether one may go (not while the model is paused). A context variable, so that
whatever wraps the client below the pace, a hedge goes through the same limiter as the call; unset (no
pacing), a hedge needs none."""


class LLMClient:
    """A client for ``{base_url}/chat/completions`` (and ``/completions``) with ``connections`` connections in
    all (the in-flight limit's ceiling) that hedges at most ``hedge_ratio`` of its calls; a given httpx
    transport (tests) replaces the network."""

    def __init__(self, endpoint: LLMEndpoint, *, connections: int, hedge_ratio: float,
                 transport: httpx.AsyncBaseTransport | None = None, long_requests: LongRequests = NO_POOL) -> None:
        if not endpoint.base_url:
            raise ValueError("STREAMPROC_LLM_BASE_URL is not set: the worker has no LLM endpoint to call")
        headers = {"user-agent": "streamproc"}
        key = check_llm_key(endpoint)
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        self._secrets = () if key is None else (key,)  # redacted from every failure's message and body
        self._urls = endpoint_urls(endpoint.base_url)  # a base URL the table cannot be joined under fails here
        self._http = http_stack(endpoint, connections, headers, transport)
        self._max_response_bytes = endpoint.max_response_bytes
        # per model and size class (long calls are timed against long calls); the setting is the ceiling
        self.timeouts = AdaptiveTimeout(endpoint.read_timeout_s)
        self._queue = OwnQueue()  # a call's timeout runs from when the calls sent before it are done
        self._long_requests = long_requests
        self._hedges = HedgeBudget(hedge_ratio)
        self.hedged = 0  # hedges sent (read by the metrics)

    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        """POST the body; every outcome, exceptions included, comes back classified. A url outside the endpoint
        table is refused here too, unsent, whatever called (the handler refuses it before the guards)."""
        model = body.get("model")
        model = model if isinstance(model, str) else ""
        endpoint = endpoint_for(request.url)
        if isinstance(endpoint, UrlRefused):
            return CallResult(unsupported_url(request, endpoint), b"", 0, model=model)
        url = self._urls[endpoint]
        budget = completion_budget(body)
        timed_as = timing_key(model, self._long_requests.is_long(body))
        read_timeout_s = self.timeouts.timeout_s(timed_as, budget)
        headers = correlation_headers(request)
        self._hedges.on_call()
        started = time.monotonic()
        place = self._queue.start(timed_as, started)
        # the socket's own read timeout is only a backstop: the watchdog in _first_answer cuts a hung call
        socket_timeout_s = read_timeout_s * (1 + place.ahead)
        try:
            answer, answered_after = await self._first_answer(
                lambda: self._http.post(url, body, headers, socket_timeout_s), place, budget, started)
        except BaseException as exc:
            self._queue.finish(place, time.monotonic(), answered=False)
            if not isinstance(exc, Exception):
                raise
            return CallResult(classify_exception(exc, self._secrets), b"", _ms_since(started), model=model)
        self._queue.finish(place, time.monotonic(), answered=True)
        latency = _ms_since(started)
        if answer.too_large and answer.status == 200:
            return CallResult(self._too_large(request, endpoint), answer.content, latency, answer.headers, model)
        if answer.status == 200:
            outcome = await checked_completion(answer.content, body)  # a schema: off the event loop
            if isinstance(outcome, Success):  # the latency of the copy that answered: a hedge's starts later
                self.timeouts.observe(timed_as, answered_after, budget)
                return CallResult(outcome, answer.content, latency, answer.headers, model)
            return self._redacted(CallResult(outcome, answer.content, latency, answer.headers, model))
        return self._redacted(CallResult(classify_http_error(answer.status, answer.headers, answer.content),
                                         answer.content, latency, answer.headers, model))

    def _redacted(self, result: CallResult) -> CallResult:
        """A failed call's message and body without credentials (core.redact): a provider may echo the key."""
        outcome = result.outcome
        if not isinstance(outcome, Success):
            outcome = replace(outcome, message=redact(outcome.message, self._secrets))
        return replace(result, outcome=outcome, response_body=redact_bytes(result.response_body, self._secrets))

    def _too_large(self, request: InferenceRequest, endpoint: Endpoint) -> Failure:
        """Business, as a 200 too large for a result record (core.record_size): the answer is paid for and the
        same request answers about as long again, so a retry costs as much for the same end."""
        return Failure(FailureLayer.BUSINESS, RESPONSE_TOO_LARGE, truncate(
            f"the answer to request {request.request_id!r} ({endpoint.url}) went past "
            f"STREAMPROC_LLM_MAX_RESPONSE_BYTES ({self._max_response_bytes:,} bytes decoded); not read further, "
            "not called again"), 200)

    async def _first_answer(self, post: Callable[[], Awaitable[Answer]], place: Place, budget: int | None,
                            started: float) -> tuple[Answer, float]:
        """The first answer of the call or of its hedge (core.guards.hedging); ReadTimeout once the call has run
        longer than the model's adaptive timeout *now*: a call that started while the timeout was still its
        ceiling (the model's first calls) is cut as soon as the answers of others teach a shorter one, so an
        early hang costs seconds, not the ceiling. The time counts from when the calls sent before it to
        the same model were done (core.guards.own_queue): a call waiting behind them is not hung while the
        server answers them. A copy that fails while the other runs is not the answer.
        Returns the answer and how long the copy that gave it took (seconds)."""
        model = place.model
        running = {asyncio.ensure_future(post()): started}  # each copy and when it was sent
        hedged = False
        try:
            while True:
                done, _ = await asyncio.wait(running, timeout=TIMEOUT_CHECK_S, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    sent = running.pop(task)
                    if task.exception() is None or not running:
                        return task.result(), time.monotonic() - sent
                now = time.monotonic()
                limit = self.timeouts.timeout_s(model, budget)
                if self._queue.overdue(place, limit, now):
                    behind = f" ({now - started:.1f} s after it was sent, behind {place.ahead})" if place.ahead else ""
                    raise httpx.ReadTimeout(f"no answer within the adaptive timeout of {limit:.1f} s{behind}")
                # a hedge goes by the time since the send: it loses nothing, and waiting for the front first
                # made hangs at a many-slot server cost about a second more (the strict benchmark's tail)
                after = hedge_after_s(self.timeouts.tail_s(model, budget))
                if not hedged and after is not None and now - started > after and self._may_hedge(place, now):
                    hedged = True
                    self.hedged += 1
                    running[asyncio.ensure_future(post())] = time.monotonic()
        finally:
            for task in running:
                task.cancel()
                task.add_done_callback(_consume)

    def _may_hedge(self, place: Place, now: float) -> bool:
        """Whether a hedge of the call at ``place`` goes now (core.guards.hedging): one is saved (or few calls are
        in flight), the calls sent before it were answered (else its answer is due after theirs, and a copy
        would wait behind them too), and the rate limiter lets it go (and charges it)."""
        in_flight = self._queue.in_flight(place.model)
        if not (self._hedges.available(in_flight) and self._queue.served_for_s(place, now) is not None):
            return False
        permit = hedge_permit.get()
        return (permit is None or permit()) and self._hedges.take(in_flight)

    async def aclose(self) -> None:
        await self._http.aclose()


def _consume(task: asyncio.Future[Answer]) -> None:
    """Retrieve a cancelled call's outcome, so asyncio does not report it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _ms_since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
