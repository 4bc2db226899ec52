"""``streamproc chaos`` (also ``python -m streamproc.devstack.chaos`` and ``scripts/chaos``)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from streamproc.devstack.chaos.config import MAX_TENANTS, ChaosConfig
from streamproc.errors import ExitCode, UserFacingError

_DEFAULTS = ChaosConfig()


@click.command("chaos", context_settings={"help_option_names": ["-h", "--help"]})  # also when run alone
@click.option("--requests", default=_DEFAULTS.requests, show_default=True, type=click.IntRange(min=10),
              help="Requests in the measured batch (half ask for a JSON schema).")
@click.option("--tenants", default=_DEFAULTS.tenants, show_default=True, type=click.IntRange(min=1, max=MAX_TENANTS),
              help="Tenants of equal weight (a tenants file) the batch is split among: the first submits 3/4 of it, "
                   "the others a share of the rest behind it; every tenant's requests are counted apart.")
@click.option("--priorities", is_flag=True,
              help="With --tenants: the first tenant's batch is submitted at priority low, the others' at high, "
                   "each on its priority's requests topic.")
@click.option("--workers", default=_DEFAULTS.workers, show_default=True, type=click.IntRange(min=1))
@click.option("--kills", default=_DEFAULTS.kills, show_default=True, type=click.IntRange(min=0),
              help="Worker SIGKILLs, alternating between workers, each restarted after --kill-pause.")
@click.option("--kill-pause", default=_DEFAULTS.kill_pause_s, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a killed worker stays down.")
@click.option("--broker-restarts", default=_DEFAULTS.broker_restarts, show_default=True,
              type=click.IntRange(min=0))
@click.option("--broker-down", default=_DEFAULTS.broker_down_s, show_default=True, type=click.FloatRange(min=0),
              help="Seconds between the broker's stop and its start.")
@click.option("--outage", default=_DEFAULTS.outage_s, show_default=True, type=click.FloatRange(min=0),
              help="Seconds of LLM outage (every call answers 503); 0: none.")
@click.option("--poison-per-kind", default=_DEFAULTS.poison_per_kind, show_default=True,
              type=click.IntRange(min=1), help="Hostile records of each kind, per poison wave (two waves).")
@click.option("--big-body-bytes", default=_DEFAULTS.big_body_bytes, show_default=True, type=click.IntRange(min=1),
              help="Size of the big-body poison; smaller sizes follow until the broker takes one.")
@click.option("--rpm", "mock_rpm", type=click.IntRange(min=1),
              help="The mock's requests/min [default: the profile's]: a lower rate makes a small batch last until "
                   "every fault has landed.")
@click.option("--in-flight", type=click.IntRange(min=1),
              help="The workers' STREAMPROC_IN_FLIGHT [default: theirs, 256].")
@click.option("--profile", "mock_profile", default=_DEFAULTS.mock_profile, show_default=True,
              help="The mock's fault profile.")
@click.option("--seed", default=_DEFAULTS.seed, show_default=True, type=int)
@click.option("--retry-tiers", default=_DEFAULTS.retry_tiers, show_default=True)
@click.option("--timeout", "timeout_s", default=_DEFAULTS.timeout_s, show_default=True,
              type=click.FloatRange(min=1), help="Seconds the batch may take to converge after its submit.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where broker data and logs go [default: a temporary dir, removed after a passing run].")
@click.option("--keep", is_flag=True, help="Keep the temporary work dir after a passing run.")
def chaos(requests: int, tenants: int, priorities: bool, workers: int, kills: int, kill_pause: float,
          broker_restarts: int, broker_down: float, outage: float, poison_per_kind: int, big_body_bytes: int,
          mock_rpm: int | None, in_flight: int | None, mock_profile: str, seed: int, retry_tiers: str, timeout_s: float,
          work_dir: Path | None, keep: bool) -> None:
    """Prove that nothing is lost or stalled under faults: a batch through 2 workers on a private broker
    while workers are SIGKILLed, the broker restarts, the LLM goes down and poison records arrive.

    Prints one table; exits 1 when a request was lost, an export line repeated, a partition stalled, a poison
    record was not explained, a planned fault did not fire, or the batch did not converge.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a restarting broker is the point, not news
    try:
        config = ChaosConfig(requests=requests, tenants=tenants, priorities=priorities, workers=workers, kills=kills,
                             kill_pause_s=kill_pause,
                             broker_restarts=broker_restarts, broker_down_s=broker_down, outage_s=outage,
                             poison_per_kind=poison_per_kind, big_body_bytes=big_body_bytes, mock_rpm=mock_rpm,
                             in_flight=in_flight,
                             mock_profile=mock_profile, seed=seed, retry_tiers=retry_tiers, timeout_s=timeout_s,
                             work_dir=work_dir, keep_work_dir=keep)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    # here: the run's imports (asyncio, aiokafka, aiohttp, httpx) would slow every other command
    import asyncio

    from streamproc.devstack.chaos.chaos_run import run_chaos
    from streamproc.devstack.chaos.tally import format_table

    def say(line: str) -> None:
        click.echo(line, err=True)

    try:
        report = asyncio.run(run_chaos(config, say))
    except UserFacingError as exc:  # a ChaosError too
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, or SIGTERM (run_chaos cancels itself)
        click.echo("interrupted; everything the run started was stopped", err=True)
        sys.exit(130)
    click.echo(format_table(report.result))
    for line in report.result.details:
        click.echo(line)
    if not report.result.ok:
        click.echo(f"logs and data: {report.work_dir}")
        sys.exit(ExitCode.FAILED)
