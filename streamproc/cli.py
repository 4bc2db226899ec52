"""The ``streamproc`` command line: one click group, one sub-command per operation.

Each command imports what it runs inside its function, when it runs: the Kafka client, faust, the settings'
pydantic, the mock server and the chaos harness would otherwise load for every command, ``--help`` included.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import sys
import time
from collections.abc import Callable, Coroutine, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from streamproc.core.durations import HOURS_KEPT, parse_duration_ms
from streamproc.core.headers import ROUTES
from streamproc.core.tenancy import PRIORITIES
from streamproc.core.vocabulary import FailureLayer
from streamproc.errors import ExitCode, UserFacingError, exit_codes_help

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from streamproc.settings import Settings

T = TypeVar("T")
FC = TypeVar("FC", bound=Callable[..., Any])


def _run(work: Coroutine[Any, Any, T]) -> T:
    import asyncio

    return asyncio.run(work)


class _Refused(click.ClickException):
    """A :class:`UserFacingError` as click reports it: its one line on stderr, its row of :class:`ExitCode`."""

    def __init__(self, error: UserFacingError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


# the commands defined by the package they run (they also run alone), as module and attribute
_COMMANDS_ELSEWHERE = {
    "chaos": ("streamproc.devstack.chaos.chaos_command", "chaos"),
    "mock-llm": ("streamproc.mockllm.mock_llm_command", "mock_llm"),
}


class _Commands(click.Group):
    """The command tree, whose commands from other packages are imported when asked for; an error the user can
    act on ends any command with its reason and exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *_COMMANDS_ELSEWHERE])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _COMMANDS_ELSEWHERE:
            module, attribute = _COMMANDS_ELSEWHERE[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attribute)
            return command
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserFacingError as exc:
            raise _Refused(exc) from exc
        except Exception as exc:
            refusal = _kafka_refusal(ctx, exc)
            if refusal is None:
                raise
            raise refusal from exc


def _kafka_refusal(ctx: click.Context, exc: Exception) -> _Refused | None:
    """A cluster that answers nothing, refuses this client or refuses an operation: configuration, said in one
    line (a probe of our own names the cause that aiokafka only logs); None for any other error."""
    if "aiokafka" not in sys.modules:  # no Kafka client was loaded, so no Kafka error was raised
        return None
    import ssl

    from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed, UnsupportedSaslMechanismError

    from streamproc.app.bootstrap import resolve_connection
    from streamproc.kafka.authorization import AUTHORIZATION_ERRORS, not_authorized
    from streamproc.kafka.diagnose import diagnose

    if isinstance(exc, KafkaConnectionError | SaslAuthenticationFailed | UnsupportedSaslMechanismError | ssl.SSLError):
        failure = _run(diagnose(resolve_connection(_settings(ctx))))
        return _Refused(UserFacingError(failure.reason if failure else f"Kafka is not reachable: {exc}"))
    if isinstance(exc, AUTHORIZATION_ERRORS):
        return _Refused(not_authorized(exc))
    return None


_BOOTSTRAP = "streamproc.bootstrap_server"
_COMMAND_CONFIG = "streamproc.command_config"


def _keep(key: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def keep(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value:
            ctx.meta[key] = value
    return keep


def kafka_options(command: FC) -> FC:
    """``-b/--bootstrap-server`` and ``--command-config``, as Kafka's own tools spell them, on every command
    that talks to Kafka."""
    command = click.option(
        "--command-config", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path), expose_value=False,
        callback=_keep(_COMMAND_CONFIG),
        help="A Java client properties file for TLS/SASL (security.protocol, sasl.*, ssl.*) "
             "[default: $STREAMPROC_KAFKA_CLIENT_PROPERTIES].")(command)
    return click.option(
        "-b", "--bootstrap-server", metavar="HOST:PORT[,...]", expose_value=False, callback=_keep(_BOOTSTRAP),
        help="The Kafka cluster [default: $STREAMPROC_KAFKA_BOOTSTRAP, else bootstrap.servers of the "
             "client properties, else the built-in broker].")(command)


def _settings(ctx: click.Context | None = None) -> Settings:
    """The environment's settings, with ``-b`` and ``--command-config`` over their variables."""
    from streamproc.settings import Settings

    meta = (ctx or click.get_current_context()).meta
    given = {"kafka_bootstrap": meta.get(_BOOTSTRAP), "kafka_client_properties": meta.get(_COMMAND_CONFIG)}
    settings = Settings(**{name: value for name, value in given.items() if value})
    if settings.upgrade_from is not None or "streamproc.codec.framing" in sys.modules:
        # every command that writes events writes what that release reads; until the Avro side is loaded it
        # writes the current schemas, so a command that reads no event (status) does not load it
        from streamproc.codec.releases import write_as_release

        write_as_release(settings.upgrade_from)
    return settings


def json_option(what: str) -> Callable[[FC], FC]:
    """``--json``: the report as one JSON document on stdout, for every command that reports."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print {what} as one JSON document.")


def _echo_json(document: Any) -> None:
    click.echo(json.dumps(document))


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]}, epilog=exit_codes_help())
@click.version_option(package_name="streamproc")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Run large batches of LLM requests through Apache Kafka: every request ends in exactly one place,
    a result or an explained failure. Configuration comes from STREAMPROC_* environment variables."""
    if ctx.invoked_subcommand != "worker":
        # the Kafka client logs transient states (a new topic's leader not elected yet) as errors and
        # retries them itself; a command reports what really failed as its one-line reason
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


@cli.group()
def broker() -> None:
    """The built-in Kafka broker, or a local cluster of KRaft nodes (no Docker needed: JDK 17 and Maven)."""


_node_option = click.option("--node", type=click.IntRange(min=1), default=None,
                            help="Only this node of the local cluster (fault tests).")
_secure_option = click.option(
    "--secure", is_flag=True,
    help="The secured single broker (<data dir>/kafka-secure): SCRAM, mutual TLS and OAUTHBEARER listeners "
    "over TLS, ACLs per principal, client properties files for each.")


@broker.command("start")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for the port to open.")
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="A local cluster of this many nodes, one JVM each [default: the cluster this data dir "
              "holds, else the single broker].")
