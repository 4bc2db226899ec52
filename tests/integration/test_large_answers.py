"""An answer too large for a Kafka record (the mock's huge_answer: 2 MiB of content) ends as the terminal business
failure ``response_too_large`` with a bounded copy of the answer in the export, called once; the worker keeps
going and the batch converges."""

from __future__ import annotations

import json
from pathlib import Path

from openai.types.chat import ChatCompletion

from streamproc.core.record_size import RECORD_BYTES
from streamproc.llm.provider_answer import KEPT_BODY_BYTES
from streamproc.settings import Settings
from tests.batch_lines import parse_openai_line
from tests.integration.pipeline import WorkerProcess, start_mock, worker_env
from tests.integration.test_operations import cli, wait_converged

HUGE = 3
NORMAL = 40
HUGE_BYTES = 2 * 1024 * 1024  # the mock's huge_answer_bytes


def write_batch(path: Path) -> None:
    """The huge answers come first, so every normal request is handled after them. No max_tokens: a real model
    given none answers as long as it likes."""
    lines = [{"custom_id": f"huge-{i}", "body": {"model": "mock-small", "messages": [
                 {"role": "user", "content": f"Write out everything about item {i} [mock:huge_answer]"}]}}
             for i in range(HUGE)]
    lines += [{"custom_id": f"n-{i}", "body": {"model": "mock-small", "max_tokens": 64, "messages": [
                  {"role": "user", "content": f"Label item {i}."}]}} for i in range(NORMAL)]
    path.write_text("".join(json.dumps({"method": "POST", "url": "/v1/chat/completions", **line}) + "\n"
                            for line in lines))


def test_an_answer_too_large_for_a_record_ends_as_response_too_large_with_its_copy_exported(
        settings: Settings, tmp_path: Path) -> None:
    write_batch(tmp_path / "in.jsonl")
    mock = start_mock("clean")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", llm_hedge_ratio="0"), tmp_path / "w.log")
    worker.start()
    try:
        submitted = cli(settings, "submit", str(tmp_path / "in.jsonl"), "--batch-id", "big")
        assert submitted.returncode == 0, submitted.stderr
        final = wait_converged(settings, "big", 180, worker)[-1]
        exported = cli(settings, "results", "--batch-id", "big", "--output", str(tmp_path / "results.jsonl"),
                       "--errors", str(tmp_path / "errors.jsonl"))
        calls = mock.stats()["by_outcome"]
        alive = worker.alive()
    finally:
        worker.stop()
        mock.stop()

    assert alive, worker.log_tail()  # it kept going: nothing held, nothing stuck
    assert (final["succeeded"], final["failed"]["business"], sum(final["failed"].values())) == (NORMAL, HUGE, HUGE)
    assert final["usage"]["completion_tokens"] >= HUGE * HUGE_BYTES // 4  # the paid answers count
    assert calls == {"huge_answer": HUGE, "ok": NORMAL}  # each called once: never retried
    assert exported.returncode == 0, exported.stderr
    results = [parse_openai_line(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    raw_errors = (tmp_path / "errors.jsonl").read_text().splitlines()
    errors = [parse_openai_line(line) for line in raw_errors]
    assert sorted(line.custom_id for line, _ in results) == sorted(f"n-{i}" for i in range(NORMAL))
    assert sorted(line.custom_id for line, _ in errors) == [f"huge-{i}" for i in range(HUGE)]
    for raw, (line, body) in zip(raw_errors, errors, strict=True):
        assert len(raw.encode()) < KEPT_BODY_BYTES + 8 * 1024  # the bounded copy, not the 2 MiB answer
        assert line.error is not None and line.error.code == "response_too_large"
        assert f"request 'big/{line.custom_id}' is " in (line.error.message or "")
        assert f"more than the {RECORD_BYTES:,} a Kafka record may carry" in (line.error.message or "")
        assert line.response is not None and line.response.status_code == 200  # the provider's status
        assert isinstance(body, ChatCompletion) and body.usage is not None
        assert body.usage.completion_tokens == HUGE_BYTES // 4  # the usage, whole
        content = body.choices[0].message.content
        assert content is not None and content.endswith(f"[cut: {HUGE_BYTES} bytes in all]")
        assert content.startswith("[") and len(content) > KEPT_BODY_BYTES // 2  # the answer's head, kept
        assert line.streamproc is not None and line.streamproc["layer"] == "business"
