"""OpenAI's Files and Batch API on the mock: upload a JSONL file (purpose ``batch``), create a batch from it,
watch it go validating → in_progress → finalizing → completed (or failed, expired, cancelling → cancelled),
and download its output and error files, whose lines have OpenAI's ``BatchRequestOutput`` shape.

Validation runs at create time but, as OpenAI's, shows as a ``failed`` batch with ``errors`` once the
validating phase is over; only a request the API itself refuses (unknown file, wrong endpoint or window)
is an error answer. Each line is answered by the engine (``batch_lines``), so profiles and faults apply.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from aiohttp import BodyPartReader, web

from streamproc.mockllm import error_bodies as errors
from streamproc.mockllm.batch_lines import LineAnswerer
from streamproc.mockllm.batch_settings import BATCH_HEADER, BatchSettingsError
from streamproc.mockllm.batch_store import (
    BatchLine,
    BatchStore,
    LineAnswer,
    ProviderBatch,
    StoredFile,
    new_id,
    page_size,
)
from streamproc.mockllm.batch_timeline import CANCELLABLE, ENDED, Phase
from streamproc.mockllm.engine import MockEngine
from streamproc.mockllm.error_bodies import INVALID_REQUEST, ErrorReply, openai_error
from streamproc.mockllm.responses import encode
from streamproc.mockllm.validation import CHAT, COMPLETIONS

BATCH_PREFIX = "batch_"
ENDPOINTS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}
COMPLETION_WINDOW = "24h"
WINDOW_SECONDS = 24 * 3600
MAX_FILE_BYTES = 512 * 1024 * 1024  # OpenAI's limit on one uploaded file
MAX_ERRORS = 100  # validation errors reported per batch
PURPOSES = ("batch", "fine-tune", "assistants", "vision", "user_data", "evals")
EXPIRED_ERROR = {"code": "batch_expired",
                 "message": "This request could not be executed before the completion window expired."}
CANCELLED_ERROR = {"code": "batch_cancelled",
                   "message": "This request was not executed because the batch was cancelled."}


def _reply(reply: ErrorReply) -> web.Response:
    return web.Response(status=reply.status, body=encode(reply.body), content_type="application/json")


def _ok(body: Any) -> web.Response:
    return web.Response(status=200, body=encode(body), content_type="application/json")


def _not_found(message: str) -> web.Response:
    return _reply(openai_error(404, message, INVALID_REQUEST))


class OpenAIBatches:
    """The handlers of ``/v1/files`` and ``/v1/batches`` over one engine and one store."""

    def __init__(self, engine: MockEngine, store: BatchStore) -> None:
        self.engine = engine
        self.store = store
        self.answerers = {endpoint: LineAnswerer(engine, kind) for endpoint, kind in ENDPOINTS.items()}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/files", self.upload)
        app.router.add_get("/v1/files/{id}", self.get_file)
        app.router.add_get("/v1/files/{id}/content", self.file_content)
        app.router.add_delete("/v1/files/{id}", self.delete_file)
        app.router.add_post("/v1/batches", self.create)
        app.router.add_get("/v1/batches", self.list)
        app.router.add_get("/v1/batches/{id}", self.retrieve)
        app.router.add_post("/v1/batches/{id}/cancel", self.cancel)

    def _refused(self, request: web.Request) -> web.Response | None:
        refusal = self.engine.key_refusal(request.headers.get("Authorization"))
        return _reply(refusal) if refusal is not None else None

    # ---- files ----------------------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if not request.content_type.startswith("multipart/"):
            return _reply(errors.invalid_value("file", "A multipart/form-data upload with file and purpose expected."))
        try:
            purpose, filename, content = await _read_upload(request)
        except _UploadRefused as exc:
            return _reply(exc.reply)
        except ValueError as exc:  # aiohttp's word for a body that is not multipart (no or a wrong boundary, cut)
            return _reply(errors.invalid_value("file", f"The multipart body could not be read: {exc}."))
        if filename is None:
            return _reply(errors.missing_parameter("file"))
        if purpose is None:
            return _reply(errors.missing_parameter("purpose"))
        if purpose not in PURPOSES:
            return _reply(errors.invalid_value("purpose", f"'{purpose}' is not one of {', '.join(PURPOSES)}."))
        stored = self.store.add_file(filename, purpose, content, self.engine.created())
        return _ok(stored.describe())

    async def get_file(self, request: web.Request) -> web.Response:
        stored = self._file(request)
        return stored if isinstance(stored, web.Response) else _ok(stored.describe())

    async def file_content(self, request: web.Request) -> web.Response:
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        return web.Response(status=200, body=stored.content, content_type="application/octet-stream")

    def _file(self, request: web.Request) -> StoredFile | web.Response:
        """The file the path names, or the answer why not (a refused key, an unknown id)."""
        if (refused := self._refused(request)) is not None:
            return refused
        stored = self.store.files.get(request.match_info["id"])
        return stored if stored is not None else _not_found(f"No such File object: {request.match_info['id']}")

    async def delete_file(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        file_id = request.match_info["id"]
        if self.store.files.pop(file_id, None) is None:
            return _not_found(f"No such File object: {file_id}")
        return _ok({"id": file_id, "object": "file", "deleted": True})

    # ---- batches --------------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            body = await request.json()
        except ValueError:
            return _reply(errors.unparsable_body())
        if not isinstance(body, dict):
            return _reply(errors.invalid_type("body", "an object", body))
        for name in ("input_file_id", "endpoint", "completion_window"):
            if name not in body:
                return _reply(errors.missing_parameter(name))
            if not isinstance(body[name], str):
                return _reply(errors.invalid_type(name, "a string", body[name]))
        endpoint, window = body["endpoint"], body["completion_window"]
        if endpoint not in ENDPOINTS:
            return _reply(errors.invalid_value("endpoint", f"The mock runs batches of {', '.join(ENDPOINTS)}."))
        if window != COMPLETION_WINDOW:
            return _reply(errors.invalid_value("completion_window", "Only '24h' is supported."))
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            return _reply(errors.invalid_type("metadata", "an object", metadata))
        stored = self.store.files.get(body["input_file_id"])
        if stored is None:
            return _not_found(f"No such File object: {body['input_file_id']}")
        if stored.purpose != "batch":
            return _reply(errors.invalid_value("input_file_id", f"File {stored.id} has purpose '{stored.purpose}', "
                                                                "not 'batch'."))
        try:
            number = sum(1 for batch_id in self.store.batches if batch_id.startswith(BATCH_PREFIX)) + 1
            settings = self.engine.profile.batches.for_number(number, request.headers.get(BATCH_HEADER))
        except BatchSettingsError as exc:
            return _reply(errors.invalid_value(BATCH_HEADER, str(exc)))
        lines, problems, model = read_input(stored.content, endpoint, settings.openai_max_requests,
                                            settings.openai_max_bytes)
        if settings.fail_validation and not problems:
            problems.append(_problem("invalid_request", f"Validation failure forced by {BATCH_HEADER}: invalid."))
        if problems:
            settings = replace(settings, fail_validation=True)
            lines = []
        batch = ProviderBatch(
            new_id(BATCH_PREFIX),
            settings,
            lines,
            self.engine.clock(),
            self.engine.wall_clock(),
            {"endpoint": endpoint, "input_file_id": stored.id, "metadata": metadata, "model": model,
             "errors": problems[:MAX_ERRORS]},
        )
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
        phase = batch.catch_up(now, self.answerers[batch.details["endpoint"]])
        if phase not in CANCELLABLE:
            return _reply(openai_error(409, f"Cannot cancel a batch with status '{phase}'.", INVALID_REQUEST))
        batch.cancelled_at = batch.elapsed(now)
        return _ok(self.describe(batch))

    async def list(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        limit = page_size(request.query.get("limit"), 100)
        if limit is None:
            return _reply(errors.invalid_value("limit", "An integer between 1 and 100 expected."))
        chosen, more = self.store.page(BATCH_PREFIX, request.query.get("after"), limit, newest_first=True)
        data = [self.describe(b) for b in chosen]
        return _ok({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None, "has_more": more})

    def _found(self, request: web.Request) -> ProviderBatch | web.Response:
        """The batch the path names, or the answer why not (a refused key, an unknown id)."""
        if (refused := self._refused(request)) is not None:
            return refused
        batch = self.store.batch(request.match_info["id"], BATCH_PREFIX)
        return batch if batch is not None else _not_found(f"No batch found with id '{request.match_info['id']}'.")

    # ---- the batch object -----------------------------------------------------------------------

    def describe(self, batch: ProviderBatch) -> dict[str, Any]:
        """OpenAI's ``batch`` object as of now, answering the lines due and writing the files once it ends."""
        now = self.engine.clock()
        details = batch.details
        phase = batch.catch_up(now, self.answerers[details["endpoint"]])
        if phase in ENDED and "output_file_id" not in details:
            self._write_files(batch, phase)
        answered = list(batch.answers)
        unanswered = len(batch.lines) - len(answered) if phase in (Phase.EXPIRED, Phase.CANCELLED) else 0
        completed = sum(1 for a in answered if a.ok)
        created = int(batch.created_wall)
        problems = details["errors"]
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": details["endpoint"],
            "model": details["model"],
            "errors": {"object": "list", "data": problems} if problems and phase is Phase.FAILED else None,
            "input_file_id": details["input_file_id"],
            "completion_window": COMPLETION_WINDOW,
            "status": phase.value,
            "output_file_id": details.get("output_file_id"),
            "error_file_id": details.get("error_file_id"),
            "created_at": created,
            "in_progress_at": batch.reached(Phase.IN_PROGRESS, now),
            "expires_at": created + WINDOW_SECONDS,
            "finalizing_at": batch.reached(Phase.FINALIZING, now),
            "completed_at": batch.reached(Phase.COMPLETED, now),
            "failed_at": batch.reached(Phase.FAILED, now),
            "expired_at": batch.reached(Phase.EXPIRED, now),
            "cancelling_at": batch.reached(Phase.CANCELLING, now),
            "cancelled_at": batch.reached(Phase.CANCELLED, now),
            "request_counts": {"total": len(batch.lines), "completed": completed,
                               "failed": len(answered) - completed + unanswered},
            "usage": _usage(answered),
            "metadata": details["metadata"],
        }

    def _write_files(self, batch: ProviderBatch, phase: Phase) -> None:
        output: list[bytes] = []
        failed: list[bytes] = []
        for line, answer in batch.answered():
            (output if answer.ok else failed).append(encode(_output_line(line.custom_id, answer)))
        if phase in (Phase.EXPIRED, Phase.CANCELLED):
            error = EXPIRED_ERROR if phase is Phase.EXPIRED else CANCELLED_ERROR
            failed += [encode(_not_run_line(line.custom_id, error)) for line in batch.unanswered()]
        created = self.engine.created()
        for key, lines, name in (("output_file_id", output, "output"), ("error_file_id", failed, "error")):
            if lines:
                stored = self.store.add_file(f"{batch.id}_{name}.jsonl", "batch_output", b"\n".join(lines) + b"\n",
                                             created)
                batch.details[key] = stored.id
            else:
                batch.details[key] = None