@_node_option
@_secure_option
def broker_start(timeout: float, nodes: int | None, node: int | None, secure: bool) -> None:
    """Start the local broker (or cluster); returns once it accepts connections (a no-op when it runs already)."""
    from streamproc.devstack.cluster import start_local_kafka
    from streamproc.devstack.secure_broker import SecureBroker

    if secure:
        if nodes is not None or node is not None:
            raise click.UsageError("--secure starts a single broker: no --nodes or --node")
        click.echo(SecureBroker(_settings()).start(timeout).describe())
        return
    status = start_local_kafka(_settings(), nodes, node, timeout)
    click.echo(status.describe())


@broker.command("stop")
@_node_option
@_secure_option
def broker_stop(node: int | None, secure: bool) -> None:
    """Stop the local broker or every node of the local cluster (also cleans up after a crashed one)."""
    from streamproc.devstack.cluster import stop_local_kafka
    from streamproc.devstack.secure_broker import SecureBroker

    was_running = SecureBroker(_settings()).stop() if secure else stop_local_kafka(_settings(), node)
    click.echo("stopped" if was_running else "not running")


@broker.command("status")
@click.option("--bootstrap", "bootstrap_only", is_flag=True, help="Print only host:port[,host:port...].")
@json_option("running, pid, bootstrap and version (with --secure: listeners, CA and client files)")
@_secure_option
def broker_status(bootstrap_only: bool, as_json: bool, secure: bool) -> None:
    """Say whether the local broker runs, and where (exit 1 when it is stopped)."""
    from streamproc.devstack.cluster import local_kafka
    from streamproc.devstack.secure_broker import SecureBroker

    status = SecureBroker(_settings()).status() if secure else local_kafka(_settings()).status()
    if bootstrap_only:
        if not status.running:
            raise click.ClickException("the local broker is not running")
        click.echo(status.bootstrap)
        return
    if as_json:
        _echo_json(status.as_json())
    else:
        click.echo(status.describe())
    if not status.running:
        sys.exit(ExitCode.FAILED)


@cli.group("real-llm")
def real_llm() -> None:
    """A real OpenAI-compatible server on this machine: llama-cpp-python with SmolLM2-135M (one slot,
    2,048-token window), installed into its own virtualenv under the cache dir on first start."""


@real_llm.command("start")
@click.option("--port", default=0, show_default=True, help="Port on 127.0.0.1 (0: a free one).")
def real_llm_start(port: int) -> None:
    """Install (first time: ~15 min of compiling) and start the server; prints its base URL."""
    from streamproc.devstack.real_llm import RealLLM

    status = RealLLM(_settings()).start(port)
    click.echo(status.base_url)


@real_llm.command("stop")
def real_llm_stop() -> None:
    """Stop the server started by `real-llm start`."""
    from streamproc.devstack.real_llm import RealLLM

    click.echo("stopped" if RealLLM(_settings()).stop() else "not running")


@real_llm.command("status")
@json_option("running, pid and base_url")
def real_llm_status(as_json: bool) -> None:
    """Print the base URL of the running server (exit 1 when it is not running)."""
    from streamproc.devstack.real_llm import RealLLM

    status = RealLLM(_settings()).status()
    if as_json:
        _echo_json({"running": status.running, **dataclasses.asdict(status)})
    else:
        click.echo(status.base_url if status.running else "not running")
    if not status.running:
        sys.exit(ExitCode.FAILED)


