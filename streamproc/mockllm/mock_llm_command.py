"""``streamproc mock-llm``: serve the fault-injecting OpenAI-compatible server until SIGINT/SIGTERM.

The first stdout line is ``mock-llm listening on http://HOST:PORT/v1`` (flushed), so a parent process
started with ``--port 0`` learns the URL; everything else goes to stderr.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import TYPE_CHECKING

import click

from streamproc.mockllm.injected_faults import FaultKind
from streamproc.mockllm.latency import Latency, LatencyError, parse_latency_spec

if TYPE_CHECKING:
    from streamproc.mockllm.profiles import Profile


def _pairs(values: tuple[str, ...], option: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not name or not number:
            raise click.BadParameter(f"{value!r} is not NAME=VALUE", param_hint=option)
        pairs.append((name.strip(), number.strip()))
    return pairs


def _models(values: tuple[str, ...]) -> dict[str, int]:
    models: dict[str, int] = {}
    for name, window in _pairs(values, "--model"):
        if not window.isdigit() or int(window) <= 0:
            raise click.BadParameter(f"context window of {name!r} must be a positive integer", param_hint="--model")
        models[name] = int(window)
    return models


def _faults(values: tuple[str, ...]) -> dict[FaultKind, float]:
    faults: dict[FaultKind, float] = {}
    for name, rate in _pairs(values, "--fault"):
        try:
            faults[FaultKind(name)] = float(rate)
        except ValueError:
            known = ", ".join(k.value for k in FaultKind)
            raise click.BadParameter(
                f"{name}={rate}: fault kinds are {known}; rates are numbers", param_hint="--fault"
            ) from None
    return faults


def _batch_faults(values: tuple[str, ...]) -> dict[int, str]:
    """``--batch-fault 3:expire=0.5``: batch number -> x-mock-batch parts (the parts are checked by the profile)."""
    faults: dict[int, str] = {}
    for value in values:
        number, sep, parts = value.partition(":")
        if not sep or not number.strip().isdigit():
            raise click.BadParameter(f"{value}: N:PARTS expected, e.g. 3:expire=0.5", param_hint="--batch-fault")
        faults[int(number)] = parts
    return faults


def _latency(spec: str | None) -> Latency | None:
    if spec is None:
        return None
    try:
        return parse_latency_spec(spec)
    except LatencyError as exc:
        raise click.BadParameter(str(exc), param_hint="--latency") from None


@click.command("mock-llm", context_settings={"help_option_names": ["-h", "--help"]})  # also when run alone
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8100,
    show_default=True,
    help="Port to listen on; 0 picks a free one (the first stdout line tells which).",
)
@click.option(
    "--profile",
    "profile_name",
    default="clean",
    show_default=True,
    metavar="NAME|FILE",
    help="clean, flaky, realistic, outage, strict, strict-v1, strict-unlimited, or a YAML/JSON profile file.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the fault and latency draws.")
@click.option("--api-key", default=None, help="Require this bearer key (a wrong one gets 401 invalid_api_key).")
@click.option("--rpm", type=click.IntRange(min=1), default=None, help="Requests-per-minute limit (all clients).")
@click.option("--tpm", type=click.IntRange(min=1), default=None, help="Tokens-per-minute limit (all clients).")
@click.option(
    "--burst-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Size of the rate-limit buckets, in seconds of the per-minute rate (default 0.25).",
)
@click.option(
    "--latency",
    "latency_spec",
    default=None,
    metavar="SPEC",
    help="Latency of every model: SECONDS, uniform:LOW:HIGH or lognormal:P50:P99.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME=WINDOW",
    help="Serve another model (or change a window), e.g. gpt-4o-mini=128000. Repeatable.",
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    metavar="KIND=RATE",
    help="Override the rate of one fault kind, e.g. server_error=0.05. Repeatable.",
)
@click.option(
    "--outage",
    "outage_seconds",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Answer 503 to every call for this long after start.",
)
@click.option(
    "--hang-seconds",
    type=click.FloatRange(min=0),
    default=None,
    help="How long a hang fault lasts if the client does not give up first (default 300; inf: forever).",
)
@click.option(
    "--slots",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Work on at most N requests at once; the rest queue in arrival order (llama.cpp's slots).",
)
@click.option(
    "--batch-seconds",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="How long a provider batch (OpenAI Batch, Anthropic Message Batches) stays in_progress (default 1).",
)
@click.option(
    "--batch-fault",
    "batch_faults",
    multiple=True,
    metavar="N:PARTS",
    help="Give the Nth OpenAI provider batch created the x-mock-batch parts PARTS, e.g. 3:expire=0.5 or 5:invalid "
    "(for clients that send no header). Repeatable.",
)
@click.option("--access-log", is_flag=True, help="Log every request to stderr (slows the server down).")
def mock_llm(
    host: str,
    port: int,
    profile_name: str,
    seed: int,
    api_key: str | None,
    rpm: int | None,
    tpm: int | None,
    burst_seconds: float | None,
    latency_spec: str | None,
    models: tuple[str, ...],
    faults: tuple[str, ...],
    outage_seconds: float | None,
    hang_seconds: float | None,
    slots: int | None,
    batch_seconds: float | None,
    batch_faults: tuple[str, ...],
    access_log: bool,
) -> None:
    """Serve a fault-injecting OpenAI-compatible LLM API for rehearsing a batch's failure handling.

    Endpoints: POST /v1/chat/completions (JSON or SSE), POST /v1/completions, GET /v1/models, GET /stats,
    GET /healthz, POST /control/outage, POST /control/reset; OpenAI's /v1/files and /v1/batches and
    Anthropic's /v1/messages/batches. See docs/mock-llm.md.
    """
    # here: the profiles' YAML, asyncio and the server's aiohttp would slow every other command, --help included
    import asyncio

    from streamproc.mockllm.profiles import Overrides, ProfileError, customize, load_profile

    overrides = Overrides(
        rpm=rpm,
        tpm=tpm,
        burst_seconds=burst_seconds,
        latency=_latency(latency_spec),
        models=_models(models),
        faults=_faults(faults),
        outage_seconds=outage_seconds,
        hang_seconds=hang_seconds,
        slots=slots,
        batch_seconds=batch_seconds,
        batch_faults=_batch_faults(batch_faults),
    )
    try:
        profile = customize(load_profile(profile_name), overrides)
    except ProfileError as exc:
        raise click.BadParameter(str(exc), param_hint="--profile") from None
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(_serve(profile, seed, api_key, host, port, access_log))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None


async def _serve(profile: Profile, seed: int, api_key: str | None, host: str, port: int, access_log: bool) -> None:
    import asyncio

    from streamproc.mockllm.runner import LISTENING_PREFIX, running_mock_llm

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with running_mock_llm(profile, seed, api_key=api_key, host=host, port=port, access_log=access_log) as handle:
        click.echo(f"{LISTENING_PREFIX}{handle.url}")
        sys.stdout.flush()
        rates = ", ".join(f"{k.value}={v:g}" for k, v in sorted(profile.faults.items()) if v) or "none"
        models = ", ".join(f"{m.name}({m.context_window})" for m in profile.models)
        slots = f"; {profile.slots} slot(s)" if profile.slots is not None else ""
        click.echo(f"profile {profile.name}, seed {seed}; models {models}; faults {rates}{slots}", err=True)
        await stop.wait()
    click.echo("mock-llm stopped", err=True)
