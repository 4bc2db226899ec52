"""From collected facts to the one table a chaos run prints, and the verdict: pure, no I/O.

Kept apart from the orchestration so that the arithmetic the run is judged by (what counts as lost, as a
duplicated call, as an explained poison record) is unit-tested on its own.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from streamproc.core.identity import custom_id_of
from streamproc.devstack.chaos.facts import IdOutcome, Outcomes
from streamproc.devstack.chaos.fault_schedule import Fault, FaultKind, FiredFault
from streamproc.devstack.chaos.poison import Expect, Poison, PoisonKind
from streamproc.devstack.chaos.worker_metrics import StallReading

KILL_DROP_WINDOW_S = 2.0  # an LLM call the client dropped this soon after a kill was cut by the kill
DETAIL_WIDTH = 110


@dataclass(frozen=True)
class WorkerExit:
    """A worker that exited although nobody killed it (the run restarts it, as a supervisor would)."""

    worker: int
    code: int
    at_s: float
    log_excerpt: str = ""


@dataclass(frozen=True)
class MeasuredBatch:
    """One measured batch: the whole batch, or one tenant's (``--tenants``), with what the end read of it."""

    batch_id: str
    tenant: str | None  # None: submitted without --tenant (the default tenant's)
    submitted: Sequence[str]  # request ids (submit scopes each custom_id by the batch)
    export_ids: Sequence[str] = ()  # custom_id of every line of its results export (output and errors files)
    status_json: Mapping[str, object] | None = None  # `streamproc status --json` at the end (the summaries)
    verified_json: Mapping[str, object] | None = None  # `streamproc status --json --verify` (the changelog fold)
    converged_after_s: float | None = None  # from its own submit: a small tenant's wait behind a flood
    own_bodies: Mapping[str, str] = field(default_factory=dict)  # request id -> body_digest of its line in the file
    priority: str | None = None  # None: submitted without --priority

    @property
    def label(self) -> str:
        named = f"tenant {self.tenant}" if self.tenant else "the batch"
        return f"{named} ({self.priority})" if self.priority else named


@dataclass(frozen=True)
class ChaosFacts:
    """Everything the verdict is computed from. Times are seconds since the run started."""

    batches: Sequence[MeasuredBatch]  # one per tenant, the largest first
    outcomes: Outcomes
    llm_calls: Mapping[str, int]  # LLM calls per request id, as the mock counted them
    planned: Sequence[Fault]
    fired: Sequence[FiredFault]
    call_drops_s: Sequence[float]  # when a client dropped an open LLM call
    stalls: Sequence[StallReading]  # every /metrics reading that showed a partition stalled
    group_stalls: Sequence[StallReading]  # the same rule applied from outside, to the group's committed offsets
    stall_threshold_s: float  # the workers' watchdog threshold: slowest retry tier + LLM timeout
    stalled_at_end: frozenset[tuple[int, str, int]]
    redriven: float | None  # None: no worker exported the counter
    hedged: float | None  # hedged calls the workers sent on purpose (None: not exported)
    converged_at_s: float | None
    submitted_at_s: float
    wall_s: float
    poison: Sequence[Poison]
    unplanned_exits: Sequence[WorkerExit] = ()
    unfinished_states: Mapping[str, str] = field(default_factory=dict)  # request id -> its state, described
    trace: Sequence[str] = ()

    @property
    def tenanted(self) -> bool:
        """More than one batch: the report counts per tenant too."""
        return len(self.batches) > 1


@dataclass(frozen=True)
class Row:
    label: str
    value: str
    detail: str = ""


@dataclass(frozen=True)
class Tally:
    rows: list[Row]
    problems: list[str]
    details: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


COUNT_KEYS = ("submitted", "succeeded", "failed", "retrying", "in_flight", "pending", "converged", "usage", "reused")


def counts_of(status: Mapping[str, object]) -> dict[str, object]:
    """What ``status --json`` counts (no times, no stall): what the summaries and the fold must agree on."""
    return {key: status.get(key) for key in COUNT_KEYS}


