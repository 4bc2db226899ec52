"""The mock's decisions: for one request, which answer, which fault, which latency, and what to count.

No HTTP and no sleeping here: the engine turns (endpoint, body, a few headers, now) into an ``Outcome``
that the server renders, and records the call in the stats. The order of checks is the one a real
provider applies: key, outage, body, model, context window, rate limits, then the drawn or forced fault.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from streamproc.core.vocabulary import FailureLayer
from streamproc.mockllm import error_bodies as errors
from streamproc.mockllm import jsonfast
from streamproc.mockllm.content import Answer, AnswerRequest, compose
from streamproc.mockllm.content_key import fingerprint, raw_key, request_key
from streamproc.mockllm.error_bodies import ErrorReply
from streamproc.mockllm.injected_faults import FaultKind, ForcedFault, ForcedFaultError, draw, find_marker
from streamproc.mockllm.latency import FixedLatency, Latency
from streamproc.mockllm.limits import ServerLimiter, format_duration, retry_headers
from streamproc.mockllm.outage import OutageSwitch
from streamproc.mockllm.profiles import ModelSpec, Profile
from streamproc.mockllm.stats import CONFIG_LAYER, OK, Call, Stats
from streamproc.mockllm.token_count import chat_prompt_tokens, text_tokens
from streamproc.mockllm.validation import CHAT, InvalidRequest, ParsedRequest, parse_chat, parse_completion

FORCE_HEADER = "x-mock-fault"
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
NOMINAL_RPM = 3500  # what an injected 429 reports as its limit when the profile sets no RPM

# outcome names of the real checks (fault kinds use their own names)
UNAUTHORIZED = "unauthorized"
OUTAGE = "outage"
MALFORMED = "malformed_request"
MODEL_NOT_FOUND = "model_not_found"
CONTEXT_LENGTH = "context_length_exceeded"
RATE_LIMITED = "rate_limited"
BODY_TOO_LARGE = "body_too_large"
INVALID_REQUEST_ID = "invalid_request_id"


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class Completed:
    """A 200 answer; ``transport`` says how the server spoils its delivery (None: delivered intact)."""

    parsed: ParsedRequest
    response_id: str
    answers: list[Answer]
    prompt_tokens: int
    completion_tokens: int
    transport: FaultKind | None
    latency: float
    headers: Mapping[str, str]  # rate-limit headers, when limits are set


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class Rejected:
    """An error status with its body."""

    reply: ErrorReply
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class Hang:
    """Answer nothing for ``seconds`` (inf: never), or until the client gives up or the server stops."""

    seconds: float


Outcome = Completed | Rejected | Hang


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class Incoming:
    """The parts of an HTTP request the engine looks at."""

    endpoint: str  # CHAT or COMPLETIONS
    body: bytes
    authorization: str | None = None
    forced_fault: str | None = None  # the x-mock-fault header
    request_id: str | None = None  # x-client-request-id (percent-decoded), else x-request-id
    request_id_header: str | None = None  # x-request-id as sent, for the strict_request_id check
    # a line of a provider batch: its create call was checked for the key, and a batch queue is neither
    # rate limited nor down with the synchronous API, so those checks are skipped
    in_batch: bool = False


class MockEngine:
    """Decides every answer of one server; the only mutable state is the stats, the buckets and the outage."""

    def __init__(
        self,
        profile: Profile,
        seed: int = 0,
        *,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.profile = profile
        self.seed = seed
        self.api_key = api_key
        self.clock = clock
        self.wall_clock = wall_clock
        self.started_at = clock()
        self.faults = profile.fault_table()
        self._faults_on = not self.faults.empty
        # per model: its latency and whether it is fixed (no draw needed when nothing is random)
        self._latency: dict[str, tuple[Latency, bool]] = {
            m.name: (m.latency or profile.latency, isinstance(m.latency or profile.latency, FixedLatency))
            for m in profile.models
        }
        self.models: dict[str, ModelSpec] = {m.name: m for m in profile.models}
        self.stats = Stats()
        self.limiter = ServerLimiter(profile.rate_limits, self.started_at)
        self.outage = OutageSwitch(profile.outage, self.started_at)
        self._expected_auth = f"Bearer {api_key}" if api_key is not None else None
        self._limit_headers_always = profile.limit_headers == "always"

    # ---- control --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every call (attempt numbers start again from 0) and refill the rate-limit buckets."""
        self.stats.reset()
        self.limiter = ServerLimiter(self.profile.rate_limits, self.clock())

    def snapshot(self, *, detail: bool = False) -> dict[str, Any]:
        now = self.clock()
        out = {
            "profile": self.profile.name,
            "seed": self.seed,
            "uptime_s": round(now - self.started_at, 3),
            **self.stats.snapshot(detail=detail),
            "outage": self.outage.describe(now),
        }
        return out

    # ---- deciding -------------------------------------------------------------------------------

    def decide(self, incoming: Incoming) -> Outcome:
        """The outcome of one chat/completions call, recorded in the stats."""
        body: Any = None
        try:
            body = jsonfast.loads(incoming.body.decode())  # UTF-8 only, as OpenAI; a bad byte is a ValueError
            key = request_key(body)
            parsed_json = True
        except (ValueError, RecursionError):
            key = raw_key(incoming.body)
            parsed_json = False
        call = self.stats.begin(incoming.endpoint, key, incoming.request_id)

        in_batch = incoming.in_batch
        if self.profile.strict_request_id and not _uuid_or_absent(incoming.request_id_header):
            return self._reject(call, errors.bare_bad_request(), INVALID_REQUEST_ID, CONFIG_LAYER)
        if not in_batch and (refused := self.key_refusal(incoming.authorization)) is not None:
            return self._reject(call, refused, UNAUTHORIZED, CONFIG_LAYER)
        now = self.clock()
        if not in_batch and self.outage.active(now):
            return self._reject(call, errors.outage(self.outage.remaining(now)), OUTAGE, FailureLayer.SERVICE)
        if not parsed_json:
            return self._reject(call, errors.unparsable_body(), MALFORMED, FailureLayer.BUSINESS)
        try:
            parsed = parse_chat(body) if incoming.endpoint == CHAT else parse_completion(body)
            forced = self._forced(incoming.forced_fault, parsed)
        except InvalidRequest as exc:
            return self._reject(call, exc.reply, MALFORMED, FailureLayer.BUSINESS)
        model = self.models.get(parsed.model)
        if model is None:
            return self._reject(call, errors.model_not_found(parsed.model), MODEL_NOT_FOUND, CONFIG_LAYER)

        prompt_tokens = self._prompt_tokens(parsed)
        reserve = parsed.max_tokens if parsed.max_tokens is not None else self.profile.default_max_tokens
        if prompt_tokens + reserve > model.context_window:
            reply = errors.context_length_exceeded(model.context_window, prompt_tokens, reserve)
            return self._reject(call, reply, CONTEXT_LENGTH, FailureLayer.BUSINESS)

        headers = _NO_HEADERS
        if self.limiter.active and not in_batch:
            admission = self.limiter.admit(prompt_tokens + reserve, now, headers=self._limit_headers_always)
            headers = admission.headers
            if not admission.admitted:
                unit = admission.limited_by or "requests"
                reply = errors.rate_limited(
                    parsed.model,
                    unit,
                    admission.limit,
                    admission.used,
                    1 if unit == "requests" else prompt_tokens + reserve,
                    format_duration(admission.retry_after),
                    {},
                )
                return self._reject(call, reply, RATE_LIMITED, FailureLayer.SERVICE, headers)

        latency_model, latency_is_fixed = self._latency[model.name]
        draws = draw(self.seed, key, call.attempt) if self._faults_on or not latency_is_fixed else None
        if forced is not None:
            fault = forced.on_attempt(call.attempt)
        elif draws is not None and self._faults_on:
            fault = self.faults.pick(draws, parsed.traits)
        else:
            fault = None
        latency = latency_model.sample(draws.latency if draws is not None else 0.0)

        if fault is not None:
            early = self._fault_reply(fault, parsed, now)
            if early is not None:
                return self._reject(call, early, fault.value, fault.layer or CONFIG_LAYER, headers)
            if fault is FaultKind.HANG:
                self.stats.finish(call, None, fault.value, fault.layer)
                return Hang(self.profile.hang_seconds)
        return self._complete(call, key, parsed, fault, prompt_tokens, latency, headers)

    def key_refusal(self, authorization: str | None) -> ErrorReply | None:
        """The 401 for a missing or wrong ``Authorization: Bearer`` key; None when it is right or none is set."""
        if self._expected_auth is None or authorization == self._expected_auth:
            return None
        if not authorization:
            return errors.missing_api_key()
        return errors.invalid_api_key(authorization.removeprefix("Bearer ").strip())

    def reject_oversized(self, incoming_endpoint: str, body_prefix: bytes, limit: int) -> Rejected:
        """A body over the size limit: 413, counted like any call (keyed by what was read of it)."""
        call = self.stats.begin(incoming_endpoint, raw_key(body_prefix), None)
        return self._reject(call, errors.body_too_large(limit), BODY_TOO_LARGE, FailureLayer.BUSINESS)

    def _reject(
        self,
        call: Call,
        reply: ErrorReply,
        outcome: str,
        layer: FailureLayer | str | None,
        headers: Mapping[str, str] = _NO_HEADERS,
    ) -> Rejected:
        """An error answer; it names the request key and attempt in headers (answers do in their id)."""
        self.stats.finish(call, reply.status, outcome, layer)
        mock = {"x-mock-request-key": call.key.hex(), "x-mock-attempt": str(call.attempt)}
        return Rejected(reply, {**mock, **headers, **reply.headers})

    def _forced(self, header: str | None, parsed: ParsedRequest) -> ForcedFault | None:
        spec = header
        if spec is None:
            for text in parsed.texts:
                spec = find_marker(text)
                if spec is not None:
                    break
        if spec is None:
            return None
        try:
            return ForcedFault.parse(spec)
        except ForcedFaultError as exc:
            raise InvalidRequest(errors.invalid_value(FORCE_HEADER, str(exc))) from None

    def _prompt_tokens(self, parsed: ParsedRequest) -> int:
        if parsed.endpoint == CHAT:
            return chat_prompt_tokens(parsed.texts, parsed.message_count, parsed.image_parts)
        return sum(text_tokens(t) for t in parsed.texts) + parsed.prompt_token_ids

    def _fault_reply(self, fault: FaultKind, parsed: ParsedRequest, now: float) -> ErrorReply | None:
        """The error answer of a business or service fault; None for faults that are not an error status."""
        if fault is FaultKind.INVALID_REQUEST:
            return errors.injected_invalid_request()
        if fault is FaultKind.CONTENT_POLICY:
            return errors.content_policy()
        if fault is FaultKind.INSUFFICIENT_QUOTA:
            return errors.insufficient_quota()
        if fault is FaultKind.RATE_LIMIT:
            wait = self.profile.retry_after_seconds
            if self.profile.injected_429 == "retry_after_only":
                return errors.busy(wait)
            bucket = self.limiter.requests
            limit = bucket.limit if bucket is not None else NOMINAL_RPM
            headers = {**self.limiter.headers(now), **retry_headers(wait)}
            return errors.rate_limited(parsed.model, "requests", limit, limit, 1, format_duration(wait), headers)
        return errors.SERVICE_FAULT_REPLIES.get(fault)

    def _complete(
        self,
        call: Call,
        key: bytes,
        parsed: ParsedRequest,
        fault: FaultKind | None,
        prompt_tokens: int,
        latency: float,
        headers: Mapping[str, str],
    ) -> Completed:
        fp = fingerprint(key)
        n = parsed.n
        prompts = parsed.prompts
        answers: list[Answer] = []
        for prompt_index, prompt in enumerate(prompts):
            request = AnswerRequest(key, fp, prompt, parsed.response_format, parsed.schema, parsed.max_tokens,
                                    self.profile.huge_answer_bytes)
            if n == 1:
                answers.append(compose(request, prompt_index, fault))
            else:
                answers += [compose(request, prompt_index * n + i, fault) for i in range(n)]
        completion_tokens = sum([text_tokens(a.content) for a in answers])
        if fault is None:
            self.stats.finish(call, 200, OK, None, prompt_tokens, completion_tokens)
            transport = None
        else:
            self.stats.finish(call, 200, fault.value, fault.layer, prompt_tokens, completion_tokens)
            transport = fault if fault.layer is FailureLayer.TRANSPORT else None
        prefix = "chatcmpl" if parsed.endpoint == CHAT else "cmpl"
        return Completed(
            parsed,
            f"{prefix}-mock{fp}x{call.attempt}",  # fingerprint and attempt, for tests to read
            answers,
            prompt_tokens,
            completion_tokens,
            transport,
            latency,
            headers,
        )

    def created(self) -> int:
        return int(self.wall_clock())


def _uuid_or_absent(value: str | None) -> bool:
    """What starlette-context's RequestIdPlugin lets through: no (or an empty) header, or any UUID spelling."""
    if not value:
        return True
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
