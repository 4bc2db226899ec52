"""The arithmetic a chaos run is judged by: lost, duplicated calls and lines, stalls, poison, the verdict."""

from __future__ import annotations

from collections.abc import Sequence

from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.chaos.facts import Outcomes, body_digest, sha
from streamproc.devstack.chaos.fault_schedule import Fault, FaultKind, FiredFault
from streamproc.devstack.chaos.poison import Expect, Poison, PoisonKind
from streamproc.devstack.chaos.tally import (
    ChaosFacts,
    MeasuredBatch,
    WorkerExit,
    calls_cut,
    duplicated_calls,
    explained,
    fault_before,
    format_table,
    lost_ids,
    repeated_export_ids,
    stalls_by_partition,
    tally,
)
from streamproc.devstack.chaos.worker_metrics import StallReading

BATCH = "b1"


def result(request_id: str, attempts: int = 1, batch_id: str = BATCH) -> InferenceResult:
    return InferenceResult(request_id=request_id, batch_id=batch_id, model="m", response_json="{}", content="ok",
                           attempts=attempts, latency_ms=1, completed_ms=1, input_hash="h")


def failure(request_id: str, attempt: int, *, terminal: bool, code: str = "server_error", batch_id: str = BATCH,
            body: str = "{}") -> FailureEvent:
    request = InferenceRequest(request_id=request_id, body_json=body, batch_id=batch_id)
    return FailureEvent(request=request, layer=FailureLayer.SERVICE, error_code=code, message="m", attempt=attempt,
                        terminal=terminal, first_failure_ms=1, last_failure_ms=2)


def outcomes_of(*events: InferenceResult | FailureEvent) -> Outcomes:
    outcomes = Outcomes()
    for event in events:
        if isinstance(event, InferenceResult):
            outcomes.add_result(event)
        else:
            outcomes.add_failure(event)
    return outcomes


def kill(at_s: float, gauge: float | None, worker: int = 0) -> FiredFault:
    return FiredFault(Fault(FaultKind.KILL_WORKER, 0.1, worker=worker, seconds=5), at_s, 0.1, 5.0, gauge)


def facts(*, submitted: Sequence[str] | None = None, export_ids: Sequence[str] = ("r0", "r1", "r2"),
          **changes: object) -> ChaosFacts:
    """A clean run's facts of one batch (``submitted``, ``export_ids``: the batch's), with ``changes``."""
    ids = [f"{BATCH}/r{i}" for i in range(3)] if submitted is None else submitted
    base: dict[str, object] = dict(
        batches=[MeasuredBatch(BATCH, None, ids, export_ids)],
        outcomes=outcomes_of(result(f"{BATCH}/r0"), result(f"{BATCH}/r1", attempts=2),
                             failure(f"{BATCH}/r2", 1, terminal=True, code="content_policy_violation")),
        llm_calls={f"{BATCH}/r0": 1, f"{BATCH}/r1": 2, f"{BATCH}/r2": 1},
        planned=[Fault(FaultKind.KILL_WORKER, 0.1, worker=0, seconds=5)], fired=[kill(10.0, 12.0)],
        call_drops_s=[10.5], stalls=[], group_stalls=[], stall_threshold_s=90.0, stalled_at_end=frozenset(),
        redriven=None, hedged=None, converged_at_s=60.0, submitted_at_s=5.0, wall_s=70.0, poison=[])
    base.update(changes)
    return ChaosFacts(**base)  # type: ignore[arg-type]


def test_a_clean_run_passes_and_prints_one_table() -> None:
    outcome = tally(facts())
    assert outcome.ok, outcome.problems
    rows = {row.label: row for row in outcome.rows}
    assert rows["requests submitted"].value == "3"
    assert rows["lost"].value == "0"
    assert rows["duplicated LLM calls"].value == "0"
    assert rows["duplicate export lines"].value == "0"
    assert rows["stalled partitions"].value == "0"
    assert rows["time to converge"].value == "55.0s"
    assert rows["reconciler re-drives"].value == "0" and "absent" in rows["reconciler re-drives"].detail
    table = format_table(outcome)
    assert table.splitlines()[-1] == "chaos run PASSED"


def test_lost_means_no_result_and_no_terminal_failure_of_the_batch() -> None:
    outcomes = outcomes_of(result("b1/a"), failure("b1/b", 1, terminal=False),  # b only retrying
                           failure("b1/c", 1, terminal=True),
                           result("b1/d", batch_id="other"))  # an outcome of another batch does not count
    assert lost_ids(BATCH, ["b1/a", "b1/b", "b1/c", "b1/d"], outcomes) == ["b1/b", "b1/d"]
    outcome = tally(facts(submitted=["b1/a", "b1/b", "b1/c", "b1/d"], outcomes=outcomes))
    assert not outcome.ok
    assert any("2 request(s) lost" in problem for problem in outcome.problems)


