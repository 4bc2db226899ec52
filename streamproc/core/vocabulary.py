"""The vocabulary every module shares: failure layers and per-request statuses (design §2, §4)."""

from __future__ import annotations

from enum import StrEnum


class FailureLayer(StrEnum):
    """Where a failure comes from; the layer decides retry policy, topic and backfill treatment."""

    TRANSPORT = "transport"  # L1: timeouts, resets, cut or non-JSON bodies, 408
    SERVICE = "service"  # L2: 429 rate limits, 5xx, 529, 409
    SEMANTIC = "semantic"  # L3: 200 but empty / invalid JSON / schema mismatch / truncated
    BUSINESS = "business"  # L4: invalid request, context length, policy, malformed input: never retried as is


class RequestStatus(StrEnum):
    """The state-table status of one request id."""

    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
