"""What the server received and answered, so tests can assert on it ("no business failure was called twice").

Calls are counted per distinct request content (the content key) and per client request id (header
``x-client-request-id``, or ``x-request-id``; e.g. the batch ``custom_id``). The count per content is also
the attempt number that the fault draw uses, so this ledger is the server's memory of retries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from streamproc.core.vocabulary import FailureLayer

K = TypeVar("K")
OK = "ok"
CONFIG_LAYER = "config"  # 401/403/404-model and insufficient_quota: account problems, no failure layer


@dataclass(slots=True)
class RequestRecord:
    calls: int = 0
    outcomes: list[str] = field(default_factory=list)
    business_failed: bool = False


class CallLedger(Generic[K]):
    """Calls per key, with a running histogram so ``/stats`` stays cheap for millions of requests."""

    def __init__(self) -> None:
        self.records: dict[K, RequestRecord] = {}
        self.histogram: dict[int, int] = {}  # calls -> how many keys were called that often
        self.repeated_after_business_failure = 0

    def arrive(self, key: K) -> tuple[int, RequestRecord]:
        """Count a call; returns the attempt number (calls seen before this one) and the record."""
        record = self.records.get(key)
        if record is None:
            record = self.records[key] = RequestRecord()
        attempt = record.calls
        histogram = self.histogram
        if attempt:
            left = histogram[attempt] - 1
            if left:
                histogram[attempt] = left
            else:
                del histogram[attempt]
        if record.business_failed:
            self.repeated_after_business_failure += 1
        record.calls = attempt + 1
        histogram[attempt + 1] = histogram.get(attempt + 1, 0) + 1
        return attempt, record

    def summary(self) -> dict[str, Any]:
        return {
            "distinct": len(self.records),
            "max_calls": max(self.histogram, default=0),
            "calls_histogram": {str(calls): n for calls, n in sorted(self.histogram.items())},
            "repeated_after_business_failure": self.repeated_after_business_failure,
        }

    def detail(self) -> dict[str, dict[str, Any]]:
        return {
            (key.hex() if isinstance(key, bytes) else str(key)): {"calls": r.calls, "outcomes": list(r.outcomes)}
            for key, r in self.records.items()
        }


@dataclass(slots=True)
class Call:
    """One call in progress: its attempt number and the records its outcome is written to."""

    endpoint: str
    key: bytes
    attempt: int
    records: tuple[RequestRecord, ...]


class Stats:
    """All counters of one server run; ``reset()`` starts a new run (attempt numbers included)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.by_endpoint: dict[str, int] = {}
        self.by_status: dict[int | None, int] = {}
        self.by_outcome: dict[str, int] = {}
        self.by_layer: dict[str, int] = {}
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.internal_errors = 0
        self.requests: CallLedger[bytes] = CallLedger()
        self.request_ids: CallLedger[str] = CallLedger()

    def begin(self, endpoint: str, key: bytes, request_id: str | None) -> Call:
        self.calls += 1
        self.by_endpoint[endpoint] = self.by_endpoint.get(endpoint, 0) + 1
        attempt, record = self.requests.arrive(key)
        if request_id is None:
            return Call(endpoint, key, attempt, (record,))
        _, id_record = self.request_ids.arrive(request_id)
        return Call(endpoint, key, attempt, (record, id_record))

    def finish(
        self,
        call: Call,
        status: int | None,
        outcome: str,
        layer: str | None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """Record how a call ended; ``status`` None means no HTTP status was sent (hang, early reset)."""
        self.by_status[status] = self.by_status.get(status, 0) + 1
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1
        if layer is not None:
            self.by_layer[layer] = self.by_layer.get(layer, 0) + 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        business = layer == FailureLayer.BUSINESS
        for record in call.records:
            record.outcomes.append(outcome)
            if business:
                record.business_failed = True

    def snapshot(self, *, detail: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "calls": self.calls,
            "by_endpoint": dict(self.by_endpoint),
            "by_status": {
                str(status) if status is not None else "none": n
                for status, n in sorted(self.by_status.items(), key=lambda item: item[0] or 0)
            },
            "by_outcome": dict(sorted(self.by_outcome.items())),
            "by_layer": {str(layer): n for layer, n in sorted(self.by_layer.items())},
            "tokens": {
                "prompt": self.prompt_tokens,
                "completion": self.completion_tokens,
                "total": self.prompt_tokens + self.completion_tokens,
            },
            "requests": self.requests.summary(),
            "request_ids": self.request_ids.summary(),
            "internal_errors": self.internal_errors,
        }
        if detail:
            out["per_request"] = self.requests.detail()
            out["per_request_id"] = self.request_ids.detail()
        return out
