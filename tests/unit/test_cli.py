"""The command line's conventions: one exit-code table, -b/--bootstrap-server wherever Kafka is used, --json
wherever a command reports, and ``run`` never answering with the mock unless asked.

The refusals are real: an address nothing listens on, a data dir with no broker, an invalid file."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from streamproc.cli import IsoDateTime, cli
from streamproc.errors import MEANINGS, ExitCode

NOTHING_LISTENS = "127.0.0.1:1"
KAFKA_COMMANDS = {("submit",), ("status",), ("cancel",), ("batches",), ("results",), ("sink",), ("run",),
                  ("backfill",), ("worker",), ("lag",), ("roundtrip",)}
REPORTING_COMMANDS = {("run",), ("submit",), ("results",), ("status",), ("lag",), ("backfill",), ("batches",),
                      ("cancel",), ("roundtrip",), ("broker", "status"), ("real-llm", "status")}


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No configured cluster or LLM, and a data dir where no built-in broker runs."""
    monkeypatch.delenv("STREAMPROC_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("STREAMPROC_LLM_BASE_URL", raising=False)
    monkeypatch.setenv("STREAMPROC_DATA_DIR", str(tmp_path / "data"))


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def command(path: tuple[str, ...]) -> click.Command:
    found: click.Command = cli
    for name in path:
        assert isinstance(found, click.Group)
        found = found.commands[name]
    return found


def option_names(path: tuple[str, ...]) -> set[str]:
    return {name for param in command(path).params for name in param.opts}


def requests_file(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "Hello?"}) + "\n")
    return path


def test_help_shows_the_exit_code_table() -> None:
    result = invoke("--help")
    assert result.exit_code == ExitCode.OK
    for code, meaning in MEANINGS.items():
        assert f"  {int(code)}  {meaning}" in result.output
    assert set(MEANINGS) == set(ExitCode)


@pytest.mark.parametrize("path", sorted(KAFKA_COMMANDS))
def test_every_command_that_talks_to_kafka_takes_bootstrap_server(path: tuple[str, ...]) -> None:
    assert {"-b", "--bootstrap-server"} <= option_names(path)


@pytest.mark.parametrize("path", sorted(REPORTING_COMMANDS))
def test_every_command_that_reports_takes_json(path: tuple[str, ...]) -> None:
    assert "--json" in option_names(path)


def test_an_unknown_flag_is_a_usage_error() -> None:
    result = invoke("status", "--batch-id", "b", "--no-such-flag")
    assert result.exit_code == ExitCode.USAGE and "No such option: --no-such-flag" in result.output


@pytest.mark.parametrize("args", [(), ("--batch-id", "b", "--stream"), ("--stream", "--hours", "0")])
def test_status_reports_one_batch_or_the_stream(args: tuple[str, ...]) -> None:
    result = invoke("status", *args, "-b", NOTHING_LISTENS)
    assert result.exit_code == ExitCode.USAGE
    assert "give --batch-id or --stream" in result.output or "--hours" in result.output


def test_an_invalid_input_file_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("{not json\n")
    result = invoke("submit", str(path), "--batch-id", "b", "-b", NOTHING_LISTENS)
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.startswith("error: ") and "1 invalid line(s); nothing was sent" in result.stderr


