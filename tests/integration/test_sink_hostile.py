"""Hostile records on the real broker into SQLite and a throwaway PostgreSQL: NUL and lone surrogates are
stored and read back, rows that cannot be made are set aside in ``rejected_rows``, and the sink commits past
them and goes on."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from streamproc import codec
from streamproc.app.bootstrap import resolve_connection
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core import headers
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.clients import kafka_producer
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from streamproc.sink.database import open_database
from streamproc.sink.follow import SinkTotals, run_sink
from streamproc.sink.ledger import read_ledger
from streamproc.sink.rows import Kind, RowBatch
from streamproc.sink.target import parse_target
from tests.integration.sink_database import Database
from tests.unit.sink.events import failure, record, result

pytestmark = pytest.mark.integration


async def send(settings: Settings, topic: str, records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]
               ) -> None:
    producer = kafka_producer(resolve_connection(settings), acks="all")
    await producer.start()
    try:
        for key, value, hdrs in records:
            await producer.send(topic, key=key, value=value, headers=hdrs, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def drain(settings: Settings, url: str, lines: list[str]) -> SinkTotals:
    sink = run_sink(resolve_connection(settings), settings.topology(), settings.durability.replication,
                    parse_target(url), group=f"{settings.app_id}.sink", until_idle=True, report=lines.append,
                    stop=asyncio.Event())
    return await asyncio.wait_for(sink, 120)


async def test_hostile_rows_are_stored_or_set_aside_and_the_sink_goes_on(settings: Settings, database: Database
                                                                         ) -> None:
    assert settings.kafka_bootstrap is not None
    topology = settings.topology()
    await ensure_pipeline_topics(KafkaConnection(bootstrap=settings.kafka_bootstrap), topology)
    body = json.dumps({"model": "m\x00\ud800", "messages": []})  # the JSON escapes make a NUL and a lone surrogate
    plain = failure("fail\x00id", terminal=True, message="refused \x00 here")
    hostile_failure = replace(plain, request=replace(plain.request, body_json=body))
    deep = result("deep", response="[" * 200_000)  # RecursionError when its usage is read
    timeless = result("timeless", completed_ms=2**62)  # no calendar has that year
    await send(settings, topology.results, [
        (b"b1/ok", record(result("ok")).value or b"", []),
        (b"b1/nul", record(result("nul\x00id", content="an \x00 answer")).value or b"", []),
        (b"b1/deep", record(deep).value or b"", [(headers.REQUEST_ID, b"b1/deep")]),
        (b"b1/timeless", record(timeless).value or b"", []),
        (None, b"not a record of ours", []),
    ])
    await send(settings, topology.failed(FailureLayer.SERVICE), [(b"b1/f", codec.encode(hostile_failure), [])])

    lines: list[str] = []
    totals = await drain(settings, database.url, lines)
    assert (totals.records, totals.results, totals.failures, totals.skipped, totals.rejected) == (6, 2, 1, 1, 2)
    assert sorted(database.query("SELECT custom_id, content FROM results")) == [
        ('"nul\\u0000id"', '"an \\u0000 answer"'), ("ok", "spam")]
    assert database.query("SELECT custom_id, model, message FROM failures") == [
        ('"fail\\u0000id"', '"m\\u0000\\ud800"', '"refused \\u0000 here"')]
    rejected = sorted(database.query("SELECT topic, kafka_partition, kafka_offset, request_id, reason "
                                     "FROM rejected_rows"))
    assert [row[:4] for row in rejected] == [(topology.results, 0, 2, "b1/deep"), (topology.results, 0, 3, None)]
    assert "RecursionError" in rejected[0][4] and "year" in rejected[1][4]
    assert any("set aside in rejected_rows" in line for line in lines)
    [event], _ = read_ledger(parse_target(database.url), None)
    assert (event.request.request_id, event.request.body_json) == ("b1/fail\x00id", body)

    # the offsets were committed past the hostile records: the next run reads only what came after
    await send(settings, topology.results, [(b"b1/after", record(result("after")).value or b"", [])])
    totals = await drain(settings, database.url, lines)
    assert (totals.records, totals.results, totals.rejected) == (1, 1, 0)
    assert database.count("SELECT COUNT(*) FROM results") == 3
    assert database.count("SELECT COUNT(*) FROM rejected_rows") == 2


def test_a_row_the_driver_refuses_is_set_aside_by_the_database_too(database: Database) -> None:
    """Text that skipped the escaping (PostgreSQL refuses the NUL; SQLite stores it): either way the batch
    is written and nothing stops."""
    rows = RowBatch()
    rows.add(Kind.RESULT, record(result("fine"), offset=1), "llm.results")
    rows.add(Kind.RESULT, record(result("raw"), offset=2), "llm.results")
    rows.results[("b1", "raw")] = rows.results[("b1", "raw")]._replace(content="raw \x00 text")
    sink = open_database(parse_target(database.url))
    try:
        rejected = sink.write(rows)
    finally:
        sink.close()
    if database.url.startswith("sqlite"):
        assert rejected == [] and database.count("SELECT COUNT(*) FROM results") == 2
    else:
        assert [(row.key, row.request_id) for row in rejected] == [(("llm.results", 0, 2), "b1/raw")]
        assert "NUL" in rejected[0].reason
        assert database.query("SELECT custom_id FROM results") == [("fine",)]
