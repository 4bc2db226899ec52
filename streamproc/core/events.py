"""The records that travel on streamproc's topics, as typed values (their Avro schemas are in ``schemas/``).

Bodies are kept as JSON text: the OpenAI request and response bodies are open-ended, and keeping them as
text means a reader in any language gets exactly what was sent and received.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamproc.core.tenancy import DEFAULT_PRIORITY, DEFAULT_TENANT
from streamproc.core.vocabulary import FailureLayer, RequestStatus


@dataclass(frozen=True)
class RepairContext:
    """What a semantic repair attempt sends back to the model: its bad output and why it was rejected."""

    bad_output: str
    reason: str


@dataclass(frozen=True)
class InferenceRequest:
    """One LLM call to make; key = ``request_id`` (OpenAI ``custom_id``)."""

    request_id: str
    body_json: str  # the OpenAI request body, e.g. {"model": ..., "messages": [...]}
    url: str = "/v1/chat/completions"
    batch_id: str | None = None
    submitted_ms: int = 0
    repair: RepairContext | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    tenant: str = DEFAULT_TENANT  # who it is for (core.tenancy); a record that names none is the default tenant's
    priority: str = DEFAULT_PRIORITY  # high, normal or low


@dataclass(frozen=True)
class InferenceResult:
    """The successful answer to one request; key = ``request_id``."""

    request_id: str
    batch_id: str | None
    model: str  # the model that answered (may be a fallback)
    response_json: str  # the provider's full response body
    content: str  # choices[0].message.content
    attempts: int
    latency_ms: int
    completed_ms: int
    input_hash: str
    provider_request_id: str | None = None  # the provider's id for the call (its x-request-id header), if sent
    reused_from: str | None = None  # the request whose answer this reuses (submit --reuse-results): no call made
    deployment: str | None = None  # the deployment of the model list that answered (<model_name>@<n>), if any
    tenant: str = DEFAULT_TENANT  # the request's (core.tenancy)
    priority: str = DEFAULT_PRIORITY


@dataclass(frozen=True)
class FailureEvent:
    """One failed attempt (``terminal`` on the last), carrying the full request so it can be replayed."""

    request: InferenceRequest
    layer: FailureLayer
    error_code: str
    message: str
    attempt: int
    terminal: bool
    first_failure_ms: int
    last_failure_ms: int
    http_status: int | None = None
    retry_after_ms: int | None = None
    # what the provider answered, as received (bounded: llm.provider_answer): an error body, or the 200 answer
    # a check rejected; None when no HTTP answer came (or no call was made)
    response_body: str | None = None
    provider_request_id: str | None = None  # the provider's id for the call (its x-request-id header), if sent
    # the run of the request this attempt belongs to (attempts restart at 1 in each run); 0: unknown
    run: int = 0
    deployment: str | None = None  # the deployment of the model list the failed call went to (<model_name>@<n>)


@dataclass(frozen=True)
class RequestState:
    """The state-table value for one request id: a fold over that request's events (design §4)."""

    request_id: str
    status: RequestStatus
    input_hash: str
    attempts: int = 0
    batch_id: str | None = None
    last_layer: FailureLayer | None = None
    last_error_code: str | None = None
    created_ms: int = 0
    updated_ms: int = 0
    # the record that started the current attempt: its redelivery after a crash is admitted again,
    # any other record for an id in flight is a duplicate (see state.admit)
    source_topic: str | None = None
    source_offset: int | None = None
    # the record that continues the request while it waits (retry or deferred): the reconciler sends it
    # again if it was consumed while the state still waits (see core.reconcile)
    next_topic: str | None = None
    next_offset: int | None = None
    retries_spent: int = 0  # retries that spent the batch's retry budget (summed per batch after a restart)
    # the usage of the answer that became the result (status sums it per batch and model)
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused: bool = False  # the result was reused from an earlier identical request: no call, no tokens spent
    run: int = 0  # 1 for the first submission, one more per replay that started it again (0: before runs existed)
    # the backfill replay record that started the current run: read again, it (or an older one) is skipped
    replay_topic: str | None = None
    replay_offset: int | None = None
    tenant: str = DEFAULT_TENANT  # the request's (core.tenancy): status and the scheduler group by it
    priority: str = DEFAULT_PRIORITY
    provider_batch: bool = False  # the usage kept is of a provider batch's line (the discount), not of a call
