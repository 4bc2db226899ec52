"""The user's commands end to end, run as a user runs them: submit, status, results, backfill."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streamproc import codec
from streamproc.core.events import InferenceResult
from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, produce, start_mock, worker_env

pytestmark = pytest.mark.integration


def cli(settings: Settings, *args: str, llm_url: str = "", **extra: str) -> subprocess.CompletedProcess[str]:
    """``streamproc *args`` on the test's deployment; ``extra``: more settings, as ``worker_env`` takes them."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("STREAMPROC_")}
    env.update({"STREAMPROC_KAFKA_BOOTSTRAP": str(settings.kafka_bootstrap),
                "STREAMPROC_TOPIC_PREFIX": settings.topic_prefix, "STREAMPROC_APP_ID": settings.app_id,
                "STREAMPROC_RETRY_TIERS": settings.retry_tiers, "STREAMPROC_DATA_DIR": str(settings.data_dir),
                "STREAMPROC_LLM_TIMEOUT_S": "5"})
    if llm_url:
        env["STREAMPROC_LLM_BASE_URL"] = llm_url
    env.update({f"STREAMPROC_{key.upper()}": value for key, value in extra.items()})
    return subprocess.run([sys.executable, "-m", "streamproc", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def batch_file(path: Path, count: int, prefix: str = "c") -> Path:
    """Half OpenAI Batch form, half the simple form."""
    with open(path, "w") as out:
        for i in range(count):
            if i % 2:
                line: dict[str, Any] = {"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                        "body": {"model": "mock-small", "max_tokens": 200,
                                                 "messages": [{"role": "user", "content": f"Question {i}?"}]}}
            else:
                line = {"id": f"{prefix}-{i}", "prompt": f"Question {i}?", "max_tokens": 200}
            out.write(json.dumps(line) + "\n")
    return path


def status_of(settings: Settings, batch_id: str) -> dict[str, Any]:
    result = cli(settings, "status", "--batch-id", batch_id, "--json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def wait_converged(settings: Settings, batch_id: str, timeout_s: float, worker: WorkerProcess) -> list[dict[str, Any]]:
    """Poll ``status --json`` until converged; every poll's counts must add up to ``submitted``."""
    polls = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and worker.alive():
        current = status_of(settings, batch_id)
        polls.append(current)
        parts = (current["succeeded"] + sum(current["failed"].values()) + current["retrying"]
                 + current["in_flight"] + current["pending"])
        assert parts == current["submitted"], current
        if current["converged"]:
            return polls
        time.sleep(1)
    raise AssertionError(f"batch {batch_id} did not converge: {polls[-1:]}\n{worker.log_tail()}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_invalid_file_is_rejected_with_line_numbers_and_nothing_is_sent(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        json.dumps({"id": "ok-1", "prompt": "fine"}),
        "{not json",
        json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a"}}),
        json.dumps({"id": "ok-1", "prompt": "again"}),
        json.dumps({"prompt": "no id"}),
    ]) + "\n")
    result = cli(settings, "submit", str(path), "--batch-id", "bad")
    assert result.returncode != 0
    for expected in ("4 invalid line(s); nothing was sent", "line 2", "line 3 (custom_id 'x')",
                     "/v1/embeddings", "line 4 (custom_id 'ok-1'): duplicate custom_id 'ok-1' (first on line 1)",
                     "line 5"):
        assert expected in result.stderr, (expected, result.stderr)
    assert "Traceback" not in result.stderr
    assert status_of_missing(settings)  # no manifest, no request: nothing was sent


def status_of_missing(settings: Settings) -> bool:
    result = cli(settings, "status", "--batch-id", "bad")
    return result.returncode != 0 and "no batch 'bad'" in result.stderr


def test_submit_status_results_end_to_end(settings: Settings, tmp_path: Path) -> None:
    mock = start_mock("clean", 9, "--latency", "0.2")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    worker.start()
    try:
        submitted = cli(settings, "submit", str(batch_file(tmp_path / "in.jsonl", 120)), "--batch-id", "e2e")
        assert submitted.returncode == 0, submitted.stderr
        assert "batch e2e: 120 requests submitted" in submitted.stdout
        again = cli(settings, "submit", str(tmp_path / "in.jsonl"), "--batch-id", "e2e")
        assert again.returncode != 0 and "already submitted" in again.stderr
        polls = wait_converged(settings, "e2e", 120, worker)
    finally:
        worker.stop()
        mock.stop()
    assert polls[-1]["succeeded"] == 120 and polls[-1]["submitted"] == 120
    # a duplicate result on the topic (as a crash between result and state can leave) is exported once
    assert settings.kafka_bootstrap is not None
    duplicate = InferenceResult("e2e/c-1", "e2e", "mock-small", "{}", "dup", 1, 1, 1, "h")  # keyed (batch, custom_id)
    asyncio.run(produce(settings.kafka_bootstrap, settings.topology().results,
                        [(b"e2e/c-1", codec.encode(duplicate))]))
    exported = cli(settings, "results", "--batch-id", "e2e", "--output", str(tmp_path / "out.jsonl"),
                   "--errors", str(tmp_path / "err.jsonl"))
    assert exported.returncode == 0, exported.stderr
    lines = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(line["custom_id"] for line in lines) == sorted(f"c-{i}" for i in range(120))
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in lines)
    assert next(line for line in lines if line["custom_id"] == "c-1")["response"]["body"] != {}  # first wins
    assert read_jsonl(tmp_path / "err.jsonl") == []