def test_an_id_whose_own_record_was_refused_as_a_conflicting_duplicate_is_lost_not_ended() -> None:
    """The chaos run's ticket-407: a hostile duplicate took the id, the user's own record (the body the batch file
    holds) ended conflicting_duplicate in its batch; that request was never handled."""
    own, hostile = '{"model":"m","messages":[]}', '{"model":"m","messages":[{"role":"user","content":"x"}]}'
    refused = failure("b1/r2", 1, terminal=True, code="conflicting_duplicate", body=own)
    outcomes = outcomes_of(result("b1/r0"), result("b1/r1"), refused, refused, refused,
                           result("b1/r2", batch_id="poison"),  # the duplicate's answer, in its own batch
                           failure("b1/r1", 1, terminal=True, code="conflicting_duplicate", batch_id="poison",
                                   body=hostile))  # a duplicate refused as it must: r1 still ended
    ids = ["b1/r0", "b1/r1", "b1/r2"]
    assert lost_ids(BATCH, ids, outcomes) == ["b1/r2"]
    bodies = {i: body_digest(own) for i in ids}
    outcome = tally(facts(submitted=ids, outcomes=outcomes,
                          batches=[MeasuredBatch(BATCH, None, ids, ("r0", "r1", "r2"), own_bodies=bodies)]))
    rows = {row.label: row for row in outcome.rows}
    assert rows["lost"].value == "1" and rows["lost"].detail == "b1/r2"
    assert "1 request(s) lost" in outcome.problems
    assert any("conflicting_duplicate of their own body" in p and "b1/r2" in p for p in outcome.problems)


def test_duplicated_calls_are_calls_beyond_the_attempts_events_name() -> None:
    outcomes = outcomes_of(result("b1/a", attempts=2), failure("b1/a", 1, terminal=False),
                           failure("b1/b", 3, terminal=True), result("b1/c"))
    calls = {"b1/a": 4, "b1/b": 3, "b1/c": 0}  # a: two calls too many; c: its one attempt never reached the LLM
    assert duplicated_calls(BATCH, ["b1/a", "b1/b", "b1/c", "b1/lost"], outcomes, calls) == (2, 1)


def test_duplicate_export_lines_count_ids_on_more_than_one_line() -> None:
    assert repeated_export_ids(["a", "b", "a", "c", "a", "b"]) == {"a": 3, "b": 2}
    outcome = tally(facts(export_ids=["r0", "r1", "r2", "r1"]))
    rows = {row.label: row for row in outcome.rows}
    assert rows["duplicate export lines"].value == "1"
    assert not outcome.ok


def test_ids_missing_from_the_export_are_shown_by_custom_id() -> None:
    rows = {row.label: row for row in tally(facts(export_ids=["r0", "r2"])).rows}
    assert rows["ids missing from the export"].value == "1"
    assert rows["ids missing from the export"].detail == "r1"


def test_calls_cut_by_a_kill_are_drops_right_after_it() -> None:
    assert calls_cut(10.0, [9.9, 10.0, 11.0, 12.0, 12.5]) == 3
    outcome = tally(facts(fired=[kill(10.0, 12.0), kill(30.0, None, worker=1)], call_drops_s=[10.2, 30.1, 30.3]))
    rows = {row.label: row for row in outcome.rows}
    assert rows["LLM calls cut by each kill"].value == "1 2"
    assert rows["in flight at each kill (gauge)"].value == "12 ?"


def test_duplicates_are_compared_with_the_in_flight_gauge_at_the_kills() -> None:
    outcomes = outcomes_of(result("b1/r0"), result("b1/r1"), result("b1/r2"))
    rows = {row.label: row for row in tally(facts(outcomes=outcomes, llm_calls={"b1/r0": 3, "b1/r1": 3, "b1/r2": 1},
                                                  fired=[kill(10.0, 3.0)])).rows}
    assert rows["duplicated LLM calls"].value == "4"
    assert "ABOVE" in rows["in flight at each kill (gauge)"].detail


