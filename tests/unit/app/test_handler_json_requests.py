"""JSON requests on the request topic (design §3): called like Avro ones, refused with submit's reasons, and
their ends filed under the id they name (a dead letter when none can be known)."""

from __future__ import annotations

import base64
import json

from streamproc import codec
from streamproc.app.handler import Disposition, Record
from streamproc.core import headers
from streamproc.core.events import InferenceRequest
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from tests.unit.app.test_handler import (
    BODY,
    NOW,
    OFFSET,
    PARTITION,
    REQUESTS,
    UNAVAILABLE,
    Rig,
    answer,
    next_hop,
    only_failure,
    text,
)

LINE = {"custom_id": "r-1", "method": "POST", "url": "/v1/chat/completions", "body": BODY}


def json_record(value: dict[str, object], key: bytes | None = None, hdrs: dict[str, bytes] | None = None,
                offset: int = OFFSET) -> Record:
    return Record(REQUESTS, PARTITION, offset, key, json.dumps(value).encode(), hdrs or {})


async def test_a_json_batch_line_is_called_and_answered_under_its_scoped_id() -> None:
    rig = Rig([answer("ham")])
    record = json_record({**LINE, "batch_id": "b-1", "tenant": "team-a"}, key=b"b-1/r-1")
    assert await rig.handle(record) is Disposition.ACK
    [(called, body)] = rig.caller.calls
    assert (called.request_id, called.batch_id, called.tenant, called.metadata) == ("b-1/r-1", "b-1", "team-a", {})
    assert body["messages"] == BODY["messages"]
    [result] = rig.sink.results
    assert (result.request_id, result.batch_id, result.content) == ("b-1/r-1", "b-1", "ham")
    assert rig.state("b-1/r-1").status is RequestStatus.SUCCEEDED


async def test_a_keyless_json_request_without_a_batch_is_a_stream_request_keyed_by_its_id() -> None:
    rig = Rig([answer("ham")])
    assert await rig.handle(json_record({"id": "s-1", "prompt": "Label this"})) is Disposition.ACK
    [copy] = rig.sink.rekeyed
    assert copy.key == b"s-1" and await rig.handle(copy) is Disposition.ACK
    [result] = rig.sink.results
    assert (result.request_id, result.batch_id) == ("s-1", None)


async def test_a_json_request_that_fails_goes_on_as_avro_through_the_tiers() -> None:
    rig = Rig([UNAVAILABLE, answer("ham")])
    await rig.handle(json_record({**LINE, "priority": "high"}, key=b"r-1"))
    [retry] = rig.sink.retries
    assert (retry.request.priority, retry.request.metadata) == ("high", {})  # carried on through the tiers
    assert await rig.handle(next_hop(retry, offset=7)) is Disposition.ACK  # an Avro frame on the tier
    assert [r.request_id for r in rig.sink.results] == ["r-1"] and rig.sink.results[0].attempts == 2
    assert rig.sink.results[0].priority == "high"


async def test_an_invalid_json_request_is_a_business_failure_with_submits_reason_keeping_the_value() -> None:
    rig = Rig()
    record = json_record({**LINE, "batch_id": "b", "url": "/v1/completions"}, key=b"b/r-1")
    assert await rig.handle(record) is Disposition.ACK
    event, _ = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, "invalid_json_request", True)
    assert (event.request.request_id, event.request.batch_id) == ("b/r-1", "b")  # counted in its batch
    assert event.message.startswith(f"record {REQUESTS}[{PARTITION}]@{OFFSET}: unsupported url '/v1/completions'")
    assert base64.b64decode(event.request.metadata["raw_value_base64"]) == record.value
    assert rig.caller.calls == [] and rig.state("b/r-1").last_error_code == "invalid_json_request"


async def test_an_invalid_json_request_naming_no_id_is_a_dead_letter_with_the_reason() -> None:
    rig = Rig()
    record = json_record({"method": "POST", "body": BODY})
    assert await rig.handle(record) is Disposition.ACK
    [(dead, hdrs)] = rig.sink.dead_letters
    assert dead == record and text(hdrs, headers.ERROR_CODE) == "unreadable_record"
    assert text(hdrs, headers.ERROR_MESSAGE) == f"record {REQUESTS}[{PARTITION}]@{OFFSET}: missing custom_id"
    assert rig.sink.failures == [] and rig.caller.calls == []


async def test_a_json_request_under_another_key_is_a_key_mismatch() -> None:
    rig = Rig()
    assert await rig.handle(json_record({**LINE, "batch_id": "b"}, key=b"r-1")) is Disposition.ACK
    event, _ = only_failure(rig)
    assert (event.request.request_id, event.error_code) == ("r-1", "key_mismatch")
    assert "'b/r-1'" in event.message and rig.caller.calls == []


async def test_an_avro_request_is_read_as_before() -> None:
    rig = Rig([answer("ham")])
    request = InferenceRequest("req-1", json.dumps(BODY), batch_id="batch-1", submitted_ms=NOW)
    await rig.handle(Record(REQUESTS, PARTITION, OFFSET, b"req-1", codec.encode(request), {}))
    assert [r.request_id for r in rig.sink.results] == ["req-1"]
