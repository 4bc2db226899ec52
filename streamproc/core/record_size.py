"""How big a request can be and still travel inside the records the worker writes about it.

A failure event carries its whole request (so backfill can replay it), and a retry record is the request
again. Kafka refuses a record over the producer's ``max.request.size`` (faust's default: 1,000,000 bytes),
yet a request the broker accepted can be up to its ``message.max.bytes`` (1,048,588 by default): its failure
event is then a few hundred bytes too big, the send fails, the record can never be acked and the worker
stops on it again after every restart (the chaos run found it). So past :data:`CARRIED_BYTES`:

* the failure event carries the request *without its body*, and says where the body is (the origin record,
  which stays on its topic) and how big it was;
* a retry is impossible (the retry record would be as big): the failure is terminal ``request_too_large``.
"""

from __future__ import annotations

from dataclasses import replace

from streamproc.core.events import InferenceRequest

CARRIED_BYTES = 800_000  # a request's body and metadata: well below 1,000,000 with the event's own fields
REQUEST_TOO_LARGE = "request_too_large"


def request_bytes(request: InferenceRequest) -> int:
    """The bytes of the request's body, repair context and metadata (what grows; the rest is small)."""
    repair = request.repair
    return (len(request.body_json.encode("utf-8", "surrogatepass"))
            + (len(repair.bad_output.encode("utf-8", "surrogatepass")) + len(repair.reason) if repair else 0)
            + sum(len(key) + len(value) for key, value in request.metadata.items()))


def too_large_to_carry(request: InferenceRequest) -> bool:
    return request_bytes(request) > CARRIED_BYTES


def without_body(request: InferenceRequest, where: str) -> InferenceRequest:
    """The request as a failure event can carry it: no body, no repair, a note of the size and of ``where``
    the full request is."""
    note = f"{request_bytes(request)} bytes, too large to carry in this event; the request is at {where}"
    return replace(request, body_json="", repair=None, metadata={"body_omitted": note})
