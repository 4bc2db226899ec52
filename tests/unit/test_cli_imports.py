"""The command line loads what a command runs only when it runs: ``streamproc --help`` (and any one command)
must not pay for the Kafka client, faust, the settings' pydantic, the request events, the mock server or the chaos
harness."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import streamproc.mockllm
from streamproc.cli import cli

HEAVY = ("aiokafka", "faust", "mode", "pydantic", "aiohttp", "httpx", "fastavro", "rocksdict", "yaml", "asyncio",
         "streamproc.settings", "streamproc.app", "streamproc.ops", "streamproc.sink", "streamproc.kafka",
         "streamproc.core.events", "streamproc.core.batch_summary",
         "streamproc.mockllm.runner", "streamproc.mockllm.profiles", "streamproc.devstack.chaos.chaos_run",
         "streamproc.devstack.cluster")

# a fresh interpreter: this test session has imported everything already
_LOADED_BY = """
import json, sys
from streamproc.cli import cli
try:
    cli.main(sys.argv[1:], prog_name="streamproc")
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(*args: str) -> set[str]:
    """The modules a fresh interpreter has loaded after ``streamproc ARGS``."""
    done = subprocess.run([sys.executable, "-c", _LOADED_BY, *args], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy_among(modules: set[str]) -> list[str]:
    return sorted(name for name in HEAVY if any(m == name or m.startswith(f"{name}.") for m in modules))


@pytest.mark.parametrize("args", [("--help",), ("submit", "--help"), ("mock-llm", "--help"), ("chaos", "--help"),
                                  ("broker", "--help")])
def test_help_loads_nothing_a_command_runs(args: tuple[str, ...]) -> None:
    assert heavy_among(loaded_by(*args)) == []


def test_a_command_loads_what_it_runs() -> None:
    assert "streamproc.ops.results" in loaded_by("results", "--batch-id", "b", "--output", "/dev/null",
                                                  "--format", "nope")


def test_the_export_formats_are_the_exporters() -> None:
    from streamproc.ops.results import FORMATS

    result = CliRunner().invoke(cli, ["results", "--batch-id", "b", "--output", "out", "--format", "nope"])
    assert result.exit_code == 2
    assert "'nope' is not one of " + ", ".join(repr(name) for name in sorted(FORMATS)) in result.output


def test_the_mock_package_names_all_load() -> None:
    assert [name for name in streamproc.mockllm.__all__ if not hasattr(streamproc.mockllm, name)] == []


def test_status_loads_no_avro_no_http_client_no_properties_parser_and_no_worker_guards() -> None:
    """What ``status --batch-id`` imports (its start-up is most of its 2 s budget): neither the Avro side (it reads
    JSON summaries), nor httpx (only OAUTHBEARER tokens need it), nor javaproperties (only a client properties
    file), nor the workers' pacing (status decodes the fleet's beats and paces nothing), nor the lag reader (only
    a batch that stalls needs the group's lag)."""
    script = ("import json, sys; import streamproc.cli, streamproc.app.bootstrap, streamproc.ops.status, "
              "streamproc.settings; print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    modules = set(json.loads(done.stdout))
    lazy = ("fastavro", "httpx", "javaproperties", "faust", "streamproc.codec.framing",
            "streamproc.core.guards.rate_limits", "streamproc.app.lag_reader")
    assert [name for name in lazy if name in modules] == []


def test_the_codec_package_names_all_load() -> None:
    import streamproc.codec as codec

    assert [name for name in codec.__all__ if getattr(codec, name, None) is None] == []
    with pytest.raises(AttributeError):
        _ = codec.no_such_name