@cli.command("roundtrip")
@kafka_options
@click.option("--records", default=1000, show_default=True, help="Keys sent in each of the two passes.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False),
              help="Where the worker's output goes [default: $STREAMPROC_DATA_DIR/roundtrip-worker.log].")
@json_option("records_per_pass, first_pass_ok, second_pass_ok, ok and seconds")
def roundtrip(records: int, log_path: str | None, as_json: bool) -> None:
    """Check the stack: records through a faust worker with a RocksDB table, restart it, check the table."""
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_path or str(settings.data_dir / "roundtrip-worker.log")
    from streamproc.app.roundtrip import run_round_trip

    report = _run(run_round_trip(settings, records, log_path))
    if as_json:
        _echo_json({**dataclasses.asdict(report), "ok": report.ok})
    else:
        click.echo(f"pass 1: {records} keys sent, each total read back as 1: "
                   f"{'ok' if report.first_pass_ok else 'FAILED'}")
        click.echo(f"worker restarted; pass 2: each total read back as 2 (table recovered): "
                   f"{'ok' if report.second_pass_ok else 'FAILED'}")
        click.echo(f"round trip {'succeeded' if report.ok else 'FAILED'} in {report.seconds:.1f}s")
    if not report.ok:
        raise click.ClickException(f"the round trip failed; the worker's log is {log_path}")


class IsoDateTime(click.ParamType):
    """A time in ISO 8601, as Kafka's tools take one (``--to-datetime``): 2026-11-29, 2026-11-29T08:00,
    2026-11-29 08:00:00.5, with Z or +01:00; a time without a zone is UTC."""

    name = "datetime"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time such as 2026-11-29T08:00 or 2026-11-29T08:00:00Z",
                      param, ctx)
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A --completion-window or --deadline such as 24h, 90m, 1h30m or bare seconds, as seconds."""
    if value is None:
        return None
    ms = parse_duration_ms(value)
    if ms is None or ms <= 0:
        raise click.BadParameter(f"{value!r} is not a duration such as 24h, 90m or 1h30m")
    return ms / 1000


class _LazyChoice(click.ParamType):
    """A :class:`click.Choice` among names that a command's implementation holds, made when the command parses
    or shows its options: that module is imported then, not by every other command."""

    name = "choice"

    def __init__(self, names: Callable[[], Iterable[str]]) -> None:
        self._names = names

    @functools.cached_property
    def _choice(self) -> click.Choice[str]:
        return click.Choice(sorted(self._names()))

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return self._choice.get_metavar(param, ctx)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        return self._choice.convert(value, param, ctx)

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[CompletionItem]:
        return self._choice.shell_complete(ctx, param, incomplete)


def _export_formats() -> Iterable[str]:
    from streamproc.ops.results import FORMATS

    return FORMATS


_REUSE_HELP = ("Answer a request whose model and body got an answer before (any batch of this deployment) with "
               "that answer, without an LLM call; exported with streamproc.reused_from.")


@cli.command("submit")
@kafka_options
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--batch-id", required=True, help="Name of the batch (status, results and backfill use it).")
@click.option("--skip-invalid", is_flag=True, help="Send the valid lines even when some are invalid.")
@click.option("--completion-window", "window", callback=_duration, metavar="DURATION",
              help="e.g. 24h (OpenAI's), 90m: requests not called by then end as batch_expired. Default: none.")
@click.option("--deadline", callback=_duration, metavar="DURATION",
              help="For a model of the provider-batch route: what is not answered by then (from the submission) is "
              "called synchronously, at the full price, instead of going into a new provider batch. Shorter than "
              "--completion-window. Default: none.")
@click.option("--route", type=click.Choice(ROUTES),
              help="How the batch's requests are answered, whatever STREAMPROC_MODEL_ROUTES says of their models: "
              "provider-batch (the provider's batch API at STREAMPROC_LLM_BASE_URL, half the price, answers within "
              "24 h) or call (one synchronous call each). Default: each model's route.")
@click.option("--reuse-results", is_flag=True, help=_REUSE_HELP)
@click.option("--max-cost-usd", type=click.FloatRange(min=0), metavar="USD",
              help="Spend cap of the batch in US dollars, at STREAMPROC_MODEL_PRICES, for all workers: at the cap "
              "no new call starts and the rest wait (status: stalled, budget_exhausted) until `raise-cap`, or end "
              "budget_exceeded on `cancel`. Default: none.")
@click.option("--max-tokens", type=click.IntRange(min=0), metavar="N",
              help="Spend cap of the batch in tokens (prompt and completion), like --max-cost-usd. Default: none.")
@click.option("--tenant", metavar="NAME", help="Who the batch is for (letters, digits, '.', '_', '-'; at most 64): "
              "shown in status, batches, exports and metrics. A line's own \"tenant\" field wins. Default: default.")
@click.option("--priority", type=click.Choice(PRIORITIES), help="How urgent the batch is; a line's own "
              "\"priority\" field wins. Default: normal.")
@json_option("batch_id, submitted, skipped_invalid and seconds")
def submit(file: Path, batch_id: str, skip_invalid: bool, window: float | None, deadline: float | None,
           route: str | None, reuse_results: bool, max_cost_usd: float | None, max_tokens: int | None,
           tenant: str | None, priority: str | None, as_json: bool) -> None:
    """Validate FILE (OpenAI Batch JSONL, or {"id", "prompt", ...} lines) and send its requests.

    The whole file is checked first; an invalid line (with its number and reason) means nothing is sent,
    unless --skip-invalid.

    \b
    Example:
      streamproc submit requests.jsonl --batch-id labels-2026-11 --completion-window 24h
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.core.provider_batch_deadline import deadline_problem
    from streamproc.core.spend_cap import Cap
    from streamproc.core.tenancy import InvalidTenancy, tenancy_of
    from streamproc.kafka.schema_registry import request_encoder
    from streamproc.ops.progress import Progress
    from streamproc.ops.submit import submit_file

    if deadline is not None and (problem := deadline_problem(deadline, window)) is not None:
        raise click.BadParameter(problem, param_hint="--deadline")
    settings = _settings()
    cap = Cap(max_cost_usd, max_tokens) if max_cost_usd is not None or max_tokens is not None else None
    try:
        tenancy = tenancy_of(tenant, priority)
    except InvalidTenancy as invalid:
        raise click.BadParameter(str(invalid), param_hint="--tenant") from None
    encode_request = request_encoder(settings.schema_registry, settings.topology())  # a refusing registry: exit 3
    with Progress(f"sending {file.name}") as bar:
        report = _run(submit_file(lambda: resolve_connection(settings), settings.topology(), settings.durability,
                                  settings.input_limits, file, batch_id, skip_invalid=skip_invalid, progress=bar,
                                  completion_window_s=window, deadline_s=deadline, reuse_results=reuse_results,
                                  cap=cap, tenancy=tenancy, route=route, encode_request=encode_request))
    if as_json:
        _echo_json(report.as_json())
        return
    skipped = f", {report.skipped_invalid} invalid line(s) skipped" if report.skipped_invalid else ""
    click.echo(f"batch {report.batch_id}: {report.sent} requests submitted in {report.seconds:.1f}s{skipped}")


