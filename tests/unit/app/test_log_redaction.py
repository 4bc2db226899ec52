"""Every log line the worker writes, whichever logger makes it and whatever handler faust installs later, has
its credentials redacted; and the worker refuses a bad key or plain http before it starts (exit 3, one line)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamproc.app import log_redaction
from streamproc.errors import ExitCode

KEY = "k3y-0f-the-w0rker-42"


@pytest.fixture
def redacting() -> Iterator[io.StringIO]:
    factory = logging.getLogRecordFactory()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)  # added after install: as faust's own handler is
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logger = logging.getLogger("some.library.deep")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    log_redaction.install([KEY])
    try:
        yield stream
    finally:
        logging.setLogRecordFactory(factory)
        logger.removeHandler(handler)


def test_messages_and_their_arguments_are_redacted(redacting: io.StringIO) -> None:
    log = logging.getLogger("some.library.deep")
    log.info("calling %s with headers %s", "https://u:secretpw@llm.example/v1", {"Authorization": f"Bearer {KEY}"})
    log.warning("provider said: %s", f"bad key {KEY}")
    out = redacting.getvalue()
    assert KEY not in out and "secretpw" not in out
    assert "https://[REDACTED]@llm.example/v1" in out and "'Authorization': '[REDACTED]'" in out
    assert "provider said: bad key [REDACTED]" in out


def test_a_traceback_is_redacted(redacting: io.StringIO) -> None:
    log = logging.getLogger("some.library.deep")
    try:
        raise RuntimeError(f"Authorization: Bearer {KEY}")
    except RuntimeError:
        log.exception("call failed")
    out = redacting.getvalue()
    assert "Traceback" in out and "RuntimeError: Authorization: [REDACTED]" in out and KEY not in out


def test_a_malformed_logging_call_is_left_to_logging_to_report() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "two %s %s", ("one",), None)
    assert log_redaction.RedactingFilter([KEY]).filter(record) is True
    assert (record.msg, record.args) == ("two %s %s", ("one",))


def run_worker(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMPROC_")}
    clean.update({"STREAMPROC_DATA_DIR": str(tmp_path), "STREAMPROC_KAFKA_BOOTSTRAP": "127.0.0.1:1", **env})
    return subprocess.run([sys.executable, "-m", "streamproc", "worker"], env=clean, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize(("env", "why"), [
    ({"STREAMPROC_LLM_BASE_URL": "http://llm.example/v1", "STREAMPROC_LLM_API_KEY": KEY},
     "plain http:// to llm.example, which is not loopback"),
    ({"STREAMPROC_LLM_BASE_URL": "http://127.0.0.1:9/v1", "STREAMPROC_LLM_API_KEY": KEY + " x"},
     "STREAMPROC_LLM_API_KEY holds whitespace"),
    ({"STREAMPROC_LLM_BASE_URL": "http://127.0.0.1:9/v1", "STREAMPROC_LLM_API_KEY": KEY,
      "STREAMPROC_LLM_API_KEY_FILE": "/dev/null"}, "not both"),
    ({"STREAMPROC_LLM_BASE_URL": "http://127.0.0.1:9/v1", "STREAMPROC_LLM_API_KEY": KEY,
      "STREAMPROC_RECORD_FORMAT": "json", "STREAMPROC_SCHEMA_REGISTRY_URL": "http://127.0.0.1:9"},
     "STREAMPROC_RECORD_FORMAT=json and STREAMPROC_SCHEMA_REGISTRY_URL are both set"),
])
def test_the_worker_refuses_to_start(tmp_path: Path, env: dict[str, str], why: str) -> None:
    done = run_worker(tmp_path, **env)
    assert done.returncode == ExitCode.CONFIGURATION, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0], done.stderr
    assert KEY not in done.stderr + done.stdout
