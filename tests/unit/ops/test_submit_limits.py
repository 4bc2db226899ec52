"""submit sends all or nothing: a line whose record the producer would refuse, or whose custom_id is over 512
UTF-8 bytes, stops the whole file at validation, with its line number, before any connection to Kafka."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder

from streamproc import codec
from streamproc.core.events import InferenceRequest
from streamproc.core.reuse import REUSE_RESULTS, REUSE_RESULTS_ON
from streamproc.kafka.connection import KafkaConnection
from streamproc.ops.input_lines import MAX_CUSTOM_ID_BYTES, BatchLimits, LineError, parse_line, record_bytes
from streamproc.ops.submit import PRODUCER_MAX_REQUEST_BYTES, InvalidBatchFile, limits_of, submit_file
from streamproc.settings import Settings

CHAT = "/v1/chat/completions"


def line(custom_id: str, content: str = "Label: Buy now!!!") -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}, ensure_ascii=False)


def parse(text: str, limits: BatchLimits) -> InferenceRequest | LineError | None:
    return parse_line(text, 5, limits, "batch-1", 1_700_000_000_000)


def padded(custom_id: str, body_bytes: int) -> str:
    """A line whose body is ``body_bytes`` long (compact JSON, as submit measures it)."""
    empty = len(json.dumps({"model": "m", "messages": [{"role": "user", "content": ""}]}, separators=(",", ":")))
    return line(custom_id, "x" * (body_bytes - empty))


def test_a_custom_id_of_512_bytes_passes_and_513_is_refused() -> None:
    limits = BatchLimits()
    at_limit = "é" * 256  # 2 bytes each in UTF-8
    assert len(at_limit.encode()) == MAX_CUSTOM_ID_BYTES == 512
    assert isinstance(parse(line(at_limit), limits), InferenceRequest)
    refused = parse(line(at_limit + "a"), limits)
    assert refused == LineError(5, None, f"custom_id is 513 bytes in UTF-8, over the 512-byte limit "
                                         f"(starts {at_limit[:40]!r})")
    simple = parse(json.dumps({"id": "i" * 513, "prompt": "p"}), limits)
    assert isinstance(simple, LineError) and "id is 513 bytes in UTF-8" in simple.reason


def test_a_record_over_the_producers_limit_is_refused_with_its_size() -> None:
    limits = BatchLimits(max_body_bytes=2_000_000, max_record_bytes=PRODUCER_MAX_REQUEST_BYTES)
    fits = parse(padded("ok", PRODUCER_MAX_REQUEST_BYTES - 1_000), limits)
    assert isinstance(fits, InferenceRequest)
    refused = parse(padded("big", PRODUCER_MAX_REQUEST_BYTES), limits)
    assert isinstance(refused, LineError) and refused.custom_id == "big"
    assert "encoded (key, value and headers), over the producer's 1,048,576-byte max request size" in refused.reason
    assert refused.reason.startswith("its record is 1,048,")


def test_the_headers_submit_sends_count_towards_the_record() -> None:
    request = parse(padded("ok", 10_000), BatchLimits())
    assert isinstance(request, InferenceRequest)
    headers = ((REUSE_RESULTS, REUSE_RESULTS_ON),)
    assert record_bytes(request, headers) == record_bytes(request) + len(REUSE_RESULTS) + len(REUSE_RESULTS_ON) + 2
    assert limits_of(Settings().input_limits, reuse_results=True).record_headers == headers
    assert limits_of(Settings().input_limits).record_headers == ()
    tight = BatchLimits(max_record_bytes=record_bytes(request), record_headers=headers)
    assert isinstance(parse(padded("ok", 10_000), tight), LineError)


@pytest.mark.parametrize("body_bytes", [100, 50_000, 1_000_000])
def test_a_record_that_passes_is_one_the_producer_takes(body_bytes: int) -> None:
    """The check is aiokafka's upper bound: never below what the batch holds, nor below the producer's own check."""
    request = parse(padded("x", body_bytes), BatchLimits(max_body_bytes=2_000_000))
    assert isinstance(request, InferenceRequest)
    key, value = request.request_id.encode(), codec.encode(request)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=2**24)
    builder.append(0, timestamp=None, key=key, value=value, headers=[])
    assert len(builder.build()) <= record_bytes(request)
    assert LegacyRecordBatchBuilder.record_overhead(2) + len(key) + len(value) <= record_bytes(request)


async def test_submit_refuses_the_whole_file_before_connecting(tmp_path: Path) -> None:
    """Line 2's record is too large and line 3's custom_id too long: InvalidBatchFile names both lines, and no
    connection was asked for."""
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join([line("a"), padded("b", 1_048_560), line("c" * 513), line("d")]) + "\n")

    def connect() -> KafkaConnection:
        raise AssertionError("submit asked for its connection before the file was found valid")

    settings = Settings(max_body_bytes=1_048_576)
    with pytest.raises(InvalidBatchFile) as raised:
        await submit_file(connect, settings.topology(), settings.durability, settings.input_limits, path, "batch-1")
    errors: list[Any] = raised.value.errors
    assert [(e.line, e.custom_id) for e in errors] == [(2, "b"), (3, None)]
    assert "over the producer's 1,048,576-byte max request size" in errors[0].reason
    assert "custom_id is 513 bytes in UTF-8" in errors[1].reason
    assert "2 invalid line(s); nothing was sent" in str(raised.value)
    assert "line 2 (custom_id 'b'): its record is" in str(raised.value)
