"""``streamproc cancel`` end to end: requests not called yet end batch_cancelled, calls in flight finish, the
batch converges as cancelled and its export has one line per request."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from streamproc.app.manifest_follower import FOLLOW_INTERVAL_S
from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, start_mock, worker_env
from tests.integration.test_operations import batch_file, cli, status_of, wait_converged

pytestmark = [pytest.mark.integration, pytest.mark.serial]

IN_FLIGHT = 4
LATENCY_S = 0.5


def test_cancel_ends_what_was_not_called_and_the_batch_converges(settings: Settings, tmp_path: Path) -> None:
    path = batch_file(tmp_path / "in.jsonl", 300)
    assert cli(settings, "submit", str(path), "--batch-id", "doomed").returncode == 0
    mock = start_mock("clean", 5, "--latency", str(LATENCY_S))
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", in_flight=str(IN_FLIGHT),
                                      adaptive_initial_in_flight=str(IN_FLIGHT), llm_hedge_ratio="0"),
                           tmp_path / "worker.log")
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while mock.stats()["calls"] < 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        cancelled = cli(settings, "cancel", "--batch-id", "doomed")
        calls_at_cancel = mock.stats()["calls"]
        assert cancelled.returncode == 0, cancelled.stderr
        assert "batch doomed cancelled at" in cancelled.stdout
        final = wait_converged(settings, "doomed", 120, worker)[-1]
        calls_after = mock.stats()["calls"]
        listed = json.loads(cli(settings, "batches", "--json").stdout)
        exported = cli(settings, "results", "--batch-id", "doomed", "--output", str(tmp_path / "out.jsonl"),
                       "--errors", str(tmp_path / "errors.jsonl"))
    finally:
        worker.stop()
        mock.stop()
    assert final["converged"] and final["cancelled_at"] is not None, final
    # the calls in flight finish; the worker learns of the cancel within one poll of the manifests
    rate = IN_FLIGHT / LATENCY_S
    assert calls_after - calls_at_cancel <= IN_FLIGHT + rate * (FOLLOW_INTERVAL_S + 1), (calls_at_cancel, calls_after)
    assert final["succeeded"] == calls_after  # every call made was answered: a clean server
    usage = final["usage"]  # the results' tokens, as the mock counted them
    assert set(usage["by_model"]) == {"mock-small"} and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert final["failed"]["business"] == 300 - calls_after  # the rest were never called
    [entry] = [batch for batch in listed["data"] if batch["id"] == "doomed"]
    assert entry["status"] == "cancelled"
    assert exported.returncode == 0, exported.stderr
    results = (tmp_path / "out.jsonl").read_text().splitlines()
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert len(results) + len(errors) == 300
    assert {error["error"]["code"] for error in errors} == {"batch_cancelled"}, errors[:2]
    assert status_of(settings, "doomed")["cancelled_at"] == final["cancelled_at"]


def test_cancel_of_an_unknown_batch_is_one_clear_line(settings: Settings) -> None:
    result = cli(settings, "cancel", "--batch-id", "never-submitted")
    assert result.returncode != 0
    assert "no manifest for batch 'never-submitted'" in result.stderr
    assert "Traceback" not in result.stderr


def test_requests_not_called_within_the_completion_window_end_batch_expired(settings: Settings,
                                                                            tmp_path: Path) -> None:
    path = batch_file(tmp_path / "in.jsonl", 120)
    submitted = cli(settings, "submit", str(path), "--batch-id", "hurried", "--completion-window", "4s")
    assert submitted.returncode == 0, submitted.stderr
    mock = start_mock("clean", 5, "--latency", str(LATENCY_S))
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", in_flight=str(IN_FLIGHT),
                                      adaptive_initial_in_flight=str(IN_FLIGHT), llm_hedge_ratio="0"),
                           tmp_path / "worker.log")
    worker.start()
    try:
        final = wait_converged(settings, "hurried", 120, worker)[-1]
        calls = mock.stats()["calls"]
        listed = json.loads(cli(settings, "batches", "--json").stdout)
    finally:
        worker.stop()
        mock.stop()
    assert final["expires_at"] is not None and final["succeeded"] == calls
    assert final["failed"]["business"] == 120 - calls > 0, final  # 120 calls take 15 s at 8 calls/s
    [entry] = [batch for batch in listed["data"] if batch["id"] == "hurried"]
    assert entry["status"] == "expired"


def test_a_completion_window_that_is_not_a_duration_is_refused(settings: Settings, tmp_path: Path) -> None:
    path = batch_file(tmp_path / "in.jsonl", 2)
    result = cli(settings, "submit", str(path), "--batch-id", "x", "--completion-window", "tomorrow")
    assert result.returncode == 2 and "is not a duration such as 24h" in result.stderr
