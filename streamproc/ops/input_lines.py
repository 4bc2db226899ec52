"""One line of a batch input file turned into a request, or why not (design §6).

What a line may hold, and every reason it is refused, is :mod:`streamproc.core.request_line`: the worker reads a
JSON record on the request topic with the same rules, so both give the same message. Here a problem becomes a
:class:`LineError` with its line number, and each line's record, encoded as the producer sends it (key, value,
headers), must fit the producer's max request size: a file that would be sent half is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from streamproc import codec
from streamproc.core.events import InferenceRequest
from streamproc.core.identity import request_id_for
from streamproc.core.request_line import MAX_CUSTOM_ID_BYTES, InvalidLine, LineLimits, loads_line, read_request
from streamproc.core.scheduling_headers import scheduling_headers
from streamproc.core.tenancy import DEFAULT_TENANCY, InvalidTenancy, Tenancy, tenancy_of

__all__ = ["LINE_CAP_FACTOR", "MAX_CUSTOM_ID_BYTES", "BatchLimits", "LineError", "parse_line", "record_bytes"]

# A line may spell its body with whitespace and \uXXXX escapes (an emoji is 4 UTF-8 bytes, 12 escaped), so
# it can be a few times longer than the body it carries; past this factor it is refused unread, which keeps
# memory bounded even for a file that is one endless line.
LINE_CAP_FACTOR: Final = 8
_JSON_WHITESPACE: Final = " \t\r\n"
TENANCY_FIELDS: Final = ("tenant", "priority")  # a line may name its own, beside either form's fields


@dataclass(frozen=True)
class LineError:
    """Why one input line cannot be sent; ``custom_id`` when the line got far enough to name one."""

    line: int
    custom_id: str | None
    reason: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.custom_id is None else f"line {self.line} (custom_id {self.custom_id!r})"
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class BatchLimits(LineLimits):
    """What a line may contain (:class:`LineLimits`), and the record the producer sends: its largest size (None:
    not checked) and the headers every record carries."""

    max_record_bytes: int | None = None
    record_headers: tuple[tuple[str, bytes], ...] = ()
    tenancy: Tenancy = DEFAULT_TENANCY  # submit --tenant/--priority: a line's own tenant/priority fields win

    @property
    def max_line_bytes(self) -> int:
        return self.max_body_bytes * LINE_CAP_FACTOR


def parse_line(
    text: str, line: int, limits: BatchLimits, batch_id: str, submitted_ms: int
) -> InferenceRequest | LineError | None:
    """Turn one line (without its newline) into a request keyed by (batch, custom_id), or say why not;
    ``None`` for a blank line."""
    if not text.strip(_JSON_WHITESPACE):
        return None
    try:
        return _parse(text, limits, batch_id, submitted_ms)
    except InvalidLine as invalid:
        return LineError(line, invalid.custom_id, invalid.reason)


def _parse(text: str, limits: BatchLimits, batch_id: str, submitted_ms: int) -> InferenceRequest:
    asked = read_request(loads_line(text), limits, envelope=TENANCY_FIELDS)
    try:
        tenant, priority = (asked.envelope.get(name) for name in TENANCY_FIELDS)  # null: as not given
        tenancy = tenancy_of(limits.tenancy.tenant if tenant is None else tenant,
                             limits.tenancy.priority if priority is None else priority)
    except InvalidTenancy as invalid:
        raise InvalidLine(str(invalid), asked.custom_id) from None
    request = InferenceRequest(request_id_for(batch_id, asked.custom_id), asked.body_json, url=asked.url,
                               batch_id=batch_id, submitted_ms=submitted_ms, tenant=tenancy.tenant,
                               priority=tenancy.priority)
    if limits.max_record_bytes is not None:
        record = record_bytes(request, limits.record_headers + scheduling_headers(request))
        if record > limits.max_record_bytes:
            raise InvalidLine(f"its record is {record:,} bytes encoded (key, value and headers), over the "
                              f"producer's {limits.max_record_bytes:,}-byte max request size", asked.custom_id)
    return request


def record_bytes(request: InferenceRequest, headers: tuple[tuple[str, bytes], ...] = ()) -> int:
    """The request's record as the producer sends it on ``llm.requests`` (key, Avro value, headers), with the
    record batch's own overhead: aiokafka's upper bound."""
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(
        request.request_id.encode("utf-8"), codec.encode(request), list(headers))
    return size