@cli.command("status")
@kafka_options
@click.option("--batch-id", help="The batch to report.")
@click.option("--stream", is_flag=True,
              help="Report the stream instead: the requests that name no batch (JSON requests without batch_id).")
@click.option("--hours", default=24, show_default=True, type=click.IntRange(1, HOURS_KEPT),
              help="With --stream: how many clock hours (UTC) of arrivals and ends to show, the current one last.")
@click.option("--verify", is_flag=True,
              help="Count the batch (or the stream) from every request state on the changelog instead of the "
                   "workers' summaries: slower the more requests were ever made, and a check of the summaries.")
@json_option("the counts")
def status(batch_id: str | None, stream: bool, hours: int, verify: bool, as_json: bool) -> None:
    """Counts of a batch: submitted, succeeded, failed per layer, retrying, in flight, pending,
    converged, and what its results cost (spend) beside its spend cap.

    The counts are the workers' summaries (each worker publishes what changed at most once a second), and it
    says how old the newest of them is; --verify counts every state on the changelog instead.

    When no request of the batch ended for STREAMPROC_STALL_AFTER_S (120 s) although some have not, it also
    says how many wait and why (no worker consuming, an open breaker, a paused model, its spend cap (budget_exhausted),
    skipped duplicates...). It names each deployment out of rotation at the live workers (its circuit breaker
    open after failures or hangs, or paused because its first calls all failed alike), and why, as their beats
    say.

    With --stream, the requests that name no batch instead: their counts per outcome (failures per layer and
    code), and per hour how many arrived, succeeded and failed, from the workers' summary of them too.

    \b
    Example:
      streamproc status --batch-id labels-2026-11 --json
      streamproc status --stream --hours 6
    """
    if stream == (batch_id is not None):
        raise click.UsageError("give --batch-id or --stream")
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.ops.status import read_status, read_stream_status

    settings = _settings()
    connection, topology = resolve_connection(settings), settings.topology()
    report = (_run(read_stream_status(connection, topology, hours=hours, verify=verify)) if batch_id is None else
              _run(read_status(connection, topology, batch_id, stall_after_s=settings.stall_after_s,
                               prices=settings.model_prices, verify=verify)))
    if as_json:
        _echo_json(report.as_json())
        return
    click.echo(report.format())


