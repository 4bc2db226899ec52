"""Result reuse (``submit --reuse-results``): a request asking exactly what an earlier request asked, and got an
answer to, is answered with that answer, without an LLM call (design §4, "Result reuse").

"Exactly": the same input hash (url and canonical body, so the model and every parameter; see
:func:`streamproc.core.request_state.input_hash`). The reused answer is a normal result event that names the
request it came from (``reused_from``), so exports mark it, and the state says ``reused`` so ``status`` counts
it. A batch opts in; nothing is reused otherwise, since an LLM's answer to the same input may differ and a user
may want a fresh one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Final

from streamproc.core.events import InferenceRequest, InferenceResult, RequestState
from streamproc.core.request_state import on_success

REUSE_RESULTS: Final = "x-reuse-results"
"""Header ``submit --reuse-results`` puts on each request record: the batch manifest says so too, but it is written
after the last request, so a worker may handle the first requests before it knows the manifest."""
REUSE_RESULTS_ON: Final = b"1"


def reuse_wanted(record_headers: Mapping[str, bytes], batch_reuses: bool) -> bool:
    """Whether a record may be answered from an earlier result: its own header, or its batch's manifest (for the
    records that do not carry the header: retries, backfill replays, re-driven records)."""
    return batch_reuses or record_headers.get(REUSE_RESULTS) == REUSE_RESULTS_ON


def indexable(result: InferenceResult) -> bool:
    """Whether a result may answer later requests: one that was called for (a reused one names its origin, which
    the index already holds)."""
    return result.reused_from is None


def reused_result(original: InferenceResult, request: InferenceRequest, digest: str, now_ms: int) -> InferenceResult:
    """The result event of ``request`` answered with ``original``: its answer and model, this request's identity,
    no attempt and no latency (no call was made), and where the answer came from."""
    return replace(original, request_id=request.request_id, batch_id=request.batch_id, attempts=0, latency_ms=0,
                   completed_ms=now_ms, input_hash=digest, reused_from=original.request_id, tenant=request.tenant,
                   priority=request.priority)


def on_reused(state: RequestState, result: InferenceResult, now_ms: int) -> RequestState:
    """The reused result was sent: the request succeeded, with the answer's model and no tokens spent."""
    return replace(on_success(state, now_ms), model=result.model, prompt_tokens=0, completion_tokens=0, reused=True)
