"""The ``streamproc`` command line: one click group, one sub-command per operation."""

from __future__ import annotations

import sys

import click

from streamproc.localkafka import LocalBroker, LocalKafkaError
from streamproc.settings import Settings


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


def main() -> None:
    """Entry point: known failures become a one-line reason and a non-zero exit, not a traceback."""
    try:
        cli(standalone_mode=True)
    except LocalKafkaError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
