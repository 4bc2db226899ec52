"""The sink's database read back as backfill's input: ``backfill --from-db`` (design §6 sink).

Backfill plans from two things: every terminal failure as the event it was, and each request's status now.
From the topics those are the ``failed.*`` events and the state table; here they are the ``failures`` rows
(which keep the whole request: url, body, metadata, submission time, repair context, so the event is rebuilt
as it was and the replay is the record a topic backfill sends) and the ``requests`` view's latest outcome
(``succeeded`` once a result arrived, so resolved rows are skipped as "succeeded since"). The filters stay
backfill's own (``ops.backfill.BackfillFilter``); only the batch is selected in SQL, which the
``failures_by_code`` index serves. A row's url is given back as the database holds it, anyone who can write
the database may have changed it: the plan refuses it as the worker would (``core.endpoints``), so a row can
never turn into a call to another path or host.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import NamedTuple

from streamproc.core.events import FailureEvent, InferenceRequest, RepairContext
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.sink.database import DatabaseError, open_database
from streamproc.sink.target import SqliteTarget, Target
from streamproc.sink.text import restored_row


class LedgerRow(NamedTuple):
    """A terminal failure row with its request's latest outcome, as :data:`TERMINAL_FAILURES` selects it."""

    request_id: str
    batch: str
    url: str
    body: str
    metadata: str
    submitted_ms: int
    repair: str | None
    layer: str
    code: str
    message: str
    run: int
    attempt: int
    terminal: bool | int  # SQLite gives 1
    first_failed_at: datetime | str  # PostgreSQL gives a datetime, SQLite the ISO text the sink wrote
    failed_at: datetime | str
    http_status: int | None
    retry_after_ms: int | None
    provider_body: str | None
    provider_request_id: str | None
    deployment: str | None
    tenant: str
    priority: str
    status: str  # the requests view's: succeeded, failed or retrying


# oldest first, so the latest terminal failure of a request is the one backfill keeps (as from the topics)
TERMINAL_FAILURES = f"""SELECT {', '.join(f'f.{column}' for column in LedgerRow._fields[:-1])}, r.status
    FROM failures f JOIN requests r ON r.batch = f.batch AND r.custom_id = f.custom_id
    WHERE f.terminal{{batch}}
    ORDER BY f.failed_at, f.run, f.attempt"""


def epoch_ms(moment: datetime | str) -> int:
    """The inverse of ``rows.iso_ms``, for both drivers' timestamps."""
    parsed = moment if isinstance(moment, datetime) else datetime.fromisoformat(moment)
    return round(parsed.timestamp() * 1000)


def failure_event(row: LedgerRow) -> FailureEvent:
    """The failure event a row was written from (``rows.failure_row`` the other way)."""
    repair = None if row.repair is None else RepairContext(**json.loads(row.repair))
    request = InferenceRequest(row.request_id, row.body, url=row.url, batch_id=row.batch or None,
                               submitted_ms=row.submitted_ms, repair=repair, metadata=json.loads(row.metadata),
                               tenant=row.tenant, priority=row.priority)
    return FailureEvent(request, FailureLayer(row.layer), row.code, row.message, row.attempt, bool(row.terminal),
                        first_failure_ms=epoch_ms(row.first_failed_at), last_failure_ms=epoch_ms(row.failed_at),
                        http_status=row.http_status, retry_after_ms=row.retry_after_ms,
                        response_body=row.provider_body, provider_request_id=row.provider_request_id, run=row.run,
                        deployment=row.deployment)


def read_ledger(target: Target, batch_id: str | None) -> tuple[list[FailureEvent], dict[str, RequestStatus]]:
    """The terminal failures (of ``batch_id``, or all), oldest first, and the status of each of their requests:
    what ``ops.backfill.plan_backfill`` takes, as ``read_for_backfill`` gives it from the topics."""
    if isinstance(target, SqliteTarget) and not target.path.is_file():
        raise DatabaseError(f"no database at {target.describe()}: `streamproc sink --to URL` writes it")
    database = open_database(target)  # a database of an older streamproc gains the columns read here
    try:
        if batch_id is None:
            raw = database.read(TERMINAL_FAILURES.format(batch=""))
        else:
            raw = database.read(TERMINAL_FAILURES.format(batch=" AND f.batch = ?"), (batch_id,))
    finally:
        database.close()
    rows = [restored_row(LedgerRow(*values)) for values in raw]
    return [failure_event(row) for row in rows], {row.request_id: RequestStatus(row.status) for row in rows}