def test_run_without_an_llm_url_refuses_unless_the_mock_is_asked_for(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    result = invoke("run", str(requests_file(tmp_path)), "--output", str(output), "-b", NOTHING_LISTENS)
    assert result.exit_code == ExitCode.CONFIGURATION
    assert "no LLM endpoint: set STREAMPROC_LLM_BASE_URL" in result.stderr and "--mock-llm" in result.stderr
    assert not output.exists()


def test_a_worker_without_an_llm_url_or_model_list_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    monkeypatch.delenv("STREAMPROC_MODELS_FILE", raising=False)
    result = invoke("worker", "-b", NOTHING_LISTENS)
    assert result.exit_code == ExitCode.CONFIGURATION
    assert result.stderr.startswith("error: no LLM endpoint: set STREAMPROC_LLM_BASE_URL")
    assert "STREAMPROC_MODELS_FILE" in result.stderr and result.stderr.count("\n") == 1
    (tmp_path / "models.yaml").write_text("model_list:\n  - {model_name: a, litellm_params: {model: a, tags: []}}\n")
    monkeypatch.setenv("STREAMPROC_MODELS_FILE", str(tmp_path / "models.yaml"))
    result = invoke("worker", "-b", NOTHING_LISTENS)
    assert result.exit_code == ExitCode.CONFIGURATION and "unsupported key 'tags'" in result.stderr


def test_run_with_an_unknown_mock_profile_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke("run", str(requests_file(tmp_path)), "--output", str(tmp_path / "out.jsonl"),
                    "--mock-llm", "no-such-profile")
    assert result.exit_code == ExitCode.USAGE and "--mock-llm" in result.output


def test_no_broker_anywhere_is_refused_configuration() -> None:
    result = invoke("status", "--batch-id", "b")
    assert result.exit_code == ExitCode.CONFIGURATION
    assert "no Kafka broker: pass -b host:port" in result.stderr


@pytest.mark.parametrize("args", [("status", "--batch-id", "b"), ("status", "--stream"), ("batches",),
                                  ("lag", "--no-rate"), ("backfill", "--dry-run", "--since", "2026-11-29T08:00")])
def test_bootstrap_server_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]) -> None:
    """The address -b names is the one tried (nothing listens there: refused configuration, one line)."""
    monkeypatch.setenv("STREAMPROC_KAFKA_BOOTSTRAP", "127.0.0.1:2")
    result = invoke(*args, "--bootstrap-server", NOTHING_LISTENS)
    assert result.exit_code == ExitCode.CONFIGURATION, result.output
    assert result.stderr.startswith("error: ") and "127.0.0.1:1" in result.stderr and "127.0.0.1:2" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "'127.0.0.1', 2," not in result.stderr and "Traceback" not in result.output


def test_broker_status_of_a_stopped_broker_fails_and_says_so_in_json() -> None:
    result = invoke("broker", "status", "--json")
    assert result.exit_code == ExitCode.FAILED
    document = json.loads(result.stdout)
    assert document["running"] is False and document["pid"] is None and document["bootstrap"] is None


def test_broker_stop_and_start_reach_the_local_broker() -> None:
    """Without a JVM: stop finds nothing running, start --node finds no cluster to start a node of."""
    stop = invoke("broker", "stop")
    assert (stop.exit_code, stop.output) == (ExitCode.OK, "not running\n")
    start = invoke("broker", "start", "--node", "2")
    assert start.exit_code == ExitCode.CONFIGURATION and "no local cluster in this data dir" in start.stderr


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-29", datetime(2026, 11, 29, tzinfo=UTC)),
    ("2026-11-29T08:00", datetime(2026, 11, 29, 8, tzinfo=UTC)),
    ("2026-11-29 08:00:00.500", datetime(2026, 11, 29, 8, 0, 0, 500_000, tzinfo=UTC)),
    ("2026-11-29T08:00:00Z", datetime(2026, 11, 29, 8, tzinfo=UTC)),
    ("2026-11-29T09:00+01:00", datetime(2026, 11, 29, 9, tzinfo=timezone(timedelta(hours=1)))),
])
def test_times_are_iso_8601_and_utc_without_a_zone(text: str, expected: datetime) -> None:
    parsed = IsoDateTime().convert(text, None, None)
    assert parsed == expected and parsed.utcoffset() == expected.utcoffset()


def test_a_time_that_is_not_iso_8601_is_a_usage_error() -> None:
    result = invoke("backfill", "--dry-run", "--since", "29/11/2026 08:00")
    assert result.exit_code == ExitCode.USAGE and "not an ISO 8601 time" in result.output


@pytest.mark.parametrize(("window", "deadline"), [("1h", "1h"), ("90m", "2h")])
def test_a_deadline_not_before_the_completion_window_is_refused_before_anything_is_sent(
        tmp_path: Path, window: str, deadline: str) -> None:
    result = invoke("submit", str(requests_file(tmp_path)), "--batch-id", "b", "--completion-window", window,
                    "--deadline", deadline, "-b", NOTHING_LISTENS)
    assert result.exit_code == ExitCode.USAGE
    assert "--deadline" in result.output and "must be shorter than the completion window" in result.output


def test_a_deadline_is_a_duration(tmp_path: Path) -> None:
    result = invoke("submit", str(requests_file(tmp_path)), "--batch-id", "b", "--deadline", "soon",
                    "-b", NOTHING_LISTENS)
    assert result.exit_code == ExitCode.USAGE and "'soon' is not a duration" in result.output
