"""Backfill never replays a request whose url the worker's endpoint table refuses: from the failure topics or
from the sink's database (``--from-db``, a real SQLite file), with ``--include-business`` or without."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from streamproc.core.events import FailureEvent, InferenceRequest
from streamproc.core.vocabulary import FailureLayer
from streamproc.ops.backfill import BackfillFilter, plan_backfill
from streamproc.sink.database import open_database
from streamproc.sink.ledger import read_ledger
from streamproc.sink.target import SqliteTarget
from tests.unit.sink.events import failure, rows_of

HOSTILE = ["/../../admin/keys", "http://127.0.0.1:1/v1/chat/completions", "/v1/files", "/v1/%2e%2e/files"]


def event(request_id: str, url: str, layer: FailureLayer = FailureLayer.TRANSPORT) -> FailureEvent:
    request = InferenceRequest(request_id, '{"model": "m", "messages": []}', url=url, batch_id="b")
    return FailureEvent(request, layer, "read_timeout", "read_timeout happened", 6, True, 1_000, 1_000)


@pytest.mark.parametrize("include_business", [False, True])
def test_a_failure_with_a_refused_url_is_skipped(include_business: bool) -> None:
    failures = [event("good", "/v1/chat/completions"),
                *(event(f"bad-{i}", url) for i, url in enumerate(HOSTILE)),
                event("bad-business", HOSTILE[0], FailureLayer.BUSINESS)]
    plan = plan_backfill(failures, {}, BackfillFilter(include_business=include_business))
    assert [r.request_id for r in plan.replays] == ["good"]
    assert plan.counts[("transport", "read_timeout", "skip: unsupported url")] == len(HOSTILE)
    assert plan.counts[("business", "read_timeout", "skip: unsupported url")] == 1


def test_a_row_of_the_sink_with_a_refused_url_is_not_replayed(tmp_path: Path) -> None:
    target = SqliteTarget(tmp_path / "sink.db")
    database = open_database(target)
    good = failure("good", "b1", terminal=True, layer=FailureLayer.TRANSPORT, code="read_timeout")
    bad = [replace(good, request=replace(good.request, request_id=f"b1/bad-{i}", url=url))
           for i, url in enumerate(HOSTILE)]
    try:
        database.write(rows_of(good, *bad))
    finally:
        database.close()
    failures, statuses = read_ledger(target, "b1")
    assert sorted(f.request.url for f in failures) == sorted([good.request.url, *HOSTILE])  # the rows keep them
    plan = plan_backfill(failures, statuses, BackfillFilter(include_business=True))
    assert [r.request_id for r in plan.replays] == [good.request.request_id]
    assert plan.counts[("transport", "read_timeout", "skip: unsupported url")] == len(HOSTILE)