@cli.command("cancel")
@kafka_options
@click.option("--batch-id", required=True)
@json_option("batch_id and cancelled_at (seconds)")
def cancel(batch_id: str, as_json: bool) -> None:
    """Cancel a batch: its requests not called yet end as batch_cancelled failures; calls in flight finish.

    Provider batches (STREAMPROC_MODEL_ROUTES) that hold only its requests are cancelled at the provider by the
    worker following them; their lines not run end as batch_cancelled.

    The batch then converges (status shows cancelling, then cancelled in `streamproc batches`), and
    `results` writes the cancelled requests to the errors file, like OpenAI's cancelled batches.

    \b
    Example:
      streamproc cancel --batch-id labels-2026-11
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.ops.cancel import cancel_batch

    settings = _settings()
    manifest = _run(cancel_batch(resolve_connection(settings), settings.topology(), settings.durability, batch_id))
    if as_json:
        _echo_json({"batch_id": batch_id, "cancelled_at": (manifest.cancelled_ms or 0) // 1000})
        return
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((manifest.cancelled_ms or 0) / 1000))
    click.echo(f"batch {batch_id} cancelled at {when}: requests not called yet end as batch_cancelled; calls in "
               "flight finish")


@cli.command("forget")
@kafka_options
@click.option("--batch-id", "batch_ids", multiple=True, metavar="ID", help="A batch to forget (repeatable).")
@click.option("--finished-before", type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]),
              metavar="DATE", help="Forget every batch whose last request ended before DATE (2026-11-01 or "
              "2026-11-01T12:00:00; UTC unless it says its zone).")
@click.option("--force", is_flag=True, help="Forget a batch named with --batch-id even if it has not finished: its "
              "requests not ended yet are refused as batch_forgotten from then on.")
@json_option("one object per batch (batch_id, forgotten, states_removed, forgotten_at, finished_at, refused) in a list")
def forget_command(batch_ids: tuple[str, ...], finished_before: datetime | None, force: bool, as_json: bool) -> None:
    """Forget finished batches: remove their request states, so the state table, its changelog and every restore
    stop growing with all history.

    Only a finished batch (every request ended: a result or a terminal failure) is forgotten, unless --force.
    Its states are tombstoned on the state changelog, the workers delete them from their disks and their
    answers from the result index, and its manifest is marked forgotten: status and batches report it as
    forgotten, with the counts and usage it ended with. Its results and failures stay on their topics, so
    exports and the sink are untouched. A request of a forgotten batch that arrives later (a resubmission, a
    backfill replay) is refused as the business failure batch_forgotten, never started again. With
    STREAMPROC_RETAIN_FINISHED set, the workers forget finished batches themselves after that long.

    \b
    Examples:
      streamproc forget --batch-id labels-2026-11
      streamproc forget --finished-before 2026-11-01
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.ops.forget import as_json as outcome_json
    from streamproc.ops.forget import describe, forget, refused

    if not batch_ids and finished_before is None:
        raise click.UsageError("give --batch-id, --finished-before or both")
    settings = _settings()
    outcomes = _run(forget(resolve_connection(settings), settings.topology(), settings.durability, batch_ids,
                           finished_before, force))
    if as_json:
        _echo_json([outcome_json(outcome) for outcome in outcomes])
    else:
        click.echo("\n".join(describe(outcome) for outcome in outcomes) or "no batch finished before that date")
    error = refused(outcomes)
    if error is not None:
        raise error


