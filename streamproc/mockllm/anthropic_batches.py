"""Anthropic's Message Batches API on the mock: create a batch of ``{custom_id, params}`` requests, watch it go
in_progress → (canceling →) ended, and stream its results (JSONL, one ``MessageBatchIndividualResponse`` per
request: succeeded, errored, canceled or expired).

Each request's Messages ``params`` run through the engine as the equivalent chat completion (system prompt
first, text blocks joined), and the answer comes back as an Anthropic Message; an error status becomes an
``errored`` result with Anthropic's error type for that status. The envelope is checked at create time
(Anthropic answers a bad batch with a 400), the params line by line.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

from aiohttp import web

from streamproc.mockllm.batch_lines import LineAnswerer
from streamproc.mockllm.batch_settings import BATCH_HEADER, BatchSettingsError, apply_batch_header
from streamproc.mockllm.batch_store import BatchLine, BatchStore, LineAnswer, ProviderBatch, new_id, page_size
from streamproc.mockllm.batch_timeline import CANCELLABLE, ENDED, Phase
from streamproc.mockllm.engine import MockEngine
from streamproc.mockllm.responses import encode
from streamproc.mockllm.validation import CHAT

BATCH_PREFIX = "msgbatch_"
WINDOW_SECONDS = 24 * 3600
CUSTOM_ID_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_STOP_REASONS: Final = {"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal"}
_ERROR_TYPES: Final = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                       403: "permission_error", 404: "not_found_error", 413: "invalid_request_error",
                       429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}
_PROCESSING_STATUS: Final = {Phase.CANCELLING: "canceling"}


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def _error(status: int, error_type: str, message: str) -> web.Response:
    return web.Response(status=status, body=encode(error_body(error_type, message)), content_type="application/json")


def _ok(body: Any) -> web.Response:
    return web.Response(status=200, body=encode(body), content_type="application/json")


def _rfc3339(unix: float | None) -> str | None:
    if unix is None:
        return None
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


class AnthropicBatches:
    """The handlers of ``/v1/messages/batches`` over one engine and one store."""

    def __init__(self, engine: MockEngine, store: BatchStore) -> None:
        self.engine = engine
        self.store = store
        self.answer = LineAnswerer(engine, CHAT)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages/batches", self.create)
        app.router.add_get("/v1/messages/batches", self.list)
        app.router.add_get("/v1/messages/batches/{id}", self.retrieve)
        app.router.add_get("/v1/messages/batches/{id}/results", self.results)
        app.router.add_post("/v1/messages/batches/{id}/cancel", self.cancel)

    def _refused(self, request: web.Request) -> web.Response | None:
        """The mock's ``--api-key``, sent in ``x-api-key`` or (as the 2.x SDK does) as a bearer token."""
        key = request.headers.get("x-api-key")
        authorization = f"Bearer {key}" if key else request.headers.get("Authorization")
        if self.engine.key_refusal(authorization) is None:
            return None
        return _error(401, "authentication_error",
                      "invalid x-api-key" if authorization else "x-api-key header is required")

    async def create(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            settings = apply_batch_header(self.engine.profile.batches, request.headers.get(BATCH_HEADER))
        except BatchSettingsError as exc:
            return _error(400, "invalid_request_error", str(exc))
        limit = settings.anthropic_max_bytes
        if request.content_length is not None and request.content_length > limit:
            return _error(413, "request_too_large", f"Request exceeds the maximum size of {limit} bytes.")
        raw = await _read_at_most(request, limit)
        if raw is None:
            return _error(413, "request_too_large", f"Request exceeds the maximum size of {limit} bytes.")
        try:
            body = json_object(raw)
        except ValueError as exc:
            return _error(400, "invalid_request_error", str(exc))
        lines, problem = read_requests(body, settings.anthropic_max_requests)
        if problem is None and settings.fail_validation:
            problem = f"Validation failure forced by {BATCH_HEADER}: invalid."
        if problem is not None:
            return _error(400, "invalid_request_error", problem)
        batch = ProviderBatch(new_id(BATCH_PREFIX), settings, lines, self.engine.clock(), self.engine.wall_clock(),
                              {"root": f"{request.scheme}://{request.host}"})
        self.store.batches[batch.id] = batch
        return _ok(self.describe(batch))

    async def retrieve(self, request: web.Request) -> web.Response:
        batch = self._found(request)
        return batch if isinstance(batch, web.Response) else _ok(self.describe(batch))

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self._found(request)
        if isinstance(batch, web.Response):
            return batch
        now = self.engine.clock()
        if batch.catch_up(now, self.answer) in CANCELLABLE:
            batch.cancelled_at = batch.elapsed(now)
        elif batch.ended(now):
            return _error(400, "invalid_request_error", f"Message batch {batch.id} has already ended.")
        return _ok(self.describe(batch))

    async def results(self, request: web.Request) -> web.Response:
        batch = self._found(request)
        if isinstance(batch, web.Response):
            return batch
        phase = batch.catch_up(self.engine.clock(), self.answer)
        if phase not in ENDED:
            return _error(400, "invalid_request_error", f"Message batch {batch.id} is still processing; its "
                                                        "results are available once it has ended.")
        lines = [encode(_result(line.custom_id, answer)) for line, answer in batch.answered()]
        left = "expired" if phase is Phase.EXPIRED else "canceled"
        lines += [encode({"custom_id": line.custom_id, "result": {"type": left}}) for line in batch.unanswered()]
        return web.Response(status=200, body=b"\n".join(lines) + b"\n", content_type="application/binary")

    async def list(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        limit = page_size(request.query.get("limit"), 1000)
        if limit is None:
            return _error(400, "invalid_request_error", "limit: an integer between 1 and 1000 expected.")
        chosen, more = self.store.page(BATCH_PREFIX, request.query.get("after_id"), limit, newest_first=True)
        data = [self.describe(b) for b in chosen]
        return _ok({"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None})

    def _found(self, request: web.Request) -> ProviderBatch | web.Response:
        """The batch the path names, or the answer why not (a refused key, an unknown id)."""
        if (refused := self._refused(request)) is not None:
            return refused
        batch = self.store.batch(request.match_info["id"], BATCH_PREFIX)
        return batch if batch is not None else _error(404, "not_found_error",
                                                      f"Message batch {request.match_info['id']} not found.")

    def describe(self, batch: ProviderBatch) -> dict[str, Any]:
        """Anthropic's ``message_batch`` object as of now, answering the lines due."""
        now = self.engine.clock()
        phase = batch.catch_up(now, self.answer)
        ended = phase in ENDED
        succeeded = sum(1 for a in batch.answers if a.ok)
        errored = len(batch.answers) - succeeded
        left = len(batch.lines) - len(batch.answers)
        counts = {"processing": 0 if ended else left, "succeeded": succeeded, "errored": errored,
                  "canceled": left if phase is Phase.CANCELLED else 0,
                  "expired": left if phase is Phase.EXPIRED else 0}
        end = batch.reached(Phase.CANCELLED, now) or batch.reached(Phase.EXPIRED, now) or batch.reached(
            Phase.COMPLETED, now)
        cancelled_at = None if batch.cancelled_at is None else batch.created_wall + batch.cancelled_at
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended" if ended else _PROCESSING_STATUS.get(phase, "in_progress"),
            "request_counts": counts,
            "ended_at": _rfc3339(end),
            "created_at": _rfc3339(batch.created_wall),
            "expires_at": _rfc3339(batch.created_wall + WINDOW_SECONDS),
            "archived_at": None,
            "cancel_initiated_at": _rfc3339(cancelled_at),
            "results_url": f"{batch.details['root']}/v1/messages/batches/{batch.id}/results" if ended else None,
        }


async def _read_at_most(request: web.Request, limit: int) -> bytes | None:
    """The whole body, or None once it passes ``limit`` (read past the server's 32 MiB: a batch may be 256 MB)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 20):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    return body


def read_requests(body: dict[str, Any], max_requests: int) -> tuple[list[BatchLine], str | None]:
    """The batch's requests as engine lines, or the 400 message Anthropic would give the envelope."""
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        return [], "requests: a non-empty list of {custom_id, params} expected."
    if len(requests) > max_requests:
        return [], f"requests: {len(requests)} requests; a batch takes at most {max_requests}."
    lines: list[BatchLine] = []
    seen: set[str] = set()
    for index, item in enumerate(requests):
        where = f"requests.{index}"
        if not isinstance(item, dict) or not isinstance(item.get("params"), dict):
            return [], f"{where}: an object with custom_id and params expected."
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 64 or not set(custom_id) <= CUSTOM_ID_CHARS:
            return [], f"{where}.custom_id: 1 to 64 characters of letters, digits, '_' and '-' expected."
        if custom_id in seen:
            return [], f"{where}.custom_id: '{custom_id}' is used more than once in this batch."
        seen.add(custom_id)
        lines.append(BatchLine(custom_id, encode(chat_body(item["params"]))))
    return lines, None


def chat_body(params: dict[str, Any]) -> dict[str, Any]:
    """The chat completion a Messages request amounts to; what does not fit is passed on for the engine to refuse."""
    messages = params.get("messages")
    if isinstance(messages, list):
        messages = [_chat_message(m) for m in messages]
        system = params.get("system")
        if system is not None:
            messages.insert(0, {"role": "system", "content": _text(system)})
    body = {"model": params.get("model"), "messages": messages}
    if "max_tokens" in params:
        body["max_tokens"] = params["max_tokens"]
    return body


def _chat_message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    return {**message, "content": _text(message.get("content"))}


def _text(content: Any) -> Any:
    """A string, or Anthropic's list of content blocks with their text joined."""
    if isinstance(content, list):
        return "\n".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return content


def _result(custom_id: str, answer: LineAnswer) -> dict[str, Any]:
    if answer.ok:
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": _message(answer.body)}}
    error = answer.body.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    error_type = _ERROR_TYPES.get(answer.status, "api_error")
    body = {**error_body(error_type, str(message or f"HTTP {answer.status}")), "request_id": answer.request_id}
    return {"custom_id": custom_id, "result": {"type": "errored", "error": body}}


def _message(completion: dict[str, Any]) -> dict[str, Any]:
    choice = completion["choices"][0]
    usage = completion["usage"]
    return {
        "id": f"msg_{completion['id']}",
        "type": "message",
        "role": "assistant",
        "model": completion["model"],
        "content": [{"type": "text", "text": choice["message"]["content"], "citations": None}],
        "stop_reason": _STOP_REASONS.get(choice["finish_reason"], "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "service_tier": "batch"},
    }
