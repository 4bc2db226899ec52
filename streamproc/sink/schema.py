"""The sink's tables, as an ordered list of migrations, and the statements that write them.

One SQL text serves SQLite and PostgreSQL: the column types are PostgreSQL's, which SQLite accepts (it
stores by value), booleans are ``TRUE``/``FALSE`` (SQLite ≥ 3.23) and the view uses a window function
(SQLite ≥ 3.25). Statements use ``?`` placeholders; :func:`placeholders` turns them into psycopg's.

**Migrations** are explicit: ``schema_version`` holds one row per applied version, and a database is
brought up to date by applying, in one transaction, every migration above its highest row. A schema change
is a new entry at the end of :data:`MIGRATIONS`; entries are never edited once released.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamproc.errors import UserFacingError
from streamproc.sink.rows import DeadLetterRow, FailureRow, RejectedRow, ResultRow


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


CREATE_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL)"""
CURRENT_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"
RECORD_VERSION = "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)"

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "results, failures, dead_letters and the requests view", (
        """CREATE TABLE results (
            batch TEXT NOT NULL, custom_id TEXT NOT NULL, request_id TEXT NOT NULL, model TEXT NOT NULL,
            content TEXT NOT NULL, response TEXT NOT NULL, usage TEXT,
            prompt_tokens BIGINT, completion_tokens BIGINT, total_tokens BIGINT,
            attempt INTEGER NOT NULL, latency_ms BIGINT NOT NULL, finished_at TIMESTAMPTZ NOT NULL,
            input_hash TEXT NOT NULL, provider_request_id TEXT, reused_from TEXT,
            PRIMARY KEY (batch, custom_id))""",
        """CREATE TABLE failures (
            batch TEXT NOT NULL, custom_id TEXT NOT NULL, attempt INTEGER NOT NULL, request_id TEXT NOT NULL,
            layer TEXT NOT NULL, code TEXT NOT NULL, message TEXT NOT NULL,
            http_status INTEGER, retry_after_ms BIGINT, terminal BOOLEAN NOT NULL,
            resolved BOOLEAN NOT NULL DEFAULT FALSE, model TEXT,
            first_failed_at TIMESTAMPTZ NOT NULL, failed_at TIMESTAMPTZ NOT NULL,
            url TEXT NOT NULL, body TEXT NOT NULL, metadata TEXT NOT NULL,
            provider_body TEXT, provider_request_id TEXT,
            PRIMARY KEY (batch, custom_id, attempt))""",
        "CREATE INDEX failures_by_code ON failures (batch, layer, code)",
        """CREATE TABLE dead_letters (
            kafka_partition INTEGER NOT NULL, kafka_offset BIGINT NOT NULL, request_id TEXT,
            record_key BYTEA, record_value BYTEA, layer TEXT, code TEXT, message TEXT,
            origin_topic TEXT, origin_partition INTEGER, origin_offset BIGINT, dead_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (kafka_partition, kafka_offset))""",
        # each request's latest outcome: its result if it has one, else its latest failed attempt
        # (terminal: failed; otherwise still retrying). A backfill's outcome is later, so it replaces the first.
        """CREATE VIEW requests AS
            SELECT batch, custom_id, 'succeeded' AS status, attempt AS attempts, model,
                   CAST(NULL AS TEXT) AS layer, CAST(NULL AS TEXT) AS code, CAST(NULL AS TEXT) AS message,
                   finished_at AS ended_at
            FROM results
            UNION ALL
            SELECT batch, custom_id, CASE WHEN terminal THEN 'failed' ELSE 'retrying' END, attempt, model,
                   layer, code, message, failed_at
            FROM (SELECT f.*, ROW_NUMBER() OVER (PARTITION BY batch, custom_id
                                                 ORDER BY failed_at DESC, attempt DESC) AS latest
                  FROM failures f) ranked
            WHERE latest = 1 AND NOT EXISTS (
                SELECT 1 FROM results r WHERE r.batch = ranked.batch AND r.custom_id = ranked.custom_id)""",
    )),
    # backfill --from-db rebuilds the failure event from its row; rows written before read as a request
    # submitted at 0 without a repair context (what InferenceRequest defaults to)
    Migration(2, "failures keep the request's submitted_ms and repair context, for backfill --from-db", (
        "ALTER TABLE failures ADD COLUMN submitted_ms BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE failures ADD COLUMN repair TEXT",
    )),
    # a replay restarts at attempt 1, so (batch, custom_id, attempt) let its rows overwrite the first run's:
    # the key gains the run. Neither database changes a primary key in place, so the table is rebuilt (its
    # index with it) and the view, which names it, is dropped first and made again. Earlier rows are run 0.
    Migration(3, "failures are keyed by the request's run too: a replay's attempts keep the first run's rows", (
        "DROP VIEW requests",
        """CREATE TABLE failures_v3 (
            batch TEXT NOT NULL, custom_id TEXT NOT NULL, run INTEGER NOT NULL DEFAULT 0,
            attempt INTEGER NOT NULL, request_id TEXT NOT NULL,
            layer TEXT NOT NULL, code TEXT NOT NULL, message TEXT NOT NULL,
            http_status INTEGER, retry_after_ms BIGINT, terminal BOOLEAN NOT NULL,
            resolved BOOLEAN NOT NULL DEFAULT FALSE, model TEXT,
            first_failed_at TIMESTAMPTZ NOT NULL, failed_at TIMESTAMPTZ NOT NULL,
            url TEXT NOT NULL, body TEXT NOT NULL, metadata TEXT NOT NULL,
            provider_body TEXT, provider_request_id TEXT,
            submitted_ms BIGINT NOT NULL DEFAULT 0, repair TEXT,
            PRIMARY KEY (batch, custom_id, run, attempt))""",
        """INSERT INTO failures_v3 (batch, custom_id, run, attempt, request_id, layer, code, message, http_status,
                retry_after_ms, terminal, resolved, model, first_failed_at, failed_at, url, body, metadata,
                provider_body, provider_request_id, submitted_ms, repair)
            SELECT batch, custom_id, 0, attempt, request_id, layer, code, message, http_status,
                retry_after_ms, terminal, resolved, model, first_failed_at, failed_at, url, body, metadata,
                provider_body, provider_request_id, submitted_ms, repair
            FROM failures""",
        "DROP TABLE failures",
        "ALTER TABLE failures_v3 RENAME TO failures",
        "CREATE INDEX failures_by_code ON failures (batch, layer, code)",
        # as in version 1, but a later run's failure wins a tie of failed_at over an earlier run's
        """CREATE VIEW requests AS
            SELECT batch, custom_id, 'succeeded' AS status, attempt AS attempts, model,
                   CAST(NULL AS TEXT) AS layer, CAST(NULL AS TEXT) AS code, CAST(NULL AS TEXT) AS message,
                   finished_at AS ended_at
            FROM results
            UNION ALL
            SELECT batch, custom_id, CASE WHEN terminal THEN 'failed' ELSE 'retrying' END, attempt, model,
                   layer, code, message, failed_at
            FROM (SELECT f.*, ROW_NUMBER() OVER (PARTITION BY batch, custom_id
                                                 ORDER BY failed_at DESC, run DESC, attempt DESC) AS latest
                  FROM failures f) ranked
            WHERE latest = 1 AND NOT EXISTS (
                SELECT 1 FROM results r WHERE r.batch = ranked.batch AND r.custom_id = ranked.custom_id)""",
    )),
    # a record whose row cannot be made or written is set aside here, so the sink commits past it
    Migration(4, "rejected_rows: records set aside, with the reason, so one row never stops the sink", (
        """CREATE TABLE rejected_rows (
            topic TEXT NOT NULL, kafka_partition INTEGER NOT NULL, kafka_offset BIGINT NOT NULL,
            request_id TEXT, reason TEXT NOT NULL, rejected_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
            PRIMARY KEY (topic, kafka_partition, kafka_offset))""",
    )),
    # the deployment of the model list (STREAMPROC_MODELS_FILE) that answered; rows from before read NULL
    Migration(5, "results keep the deployment of the model list that answered", (
        "ALTER TABLE results ADD COLUMN deployment TEXT",
    )),
    # the deployment of the model list a failed call was made to; rows from before read NULL
    Migration(6, "failures keep the deployment of the model list the failed call was made to", (
        "ALTER TABLE failures ADD COLUMN deployment TEXT",
    )),
    # the request's tenant and priority (design §3), so SQL can group by tenant; rows from before were all the
    # default tenant's at normal priority (they were written before requests had either)
    Migration(7, "results and failures keep the request's tenant and priority", (
        "ALTER TABLE results ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'",
        "ALTER TABLE results ADD COLUMN priority TEXT NOT NULL DEFAULT 'normal'",
        "ALTER TABLE failures ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'",
        "ALTER TABLE failures ADD COLUMN priority TEXT NOT NULL DEFAULT 'normal'",
    )),
)