def lost_ids(batch_id: str, submitted: Sequence[str], outcomes: Outcomes) -> list[str]:
    """Submitted ids of the batch with neither a result nor a terminal failure of that batch; a
    ``conflicting_duplicate`` does not count (:attr:`IdOutcome.ended_as_submitted`)."""
    return [i for i in submitted if not outcomes.get(batch_id, i).ended_as_submitted]


def refused_own(batch: MeasuredBatch, outcomes: Outcomes) -> list[str]:
    """Ids whose own record (the body the batch file holds) was refused as a ``conflicting_duplicate``: another
    record took the id first, and the user's request was never handled."""
    return [i for i in batch.submitted if (own := batch.own_bodies.get(i)) is not None
            and own in outcomes.get(batch.batch_id, i).conflict_bodies]


def duplicated_calls(batch_id: str, submitted: Sequence[str], outcomes: Outcomes,
                     llm_calls: Mapping[str, int]) -> tuple[int, int]:
    """LLM calls beyond the attempts each request's events name (a repeated call of one attempt), summed;
    and, the other way round, attempts the LLM never saw (a call that failed before reaching it)."""
    extra = unseen = 0
    for request_id in submitted:
        attempts = outcomes.get(batch_id, request_id).attempts
        if not attempts:
            continue  # never ended: counted as lost, not here
        calls = llm_calls.get(request_id, 0)
        extra += max(0, calls - attempts)
        unseen += max(0, attempts - calls)
    return extra, unseen


def repeated_export_ids(export_ids: Sequence[str]) -> dict[str, int]:
    """custom_ids on more than one line of the export (both files together)."""
    return {i: n for i, n in Counter(export_ids).items() if n > 1}


def calls_cut(kill_at_s: float, drops_s: Sequence[float], window_s: float = KILL_DROP_WINDOW_S) -> int:
    return sum(1 for t in drops_s if kill_at_s <= t <= kill_at_s + window_s)


@dataclass(frozen=True)
class Stall:
    """One partition the workers' watchdog reported stalled: when first and last, by whom."""

    topic: str
    partition: int
    first_s: float
    last_s: float
    workers: frozenset[int]
    readings: int


def stalls_by_partition(readings: Sequence[StallReading]) -> list[Stall]:
    """Every reading counts (a stall that cleared by itself was still one); grouped per partition."""
    grouped: dict[tuple[str, int], list[StallReading]] = {}
    for reading in readings:
        grouped.setdefault((reading.topic, reading.partition), []).append(reading)
    return [Stall(topic, partition, min(r.at_s for r in rs), max(r.at_s for r in rs),
                  frozenset(r.worker for r in rs), len(rs)) for (topic, partition), rs in sorted(grouped.items())]


def fault_before(at_s: float, fired: Sequence[FiredFault]) -> str:
    """The last fault fired before ``at_s``, for the reader of a stall report."""
    earlier = [f for f in fired if f.at_s <= at_s]
    if not earlier:
        return "before any fault"
    last = max(earlier, key=lambda f: f.at_s)
    return f"{at_s - last.at_s:.0f}s after: {last.fault.describe()}"


def explained(poison: Poison, outcomes: Outcomes) -> tuple[bool, str]:
    """Whether a poison record ended as it must, and what became of it."""
    if poison.expect is Expect.REFUSED:
        return poison.refused_as_it_must, poison.note
    if poison.expect is Expect.DEAD_LETTER:
        count = outcomes.dead_letters.get(poison.value_sha or "", 0)
        return count > 0, f"{count} dead letter(s)" if count else "no dead letter"
    assert poison.request_id is not None
    seen = outcomes.any_batch(poison.request_id)
    how = _describe(seen)
    if poison.expect is Expect.CONFLICT:
        return (poison.body_sha in seen.conflict_bodies), how
    if poison.expect is Expect.TERMINAL_FAILURE:
        return bool(seen.terminal_codes), how
    return seen.ended, how


def _describe(outcome: IdOutcome) -> str:
    parts = [f"{outcome.results} result(s)"] if outcome.results else []
    parts += [f"{code} x{n}" for code, n in sorted(Counter(outcome.terminal_codes).items())]
    return ", ".join(parts) or "nothing yet"


