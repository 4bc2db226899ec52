"""The ``streamproc`` command line: one click group, one sub-command per operation."""

from __future__ import annotations

import asyncio
import sys

import click

from streamproc.kafka import NoBrokerError
from streamproc.localkafka import LocalBroker, LocalKafkaError
from streamproc.mockllm.cli import mock_llm
from streamproc.roundtrip import run_round_trip
from streamproc.settings import Settings
from streamproc.worker import run_worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamproc")
def cli() -> None:
    """Run large batches of LLM requests through Apache Kafka: every request ends in exactly one place,
    a result or an explained failure. Configuration comes from STREAMPROC_* environment variables."""


@cli.group()
def broker() -> None:
    """The built-in single-node Kafka broker (no Docker needed: JDK 17 and Maven)."""


@broker.command("start")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for the port to open.")
def broker_start(timeout: float) -> None:
    """Start the local broker; returns once it accepts connections (a no-op when it runs already)."""
    status = LocalBroker(Settings()).start(timeout=timeout)
    click.echo(status.describe())


@broker.command("stop")
def broker_stop() -> None:
    """Stop the local broker (also cleans up after a crashed one)."""
    was_running = LocalBroker(Settings()).stop()
    click.echo("stopped" if was_running else "not running")


@broker.command("status")
@click.option("--bootstrap", "bootstrap_only", is_flag=True, help="Print only host:port (exit 1 when stopped).")
def broker_status(bootstrap_only: bool) -> None:
    """Say whether the local broker runs, and where."""
    status = LocalBroker(Settings()).status()
    if bootstrap_only:
        if not status.running:
            raise click.ClickException("the local broker is not running")
        click.echo(status.bootstrap)
        return
    click.echo(status.describe())
    if not status.running:
        sys.exit(3)


@cli.command("roundtrip")
@click.option("--records", default=1000, show_default=True, help="Keys sent in each of the two passes.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False),
              help="Where the worker's output goes [default: $STREAMPROC_DATA_DIR/roundtrip-worker.log].")
def roundtrip(records: int, log_path: str | None) -> None:
    """Check the stack: records through a faust worker with a RocksDB table, restart it, check the table."""
    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_path or str(settings.data_dir / "roundtrip-worker.log")
    report = asyncio.run(run_round_trip(settings, records, log_path))
    click.echo(f"pass 1: {records} keys sent, each total read back as 1: "
               f"{'ok' if report.first_pass_ok else 'FAILED'}")
    click.echo(f"worker restarted; pass 2: each total read back as 2 (table recovered): "
               f"{'ok' if report.second_pass_ok else 'FAILED'}")
    click.echo(f"round trip {'succeeded' if report.ok else 'FAILED'} in {report.seconds:.1f}s")
    if not report.ok:
        raise click.ClickException(f"the round trip failed; the worker's log is {log_path}")


cli.add_command(mock_llm)


@cli.command("worker")
@click.option("--loglevel", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def worker(loglevel: str) -> None:
    """Consume requests (and retry tiers), call the LLM, emit results or layered failures.

    Start more workers with the same STREAMPROC_APP_ID (on any machine) to scale out: they share the
    partitions as one consumer group. Stop with SIGTERM or Ctrl-C: in-flight calls finish first.
    Exit code 3: the LLM endpoint refused the configuration (key, model, quota); fix it and restart.
    """
    sys.exit(run_worker(Settings(), loglevel.upper()))


def main() -> None:
    """Entry point: known failures become a one-line reason and a non-zero exit, not a traceback."""
    try:
        cli(standalone_mode=True)
    except (LocalKafkaError, NoBrokerError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