class _UploadRefused(Exception):
    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(reply.status)
        self.reply = reply


async def _read_upload(request: web.Request) -> tuple[str | None, str | None, bytes]:
    """The ``purpose`` and the ``file`` (name, bytes) of a multipart upload, read in chunks up to 512 MB."""
    purpose: str | None = None
    filename, content = None, b""
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):  # a nested multipart: not what OpenAI takes
            raise _UploadRefused(errors.invalid_value("file", "Nested multipart bodies are not accepted."))
        if part.name == "purpose":
            purpose = (await part.text()).strip()
        elif part.name == "file":
            filename = part.filename or "upload.jsonl"
            chunks: list[bytes] = []
            size = 0
            while chunk := await part.read_chunk():
                size += len(chunk)
                if size > MAX_FILE_BYTES:
                    raise _UploadRefused(errors.body_too_large(MAX_FILE_BYTES))
                chunks.append(chunk)
            content = b"".join(chunks)
    return purpose, filename, content


def _output_line(custom_id: str, answer: LineAnswer) -> dict[str, Any]:
    return {"id": new_id("batch_req_"), "custom_id": custom_id,
            "response": {"status_code": answer.status, "request_id": answer.request_id, "body": answer.body},
            "error": None}


def _not_run_line(custom_id: str, error: dict[str, str]) -> dict[str, Any]:
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None, "error": error}


