"""``scripts/bench fleet``: the workers' pace against servers whose 429s are not all their limiter's, one worker
and a fleet, beside asyncio+tenacity and LiteLLM's Router on the same server, ``--runs`` times (default 5),
every run printed.

Starts a private Kafka broker, then for each run ``i`` and each profile of ``--fleet-profiles`` a fresh
``mock-llm --profile P --seed S+i`` for each client (the ``servers`` suite's clients and request mix):

* ``strict``: RPM 3,000 with a one-second bucket, its limiter's 429s carry ``x-ratelimit-limit-requests``,
  ``remaining 0`` and ``retry-after-ms``; besides, 1 % of calls get a 429 with only ``retry-after: 1``
  whatever the rate; transport/service/semantic/business faults, hangs of 90 s;
* ``strict-v1``: the strict profile as first built (2 % injected 429s that carry the limiter's headers,
  saying its bucket has room; hangs without end);
* ``strict-unlimited``: strict's faults, 429s and hangs, no rate limit at all.

Against each: the worker with its default settings (hedging on), the worker with hedging off
(``STREAMPROC_LLM_HEDGE_RATIO=0``), asyncio+tenacity and LiteLLM's Router (``--fleet-clients``). Each worker
client runs as the rows of ``--fleet-workers``: ``1`` worker, ``2`` and ``3`` started together, ``join`` (2,
a third started once a third of the requests had an outcome) and ``kill`` (3, one SIGKILLed then). The
workers derive their shares of the limit through the ``<prefix>.fleet`` topic (design §5.8; no
``STREAMPROC_LLM_LIMIT_SHARE``). The rows of more than one worker run against ``strict`` only: the profile
whose limit the issue's fleet targets are set at.

Each run prints, per profile and client: the wall (first call → last outcome), the ideal (calls the
server's limiter admitted ÷ RPM; for ``strict-unlimited`` the strict profile's RPM, for reference),
wall / ideal, all 429s and the limiter's 429s as shares of the calls, the workers' hedged calls (a killed
worker's as read just before the kill), the business failures the server answered more than once for one
request (a worker never retries one: its hedges; a peer's retries), the requests that ended more than once,
the recoverable requests without a result. Targets, checked in every run (not the median): against
``strict`` and ``strict-v1``, wall / ideal <= 1.10 for one worker and <= 1.15 for the other rows, and 429s
<= 2 % of calls (all of them against ``strict``; the limiter's against ``strict-v1``, whose own injected
429s are 2 %); against every profile, the workers' wall below both peers' walls (single processes, same run
and profile) and every request ended exactly once. A missed target is a warning; the exit code is 1 only
when a run did not finish.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from benchmarks.fleet_workers import ONE, SCENARIOS
from benchmarks.pipeline import BenchError, Stack, add_worker_setting_argument, open_bench, suite_main, table
from benchmarks.servers import (
    TARGET_WALL_RATIO,
    ServersBench,
    StrictRun,
    add_strict_arguments,
    check_strict_arguments,
)

TARGET_429_SHARE = 0.02
TARGET_FLEET_WALL_RATIO = 1.15  # several workers: a rebalance (a start, a join, a kill) costs seconds
PROFILES = ("strict", "strict-v1", "strict-unlimited")
RATIO_PROFILES = frozenset({"strict", "strict-v1"})  # wall / ideal and the 429 share are targets against these
LIMITER_429_ONLY = frozenset({"strict-v1"})  # its own injected 429s alone are 2 %: the target is the limiter's
FLEET_PROFILES = frozenset({"strict"})  # the rows of more than one worker run against these
WORKERS: Mapping[str, tuple[str, Mapping[str, str]]] = {  # client -> (label, the worker's settings)
    "worker": ("worker", {}),
    "worker-no-hedge": ("worker, hedging off", {"STREAMPROC_LLM_HEDGE_RATIO": "0"}),
}
PEERS: Mapping[str, str] = {"tenacity": "asyncio+tenacity", "litellm": "LiteLLM Router"}
CLIENTS = (*WORKERS, *PEERS)


@dataclass(frozen=True)
class Measured:
    """One client against one profile in one run."""

    run: int
    profile: str
    client: str
    figures: StrictRun
    workers: str = ONE.name  # the row of --fleet-workers

    @property
    def label(self) -> str:
        return client_label(self.client, self.workers)

    @property
    def worker(self) -> bool:
        return self.client in WORKERS

    @property
    def share_429(self) -> float:
        """The 429s the target counts, as a share of the calls (see the module docstring)."""
        return self.figures.share_paced_429 if self.profile in LIMITER_429_ONLY else self.figures.share_429


def client_label(client: str, workers: str) -> str:
    """E.g. "worker, hedging off", or "3 workers, hedging off" for the row of 3."""
    label = WORKERS[client][0] if client in WORKERS else PEERS[client]
    return label if workers == ONE.name else SCENARIOS[workers].label + label.removeprefix("worker")


@dataclass(frozen=True)
class Check:
    """One target of one run: what, the figure, whether it held."""

    run: int
    profile: str
    what: str
    figure: str
    met: bool


def checks(measured: Sequence[Measured]) -> list[Check]:
    """Every target of every run (see the module docstring)."""
    found: list[Check] = []
    for one in measured:
        if not one.worker:
            continue
        run = one.figures
        label = one.label
        if one.profile in RATIO_PROFILES:
            ratio = run.ratio
            target = TARGET_WALL_RATIO if one.workers == ONE.name else TARGET_FLEET_WALL_RATIO
            found.append(Check(one.run, one.profile, f"{label}: wall / ideal <= {target:.2f}",
                               "n/a" if ratio is None else f"{ratio:.3f}",
                               run.converged and ratio is not None and ratio <= target))
            which = "the limiter's 429s" if one.profile in LIMITER_429_ONLY else "429s"
            found.append(Check(one.run, one.profile, f"{label}: {which} <= {TARGET_429_SHARE:.0%} of calls",
                               f"{one.share_429:.2%}", one.share_429 <= TARGET_429_SHARE))
        peers = [other for other in measured if (other.run, other.profile) == (one.run, one.profile)
                 and other.client in PEERS]
        for peer in peers:
            mine, theirs = run.wall_s, peer.figures.wall_s if peer.figures.converged else None
            below = run.converged and mine is not None and (theirs is None or mine < theirs)
            found.append(Check(one.run, one.profile, f"{label}: wall below {PEERS[peer.client]}'s",
                               f"{_seconds(mine)} vs {_seconds(theirs)}", below))
        found.append(Check(one.run, one.profile, f"{label}: every request ended once",
                           f"{run.finished} of {len(run.ids)} ended, {run.repeated_outcomes} more than once",
                           run.converged and run.repeated_outcomes == 0))
    return found


def _seconds(value: float | None) -> str:
    return "did not finish" if value is None else f"{value:.1f} s"


def rows(measured: Sequence[Measured]) -> list[tuple[str, ...]]:
    """One row per run, profile and client: every figure."""
    out: list[tuple[str, ...]] = []
    for one in measured:
        run = one.figures
        ratio = run.ratio
        wall = _seconds(run.wall_s if run.converged else None)
        out.append((str(one.run), one.profile, one.client, one.workers if one.worker else "-", wall,
                    f"{run.ideal_s:.1f} s",
                    "n/a" if ratio is None or not run.converged else f"{ratio:.3f}",
                    f"{run.share_429:.2%}", f"{run.share_paced_429:.2%}",
                    "-" if run.hedged is None else str(run.hedged), str(run.hedged_business),
                    str(run.repeated_outcomes), f"{len(run.unrecovered)}/{len(run.recoverable)}",
                    f"{len(run.results)}/{len(run.ids)}"))
    return out


HEADER = ("run", "profile", "client", "workers", "wall", "ideal", "wall/ideal", "429s", "limiter 429s", "hedged",
          "business twice", "ended twice", "unrecovered", "results")


def print_run(measured: Sequence[Measured], run: int) -> None:
    mine = [one for one in measured if one.run == run]
    print(f"\nrun {run}: load average {os.getloadavg()[0]:.2f}")
    print(table(rows(mine), HEADER))
    for check in checks(mine):
        print(f"  {'met' if check.met else 'MISSED'}: {check.profile}, {check.what}: {check.figure}")


def report(args: argparse.Namespace, measured: Sequence[Measured], notes: Sequence[str]) -> None:
    print(f"\nstreamproc fleet benchmark: {os.cpu_count()} CPUs, {args.runs} runs, seeds {args.strict_seed}.."
          f"{args.strict_seed + args.runs - 1}, {args.strict_requests} requests each, workers "
          f"{args.fleet_workers}; load average now "
          f"{os.getloadavg()[0]:.2f}")
    print(table(rows(measured), HEADER))
    found = checks(measured)
    missed = [check for check in found if not check.met]
    print(f"targets: {len(found) - len(missed)} of {len(found)} met in every run they apply to"
          if not missed else f"targets: {len(missed)} of {len(found)} MISSED")
    for check in missed:
        print(f"WARNING: run {check.run}, {check.profile}, {check.what}: {check.figure}")
    for note in notes:
        print(f"WARNING: {note}")


async def measure(servers: ServersBench, run: int, profile: str, client: str, seed: int,
                  workers: str = ONE.name) -> Measured | None:
    name = f"{profile}-r{run}-{client}" + ("" if workers == ONE.name else f"-w{workers}")
    if client in WORKERS:
        settings = {**dict(servers.args.worker_setting or []), **WORKERS[client][1]}
        figures = await servers.strict_worker(seed, profile, name, f"{profile}, {client_label(client, workers)}",
                                              settings,
                                              SCENARIOS[workers])
    else:
        # the requests of the one-worker run (their ids name the batch): the same contents, so the same faults
        found = await servers.strict_client(client, PEERS[client], seed, profile, f"{profile}-r{run}-worker")
        if found is None:
            return None
        figures = found
    return Measured(run, profile, client, figures, workers)


def rows_of(profile: str, client: str, workers: Sequence[str]) -> list[str]:
    """The --fleet-workers rows a client runs against a profile: a peer, one; a worker, those selected (but
    one worker only against the profiles outside :data:`FLEET_PROFILES`)."""
    if client in PEERS:
        return [ONE.name]
    return [row for row in workers if row == ONE.name or profile in FLEET_PROFILES]


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The fleet suite's options, and the servers suite's it shares (requests, seed, clients' concurrency)."""
    parser.add_argument("--runs", type=int, default=5, help="runs of every profile and client [5]")
    parser.add_argument("--fleet-profiles", default=",".join(PROFILES),
                        help=f"comma-separated mock profiles [{','.join(PROFILES)}]")
    parser.add_argument("--fleet-clients", default=",".join(CLIENTS),
                        help=f"comma-separated clients [{','.join(CLIENTS)}]")
    parser.add_argument("--fleet-workers", default=",".join(SCENARIOS),
                        help="comma-separated rows of each worker client: 1, 2 or 3 workers, join (2, a third "
                             "starts at 1/3 of the batch), kill (3, one SIGKILLed at 1/3); more than one worker "
                             f"only against {', '.join(sorted(FLEET_PROFILES))} [{','.join(SCENARIOS)}]")
    add_strict_arguments(parser)
    add_worker_setting_argument(parser)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    check_strict_arguments(parser, args)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    for option, allowed in (("fleet_profiles", PROFILES), ("fleet_clients", CLIENTS),
                            ("fleet_workers", tuple(SCENARIOS))):
        unknown = set(getattr(args, option).split(",")) - set(allowed)
        if unknown:
            parser.error(f"--{option.replace('_', '-')}: unknown {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join(allowed)}")


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    bench = open_bench(args, stack)
    servers = ServersBench(bench, args)
    profiles, clients = args.fleet_profiles.split(","), [c for c in CLIENTS if c in args.fleet_clients.split(",")]
    workers = [row for row in SCENARIOS if row in args.fleet_workers.split(",")]
    measured: list[Measured] = []
    for index in range(args.runs):
        for profile in profiles:
            for client in clients:
                for row in rows_of(profile, client, workers):
                    one = await measure(servers, index + 1, profile, client, args.strict_seed + index, row)
                    if one is not None:
                        measured.append(one)
        print_run(measured, index + 1)
    report(args, measured, servers.notes)
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")
    unfinished = [f"run {one.run} {one.profile} {one.label}" for one in measured
                  if one.worker and not one.figures.converged]
    if unfinished:
        raise BenchError(f"did not finish within --servers-deadline-s: {', '.join(unfinished)} (figures above)")


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.fleet", __doc__, add_arguments, check_arguments, run,
               sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
