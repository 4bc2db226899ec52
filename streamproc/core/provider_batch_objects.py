"""The providers' batch objects as small typed values (issue 31): OpenAI's ``batch`` and ``file`` objects and
Anthropic's ``message_batch``, read from their decoded JSON. Pure: the client (``streamproc.llm.provider_batches``)
makes the calls, this module says what an answer means.

Both providers' phases map onto one :class:`BatchPhase`. Anthropic's ``processing_status`` has only
``in_progress``, ``canceling`` and ``ended``; which end an ``ended`` batch came to is read from what is known of
it: a cancel was initiated (cancelled), requests expired (expired), else completed.

Used by the worker's route, ``app.provider_batch_route`` (design §8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, Literal

Provider = Literal["openai", "anthropic"]


class BatchPhase(StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"  # OpenAI: the file failed validation; no line ran
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in _ENDED


_ENDED: Final = frozenset({BatchPhase.COMPLETED, BatchPhase.FAILED, BatchPhase.EXPIRED, BatchPhase.CANCELLED})
_ANTHROPIC_RUNNING: Final = {"in_progress": BatchPhase.IN_PROGRESS, "canceling": BatchPhase.CANCELLING}


class MalformedAnswer(ValueError):
    """An answer of a batch API that is not the shape the provider documents."""


@dataclass(frozen=True)
class ProviderBatchView:
    """One provider batch as of one answer. ``finished`` counts the requests that came to an end (answered,
    errored, expired or cancelled); ``output_file_id``/``error_file_id`` are OpenAI's, ``results_url``
    Anthropic's; ``errors`` the validation errors of a failed OpenAI batch (``code: message``)."""

    provider: Provider
    batch_id: str
    phase: BatchPhase
    total: int
    finished: int
    output_file_id: str | None = None
    error_file_id: str | None = None
    results_url: str | None = None
    metadata: Mapping[str, str] | None = None
    errors: tuple[str, ...] = ()
    created_ms: int | None = None  # when the provider created it (its clock)


@dataclass(frozen=True)
class BatchPage:
    """One page of a list of batches, newest first; ``last_id`` is the cursor of the next page."""

    batches: tuple[ProviderBatchView, ...]
    has_more: bool
    last_id: str | None


def openai_batch(doc: Any) -> ProviderBatchView:
    """OpenAI's ``batch`` object."""
    obj = _object(doc, "a batch")
    status = _text(obj, "status")
    try:
        phase = BatchPhase(status)
    except ValueError:
        raise MalformedAnswer(f"batch {obj.get('id')!r}: unknown status {status!r}") from None
    counts = obj.get("request_counts")
    counts = counts if isinstance(counts, dict) else {}
    errors = obj.get("errors")
    listed = errors.get("data") if isinstance(errors, dict) else None
    problems = tuple(f"{e.get('code')}: {e.get('message')}" for e in listed if isinstance(e, dict)) if isinstance(
        listed, list) else ()
    metadata = obj.get("metadata")
    return ProviderBatchView(
        "openai", _text(obj, "id"), phase, _count(counts, "total"),
        _count(counts, "completed") + _count(counts, "failed"),
        output_file_id=_optional_text(obj, "output_file_id"),
        error_file_id=_optional_text(obj, "error_file_id"),
        metadata={k: v for k, v in metadata.items() if isinstance(v, str)} if isinstance(metadata, dict) else None,
        errors=problems,
        created_ms=_unix_ms(obj.get("created_at")),
    )


def openai_file_id(doc: Any) -> str:
    """The id of OpenAI's ``file`` object (the answer to an upload)."""
    obj = _object(doc, "a file")
    if obj.get("object") != "file":
        raise MalformedAnswer(f"expected a file object, got object {obj.get('object')!r}")
    return _text(obj, "id")


def anthropic_batch(doc: Any) -> ProviderBatchView:
    """Anthropic's ``message_batch`` object."""
    obj = _object(doc, "a message batch")
    if obj.get("type") != "message_batch":
        raise MalformedAnswer(f"expected a message_batch, got type {obj.get('type')!r}")
    status = _text(obj, "processing_status")
    counts = obj.get("request_counts")
    if not isinstance(counts, dict):
        raise MalformedAnswer(f"message batch {obj.get('id')!r} has no request_counts")
    by_end = {name: _count(counts, name) for name in ("succeeded", "errored", "canceled", "expired")}
    if status == "ended":
        if obj.get("cancel_initiated_at") is not None:
            phase = BatchPhase.CANCELLED
        else:
            phase = BatchPhase.EXPIRED if by_end["expired"] else BatchPhase.COMPLETED
    elif status in _ANTHROPIC_RUNNING:
        phase = _ANTHROPIC_RUNNING[status]
    else:
        raise MalformedAnswer(f"message batch {obj.get('id')!r}: unknown processing_status {status!r}")
    finished = sum(by_end.values())
    return ProviderBatchView("anthropic", _text(obj, "id"), phase, finished + _count(counts, "processing"), finished,
                             results_url=_optional_text(obj, "results_url"),
                             created_ms=_rfc3339_ms(_optional_text(obj, "created_at")))


def batch_page(doc: Any, parse: Callable[[Any], ProviderBatchView]) -> BatchPage:
    """A list answer (``{"data": [...], "has_more", "last_id"}``, the same for both providers)."""
    obj = _object(doc, "a list")
    data = obj.get("data")
    if not isinstance(data, list):
        raise MalformedAnswer("a list answer without a data array")
    return BatchPage(tuple(parse(item) for item in data), obj.get("has_more") is True, _optional_text(obj, "last_id"))


def _unix_ms(seconds: Any) -> int | None:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    return round(seconds * 1000)


def _rfc3339_ms(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise MalformedAnswer(f"created_at is not an RFC 3339 time: {text!r}") from None
    if moment.tzinfo is None:
        raise MalformedAnswer(f"created_at has no time zone: {text!r}")
    return round(moment.timestamp() * 1000)


def _object(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise MalformedAnswer(f"expected {what} as a JSON object, got {type(doc).__name__}")
    return doc


def _text(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise MalformedAnswer(f"{name} is not a non-empty string: {value!r}")
    return value


def _optional_text(obj: dict[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise MalformedAnswer(f"{name} is not a string: {value!r}")
    return value


def _count(counts: dict[str, Any], name: str) -> int:
    value = counts.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedAnswer(f"request_counts.{name} is not a count: {value!r}")
    return value