def test_every_stall_reading_counts_grouped_per_partition() -> None:
    readings = [StallReading(40.0, 1, "t.retry.10s", 3), StallReading(42.0, 1, "t.retry.10s", 3),
                StallReading(44.0, 0, "t.requests", 0)]
    stalls = stalls_by_partition(readings)
    assert [(s.topic, s.partition, s.first_s, s.last_s, s.readings) for s in stalls] == [
        ("t.requests", 0, 44.0, 44.0, 1), ("t.retry.10s", 3, 40.0, 42.0, 2)]
    outcome = tally(facts(stalls=readings))
    assert {row.label: row for row in outcome.rows}["stalled partitions"].value == "2"
    assert "2 stalled partition(s) by the workers' /metrics" in outcome.problems
    assert any("t.retry.10s[3]: worker 1, 40s..42s" in line and "30s after: SIGKILL worker 0" in line
               for line in outcome.details)


def test_stalls_seen_in_the_group_offsets_count_too() -> None:
    outcome = tally(facts(group_stalls=[StallReading(200.0, -1, "t.requests", 2)]))
    rows = {row.label: row for row in outcome.rows}
    assert rows["stalled partitions"].value == "0"
    assert rows["  seen in the group's offsets"].value == "1"
    assert not outcome.ok
    assert any(line.startswith("  t.requests[2]: 200s..200s") for line in outcome.details)


def test_fault_before_names_the_latest_fault_fired_earlier() -> None:
    fired = [kill(10.0, 1.0), FiredFault(Fault(FaultKind.LLM_OUTAGE, 0.3, seconds=30), 20.0, 0.3, 0.1)]
    assert fault_before(5.0, fired) == "before any fault"
    assert fault_before(25.0, fired) == "5s after: LLM outage of 30s"


def poisoned(poison: Sequence[Poison], outcomes: Outcomes) -> list[bool]:
    return [explained(p, outcomes)[0] for p in poison]


def test_poison_must_end_as_it_was_expected_to() -> None:
    body = '{"model": "m", "messages": []}'
    outcomes = outcomes_of(failure("bad", 1, terminal=True, code="undecodable_record", batch_id=""),
                           failure("b1/r1", 1, terminal=True, code="conflicting_duplicate", batch_id="poison",
                                   body='{"messages":[],"model":"m"}'),  # the same body, re-serialised
                           result("tier-far", batch_id="poison"))
    outcomes.add_dead_letter(b"\x01\x02")
    cases = [
        Poison(PoisonKind.RANDOM_KEYED, Expect.TERMINAL_FAILURE, "bad", request_id="bad"),
        Poison(PoisonKind.RANDOM_UNKEYED, Expect.DEAD_LETTER, "x", value_sha=sha(b"\x01\x02")),
        Poison(PoisonKind.DUPLICATE_PRODUCED, Expect.CONFLICT, "b1/r1", request_id="b1/r1", body_sha=body_digest(body)),
        Poison(PoisonKind.TIER_FAR_FUTURE, Expect.ENDED, "tier-far", request_id="tier-far"),
        Poison(PoisonKind.BIG_BODY, Expect.REFUSED, "big", note="MessageSizeTooLargeError"),
    ]
    assert poisoned(cases, outcomes) == [True] * len(cases)
    missing = [
        Poison(PoisonKind.RANDOM_KEYED, Expect.TERMINAL_FAILURE, "never", request_id="never"),
        Poison(PoisonKind.RANDOM_UNKEYED, Expect.DEAD_LETTER, "y", value_sha=sha(b"other")),
        Poison(PoisonKind.DUPLICATE_PRODUCED, Expect.CONFLICT, "b1/r1", request_id="b1/r1", body_sha="elsewhere"),
        Poison(PoisonKind.DUPLICATE_IN_FILE, Expect.REFUSED, "f", note="submit exited 0", refused_as_it_must=False),
    ]
    assert poisoned(missing, outcomes) == [False] * len(missing)
    outcome = tally(facts(poison=cases + missing, outcomes=outcomes, submitted=[]))
    assert "4 poison record(s) not explained" in outcome.problems
    assert {row.label: row for row in outcome.rows}["poison records explained"].value == "5/9"


def test_a_batch_that_did_not_converge_or_missed_a_fault_fails() -> None:
    planned = [Fault(FaultKind.KILL_WORKER, 0.1, worker=0), Fault(FaultKind.RESTART_BROKER, 0.5)]
    outcome = tally(facts(converged_at_s=None, planned=planned))
    assert "the batch did not converge" in outcome.problems
    assert "faults not fired (the batch ended first): 1 restart broker" in outcome.problems
    assert {row.label: row for row in outcome.rows}["faults fired"].value == "kill worker 1/1, restart broker 0/1"