def _fault_counts(planned: Sequence[Fault], fired: Sequence[FiredFault]) -> tuple[str, list[str]]:
    shown, missing = [], []
    for kind in FaultKind:
        want = sum(1 for f in planned if f.kind is kind)
        if not want:
            continue
        got = sum(1 for f in fired if f.fault.kind is kind)
        shown.append(f"{kind.value} {got}/{want}")
        if got < want:
            missing.append(f"{want - got} {kind.value}")
    return ", ".join(shown), missing


def _grouped_exits(exits: Sequence[WorkerExit]) -> dict[tuple[int, str], list[WorkerExit]]:
    """Exits with the same code and the same last words (timestamps, pids and generations aside) together."""
    groups: dict[tuple[int, str], list[WorkerExit]] = {}
    for e in exits:
        gist = "\n".join(re.sub(r", \d+\)", ", N)", re.sub(r"^\[[^]]*\] \[\d+\] ", "", line))
                         for line in e.log_excerpt.splitlines())
        groups.setdefault((e.code, gist), []).append(e)
    return groups


def _fmt_ids(ids: Sequence[str], limit: int = 8) -> str:
    more = f" (+{len(ids) - limit} more)" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


@dataclass
class _Sheet:
    """What the sections of the verdict write to."""

    rows: list[Row] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


def tally(facts: ChaosFacts) -> Tally:
    """The table rows, the problems that fail the run, and the details printed under the table."""
    sheet = _Sheet()
    for section in (_requests, _calls, _export, _stalls, _redrives, _poison, _faults, _convergence):
        section(facts, sheet)
    return Tally(sheet.rows, sheet.problems, sheet.details)


def _requests(facts: ChaosFacts, sheet: _Sheet) -> None:
    submitted = sum(len(b.submitted) for b in facts.batches)
    sheet.rows.append(Row("requests submitted", str(submitted), ", ".join(b.batch_id for b in facts.batches)))
    lost = [i for b in facts.batches for i in lost_ids(b.batch_id, b.submitted, facts.outcomes)]
    sheet.rows.append(Row("lost", str(len(lost)), _fmt_ids(lost)))
    if lost:
        sheet.problems.append(f"{len(lost)} request(s) lost")
    refused = [i for b in facts.batches for i in refused_own(b, facts.outcomes)]
    if refused:
        sheet.problems.append(f"{len(refused)} request(s) refused as conflicting_duplicate of their own body (another "
                              f"record took the id): {_fmt_ids(refused)}")
    if facts.tenanted:
        sheet.rows += [_tenant_row(b, facts.outcomes) for b in facts.batches]


def _tenant_row(batch: MeasuredBatch, outcomes: Outcomes) -> Row:
    """One tenant's requests: each must end, and be exported on exactly one line."""
    ended = [outcomes.get(batch.batch_id, i) for i in batch.submitted]
    succeeded = sum(1 for o in ended if o.results)
    failed = sum(1 for o in ended if o.ended_as_submitted and not o.results)
    lost = len(batch.submitted) - succeeded - failed
    repeated = repeated_export_ids(batch.export_ids)
    converged = ("; not converged" if batch.converged_after_s is None
                 else f"; converged {batch.converged_after_s:.1f}s after its submit")
    return Row(f"  {batch.label}", f"{succeeded + failed}/{len(batch.submitted)}",
               f"ended (succeeded {succeeded}, failed {failed}), lost {lost}; {len(batch.export_ids)} export lines, "
               f"{sum(n - 1 for n in repeated.values())} repeated" + converged)


