"""``--reuse-results`` on the real broker with two workers: a corrected re-run of a converged batch calls the LLM
only for what did not succeed before (the mock's ``/stats`` counts the calls), the reused answers are exported
as the earlier ones and marked, ``status`` counts them, and nothing is reused without the opt-in. The batches'
OpenAI status and times are checked on the way, and the results' batch summary."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from streamproc.settings import Settings
from tests.integration.pipeline import MockServer, WorkerProcess, start_mock, worker_env
from tests.integration.test_operations import cli, read_jsonl, status_of

pytestmark = pytest.mark.integration

COUNT = 30
BROKEN = {i for i in range(COUNT) if i % 5 == 4}  # max_tokens beyond mock-small's 4,096-token window
TWINS = {"twin-0": 0, "twin-1": 1}  # other custom_ids asking exactly what c-0 and c-1 asked


def line(custom_id: str, i: int, max_tokens: int) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "mock-small", "max_tokens": max_tokens,
                                "messages": [{"role": "user", "content": f"Summarise item {i}."}]}})


def first_file(path: Path) -> Path:
    path.write_text("".join(line(f"c-{i}", i, 5_000 if i in BROKEN else 200) + "\n" for i in range(COUNT)))
    return path


def corrected_file(path: Path) -> Path:
    """The same requests with the broken ones fixed, and two twins of requests that succeeded."""
    lines = [line(f"c-{i}", i, 200) for i in range(COUNT)] + [line(name, i, 200) for name, i in TWINS.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def converge(settings: Settings, batch_id: str, workers: list[WorkerProcess]) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    document: dict[str, Any] = {}
    while time.monotonic() < deadline and all(worker.alive() for worker in workers):
        document = status_of(settings, batch_id)
        if document["converged"]:
            return document
        time.sleep(1)
    logs = "\n".join(worker.log_tail() for worker in workers)
    raise AssertionError(f"batch {batch_id} did not converge: {document}\n{logs}")


def submit_and_converge(settings: Settings, path: Path, batch_id: str, mock: MockServer,
                        workers: list[WorkerProcess], *flags: str) -> tuple[dict[str, Any], int]:
    """The batch's final status and the LLM calls it cost."""
    before = mock.stats()["calls"]
    submitted = cli(settings, "submit", str(path), "--batch-id", batch_id, *flags)
    assert submitted.returncode == 0, submitted.stderr
    final = converge(settings, batch_id, workers)
    return final, mock.stats()["calls"] - before


def export(settings: Settings, batch_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    output = tmp_path / f"{batch_id}.out.jsonl"
    done = cli(settings, "results", "--batch-id", batch_id, "--output", str(output), "--errors",
               str(tmp_path / f"{batch_id}.err.jsonl"))
    assert done.returncode == 0, done.stderr
    return {entry["custom_id"]: entry for entry in read_jsonl(output)}


def test_a_corrected_rerun_calls_only_what_did_not_succeed_and_reuses_the_rest(settings: Settings,
                                                                              tmp_path: Path) -> None:
    mock = start_mock("clean", 3, "--latency", "0.05")
    workers = [WorkerProcess(worker_env(settings, mock.url, tmp_path / f"w{n}", in_flight="8",
                                        adaptive_initial_in_flight="8", llm_hedge_ratio="0"),
                             tmp_path / f"w{n}.log") for n in (1, 2)]
    for worker in workers:
        worker.start()
    try:
        first, first_calls = submit_and_converge(settings, first_file(tmp_path / "a.jsonl"), "first", mock, workers)
        corrected = corrected_file(tmp_path / "b.jsonl")
        rerun, rerun_calls = submit_and_converge(settings, corrected, "rerun", mock, workers, "--reuse-results")
        again, again_calls = submit_and_converge(settings, corrected, "again", mock, workers, "--reuse-results")
        fresh, fresh_calls = submit_and_converge(settings, corrected, "fresh", mock, workers)
        exported = {batch_id: export(settings, batch_id, tmp_path) for batch_id in ("first", "rerun")}
        listed = {entry["id"]: entry for entry in json.loads(cli(settings, "batches", "--json").stdout)["data"]}
        summarised = cli(settings, "results", "--batch-id", "rerun", "--output", str(tmp_path / "again.jsonl"),
                         "--summary", str(tmp_path / "summary.json"))
    finally:
        for worker in workers:
            worker.stop()
        mock.stop()

    succeeded_before = COUNT - len(BROKEN)
    assert (first["succeeded"], first["failed"]["business"], first["reused"]) == (succeeded_before, len(BROKEN), 0)
    assert first_calls >= succeeded_before
    # the corrected re-run: only the fixed requests are called; the unchanged ones and the twins are reused
    assert rerun_calls == len(BROKEN), (rerun_calls, rerun)
    assert (rerun["succeeded"], rerun["reused"]) == (COUNT + len(TWINS), succeeded_before + len(TWINS)), rerun
    assert again_calls == 0 and again["reused"] == COUNT + len(TWINS)  # now everything was answered before
    assert fresh_calls == COUNT + len(TWINS) and fresh["reused"] == 0  # no opt-in, no reuse
    # reused answers spent no tokens; the called ones did
    assert rerun["usage"]["completion_tokens"] > 0 and again["usage"]["total_tokens"] == 0

    lines = exported["rerun"]
    assert len(lines) == COUNT + len(TWINS)
    for i in range(COUNT):
        reused = lines[f"c-{i}"].get("streamproc", {}).get("reused_from")
        if i in BROKEN:
            assert reused is None
        else:
            assert reused == f"first/c-{i}"
            assert lines[f"c-{i}"]["response"]["body"] == exported["first"][f"c-{i}"]["response"]["body"]
    for name, i in TWINS.items():
        assert lines[name]["response"]["body"] == exported["first"][f"c-{i}"]["response"]["body"]

    # OpenAI's status and times, in status --json and batches --json alike
    for document in (rerun, listed["rerun"]):
        assert document["status"] == "completed"
        assert document["created_at"] <= document["in_progress_at"] <= document["completed_at"], document
        assert document["cancelled_at"] is None and document["expired_at"] is None
    assert listed["rerun"]["completed_at"] == rerun["completed_at"]
    # the results' batch summary: the same batch object
    assert summarised.returncode == 0, summarised.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == listed["rerun"]
    assert summary["request_counts"] == {"total": COUNT + len(TWINS), "completed": COUNT + len(TWINS), "failed": 0}
    assert summary["usage"] == rerun["usage"]