@cli.command("raise-cap")
@kafka_options
@click.option("--batch-id", required=True)
@click.option("--max-cost-usd", type=click.FloatRange(min=0), metavar="USD", help="The new cap in US dollars.")
@click.option("--max-tokens", type=click.IntRange(min=0), metavar="N", help="The new cap in tokens.")
@json_option("batch_id, max_cost_usd and max_tokens")
def raise_cap(batch_id: str, max_cost_usd: float | None, max_tokens: int | None, as_json: bool) -> None:
    """Raise the spend cap of a batch submitted with --max-cost-usd or --max-tokens; its waiting requests go on.

    A limit not given stays as it was; a lower one is refused. The workers read the new cap within a few
    seconds, and the requests parked at the old one are called as they come back from the shortest retry tier.

    \b
    Example:
      streamproc raise-cap --batch-id labels-2026-11 --max-cost-usd 40
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.ops.raise_cap import raise_cap as write_cap

    if max_cost_usd is None and max_tokens is None:
        raise click.UsageError("give --max-cost-usd, --max-tokens or both")
    settings = _settings()
    raised = _run(write_cap(resolve_connection(settings), settings.topology(), settings.durability, batch_id,
                            max_cost_usd, max_tokens))
    if as_json:
        _echo_json({"batch_id": batch_id, "max_cost_usd": raised.cap.max_cost_usd,
                    "max_tokens": raised.cap.max_tokens})
        return
    click.echo(f"batch {batch_id}: spend cap now {raised.cap.describe()}")


@cli.command("batches")
@kafka_options
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=0),
              help="Show the newest N batches; 0: all.")
@click.option("--json", "as_json", is_flag=True,
              help="Print OpenAI's list shape: {\"object\": \"list\", \"data\": [batch, ...]}.")
@click.option("--verify", is_flag=True,
              help="Count from every request state on the changelog instead of the workers' summaries.")
def batches(limit: int, as_json: bool, verify: bool) -> None:
    """The batches of this deployment, newest first: id, created, status, total, succeeded, failed, waiting, spend.

    Status is OpenAI's: completed once every request ended (converged), else in_progress.

    \b
    Example:
      streamproc batches --limit 5
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.ops.batches import format_batches, list_batches

    settings = _settings()
    entries = _run(list_batches(resolve_connection(settings), settings.topology(), settings.model_prices, verify))
    shown = entries[:limit] if limit else entries
    if as_json:
        _echo_json({"object": "list", "data": [entry.as_json() for entry in shown],
                    "has_more": len(shown) < len(entries)})
        return
    click.echo(format_batches(shown))