def test_unplanned_exits_are_grouped_by_their_last_words() -> None:
    words = "[2026-11-30 17:34:23,287] [14350] [CRITICAL] STOPPING: the record at offset 37 of (tp, {gen}) could not"
    exits = [WorkerExit(0, 4, 10.0, words.format(gen=2)), WorkerExit(1, 4, 20.0, words.format(gen=5)),
             WorkerExit(1, 3, 30.0, "[x] [1] [CRITICAL] STOPPING: bad key")]
    outcome = tally(facts(unplanned_exits=exits))
    assert {row.label: row for row in outcome.rows}["unplanned worker exits"].value == "3"
    grouped = [line for line in outcome.details if line.startswith("worker exit")]
    assert len(grouped) == 2 and grouped[0].startswith("worker exit 4 x2 (w0@10s, w1@20s)")
    assert outcome.ok  # an exit the supervisor recovers from is reported, not failed on


def test_hedged_calls_are_not_counted_as_duplicates() -> None:
    outcomes = outcomes_of(result("b1/r0"), result("b1/r1"), result("b1/r2"))
    rows = {row.label: row for row in tally(facts(outcomes=outcomes, llm_calls={"b1/r0": 3, "b1/r1": 2, "b1/r2": 1},
                                                  hedged=2.0)).rows}
    assert rows["duplicated LLM calls"].value == "1"
    assert "3 calls beyond attempts, of which 2 hedged" in rows["duplicated LLM calls"].detail


def test_the_redrive_counter_is_read_when_exported() -> None:
    rows = {row.label: row for row in tally(facts(redriven=7.0)).rows}
    assert rows["reconciler re-drives"].value == "7"


def two_tenants(*, b_outcomes: Sequence[InferenceResult | FailureEvent] = (), b_export: Sequence[str] = ("r3",),
                b_status: dict[str, object] | None = None) -> ChaosFacts:
    """The clean one-batch run as tenant team-a, and tenant team-b's batch ``b2`` of one request ``b2/r3``."""
    clean = facts()
    a = MeasuredBatch(BATCH, "team-a", clean.batches[0].submitted, clean.batches[0].export_ids, converged_after_s=50.0)
    b = MeasuredBatch("b2", "team-b", ["b2/r3"], b_export, status_json=b_status, verified_json=STATUS)
    outcomes = clean.outcomes
    for event in b_outcomes:
        outcomes.add_result(event) if isinstance(event, InferenceResult) else outcomes.add_failure(event)
    return facts(batches=[a, b], outcomes=outcomes, llm_calls={**clean.llm_calls, "b2/r3": 1})


STATUS: dict[str, object] = {"submitted": 1, "succeeded": 1, "failed": {}, "retrying": 0, "in_flight": 0,
                             "pending": 0, "converged": True}


def test_two_tenants_are_counted_apart_and_pass_when_each_ended_once() -> None:
    outcome = tally(two_tenants(b_outcomes=[result("b2/r3", batch_id="b2")], b_status=STATUS))
    assert outcome.ok, outcome.problems
    rows = {row.label: row for row in outcome.rows}
    assert rows["requests submitted"].value == "4"
    assert rows["  tenant team-a"].value == "3/3"
    assert rows["  tenant team-a"].detail == ("ended (succeeded 2, failed 1), lost 0; 3 export lines, 0 repeated; "
                                             "converged 50.0s after its submit")
    assert rows["  tenant team-b"].detail.endswith("; not converged")
    assert rows["  tenant team-b"].value == "1/1"
    assert rows["status = --verify (tenant team-b)"].value == "yes"


def test_a_tenant_whose_request_did_not_end_fails_the_run() -> None:
    outcome = tally(two_tenants(b_outcomes=[result("b2/r3", batch_id=BATCH)]))  # an outcome of the other batch
    rows = {row.label: row for row in outcome.rows}
    assert rows["  tenant team-b"].value == "0/1" and "lost 1" in rows["  tenant team-b"].detail
    assert "1 request(s) lost" in outcome.problems


def test_a_tenant_exported_twice_or_not_at_all_fails_the_run() -> None:
    twice = tally(two_tenants(b_outcomes=[result("b2/r3", batch_id="b2")], b_export=["r3", "r3"]))
    assert "1 id(s) on more than one export line" in twice.problems
    assert "1 repeated" in {row.label: row for row in twice.rows}["  tenant team-b"].detail
    missing = tally(two_tenants(b_outcomes=[result("b2/r3", batch_id="b2")], b_export=["r0"]))  # a's id, not b's
    assert {row.label: row for row in missing.rows}["ids missing from the export"].detail == "r3"


def test_a_tenant_whose_summaries_differ_from_verify_fails_the_run() -> None:
    outcome = tally(two_tenants(b_outcomes=[result("b2/r3", batch_id="b2")], b_status={**STATUS, "succeeded": 0}))
    assert any("status --verify (tenant team-b): succeeded 0 (--verify 1)" in p for p in outcome.problems)
