"""Export in OpenAI's batch output and error file formats, exactly one line per ``custom_id`` (design §6).

A line's ``id`` (``batch_req_…``) is derived from the batch and custom_id, so exporting twice gives the same
file and a request keeps its line id whichever file it lands in. Error lines follow OpenAI's error-file
shape (``response`` holds the HTTP error when there was one, ``error`` holds code and message) and add our
diagnosis under ``"streamproc"``, a key OpenAI does not use, so OpenAI readers ignore it and ours need no
second file.

The results topic may hold duplicates (redelivery, replays) and a request may fail terminally, be
backfilled and then succeed; :class:`ExportDeduper` settles each custom_id on one outcome. Request ids are
batch-scoped (:mod:`streamproc.core.identity`); the lines carry the user's custom_id, as OpenAI's do.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from streamproc.core.events import FailureEvent, InferenceResult
from streamproc.core.identity import custom_id_of


def _digest(batch_id: str | None, custom_id: str) -> str:
    # the newline keeps ("ab", "c") and ("a", "bc") apart; no batch id hashes as ""
    return hashlib.sha256(f"{batch_id or ''}\n{custom_id}".encode()).hexdigest()[:24]


def output_line(result: InferenceResult) -> dict[str, Any]:
    """One line of the output file, under the user's custom_id (the request id without its batch scope);
    ``request_id`` is the provider's response id when it has one."""
    custom_id = custom_id_of(result.request_id, result.batch_id)
    digest = _digest(result.batch_id, custom_id)
    body: Any
    try:
        body = json.loads(result.response_json)
    except ValueError:  # kept as received: the export must not fail on one odd record
        body = result.response_json
    provider_id = body.get("id") if isinstance(body, dict) else None
    return {
        "id": f"batch_req_{digest}",
        "custom_id": custom_id,
        "response": {
            "status_code": 200,
            "request_id": provider_id if isinstance(provider_id, str) and provider_id else f"req_{digest}",
            "body": body,
        },
        "error": None,
    }


class _Failure(NamedTuple):
    """What an error line needs of a failure: no request body, so holding many costs little."""

    batch_id: str | None
    layer: str
    error_code: str
    message: str
    attempts: int
    first_failure_ms: int
    last_failure_ms: int
    http_status: int | None

    @classmethod
    def of(cls, failure: FailureEvent) -> _Failure:
        # codes, layers and batch ids repeat across millions of failures: one copy of each
        batch_id = failure.request.batch_id
        return cls(None if batch_id is None else sys.intern(batch_id), failure.layer.value,
                   sys.intern(failure.error_code), failure.message, failure.attempt, failure.first_failure_ms,
                   failure.last_failure_ms, failure.http_status)


def error_line(failure: FailureEvent) -> dict[str, Any]:
    """One line of the error file for a terminal failure.

    ``response`` is set only when the provider answered with an error status; its body is rebuilt in
    OpenAI's error shape from our classification (the provider's own body is not kept on the failure).
    """
    return _error_line(_custom_id(failure), _Failure.of(failure))


def _custom_id(failure: FailureEvent) -> str:
    return custom_id_of(failure.request.request_id, failure.request.batch_id)


def _error_line(custom_id: str, failure: _Failure) -> dict[str, Any]:
    digest = _digest(failure.batch_id, custom_id)
    status = failure.http_status
    response = None
    if status is not None and status != 200:
        error_body = {
            "message": failure.message, "type": _error_type(status), "param": None, "code": failure.error_code
        }
        response = {"status_code": status, "request_id": f"req_{digest}", "body": {"error": error_body}}
    return {
        "id": f"batch_req_{digest}",
        "custom_id": custom_id,
        "response": response,
        "error": {"code": failure.error_code, "message": failure.message},
        "streamproc": {
            "layer": failure.layer,
            "error_code": failure.error_code,
            "attempts": failure.attempts,
            "first_failure_ms": failure.first_failure_ms,
            "last_failure_ms": failure.last_failure_ms,
            "batch_id": failure.batch_id,
        },
    }


def _error_type(status: int) -> str:
    """OpenAI's ``error.type`` family for a status (its 429s say ``requests``/``tokens``: too specific to guess)."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


@dataclass
class ExportCounts:
    """What the deduper wrote and dropped, for the export summary."""

    results: int = 0  # output lines handed out
    duplicate_results: int = 0  # later results for an id that already had one
    failures_after_success: int = 0  # terminal failures of ids that have a result (before or after it)
    superseded_failures: int = 0  # terminal failures replaced by a later one of the same id
    non_terminal: int = 0  # attempts that were retried: never an outcome


class ExportDeduper:
    """Settles each custom_id on exactly one line: a result beats any failure, the first result beats later
    duplicates, and among terminal failures the latest (``last_failure_ms``, then arrival) wins.

    Results are final as soon as they are seen, so :meth:`add_result` hands their line out at once and only
    the id is kept; a failure can still lose to a result read later, so failures are held (without their
    request body, which the error file does not carry) until :meth:`error_lines`. Feed the results and
    failure topics in any interleaving: the outcome is the same.
    """

    def __init__(self) -> None:
        self.counts = ExportCounts()
        self._answered: set[str] = set()
        self._failed: dict[str, _Failure] = {}

    def add_result(self, result: InferenceResult) -> dict[str, Any] | None:
        """The output line to write for ``result``, or None for a duplicate."""
        custom_id = custom_id_of(result.request_id, result.batch_id)
        if custom_id in self._answered:
            self.counts.duplicate_results += 1
            return None
        self._answered.add(custom_id)
        if self._failed.pop(custom_id, None) is not None:
            self.counts.failures_after_success += 1
        self.counts.results += 1
        return output_line(result)

    def add_failure(self, failure: FailureEvent) -> None:
        custom_id = _custom_id(failure)
        if not failure.terminal:
            self.counts.non_terminal += 1
        elif custom_id in self._answered:
            self.counts.failures_after_success += 1
        else:
            held = self._failed.get(custom_id)
            if held is not None:
                self.counts.superseded_failures += 1
                if held.last_failure_ms > failure.last_failure_ms:
                    return
            self._failed[custom_id] = _Failure.of(failure)

    def error_lines(self) -> Iterator[dict[str, Any]]:
        """The error lines of ids that never got a result, in order of their first failure; call last."""
        for custom_id, failure in self._failed.items():
            yield _error_line(custom_id, failure)
