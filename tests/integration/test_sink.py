"""``streamproc sink`` on the real broker, into SQLite and a throwaway PostgreSQL: a realistic batch with a
SIGKILL of the worker and one of the sink, and a backfill after an outage."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from streamproc.core.identity import custom_id_of
from streamproc.devstack.postgres import ThrowawayPostgres
from streamproc.processes import stop_process
from streamproc.settings import Settings
from streamproc.sink.target import PostgresTarget
from tests.integration.pipeline import (
    OutcomeReader,
    Outcomes,
    WorkerProcess,
    chat_request,
    produce_requests,
    start_mock,
    worker_env,
)
from tests.integration.sink_database import Database
from tests.integration.test_operations import batch_file, cli, wait_converged
from tests.unit.sink.readme import readme_queries
from tests.unit.sink.version2 import check_upgrade, create_version_2

pytestmark = pytest.mark.integration


@dataclass
class SinkProcess:
    """``streamproc sink --to URL`` as a child process, following until stopped."""

    env: dict[str, str]
    url: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "streamproc", "sink", "--to", self.url],
                                            env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(10) == -signal.SIGKILL

    def stop(self) -> int | None:
        return None if self.process is None else stop_process(self.process, 30)

    def drain(self) -> str:
        """A second sink in the same group, ``--until-idle``: what is left, then exit 0."""
        done = subprocess.run([sys.executable, "-m", "streamproc", "sink", "--to", self.url, "--until-idle"],
                              env=self.env, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


async def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


def sink_env(settings: Settings, llm_url: str, tmp_path: Path) -> dict[str, str]:
    return worker_env(settings, llm_url, tmp_path / "sink-data")


def assert_database_matches(database: Database, outcomes: Outcomes, ids: list[str]) -> None:
    """Exactly one results row per succeeded request, one row per failed attempt, one latest outcome each."""
    succeeded = {custom_id_of(request_id, "b1") for request_id in ids if outcomes.results.get(request_id)}
    failed = {custom_id_of(request_id, "b1") for request_id in ids if outcomes.terminal(request_id)}
    attempts = {(custom_id_of(event.request.request_id, "b1"), event.run, event.attempt)
                for events in outcomes.failures.values() for event in events}
    assert database.count("SELECT COUNT(*) FROM results") == len(succeeded)
    assert {row[0] for row in database.query("SELECT custom_id FROM results WHERE batch = 'b1'")} == succeeded
    assert database.count("SELECT COUNT(*) FROM requests") == len(ids)
    statuses = dict(database.query("SELECT custom_id, status FROM requests"))
    assert statuses == {**dict.fromkeys(failed - succeeded, "failed"), **dict.fromkeys(succeeded, "succeeded")}
    assert set(database.query("SELECT custom_id, run, attempt FROM failures")) == attempts
    # resolved exactly when the request has a result
    for custom_id, resolved in database.query("SELECT custom_id, resolved FROM failures"):
        assert bool(resolved) == (custom_id in succeeded), custom_id


async def test_a_batch_with_a_killed_worker_and_a_killed_sink(settings: Settings, database: Database,
                                                              tmp_path: Path) -> None:
    """A realistic batch (failures on every layer); SIGKILL the worker, then the sink, mid-way; restart both.
    The database holds exactly one results row per succeeded request and one latest outcome per request."""
    assert settings.kafka_bootstrap is not None
    mock = start_mock("realistic", 15)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    sink = SinkProcess(sink_env(settings, mock.url, tmp_path), database.url, tmp_path / "sink.log")
    requests = [chat_request(f"s-{i}", i, json_schema=i % 3 == 0) for i in range(800)]
    ids = [r.request_id for r in requests]
    try:
        worker.start()
        sink.start()
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        await wait_for(lambda: mock.stats()["calls"] >= 200, 120, "200 calls")
        worker.signal(signal.SIGKILL)
        assert worker.process is not None and worker.process.wait(10) == -signal.SIGKILL
        worker.start()
        await wait_for(lambda: database.count("SELECT COUNT(*) FROM results") >= 300, 120, "300 results rows")
        sink.kill()
        rows_at_kill = database.count("SELECT COUNT(*) FROM results")
        sink.start()
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 300, worker)
        assert not outcomes.unfinished(ids), worker.log_tail()
        assert sink.stop() == 0, sink.log_path.read_text()[-3000:]  # SIGTERM: ends its transaction, exits 0
        drained = sink.drain()
    finally:
        worker.stop()
        sink.stop()
        mock.stop()
    duplicates = sum(len(results) - 1 for results in outcomes.results.values())
    print(f"{database.url.split(':')[0]}: results rows at the sink's kill {rows_at_kill}, duplicated results on "
          f"the topic {duplicates}; drain: {drained.strip().splitlines()[-1]}")
    assert 0 < rows_at_kill < len(ids)
    assert "sink: idle" in drained
    assert any(outcomes.terminal(i) for i in ids) and any(outcomes.failures.values())  # failures were sunk too
    assert_database_matches(database, outcomes, ids)
    for query in readme_queries("b1"):  # the README's examples run as they are on both databases
        assert database.query(query), query


def backfill(settings: Settings, *args: str) -> dict[str, Any]:
    """``backfill --batch-id outage ARGS --json``: its plan and what it replayed."""
    done = cli(settings, "backfill", "--batch-id", "outage", "--json", *args)
    assert done.returncode == 0, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


@pytest.mark.parametrize("source", ["topics", "database"])
async def test_backfill_after_an_outage_resolves_the_failure_rows(settings: Settings, database: Database, source: str,
                                                                  tmp_path: Path) -> None:
    """An outage burns some requests' retries; the sink follows throughout. Backfill plans the same from the
    failure topics and, with ``--from-db``, from the sink's database; after it replays from ``source``, the
    replayed requests' failure rows are resolved, the view shows their new outcome, and no row is doubled."""
    mock = start_mock("clean", 10, "--latency", "0.5")
    # as in test_operations: no breaker and no retry budget, so the outage's requests spend their retries
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", in_flight="8", breaker_enabled="false",
                                      retry_budget_ratio="100"), tmp_path / "worker.log")
    sink = SinkProcess(sink_env(settings, mock.url, tmp_path), database.url, tmp_path / "sink.log")

    def view(sql: str) -> int:
        return database.count(f"SELECT COUNT(*) FROM requests WHERE batch = 'outage' AND {sql}")

    try:
        worker.start()
        sink.start()
        assert cli(settings, "submit", str(batch_file(tmp_path / "in.jsonl", 200, "o")), "--batch-id",
                   "outage").returncode == 0
        await wait_for(lambda: mock.stats()["calls"] >= 40, 60, "40 calls")
        mock.post("/control/outage", {"on": True})  # until the batch has converged: as in test_operations
        first = wait_converged(settings, "outage", 180, worker)[-1]
        mock.post("/control/outage", {"on": False})
        await wait_for(lambda: view("status <> 'retrying'") == 200, 60, "the view to show every first outcome")
        failed_first = {row[0] for row in database.query(
            "SELECT custom_id FROM requests WHERE batch = 'outage' AND status = 'failed'")}
        assert len(failed_first) == first["failed"]["service"] + first["failed"]["transport"] > 0, first
        assert database.count("SELECT COUNT(*) FROM failures WHERE resolved") == 0
        from_db = ("--from-db", database.url)
        planned = backfill(settings, "--dry-run")
        assert backfill(settings, "--dry-run", *from_db) == planned
        assert (planned["to_replay"], planned["to_skip"], planned["replayed"]) == (len(failed_first), 0, 0)
        replayed = backfill(settings, "--rate", "200", *(from_db if source == "database" else ()))
        assert replayed["replayed"] == len(failed_first)
        assert wait_converged(settings, "outage", 180, worker)[-1]["succeeded"] == 200
        await wait_for(lambda: view("status = 'succeeded'") == 200, 60, "the view to show the replays' results")
        # the resolved rows are what a topic backfill skips as succeeded since
        again = backfill(settings, "--dry-run", *from_db)
        assert again == backfill(settings, "--dry-run")
        assert (again["to_replay"], again["to_skip"]) == (0, len(failed_first))
        assert sink.stop() == 0
        sink.drain()
    finally:
        worker.stop()
        sink.stop()
        mock.stop()
    assert database.count("SELECT COUNT(*) FROM results WHERE batch = 'outage'") == 200
    assert view("1 = 1") == 200
    assert {row[0] for row in database.query("SELECT DISTINCT custom_id FROM failures WHERE terminal")} == failed_first
    # the first run's ends are kept beside the replay's rows (whose attempts restart at 1)
    assert {row[0] for row in database.query("SELECT custom_id FROM failures WHERE terminal AND run = 1")} == \
        failed_first
    assert database.count("SELECT COUNT(*) FROM failures WHERE NOT resolved") == 0
    unresolved_query = readme_queries("outage")[1]
    assert database.query(unresolved_query) == []


def test_a_version_2_database_on_postgresql_upgrades_keeping_its_failures_as_run_0() -> None:
    """Migration 3 rebuilds the failures table with SQL both databases run (SQLite: tests/unit/sink)."""
    with ThrowawayPostgres() as server, psycopg.connect(server.url, autocommit=True) as connection:
        create_version_2(connection.execute)
        check_upgrade(PostgresTarget(server.url), lambda sql: connection.execute(sql).fetchall(),
                      "SELECT indexname FROM pg_indexes WHERE tablename = 'failures'")