def _calls(facts: ChaosFacts, sheet: _Sheet) -> None:
    """LLM calls made twice, against what was in flight at each kill."""
    kills = [f for f in facts.fired if f.fault.kind is FaultKind.KILL_WORKER]
    extra = unseen = 0
    for batch in facts.batches:
        more, never = duplicated_calls(batch.batch_id, batch.submitted, facts.outcomes, facts.llm_calls)
        extra, unseen = extra + more, unseen + never
    hedged = round(facts.hedged or 0)
    redone = max(0, extra - hedged)  # hedges are second calls sent on purpose, not redone work
    detail = f"{redone / len(kills):.1f} per kill over {len(kills)} kills" if kills else "no kills"
    if facts.unplanned_exits:
        detail += f" (and {len(facts.unplanned_exits)} unplanned exits)"
    if facts.hedged is not None:
        detail += f"; {extra} calls beyond attempts, of which {hedged} hedged on purpose (all workers)"
    if unseen:
        detail += f"; {unseen} attempt(s) never reached the LLM"
    sheet.rows.append(Row("duplicated LLM calls", str(redone), detail))
    gauges = [k.in_flight_gauge for k in kills]
    known = [g for g in gauges if g is not None]
    shown = " ".join("?" if g is None else f"{g:g}" for g in gauges) or "-"
    bound = (f"sum {sum(known):g}: duplicates {'within' if redone <= sum(known) else 'ABOVE'} it"
             if known and len(known) == len(gauges) else "some readings missing")
    sheet.rows.append(Row("in flight at each kill (gauge)", shown, bound))
    cuts = [calls_cut(k.at_s, facts.call_drops_s) for k in kills]
    sheet.rows.append(Row("LLM calls cut by each kill", " ".join(map(str, cuts)) or "-",
                          f"open calls the client dropped within {KILL_DROP_WINDOW_S:g}s of the kill"))


def _export(facts: ChaosFacts, sheet: _Sheet) -> None:
    """Each batch exported on its own: one line per id in each (custom_ids may repeat across batches)."""
    repeated = {f"{b.batch_id}: {i}": n for b in facts.batches for i, n in repeated_export_ids(b.export_ids).items()}
    lines = sum(len(b.export_ids) for b in facts.batches)
    sheet.rows.append(Row("duplicate export lines", str(sum(n - 1 for n in repeated.values())),
                          f"{lines} lines; " + (_fmt_ids(sorted(repeated)) if repeated else "one per id")))
    if repeated:
        sheet.problems.append(f"{len(repeated)} id(s) on more than one export line")
    missing_export = sorted(custom_id for b in facts.batches
                            for custom_id in {custom_id_of(i, b.batch_id) for i in b.submitted} - set(b.export_ids))
    if missing_export:
        sheet.rows.append(Row("ids missing from the export", str(len(missing_export)), _fmt_ids(missing_export)))


def _stalls(facts: ChaosFacts, sheet: _Sheet) -> None:
    """Stalls as the workers report them, and as the group's offsets show them across worker restarts."""
    for label, readings, source in (
            ("stalled partitions", facts.stalls, "the workers' /metrics"),
            ("  seen in the group's offsets", facts.group_stalls, "the group's committed offsets, across restarts")):
        stalls = stalls_by_partition(readings)
        note = f"{source}; threshold {facts.stall_threshold_s:g}s"
        if stalls and readings is facts.stalls:
            note += f"; {len(facts.stalled_at_end)} still stalled at the end"
        sheet.rows.append(Row(label, str(len(stalls)), note))
        if stalls:
            sheet.problems.append(f"{len(stalls)} stalled partition(s) by {source}")
            sheet.details.append(f"stalled partitions by {source}:")
            sheet.details += [f"  {st.topic}[{st.partition}]: "
                              + (f"worker {','.join(map(str, sorted(st.workers)))}, " if min(st.workers) >= 0 else "")
                              + f"{st.first_s:.0f}s..{st.last_s:.0f}s ({st.readings} readings), first "
                              f"{fault_before(st.first_s, facts.fired)}" for st in stalls]


def _redrives(facts: ChaosFacts, sheet: _Sheet) -> None:
    if facts.redriven is None:
        sheet.rows.append(Row("reconciler re-drives", "0", "streamproc_requests_redriven_total not exported by "
                                                            "these workers (counter absent)"))
    else:
        sheet.rows.append(Row("reconciler re-drives", f"{facts.redriven:g}",
                              "streamproc_requests_redriven_total, summed over workers and restarts"))


def _poison(facts: ChaosFacts, sheet: _Sheet) -> None:
    judged = [(p, *explained(p, facts.outcomes)) for p in facts.poison]
    bad = [(p, how) for p, ok, how in judged if not ok]
    sheet.rows.append(Row("poison records explained", f"{len(judged) - len(bad)}/{len(judged)}",
                          "failure event, dead letter, result, or refused by the broker"))
    for kind in PoisonKind:
        mine = [(ok, how) for p, ok, how in judged if p.kind is kind]
        if mine:
            hows = Counter(how for _, how in mine)
            sheet.rows.append(Row(f"  {kind.value}", f"{sum(1 for ok, _ in mine if ok)}/{len(mine)}",
                                  "; ".join(how + (f" (x{n})" if n > 1 else "") for how, n in sorted(hows.items()))))
    if bad:
        sheet.problems.append(f"{len(bad)} poison record(s) not explained")
        sheet.details += [f"poison not explained: {p.kind.value} {p.label}: expected {p.expect.value}, saw {how}"
                          for p, how in bad]