def _usage(answers: list[LineAnswer]) -> dict[str, Any]:
    prompt = completion = 0
    for answer in answers:
        usage = answer.body.get("usage") if answer.ok else None
        if isinstance(usage, dict):
            prompt += int(usage.get("prompt_tokens", 0))
            completion += int(usage.get("completion_tokens", 0))
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}


def _problem(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def read_input(content: bytes, endpoint: str, max_requests: int, max_bytes: int
               ) -> tuple[list[BatchLine], list[dict[str, Any]], str | None]:
    """The lines of an input file, the validation errors OpenAI would report for it, and its one model."""
    if len(content) > max_bytes:
        return [], [_problem("file_too_large", f"The input file is {len(content)} bytes; the limit is "
                                               f"{max_bytes} bytes.")], None
    lines: list[BatchLine] = []
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()
    model: str | None = None
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError:
            problems.append(_problem("invalid_json_line", "This line is not parseable as valid JSON.", number))
            continue
        if not isinstance(item, dict) or not isinstance(item.get("custom_id"), str) or not isinstance(
                item.get("body"), dict):
            problems.append(_problem("invalid_request", "Each line needs a string custom_id and an object body.",
                                     number, "custom_id"))
            continue
        if item.get("method") != "POST" or item.get("url") != endpoint:
            problems.append(_problem("invalid_url", f"The line's method and url must be POST {endpoint}, as the "
                                                    "batch's endpoint.", number, "url"))
            continue
        custom_id = item["custom_id"]
        if custom_id in seen:
            problems.append(_problem("duplicate_custom_id", f"The custom_id '{custom_id}' is used more than once "
                                                            "in this file.", number, "custom_id"))
            continue
        seen.add(custom_id)
        line_model = item["body"].get("model")
        if model is None and isinstance(line_model, str):
            model = line_model
        elif line_model != model:
            problems.append(_problem("mismatched_model", f"The model '{line_model}' differs from '{model}'; a batch "
                                                         "file takes one model.", number, "body.model"))
            continue
        lines.append(BatchLine(custom_id, encode(item["body"])))
    if not lines and not problems:
        problems.append(_problem("empty_file", "The input file has no requests."))
    if len(lines) > max_requests:
        problems.append(_problem("too_many_requests", f"The input file has {len(lines)} requests; the limit is "
                                                      f"{max_requests}."))
    return lines, problems, model