class SchemaTooNewError(UserFacingError):
    """The database was migrated by a newer streamproc."""


def pending(applied: int, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[Migration]:
    """The migrations to apply on a database at version ``applied``, in order."""
    latest = migrations[-1].version if migrations else 0
    if applied > latest:
        raise SchemaTooNewError(f"the database's schema is at version {applied}, this streamproc knows up to "
                                f"{latest}: write to it with a newer streamproc")
    return [migration for migration in migrations if migration.version > applied]


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"


# the first result of a request stays (a crash can make a second one; the export keeps the first too)
INSERT_RESULT = _insert("results", ResultRow._fields) + " ON CONFLICT (batch, custom_id) DO NOTHING"
FAILURE_KEY = ("batch", "custom_id", "run", "attempt")  # the primary key of failures (migration 3)
# a redelivered attempt rewrites its row; an older copy never replaces a newer one. ``resolved`` is kept.
UPSERT_FAILURE = (_insert("failures", FailureRow._fields) + f" ON CONFLICT ({', '.join(FAILURE_KEY)}) DO UPDATE SET "
                  + ", ".join(f"{column} = excluded.{column}" for column in FailureRow._fields
                              if column not in FAILURE_KEY)
                  + " WHERE excluded.failed_at >= failures.failed_at")
INSERT_DEAD_LETTER = _insert("dead_letters", DeadLetterRow._fields) + \
    " ON CONFLICT (kafka_partition, kafka_offset) DO NOTHING"
INSERT_REJECTED = _insert("rejected_rows", RejectedRow._fields) + \
    " ON CONFLICT (topic, kafka_partition, kafka_offset) DO NOTHING"
# a request with a result has every failure row resolved, whichever was written first
RESOLVE = """UPDATE failures SET resolved = TRUE
    WHERE batch = ? AND custom_id = ? AND NOT resolved
      AND EXISTS (SELECT 1 FROM results r WHERE r.batch = failures.batch AND r.custom_id = failures.custom_id)"""


def placeholders(statement: str, style: str) -> str:
    """``statement`` with its ``?`` placeholders in the driver's style (the statements hold no other ``?``)."""
    return statement if style == "?" else statement.replace("?", style)