def _faults(facts: ChaosFacts, sheet: _Sheet) -> None:
    fired, missing_faults = _fault_counts(facts.planned, facts.fired)
    sheet.rows.append(Row("faults fired", fired))
    if missing_faults:
        sheet.problems.append("faults not fired (the batch ended first): " + ", ".join(missing_faults))
    exits = Counter(e.code for e in facts.unplanned_exits)
    sheet.rows.append(Row("unplanned worker exits", str(len(facts.unplanned_exits)),
                          ", ".join(f"exit {code} x{n}" for code, n in sorted(exits.items()))))
    for (code, gist), seen in _grouped_exits(facts.unplanned_exits).items():
        when = ", ".join(f"w{e.worker}@{e.at_s:.0f}s" for e in seen)
        sheet.details.append(f"worker exit {code} x{len(seen)} ({when}); last words:\n"
                             + textwrap.indent(gist, "    "))


def _convergence(facts: ChaosFacts, sheet: _Sheet) -> None:
    if facts.converged_at_s is not None:
        sheet.rows.append(Row("time to converge", f"{facts.converged_at_s - facts.submitted_at_s:.1f}s",
                              f"from the submit; whole run {facts.wall_s:.0f}s"))
    else:
        sheet.rows.append(Row("time to converge", "did not converge", f"whole run {facts.wall_s:.0f}s"))
        sheet.problems.append("the batch did not converge")
    for batch in facts.batches:
        _status_rows(batch, f" ({batch.label})" if facts.tenanted else "", sheet)
    if facts.unfinished_states:
        sheet.details.append(f"{len(facts.unfinished_states)} request(s) of the batch not ended, with their state:")
        sheet.details += [f"  {i}: {state}" for i, state in sorted(facts.unfinished_states.items())[:50]]
    if facts.trace:
        sheet.details.append("where they are on the topics:")
        sheet.details += [f"  {line}" for line in facts.trace]


def _status_rows(batch: MeasuredBatch, whose: str, sheet: _Sheet) -> None:
    """``status`` at the end, and whether the workers' summaries count what ``--verify`` folds."""
    if batch.status_json is not None:
        sheet.rows.append(Row("streamproc status" + whose,
                              "converged" if batch.status_json.get("converged") else "NOT converged",
                              ", ".join(f"{k} {batch.status_json.get(k)}"
                                        for k in ("succeeded", "failed", "retrying", "in_flight", "pending"))))
    if batch.status_json is not None and batch.verified_json is not None:
        summary, verified = counts_of(batch.status_json), counts_of(batch.verified_json)
        differ = [f"{key} {summary[key]} (--verify {verified[key]})" for key in COUNT_KEYS
                  if summary[key] != verified[key]]
        sheet.rows.append(Row("status = --verify" + whose, "yes" if not differ else "NO", "; ".join(differ)))
        if differ:
            sheet.problems.append(f"status from the workers' summaries differs from status --verify{whose}: "
                                  + "; ".join(differ))


def format_table(result: Tally) -> str:
    width = max(len(r.label) for r in result.rows)
    value_width = max(len(r.value) for r in result.rows if len(r.value) <= 16)
    lines = []
    for r in result.rows:
        detail = r.detail if len(r.detail) <= DETAIL_WIDTH else r.detail[:DETAIL_WIDTH - 3] + "..."
        lines.append(f"{r.label:<{width}}  {r.value:>{value_width}}" + (f"  {detail}" if detail else ""))
    rule = "-" * min(120, max(len(line) for line in lines))
    verdict = "chaos run PASSED" if result.ok else "chaos run FAILED: " + "; ".join(result.problems)
    return "\n".join([rule, *lines, rule, verdict])
