"""A provider that echoes the request's Authorization header in its error answers, against a real worker whose
key comes from STREAMPROC_LLM_API_KEY_FILE: the failure events on Kafka, the exported error lines and the worker's
log hold ``[REDACTED]``, never the key; a 401 echoing it stops the worker with a log line without it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, worker_env
from tests.integration.test_operations import batch_file, cli, wait_converged

pytestmark = pytest.mark.integration

KEY = "integration-key-0123456789abcdef"
REQUESTS = 4


class Echoing(BaseHTTPRequestHandler):
    """Answers every call with ``status`` and a body naming the Authorization header it was sent."""

    status = 400
    seen: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        authorization = self.headers.get("authorization", "")
        self.seen.append(authorization)
        body = json.dumps({"error": {"message": f"bad request; you sent Authorization: {authorization}",
                                     "type": "invalid_request_error", "code": None, "key": KEY}}).encode()
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serving(status: int) -> Iterator[tuple[str, list[str]]]:
    handler: type[Echoing] = type("Handler", (Echoing,), {"status": status, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def echo_400() -> Iterator[tuple[str, list[str]]]:
    yield from serving(400)


@pytest.fixture
def echo_401() -> Iterator[tuple[str, list[str]]]:
    yield from serving(401)


def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "llm-key"
    path.write_text(KEY + "\n")
    return path


def test_failure_events_exports_and_log_hold_no_key(settings: Settings, tmp_path: Path,
                                                    echo_400: tuple[str, list[str]]) -> None:
    url, seen = echo_400
    assert cli(settings, "submit", str(batch_file(tmp_path / "in.jsonl", REQUESTS)), "--batch-id", "echo"
               ).returncode == 0
    worker = WorkerProcess(worker_env(settings, url, tmp_path / "w1", llm_api_key_file=str(key_file(tmp_path))),
                           tmp_path / "worker.log")
    worker.start()
    try:
        final = wait_converged(settings, "echo", 120, worker)[-1]
        exported = cli(settings, "results", "--batch-id", "echo", "--output", str(tmp_path / "out.jsonl"),
                       "--errors", str(tmp_path / "errors.jsonl"))
    finally:
        worker.stop()
    assert final["converged"] and final["failed"]["business"] == REQUESTS, (final, worker.log_tail())
    assert seen and set(seen) == {f"Bearer {KEY}"}  # the key read from the file was sent
    assert exported.returncode == 0, exported.stderr
    errors = (tmp_path / "errors.jsonl").read_text()
    assert len(errors.splitlines()) == REQUESTS
    assert KEY not in errors and "[REDACTED]" in errors
    line = json.loads(errors.splitlines()[0])
    assert "Authorization: [REDACTED]" in json.dumps(line), line
    log = (tmp_path / "worker.log").read_text()
    assert KEY not in log and KEY not in exported.stdout + exported.stderr


def test_a_401_echoing_the_key_stops_the_worker_without_logging_it(settings: Settings, tmp_path: Path,
                                                                   echo_401: tuple[str, list[str]]) -> None:
    url, seen = echo_401
    assert cli(settings, "submit", str(batch_file(tmp_path / "in.jsonl", 2)), "--batch-id", "denied"
               ).returncode == 0
    worker = WorkerProcess(worker_env(settings, url, tmp_path / "w1", llm_api_key_file=str(key_file(tmp_path))),
                           tmp_path / "worker.log")
    worker.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and worker.alive():  # it stops by itself on the refused key
        time.sleep(0.5)
    code = worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert seen and code == 3, (code, log[-3000:])
    assert "STOPPING" in log and "invalid_api_key" in log and "[REDACTED]" in log
    assert KEY not in log