def test_outage_then_backfill_recovers_every_failure(settings: Settings, tmp_path: Path) -> None:
    """An outage exhausts the retries of the requests caught in it; backfill replays them, the batch ends
    with one result per custom_id, and ids that had succeeded are not called again."""
    mock = start_mock("clean", 10, "--latency", "0.5")
    # the breaker and the retry budget off: with them, the outage's requests would wait in a retry tier, or
    # (the replays too, while the outage lasts) fail at their first attempt, instead of spending their retries
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", in_flight="8", breaker_enabled="false",
                                      retry_budget_ratio="100"), tmp_path / "w.log")
    worker.start()
    try:
        assert cli(settings, "submit", str(batch_file(tmp_path / "in.jsonl", 400, "o")), "--batch-id",
                   "outage").returncode == 0
        deadline = time.monotonic() + 60
        while mock.stats()["calls"] < 80:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # an outage without end until the batch has converged: every request caught in it spends its retries,
        # however slowly a loaded machine moves them through the tiers (a 40 s outage did not always outlast them)
        mock.post("/control/outage", {"on": True})
        first = wait_converged(settings, "outage", 180, worker)[-1]
        mock.post("/control/outage", {"on": False})
        assert first["failed"]["service"] > 0, first  # the outage really burnt requests
        calls_before = {i: e["calls"] for i, e in mock.stats(detail=True)["per_request_id"].items()}
        succeeded_before = {i for i, e in mock.stats(detail=True)["per_request_id"].items() if "ok" in e["outcomes"]}

        plan = cli(settings, "backfill", "--batch-id", "outage", "--dry-run", "--json")
        assert plan.returncode == 0, plan.stderr
        planned = json.loads(plan.stdout)
        assert planned["to_replay"] == first["failed"]["service"] + first["failed"]["transport"]
        assert planned["dry_run"] is True
        replayed = cli(settings, "backfill", "--batch-id", "outage", "--rate", "200")
        assert replayed.returncode == 0, replayed.stderr
        assert f"replayed {planned['to_replay']} requests" in replayed.stdout
        final = wait_converged(settings, "outage", 180, worker)[-1]
        again = cli(settings, "backfill", "--batch-id", "outage", "--json")  # idempotent: nothing left to do
        assert json.loads(again.stdout)["to_replay"] == 0
        calls_after = {i: e["calls"] for i, e in mock.stats(detail=True)["per_request_id"].items()}
    finally:
        worker.stop()
        mock.stop()
    assert final["succeeded"] == 400, final
    assert all(calls_after[i] == calls_before[i] for i in succeeded_before)
    exported = cli(settings, "results", "--batch-id", "outage", "--output", str(tmp_path / "out.jsonl"))
    assert exported.returncode == 0, exported.stderr
    lines = read_jsonl(tmp_path / "out.jsonl")
    assert len(lines) == 400 and len({line["custom_id"] for line in lines}) == 400


def test_run_command_submits_follows_and_exports(settings: Settings, tmp_path: Path) -> None:
    """`run` with a configured broker and --mock-llm: it starts a worker and the mock server (loudly)."""
    path = batch_file(tmp_path / "in.jsonl", 150, "r")
    result = cli(settings, "run", str(path), "--output", str(tmp_path / "out.jsonl"), "--errors",
                 str(tmp_path / "err.jsonl"), "--batch-id", "run1", "--workers", "1", "--timeout", "240",
                 "--mock-llm", "realistic")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MOCK LLM server" in result.stderr
    assert "batch run1 converged" in result.stdout and "LLM calls spent" in result.stdout
    outputs, errors = read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "err.jsonl")
    ids = [line["custom_id"] for line in outputs + errors]
    assert sorted(ids) == sorted(f"r-{i}" for i in range(150))  # exactly one line per custom_id
    assert f"results: {tmp_path / 'out.jsonl'} ({len(outputs)} lines)" in result.stdout
