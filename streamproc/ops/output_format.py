"""Exactly one line per ``custom_id`` (design §6), in any of the export formats (:data:`FORMATS`).

A line's id (OpenAI's ``batch_req_…``) is derived from the batch and custom_id, so exporting twice gives the
same file and a request keeps its line id whichever file it lands in. What a format adds beyond the
provider's own shape goes under one key, ``"streamproc"``, which neither OpenAI nor Anthropic uses, so their
readers ignore it and ours need no second file.

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
from typing import Any, NamedTuple, Protocol

from streamproc.core.events import FailureEvent, InferenceResult
from streamproc.core.identity import custom_id_of
from streamproc.core.tenancy import DEFAULT_PRIORITY, DEFAULT_TENANT


def line_id(batch_id: str | None, custom_id: str) -> str:
    """``batch_req_`` and a hash of batch and custom_id: the same on every export."""
    # the newline keeps ("ab", "c") and ("a", "bc") apart; no batch id hashes as ""
    return "batch_req_" + hashlib.sha256(f"{batch_id or ''}\n{custom_id}".encode()).hexdigest()[:24]


def result_custom_id(result: InferenceResult) -> str:
    return custom_id_of(result.request_id, result.batch_id)


def result_marks(result: InferenceResult) -> dict[str, str]:
    """What a result's line carries under ``"streamproc"``, in every format: ``reused_from`` (answered from an
    earlier identical request, without a call: core.reuse) and ``deployment`` (the one of the model list that
    answered), each only when set; ``tenant`` and ``priority`` (core.tenancy) when not the default."""
    return {name: value for name, value in (("reused_from", result.reused_from), ("deployment", result.deployment))
            if value is not None} | tenancy_marks(result.tenant, result.priority)


def tenancy_marks(tenant: str, priority: str) -> dict[str, str]:
    """``tenant`` and ``priority`` for a line's ``"streamproc"`` object, each only when not the default (a line
    without them is the default tenant's, at normal priority)."""
    return {name: value for name, value, default in (("tenant", tenant, DEFAULT_TENANT),
                                                     ("priority", priority, DEFAULT_PRIORITY)) if value != default}


def failure_custom_id(failure: FailureEvent) -> str:
    return custom_id_of(failure.request.request_id, failure.request.batch_id)


class HeldFailure(NamedTuple):
    """What a failure line needs of a failure event: no request body, so holding many costs little (the
    provider's answer is kept: it is what the line reports)."""

    batch_id: str | None
    layer: str
    error_code: str
    message: str
    attempts: int
    first_failure_ms: int
    last_failure_ms: int
    http_status: int | None
    response_body: str | None
    provider_request_id: str | None
    deployment: str | None  # the deployment of the model list the failed call was made to
    tenant: str  # the request's (core.tenancy)
    priority: str

    @classmethod
    def of(cls, failure: FailureEvent) -> HeldFailure:
        # codes, layers and batch ids repeat across millions of failures: one copy of each
        batch_id = failure.request.batch_id
        return cls(None if batch_id is None else sys.intern(batch_id), failure.layer.value,
                   sys.intern(failure.error_code), failure.message, failure.attempt, failure.first_failure_ms,
                   failure.last_failure_ms, failure.http_status, failure.response_body, failure.provider_request_id,
                   failure.deployment, sys.intern(failure.request.tenant), sys.intern(failure.request.priority))

    def body_object(self) -> dict[str, Any] | None:
        """The provider's body when it is a JSON object (as every OpenAI-compatible answer is); else None."""
        if not self.response_body:
            return None
        try:
            body: Any = json.loads(self.response_body)
        except (ValueError, RecursionError):  # cut at the bound, an HTML error page, not JSON at all
            return None
        return body if isinstance(body, dict) else None

    def ours(self) -> dict[str, Any]:
        """Our diagnosis, the ``"streamproc"`` object of a failure line in every format; ``deployment`` only when the
        call went to one of a model list, as on a result's line."""
        ours = {"layer": self.layer, "error_code": self.error_code, "message": self.message,
                "attempts": self.attempts, "first_failure_ms": self.first_failure_ms,
                "last_failure_ms": self.last_failure_ms, "batch_id": self.batch_id}
        if self.deployment is not None:
            ours["deployment"] = self.deployment
        return ours | tenancy_marks(self.tenant, self.priority)


class LineFormat(Protocol):
    """An export format: the line of a result, and the line of a request that ended in a failure."""

    def output_line(self, result: InferenceResult) -> dict[str, Any]: ...
    def error_line(self, custom_id: str, failure: HeldFailure) -> dict[str, Any]: ...


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

    Results are final as soon as they are seen, so :meth:`add_result` settles them at once and only the id is
    kept; a failure can still lose to a result read later, so failures are held (without their request body,
    which no line carries) until :meth:`failures`. Feed the results and
    failure topics in any interleaving: the outcome is the same.
    """

    def __init__(self) -> None:
        self.counts = ExportCounts()
        self._answered: set[str] = set()
        self._failed: dict[str, HeldFailure] = {}

    def add_result(self, result: InferenceResult) -> bool:
        """True when ``result`` is its custom_id's outcome (write its line now); False for a duplicate."""
        custom_id = result_custom_id(result)
        if custom_id in self._answered:
            self.counts.duplicate_results += 1
            return False
        self._answered.add(custom_id)
        if self._failed.pop(custom_id, None) is not None:
            self.counts.failures_after_success += 1
        self.counts.results += 1
        return True

    def add_failure(self, failure: FailureEvent) -> None:
        custom_id = failure_custom_id(failure)
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
            self._failed[custom_id] = HeldFailure.of(failure)

    def failures(self) -> Iterator[tuple[str, HeldFailure]]:
        """The custom_ids that never got a result, with their outcome, in order of their first failure; call
        last."""
        yield from self._failed.items()
