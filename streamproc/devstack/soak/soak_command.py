"""``scripts/soak`` (also ``python -m streamproc.devstack.soak``): not part of CI, it takes half an hour."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from streamproc.devstack.soak.soak_run import SoakConfig
from streamproc.errors import ExitCode, UserFacingError

_DEFAULTS = SoakConfig()


@click.command("soak", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--minutes", default=_DEFAULTS.minutes, show_default=True, type=click.FloatRange(min=1))
@click.option("--workers", default=_DEFAULTS.workers, show_default=True, type=click.IntRange(min=2))
@click.option("--kill-every", "kill_every_s", default=_DEFAULTS.kill_every_s, show_default=True,
              type=click.FloatRange(min=10), help="Seconds between SIGKILLs, alternating between workers.")
@click.option("--batch-requests", default=_DEFAULTS.batch_requests, show_default=True, type=click.IntRange(min=1))
@click.option("--batches-ahead", default=_DEFAULTS.batches_ahead, show_default=True, type=click.IntRange(min=1),
              help="Batches kept submitted and not yet converged.")
@click.option("--sample-every", "sample_every_s", default=_DEFAULTS.sample_every_s, show_default=True,
              type=click.FloatRange(min=5))
@click.option("--retain-finished", default=_DEFAULTS.retain_finished, show_default=True,
              help="The workers' STREAMPROC_RETAIN_FINISHED.")
@click.option("--rpm", "mock_rpm", default=_DEFAULTS.mock_rpm, show_default=True, type=click.IntRange(min=1),
              help="The mock's requests/min.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where broker data and logs go [default: a temporary dir, removed after a passing run].")
@click.option("--keep", is_flag=True, help="Keep the temporary work dir after a passing run.")
def soak(minutes: float, workers: int, kill_every_s: float, batch_requests: int, batches_ahead: int,
         sample_every_s: float, retain_finished: str, mock_rpm: int, work_dir: Path | None, keep: bool) -> None:
    """Run the pipeline for a while and look for leaks: batches submitted all the time against the realistic
    mock, a worker SIGKILLed every few minutes, automatic retention at a short setting.

    Samples every minute the workers' memory, open files and CPU time per result, the state changelog's size,
    the states the table holds, how long status and batches take, and each restart's restore time; prints
    their series and slopes. Exits 1 when a slope is past its bound (a leak) or a batch did not converge.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = SoakConfig(minutes=minutes, workers=workers, kill_every_s=kill_every_s, batch_requests=batch_requests,
                        batches_ahead=batches_ahead, sample_every_s=sample_every_s, retain_finished=retain_finished,
                        mock_rpm=mock_rpm, work_dir=work_dir, keep_work_dir=keep)
    import asyncio

    from streamproc.devstack.soak.soak_run import run_soak

    def say(line: str) -> None:
        click.echo(line, err=True)

    try:
        report = asyncio.run(run_soak(config, say))
    except UserFacingError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("interrupted; everything the run started was stopped", err=True)
        sys.exit(130)
    for line in report.lines():
        click.echo(line)
    if not report.ok:
        click.echo(f"logs and data: {report.work_dir}")
        sys.exit(ExitCode.FAILED)
