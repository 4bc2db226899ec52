"""Starting and stopping the mock: the command line, a subprocess, a thread, and shutdown with work in flight."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from click.testing import CliRunner

from streamproc.mockllm.latency import FixedLatency
from streamproc.mockllm.mock_llm_command import mock_llm
from streamproc.mockllm.profiles import Overrides
from streamproc.mockllm.runner import MockLLMProcess, MockLLMThread, running_mock_llm

CHAT = {"model": "mock-small", "messages": [{"role": "user", "content": "hello"}]}
NO_FAULT = {"x-mock-fault": "none"}


def post_json(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_subprocess_prints_its_url_first_and_stops_on_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "streamproc", "mock-llm", "--port", "0", "--profile", "flaky", "--seed", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        match = re.fullmatch(r"mock-llm listening on (http://127\.0\.0\.1:(\d+)/v1)\n", first)
        assert match, first
        url = match[1]
        assert post_json(f"{url}/chat/completions", CHAT, {"x-mock-fault": "none"})[0] == 200
        assert post_json(f"{url}/chat/completions", CHAT, {"x-mock-fault": "bad_gateway"})[0] == 502
    finally:
        started = time.monotonic()
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0
    assert time.monotonic() - started < 5
    assert "profile flaky, seed 3" in stderr


def test_process_helper_with_options(tmp_path: Path) -> None:
    profile = tmp_path / "slow.yaml"
    profile.write_text("models:\n  gpt-4o-mini: {context_window: 100}\n", encoding="utf-8")
    with MockLLMProcess.start("--profile", str(profile), "--api-key", "sk-x", "--rpm", "6000") as mock:
        assert mock.get("/healthz")["profile"] == "slow"
        headers = {"Authorization": "Bearer sk-x"}
        status, body = post_json(f"{mock.url}/chat/completions", {**CHAT, "model": "gpt-4o-mini"}, headers)
        assert (status, body["error"]["code"]) == (400, "context_length_exceeded")  # 256 reserved > 100
        assert post_json(f"{mock.url}/chat/completions", CHAT)[0] == 401
        stats = mock.stats()
        assert stats["by_outcome"] == {"context_length_exceeded": 1, "unauthorized": 1}
        assert mock.post("/control/reset", {}) == {"reset": True}
        assert mock.stats()["calls"] == 0
    assert mock.process.returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "nope"], "neither a built-in profile"),
        (["--fault", "explode=0.1"], "fault kinds are"),
        (["--fault", "reset"], "NAME=VALUE"),
        (["--fault", "reset=0.7", "--fault", "hang=0.7"], "add up"),
        (["--latency", "soon"], "latency"),
        (["--model", "m=big"], "positive integer"),
        (["--port", "70000"], "70000"),
        (["--slots", "0"], "--slots"),
        (["--batch-seconds", "-1"], "--batch-seconds"),
    ],
)
def test_bad_options_are_reported_without_starting(args: list[str], message: str) -> None:
    result = CliRunner().invoke(mock_llm, args)
    assert result.exit_code == 2
    assert message in result.output


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(mock_llm, ["--help"])
    assert result.exit_code == 0
    for option in ("--port", "--profile", "--seed", "--api-key", "--rpm", "--tpm", "--latency", "--outage", "--slots",
                   "--batch-seconds"):
        assert option in result.output


def test_batch_seconds_from_the_command_line() -> None:
    """``--batch-seconds 0.5``: a provider batch is in progress for half a second, then done."""
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
    with MockLLMProcess.start("--batch-seconds", "0.5") as mock:
        client = openai.OpenAI(base_url=mock.url, api_key="x", max_retries=0)
        stored = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
        batch = client.batches.create(input_file_id=stored.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        assert client.batches.retrieve(batch.id).status == "in_progress"
        time.sleep(0.6)
        assert client.batches.retrieve(batch.id).status == "completed"


def test_one_slot_from_the_command_line() -> None:
    """``--slots 1 --latency fixed:0.3``: three calls at once are answered one after the other."""
    with MockLLMProcess.start("--slots", "1", "--latency", "fixed:0.3", "--profile", "strict") as mock:
        url = f"{mock.url}/chat/completions"
        started = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            calls = [
                pool.submit(post_json, url, {**CHAT, "messages": [{"role": "user", "content": str(i)}]}, NO_FAULT)
                for i in range(3)
            ]
            statuses = [call.result()[0] for call in calls]
        elapsed = time.monotonic() - started
        stats = mock.stats()
    assert statuses == [200, 200, 200]
    assert 0.9 <= elapsed < 1.5
    assert (stats["profile"], stats["queue"]["slots"], stats["queue"]["max_queued"]) == ("strict", 1, 2)


def test_thread_runner_for_synchronous_code() -> None:
    with MockLLMThread("clean", seed=1) as mock:
        status, body = post_json(f"{mock.url}/chat/completions", CHAT, {"x-request-id": "custom-1"})
        assert status == 200 and body["object"] == "chat.completion"
        assert mock.stats()["request_ids"]["distinct"] == 1
        assert mock.stats(detail=True)["per_request_id"] == {"custom-1": {"calls": 1, "outcomes": ["ok"]}}
    with pytest.raises(RuntimeError):
        _ = mock.url


async def test_shutdown_does_not_wait_for_hangs() -> None:
    """A hang whose client never gives up ends when the server stops: the server leaves no task behind."""
    async with aiohttp.ClientSession() as http:
        async with running_mock_llm("clean") as mock:
            hung = asyncio.create_task(
                http.post(f"{mock.url}/chat/completions", json=CHAT, headers={"x-mock-fault": "hang"})
            )
            for _ in range(200):
                if mock.stats()["hanging"] == 1:
                    break
                await asyncio.sleep(0.01)
            assert mock.stats()["hanging"] == 1
            started = time.monotonic()
        assert time.monotonic() - started < 1.5
        with pytest.raises(aiohttp.ClientError):
            await hung
        assert mock.stats()["hanging"] == 0
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert leftover == []


async def test_shutdown_with_slow_answers_in_flight() -> None:
    """Answers still waiting out their latency are cut off at once, not waited for."""
    async with aiohttp.ClientSession() as http:
        async with running_mock_llm("clean", overrides=Overrides(latency=FixedLatency(30.0))) as mock:
            slow = asyncio.create_task(http.post(f"{mock.url}/chat/completions", json=CHAT))
            for _ in range(200):
                if mock.stats()["in_flight"] == 1:
                    break
                await asyncio.sleep(0.01)
            assert mock.stats()["in_flight"] == 1
            started = time.monotonic()
        assert time.monotonic() - started < 1.5
        with pytest.raises(aiohttp.ClientError):
            await slow


def test_subprocess_stops_promptly_with_a_hang_in_flight() -> None:
    with MockLLMProcess.start() as mock:
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, urllib.request as u; u.urlopen(u.Request(sys.argv[1], data=sys.argv[2].encode(), "
                "headers={'x-mock-fault': 'hang'}), timeout=30)",
                f"{mock.url}/chat/completions",
                json.dumps(CHAT),
            ],
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(300):
                if mock.stats()["hanging"] == 1:
                    break
                time.sleep(0.01)
            assert mock.stats()["hanging"] == 1
            started = time.monotonic()
            assert mock.stop() == 0
            assert time.monotonic() - started < 4
            assert client.wait(10) != 0  # the hung request ended with a dropped connection
        finally:
            client.kill()
            client.wait()