@cli.command("results")
@kafka_options
@click.option("--batch-id", required=True)
@click.option("--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="One line per succeeded custom_id (OpenAI's batch output file); with --format anthropic and "
                   "no --errors, every outcome, as Anthropic's results file.")
@click.option("--errors", type=click.Path(dir_okay=False, path_type=Path),
              help="One line per custom_id that ended in a failure: the provider's status and body when it "
                   "answered, our code and message otherwise, our diagnosis under 'streamproc'.")
@click.option("--format", "format_name", type=_LazyChoice(_export_formats), default="openai", show_default=True,
              help="openai: Batch API output and error lines; anthropic: Message Batches result lines "
                   "(succeeded, errored, canceled, expired).")
@click.option("--summary", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the batch's summary: OpenAI's batch object (status, created_at, in_progress_at, "
                   "completed_at, cancelled_at, expired_at..., request_counts, usage) as JSON.")
@json_option("batch_id, format, output, results, errors, failures and summary")
def results(batch_id: str, output: Path, errors: Path | None, format_name: str, summary: Path | None,
            as_json: bool) -> None:
    """Export a batch: exactly one line per custom_id, even when the results topic holds duplicates.

    \b
    Examples:
      streamproc results --batch-id labels-2026-11 --output out.jsonl --errors errors.jsonl
      streamproc results --batch-id labels-2026-11 --format anthropic --output results.jsonl
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.kafka.schema_registry import reader_lookup
    from streamproc.ops.batches import batch_object
    from streamproc.ops.results import ONE_FILE_FORMATS, export_results

    settings = _settings()
    kafka, topology = resolve_connection(settings), settings.topology()
    report = export_results(kafka, topology, batch_id, output, errors, format_name,
                            reader_lookup(settings.schema_registry))
    if summary is not None:
        batch = _run(batch_object(kafka, topology, batch_id, stall_after_s=settings.stall_after_s,
                                  prices=settings.model_prices))
        summary.write_text(json.dumps(batch, indent=2) + "\n", encoding="utf-8")
    if as_json:
        _echo_json({"batch_id": batch_id, "format": format_name, **report.as_json(),
                    "summary": None if summary is None else str(summary)})
        return
    if errors is not None:
        click.echo(f"{report.results} results to {output}, {report.failures} failures to {errors}")
    elif format_name in ONE_FILE_FORMATS:
        click.echo(f"{report.results} results and {report.failures} failures to {output}")
    else:
        click.echo(f"{report.results} results to {output} ({report.failures} failures not written)")
    if summary is not None:
        click.echo(f"batch summary to {summary}")


@cli.command("sink")
@kafka_options
@click.option("--to", "url", required=True, metavar="URL",
              help="sqlite:///relative.db, sqlite:////absolute.db or postgresql://user@host:5432/db")
@click.option("--group", help="Consumer group of the sink [default: <app id>.sink]; one per database.")
@click.option("--until-idle", is_flag=True, help="Stop once every record on the topics is written (else follow).")
def sink(url: str, group: str | None, until_idle: bool) -> None:
    """Follow results, failed attempts and dead letters into a database (tables results, failures,
    dead_letters; view requests). Idempotent upserts, offsets committed after the rows: restart it any time.

    \b
    Example:
      streamproc sink --to sqlite:///outcomes.db --until-idle
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.kafka.schema_registry import reader_lookup
    from streamproc.sink.follow import default_group, run_sink
    from streamproc.sink.target import parse_target

    settings = _settings()
    target = parse_target(url)
    _run(run_sink(resolve_connection(settings), settings.topology(), settings.durability.replication, target,
                  group=group or default_group(settings.app_id), until_idle=until_idle, report=click.echo,
                  schema_lookup=reader_lookup(settings.schema_registry)))


def _mock_profile(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --mock-llm profile the mock server will load (checked before anything starts)."""
    from streamproc.mockllm.profiles import ProfileError, load_profile

    if value is not None:
        try:
            load_profile(value)
        except ProfileError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@cli.command("run")
@kafka_options
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--errors", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--batch-id", help="Default: the file name and the time.")
@click.option("--timeout", default=3600.0, show_default=True, help="Seconds to wait for the batch to converge.")
@click.option("--mock-llm", "mock_profile", metavar="PROFILE", callback=_mock_profile,
              help="Answer with the built-in mock LLM server (fake answers) with this profile: clean, flaky, "
                   "realistic, outage, strict or a profile file. Without it, STREAMPROC_LLM_BASE_URL is required.")
@click.option("--workers", type=click.IntRange(min=0),
              help="Worker processes to start here [default: 1 with the built-in broker, else 0].")
@click.option("--reuse-results", is_flag=True, help=_REUSE_HELP)
@json_option("the outcome (batch_id, seconds, llm_calls, submit, status, export)")
def run(file: Path, output: Path, errors: Path | None, batch_id: str | None, timeout: float,
        mock_profile: str | None, workers: int | None, reuse_results: bool, as_json: bool) -> None:
    """Submit FILE, show progress until the batch converged, export results (and errors).

    With no Kafka cluster (-b or STREAMPROC_KAFKA_BOOTSTRAP) it starts the built-in broker and a worker.
    The LLM is STREAMPROC_LLM_BASE_URL's; with none it refuses (exit 3) unless --mock-llm asks for the
    built-in mock server, so a real file never gets fake answers by accident.

    \b
    Examples:
      streamproc run requests.jsonl --output out.jsonl --errors errors.jsonl
      streamproc run requests.jsonl --output out.jsonl --mock-llm realistic
    """
    from streamproc.ops.run import format_outcome, run_batch

    batch_id = batch_id or f"{file.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    report = run_batch(_settings(), file, output, errors, batch_id, timeout, mock_profile, workers, _warn,
                       reuse_results)
    if as_json:
        _echo_json(report.as_json())
        return
    click.echo(f"batch {batch_id} converged")
    click.echo(format_outcome(report))


def _warn(text: str) -> None:
    click.secho(text, err=True, fg="yellow")


@cli.command("backfill")
@kafka_options
@click.option("--batch-id", help="Only this batch.")
@click.option("--layer", "layers", multiple=True, type=click.Choice([layer.value for layer in FailureLayer]),
              help="Only these failure layers (repeatable).")
@click.option("--error-code", "error_codes", multiple=True, help="Only these error codes (repeatable).")
@click.option("--since", type=IsoDateTime(), help="Only failures at or after this time (ISO 8601; no zone: UTC).")
@click.option("--until", type=IsoDateTime(), help="Only failures before this time (ISO 8601; no zone: UTC).")
@click.option("--include-business", is_flag=True, help="Also replay business failures (after fixing the input).")
@click.option("--dry-run", is_flag=True, help="Print the plan and send nothing.")
@click.option("--rate", default=50.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Replays sent per second.")
@click.option("--from-db", "from_db", metavar="URL",
              help="Select from the database `streamproc sink --to URL` writes, not from the failure topics.")
@json_option("the plan (and replayed: how many were sent)")
def backfill(batch_id: str | None, layers: tuple[str, ...], error_codes: tuple[str, ...], since: datetime | None,
             until: datetime | None, include_business: bool, dry_run: bool, rate: float, from_db: str | None,
             as_json: bool) -> None:
    """Replay terminal failures from the failure topics, or the sink's database (after printing the plan).

    Requests that succeeded since, and those of forgotten batches, are skipped; semantic failures are
    replayed with a repair prompt; business failures only with --include-business. Running it twice is safe.

    \b
    Example:
      streamproc backfill --batch-id labels-2026-11 --layer transport --layer service --dry-run
      streamproc backfill --batch-id labels-2026-11 --from-db sqlite:///outcomes.db
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.kafka.schema_registry import reader_lookup
    from streamproc.ops.backfill import BackfillFilter, plan_backfill, read_for_backfill, read_forgotten, replay
    from streamproc.ops.progress import Progress
    from streamproc.sink.ledger import read_ledger
    from streamproc.sink.target import parse_target

    settings = _settings()
    selection = BackfillFilter(
        batch_id=batch_id, layers=frozenset(FailureLayer(v) for v in layers) or frozenset(FailureLayer),
        error_codes=frozenset(error_codes), since_ms=_epoch_ms(since), until_ms=_epoch_ms(until),
        include_business=include_business)
    if from_db is None:
        failures, statuses = _run(read_for_backfill(resolve_connection(settings), settings.topology(),
                                                    reader_lookup(settings.schema_registry)))
    else:
        failures, statuses = read_ledger(parse_target(from_db), batch_id)
    forgotten = _run(read_forgotten(resolve_connection(settings), settings.topology()))
    plan = plan_backfill(failures, statuses, selection, forgotten)
    if not as_json:
        click.echo(f"backfill plan: {len(plan.replays)} to replay, {plan.to_skip} to skip")
        for row in plan.rows():
            click.echo(f"  {row['layer']:<10} {row['error_code']:<28} {row['count']:>7}  {row['decision']}")
    sent = 0
    if plan.replays and not dry_run:
        with Progress("replaying") as bar:
            sent = _run(replay(resolve_connection(settings), settings.topology(), settings.durability, plan, rate,
                               bar))
    if as_json:
        _echo_json({**plan.summary(), "dry_run": dry_run, "replayed": sent})
    elif sent:
        click.echo(f"replayed {sent} requests; follow them with `streamproc status`")


def _epoch_ms(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


@cli.command("worker")
@kafka_options
@click.option("--loglevel", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def worker(loglevel: str) -> None:
    """Consume requests (and retry tiers), call the LLM, emit results or layered failures.

    Start more workers with the same STREAMPROC_APP_ID (on any machine) to scale out: they share the
    partitions as one consumer group. Stop with SIGTERM or Ctrl-C: in-flight calls finish first.
    Exit code 3: the LLM endpoint refused the configuration (key, quota, endpoint); fix it and restart.
    Exit code 1: a record could neither be handled nor its outcome written (Kafka refused the writes);
    restart it: the record is read again (a supervisor such as systemd or Kubernetes does that).
    """
    from streamproc.app.worker import run_worker

    sys.exit(run_worker(_settings(), loglevel.upper()))


@cli.command("lag")
@kafka_options
@click.option("--group", "groups", multiple=True, metavar="GROUP",
              help="Consumer group; repeatable [default: STREAMPROC_APP_ID, the workers' group].")
@click.option("--all-groups", is_flag=True, help="Every consumer group of the cluster.")
@json_option("the lag (keys in docs/cli.md)")
@click.option("--max-lag", type=click.IntRange(min=0), metavar="N",
              help=f"Exit {int(ExitCode.THRESHOLD)} when the total lag of a group exceeds N.")
@click.option("--interval", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between the two readings the consumption rate comes from.")
@click.option("--no-rate", is_flag=True, help="One reading: no rate and no time-to-drain estimate.")
def lag(groups: tuple[str, ...], all_groups: bool, as_json: bool, max_lag: int | None, interval: float,
        no_rate: bool) -> None:
    """Consumer lag per group/topic/partition, with the consumption rate and an estimated time to drain.

    Lag is log-end offset minus committed offset. The rate comes from two readings --interval seconds
    apart; the time to drain divides the lag by the net rate (consumed minus arriving). faust's internal
    topics (table changelogs) are shown with a * and not counted.

    \b
    Exit codes: 0 ok; 2 unknown group; 3 broker unreachable; 4 a group's lag is over --max-lag.

    \b
    Example:
      streamproc lag --max-lag 10000
      streamproc lag --group streamproc --json --interval 10
    """
    from streamproc.app.bootstrap import resolve_connection
    from streamproc.app.lag_reader import read_lag, sample_lag
    from streamproc.ops.lag_report import dumps, format_table

    settings = _settings()
    kafka = resolve_connection(settings)
    wanted = None if all_groups else list(groups) or [settings.app_id]
    topology = settings.topology()  # the workers' inputs are listed even before their first commit
    inputs = {settings.app_id: topology.inputs}
    if no_rate:
        report = _run(read_lag(kafka, wanted, inputs))
    else:
        if sys.stderr.isatty():
            click.echo(f"reading offsets twice, {interval:g}s apart (--no-rate: once)...", err=True)
        report = _run(sample_lag(kafka, wanted, interval, inputs))
    click.echo(dumps(report, max_lag) if as_json else format_table(report))
    if max_lag is not None and (over := report.over(max_lag)):
        worst = max(over, key=lambda group: group.lag)
        others = f" (and {len(over) - 1} more group(s))" if len(over) > 1 else ""
        click.echo(f"lag: group {worst.group!r} has a lag of {worst.lag} records, over --max-lag {max_lag}{others}",
                   err=True)
        sys.exit(ExitCode.THRESHOLD)


def main() -> None:
    """Entry point of the ``streamproc`` script."""
    cli()
