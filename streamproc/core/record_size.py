"""How big a request can be and still travel inside the records the worker writes about it.

A failure event carries its whole request (so backfill can replay it), and a retry record is the request
again. Kafka refuses a record over the producer's ``max.request.size`` (faust's default: 1,000,000 bytes),
yet a request the broker accepted can be up to its ``message.max.bytes`` (1,048,588 by default): its failure
event is then a few hundred bytes too big, the send fails, the record can never be acked and the worker
stops on it again after every restart. So past :data:`CARRIED_BYTES`:

* the failure event carries the request *without its body*, and says where the body is (the origin record,
  which stays on its topic) and how big it was;
* a retry is impossible (the retry record would be as big): the failure is terminal ``request_too_large``.

The same limit holds for a result, which carries the provider's answer twice (its body and the content): an
answer of about half a megabyte or more makes a result record the producer refuses. Such an answer ends as the
terminal business failure ``response_too_large`` (:func:`response_too_large`): its failure event keeps a bounded
copy and the usage (design §2, §3), instead of a send that fails and loses the paid answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Final

from streamproc.core.events import InferenceRequest, InferenceResult
from streamproc.core.outcome import Failure, Success, truncate
from streamproc.core.vocabulary import FailureLayer

CARRIED_BYTES = 800_000  # a request's body and metadata: well below 1,000,000 with the event's own fields
REQUEST_TOO_LARGE = "request_too_large"
RESPONSE_TOO_LARGE = "response_too_large"
# faust's producer refuses a record whose key and value pass max.request.size (1,000,000 bytes, kept by
# app.faust_app) with aiokafka's few bytes of framing; 1 KiB of room leaves them out of the sum
RECORD_BYTES: Final = 1_000_000 - 1_024
_FIXED_BYTES: Final = 512  # a result's numbers, string lengths and framing (or its JSON field names), at most
_BYTES_A_CHARACTER: Final = 6  # UTF-8 takes 4 at most, and JSON writes a control character as a 6-byte escape
_STR_FIELDS: Final = tuple(f.name for f in fields(InferenceResult) if "str" in str(f.type))


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


def result_record_bytes(result: InferenceResult, encode: Callable[[InferenceResult], bytes]) -> int:
    """The bytes of the result's record (key and value), Avro or JSON. A bound (:data:`_BYTES_A_CHARACTER`) answers
    for the usual small result; only one that might not fit is encoded to be measured (an encoding the sink
    repeats, for rare big answers only)."""
    key = len(result.request_id.encode("utf-8", "surrogatepass"))
    bound = key + _FIXED_BYTES + _BYTES_A_CHARACTER * sum(len(getattr(result, name) or "") for name in _STR_FIELDS)
    return bound if bound <= RECORD_BYTES else key + len(encode(result))


def response_too_large(request_id: str, answer_bytes: int, record_bytes: int, answer: Success) -> Failure | None:
    """None when the result fits in a record; else the terminal business failure that ends the request.

    Business, so never called again: the answer was paid for, and the same request answers about as long. The
    failure says the sizes, the limit and the usage, so the cost is known from the event alone.
    """
    if record_bytes <= RECORD_BYTES:
        return None
    return Failure(FailureLayer.BUSINESS, RESPONSE_TOO_LARGE, truncate(
        f"the answer to request {request_id!r} is {answer_bytes:,} bytes: its result record would be "
        f"{record_bytes:,} bytes, more than the {RECORD_BYTES:,} a Kafka record may carry here (the producer's "
        f"max.request.size); not called again (paid: {answer.prompt_tokens:,} prompt + "
        f"{answer.completion_tokens:,} completion tokens of {answer.model}); the failure keeps the answer with "
        "its text cut, usage whole"), 200)
