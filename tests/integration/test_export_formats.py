"""A realistic batch through the real broker, a worker and the mock server, exported in both formats: every line
parses with the providers' own types (openai, anthropic), a provider's error answer is in the errors file
exactly as the provider sent it, and an answer our checks rejected is kept with our verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from anthropic.types.messages import MessageBatchErroredResult, MessageBatchSucceededResult
from openai.types import ErrorObject
from openai.types.chat import ChatCompletion

from streamproc.settings import Settings
from tests.batch_lines import parse_anthropic_line, parse_openai_line
from tests.integration.pipeline import WorkerProcess, start_mock, worker_env
from tests.integration.test_operations import cli, wait_converged

REQUESTS = 160
TOO_LONG = 3  # prompts over mock-small's 4,096-token window: the mock answers context_length_exceeded
# per-content business faults (the same answer on every call), per-attempt semantic, service and transport ones
PROFILE = {"base": "clean", "latency": {"kind": "lognormal", "p50": 0.02, "p99": 0.1},
           "faults": {"invalid_request": 0.04, "content_policy": 0.04, "length": 0.25, "schema_mismatch": 0.1,
                      "rate_limit": 0.05, "server_error": 0.05, "reset": 0.08}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "label", "schema": {
    "type": "object", "required": ["label", "score"],
    "properties": {"label": {"type": "string"}, "score": {"type": "number"}}}}}


def request_body(i: int) -> dict[str, Any]:
    prompt = "lorem ipsum dolor " * 2_000 if i < TOO_LONG else f"Label item {i} of the export test."
    body: dict[str, Any] = {"model": "mock-small", "max_tokens": 64, "messages": [{"role": "user", "content": prompt}]}
    if i % 2:
        body["response_format"] = SCHEMA
    return body


def write_batch(path: Path) -> dict[str, dict[str, Any]]:
    bodies = {f"x-{i}": request_body(i) for i in range(REQUESTS)}
    path.write_text("".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                                        "body": body}) + "\n" for custom_id, body in bodies.items()))
    return bodies


def test_a_realistic_batch_exports_as_openai_and_anthropic_write_theirs(settings: Settings, tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    bodies = write_batch(tmp_path / "in.jsonl")
    mock = start_mock(str(profile), 11)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", llm_hedge_ratio="0"), tmp_path / "w.log")
    worker.start()
    try:
        submitted = cli(settings, "submit", str(tmp_path / "in.jsonl"), "--batch-id", "exp")
        assert submitted.returncode == 0, submitted.stderr
        final = wait_converged(settings, "exp", 240, worker)[-1]
        exported = cli(settings, "results", "--batch-id", "exp", "--output", str(tmp_path / "results.jsonl"),
                       "--errors", str(tmp_path / "errors.jsonl"))
        anthropic = cli(settings, "results", "--batch-id", "exp", "--format", "anthropic",
                        "--output", str(tmp_path / "anthropic.jsonl"))
        with httpx.Client(base_url=mock.url, timeout=10) as direct:  # what the provider answers, asked directly
            def provider_answer(custom_id: str) -> Any:
                return direct.post("/chat/completions", json=bodies[custom_id]).json()

            assert exported.returncode == 0, exported.stderr
            results = [parse_openai_line(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
            errors = [parse_openai_line(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
            # refused at the first call, so the body sent was the file's (a repair attempt sends another)
            business = {line.custom_id: provider_answer(line.custom_id) for line, _ in errors
                        if line.streamproc and line.streamproc["layer"] == "business"
                        and line.streamproc["attempts"] == 1 and line.response is not None}
    finally:
        worker.stop()
        mock.stop()

    assert final["converged"], final
    assert sorted(line.custom_id for line, _ in results + errors) == sorted(bodies)
    assert len(results) == final["succeeded"] and len(errors) == sum(final["failed"].values())
    for line, body in results:
        assert line.error is None and line.response is not None and line.response.status_code == 200
        assert isinstance(body, ChatCompletion)
        assert line.response.request_id is not None and line.response.request_id.startswith("req_")  # the mock's
    assert len({line.response.request_id for line, _ in results if line.response}) == len(results)

    # HTTP failures: the provider's status and body, verbatim (its message unchanged), and no error
    http = [(line, body) for line, body in errors if line.response is not None and line.response.status_code != 200]
    assert http, "the run had no HTTP failure"
    for line, body in http:
        assert line.error is None and isinstance(body, ErrorObject)
        assert line.streamproc is not None and "body_rebuilt" not in line.streamproc
        assert line.response is not None and (line.response.request_id or "").startswith("req_")
    too_long = [f"x-{i}" for i in range(TOO_LONG)]
    assert set(too_long) <= set(business)
    for custom_id, answer in business.items():
        [(line, body)] = [(line, body) for line, body in errors if line.custom_id == custom_id]
        assert line.response is not None and line.response.body == answer, custom_id
    context = [body for line, body in errors if line.custom_id in too_long]
    assert all(isinstance(body, ErrorObject) and body.code == "context_length_exceeded"
               and body.message.startswith("This model's maximum context length is 4096 tokens") for body in context)

    # answers our checks rejected: kept as the provider's 200 completion, with our verdict in error
    rejected = [(line, body) for line, body in errors if line.response is not None and line.response.status_code == 200]
    assert rejected, "the run had no rejected answer"
    for line, body in rejected:
        assert isinstance(body, ChatCompletion) and line.error is not None and line.streamproc is not None
        assert line.error.code == line.streamproc["error_code"]
    assert any(body.choices[0].finish_reason == "length" for _, body in rejected if isinstance(body, ChatCompletion))

    # no HTTP answer (connection resets): only our code and message
    unanswered = [line for line, _ in errors if line.response is None]
    assert unanswered, "the run had no failure without an HTTP answer"
    assert all(line.error is not None and line.error.code and line.error.message for line in unanswered)

    # the same batch as Anthropic's Message Batches results: one file, every outcome
    assert anthropic.returncode == 0, anthropic.stderr
    entries = [parse_anthropic_line(text) for text in (tmp_path / "anthropic.jsonl").read_text().splitlines()]
    assert sorted(entry.custom_id for entry in entries) == sorted(bodies)
    assert sum(isinstance(entry.result, MessageBatchSucceededResult) for entry in entries) == len(results)
    for entry in entries:
        if entry.custom_id in business:
            assert isinstance(entry.result, MessageBatchErroredResult)
            assert entry.result.error.error.message == business[entry.custom_id]["error"]["message"]
