"""The request state machine as the handler drives it, over generated histories (hypothesis), issue 13 item 3.

A model of one request id: the records on its topics (the submission, resubmissions with the same or another
body, replays, the retry and deferred records the handler writes, stale copies of those, redeliveries of
records acked but not committed), the handler's steps (``admit`` then the ``in_flight`` write; later the
outcome records and the state: success, retry scheduled with an attempt+1 record, deferral with a copy of the
attempt, terminal failure), and what goes wrong (a crash before or after the outcome's sends or its state
write, which leaves the record to be delivered again; a table write lost in recovery). Hypothesis chooses the
order. Then the queue is drained, the reconciler (``core.reconcile``) asked about what is left, and drained
again.

Properties, each in the world where the design promises it:

* any world: ``admit`` never raises, and never starts a succeeded request, a failed one except for a
  replay, or another body except as a replay of a failed request; a conflict leaves the state as it is;
* no crash, no lost write: one running call at most, each attempt number called once per run of the
  request (a replay starts a new run), at most one success or terminal failure per run and nothing started
  after it in that run; the reconciler never re-drives a request that something will still move;
* every world: *nothing stalls*: once no record is left to deliver (and the reconciler has nothing to
  re-drive) the request has succeeded or failed, never ``in_flight`` or ``retrying``.

Standard library and hypothesis only: this runs in the bare core virtualenv (scripts/check-core).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamproc.core.events import InferenceRequest, RequestState
from streamproc.core.outcome import Failure
from streamproc.core.reconcile import stranded
from streamproc.core.request_state import (
    CIRCUIT_OPEN,
    MODEL_PAUSED,
    Conflict,
    RecordRef,
    Skip,
    SkipReason,
    Start,
    admit,
    input_hash,
    on_deferred,
    on_retry_scheduled,
    on_success,
    on_terminal_failure,
    superseded,
)
from streamproc.core.retry_policy import Retry, RetryPolicy
from streamproc.core.vocabulary import FailureLayer, RequestStatus

REQUEST_ID = "batch-1/req-1"
REQUESTS, TIER = "llm.requests", "llm.retry.5s"
BODIES = {
    "A": json.dumps({"model": "m", "messages": [{"role": "user", "content": "label this"}]}),
    "B": json.dumps({"model": "m", "messages": [{"role": "user", "content": "something else"}]}),
}
POLICY = RetryPolicy()
TERMINAL = (RequestStatus.SUCCEEDED, RequestStatus.FAILED)
MAX_DRAIN_STEPS = 3_000

PROPERTY = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

World = Literal["clean", "crashes", "lost_writes"]
Outcome = Literal["success", "failure", "deferred"]
CrashPoint = Literal["none", "before_sends", "after_sends", "after_state"]


@dataclass(frozen=True)
class Rec:
    """A record of the request on a topic, with what its headers say."""

    topic: str
    offset: int
    body: str  # a key of BODIES
    attempt: int
    replay: bool = False
    deferred: bool = False
    run: int = 0  # the run of the request it was written in (0: not written by the handler)

    @property
    def ref(self) -> RecordRef:
        return RecordRef(self.topic, self.offset)

    def request(self) -> InferenceRequest:
        return InferenceRequest(REQUEST_ID, BODIES[self.body], batch_id="batch-1")


@dataclass
class Running:
    """A record the handler admitted: its ``in_flight`` state is written, its call is under way."""

    rec: Rec
    started: RequestState
    run: int  # which run of the request (a replay of a failed request starts the next one)


@dataclass
class Model:
    """One request id, the handler's steps and the table, as design §4 and §5 describe them."""

    world: World
    state: RequestState | None = None
    writes: list[RequestState] = field(default_factory=list)
    pending: list[Rec] = field(default_factory=list)  # to be delivered (again)
    running: list[Running] = field(default_factory=list)
    acked: list[Rec] = field(default_factory=list)
    produced: list[Rec] = field(default_factory=list)  # retry and deferred records written by the handler
    next_offset: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    committed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    now: int = 1_000
    run: int = 0
    calls: dict[tuple[int, int], set[RecordRef]] = field(default_factory=lambda: defaultdict(set))
    ends: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))  # run -> success/terminal
    redriven_at: set[int] = field(default_factory=set)  # the reconciler sends once per state version
    log: list[str] = field(default_factory=list)

    @property
    def strict(self) -> bool:
        return self.world == "clean"

    def tick(self) -> int:
        self.now += 1
        return self.now

    def produce(self, topic: str, body: str, attempt: int, *, replay: bool = False, deferred: bool = False,
                run: int = 0) -> Rec:
        rec = Rec(topic, self.next_offset[topic], body, attempt, replay, deferred, run)
        self.next_offset[topic] += 1
        self.pending.append(rec)
        return rec

    def write(self, state: RequestState) -> None:
        self.state = state
        self.writes.append(state)

    def ack(self, rec: Rec) -> None:
        self.acked.append(rec)

    # -- the handler ------------------------------------------------------------------------------------------

    def deliver(self, index: int) -> None:
        rec = self.pending.pop(index)
        before = self.state
        admission = admit(before, rec.request(), rec.attempt, self.tick(), source=rec.ref, replay=rec.replay,
                          deferred=rec.deferred, run=rec.run)
        self.log.append(f"deliver {rec} -> {type(admission).__name__}")
        check_admission(before, rec, admission)
        if not isinstance(admission, Start):  # a skip, or a conflict's failure event: acked, state untouched
            self.ack(rec)
            return
        redelivery = before is not None and before.status is RequestStatus.IN_FLIGHT and (
            before.source_topic, before.source_offset) == (rec.topic, rec.offset)
        if before is None or (before.status in (RequestStatus.FAILED, RequestStatus.PENDING) and not redelivery):
            self.run += 1  # the first submission, or a replay of a failed request
        if self.strict:
            assert not self.running, f"a second call while {self.running[0].rec} runs: {self.log}"
            assert not self.ends[self.run], f"started after the run ended ({self.ends[self.run]}): {self.log}"
        self.write(admission.state)
        self.running.append(Running(rec, admission.state, self.run))

    def finish(self, index: int, outcome: Outcome, layer: FailureLayer, crash: CrashPoint) -> None:
        """The call of a running record ends; its outcome is sent, then its state written, then it is acked
        (design §4 write order); a crash stops that sequence at ``crash`` and the record is delivered again."""
        running = self.running.pop(index)
        rec, started = running.rec, running.started
        now = self.tick()
        if outcome != "deferred":  # a deferred record was parked before any call
            refs = self.calls[(running.run, rec.attempt)]
            if self.strict:
                assert not refs - {rec.ref}, f"attempt {rec.attempt} called by {refs} and {rec.ref}: {self.log}"
            refs.add(rec.ref)
        if crash == "before_sends":
            self.log.append(f"crash before the outcome of {rec}")
            self.pending.append(rec)
            return
        final, end = self._outcome(rec, started, outcome, layer, now)
        self.log.append(f"finish {rec}: {outcome} {layer} -> {final.status}")
        if end is not None:
            self.ends[running.run].append(end)
            if self.strict:
                assert len(self.ends[running.run]) == 1, f"two ends of one run {self.ends}: {self.log}"
        if crash == "after_sends":
            self.pending.append(rec)
            return
        if outcome == "success" or not superseded(self.state, started):  # as the handler: no stale overwrite
            self.write(final)
        if crash == "after_state":
            self.pending.append(rec)
            return
        self.ack(rec)

    def _outcome(self, rec: Rec, started: RequestState, outcome: Outcome, layer: FailureLayer,
                 now: int) -> tuple[RequestState, str | None]:
        """The records the handler sends for an outcome, and the state it writes after them."""
        if outcome == "success":
            return on_success(started, now), "success"
        if outcome == "deferred":  # the shortest tier, the same attempt, the replay mark carried
            code = MODEL_PAUSED if rec.offset % 2 else CIRCUIT_OPEN
            parked = self.produce(TIER, rec.body, rec.attempt, replay=rec.replay, deferred=True, run=started.run)
            self.produced.append(parked)
            return on_deferred(started, now, code, parked.ref), None
        failure = Failure(layer, "code", "why")
        decision = POLICY.decide(failure, rec.attempt, random.Random(0))
        if isinstance(decision, Retry):
            retry = self.produce(TIER, rec.body, rec.attempt + 1, run=started.run)
            self.produced.append(retry)
            return on_retry_scheduled(started, layer, failure.code, now, retry.ref), None
        return on_terminal_failure(started, layer, failure.code, now), "terminal"

    # -- the world around it ----------------------------------------------------------------------------------

    def commit(self) -> None:
        """The consumer commits, per topic, up to the first record not acked (one partition: the request's)."""
        for topic in set(self.next_offset):
            open_offsets = [r.offset for r in [*self.pending, *(run.rec for run in self.running)] if r.topic == topic]
            self.committed[topic] = max(self.committed[topic], min(open_offsets, default=self.next_offset[topic]))

    def redeliverable(self) -> list[Rec]:
        """Acked records above their topic's committed offset: a restart or rebalance reads them again, those
        of an earlier run of the request too."""
        busy = {run.rec for run in self.running} | set(self.pending)  # read again already: not twice at once
        return [rec for rec in self.acked if rec.offset >= self.committed[rec.topic] and rec not in busy]

    def copyable(self) -> list[Rec]:
        """Records the handler wrote that a crash between a send and its state write can leave a second copy
        of (design §4): none in the clean world."""
        return [] if self.strict else self.produced

    def lose_write(self) -> None:
        """Recovery brings the table back one write older (design §8: a changelog write missing)."""
        if len(self.writes) >= 2:
            self.writes.pop()
            self.state = self.writes[-1]
            self.log.append(f"lost a write: state back to {self.state.status} attempt {self.state.attempts}")

    def reconcile(self) -> bool:
        """The reconciler's pass (app/reconciler.py over core.reconcile): re-drive a stranded request."""
        if self.state is None or self.state.updated_ms in self.redriven_at:
            return False
        redrive = stranded(self.state, lambda topic: self.committed.get(topic), self.tick(), 0)
        if redrive is None:
            return False
        source = next(rec for rec in [*self.acked, *self.produced] if rec.ref == redrive.record)
        topic = source.topic if source.topic == TIER else TIER
        if redrive.attempt is None:  # in the state's run, as core.reconcile.redrive_headers writes it
            copy = self.produce(topic, source.body, source.attempt, replay=source.replay, deferred=source.deferred,
                                run=redrive.run)
        else:  # the next attempt, as a plain retry
            copy = self.produce(topic, source.body, redrive.attempt, run=redrive.run)
        self.redriven_at.add(self.state.updated_ms)
        self.log.append(f"reconciler re-drives {source} as {copy} ({redrive.why})")
        return True

    def stalled(self) -> bool:
        return self.state is not None and self.state.status not in TERMINAL


def check_admission(before: RequestState | None, rec: Rec, admission: object) -> None:
    """What ``admit`` may decide, whatever the history (design §4's table)."""
    assert isinstance(admission, Start | Skip | Conflict), admission
    if before is None:
        assert isinstance(admission, Start)
        return
    other_body = input_hash(rec.request()) != before.input_hash
    if isinstance(admission, Conflict):
        assert other_body and not rec.replay
        assert admission.failure.layer is FailureLayer.BUSINESS and admission.failure.code == "conflicting_duplicate"
    if isinstance(admission, Start):
        assert before.status is not RequestStatus.SUCCEEDED, "a succeeded request started again"
        if before.status is RequestStatus.FAILED:
            assert rec.replay, "a failed request started again without a replay"
        redelivery = before.status is RequestStatus.IN_FLIGHT and (before.source_topic, before.source_offset) == (
            rec.topic, rec.offset)  # the record that started the attempt: the same bytes again (rule 2)
        if other_body and not redelivery:
            assert rec.replay and before.status is RequestStatus.FAILED
        assert not 0 < rec.run < before.run, f"a record of run {rec.run} started run {before.run} again"
        assert admission.state.status is RequestStatus.IN_FLIGHT and admission.state.attempts == rec.attempt
        assert (admission.state.source_topic, admission.state.source_offset) == (rec.topic, rec.offset)


# -- driving the model ---------------------------------------------------------------------------------------

_layers = st.sampled_from(list(FailureLayer))


def _finish_one(model: Model, data: st.DataObject, *, allow_crash: bool, allow_deferral: bool) -> None:
    index = data.draw(st.integers(0, len(model.running) - 1))
    outcomes: list[Outcome] = ["success", "failure", "failure"]
    if allow_deferral:
        outcomes.append("deferred")
    crashes: list[CrashPoint] = ["none", "none", "none", "before_sends", "after_sends", "after_state"]
    crash = data.draw(st.sampled_from(crashes)) if allow_crash else "none"
    model.finish(index, data.draw(st.sampled_from(outcomes)), data.draw(_layers), crash)


def _chaos(model: Model, data: st.DataObject) -> None:
    """Steps in an order hypothesis picks: deliveries, call ends, new records, redeliveries, commits."""
    crashes = model.world != "clean"
    for _ in range(data.draw(st.integers(0, 40))):
        actions = ["deliver", "deliver", "finish", "finish", "resubmit", "replay", "stale_copy", "redeliver",
                   "commit"]
        if model.world == "lost_writes":
            actions.append("lose_write")
        action = data.draw(st.sampled_from(actions))
        if action == "deliver" and model.pending:
            model.deliver(data.draw(st.integers(0, len(model.pending) - 1)))
        elif action == "finish" and model.running:
            _finish_one(model, data, allow_crash=crashes, allow_deferral=True)
        elif action == "resubmit":
            model.produce(REQUESTS, data.draw(st.sampled_from(sorted(BODIES))), 1)
        elif action == "replay":  # backfill: x-replay: 1 and x-attempt: 1, possibly with a corrected body
            model.produce(REQUESTS, data.draw(st.sampled_from(sorted(BODIES))), 1, replay=True)
        elif action == "stale_copy" and model.copyable():
            original = data.draw(st.sampled_from(model.copyable()))
            model.produce(original.topic, original.body, original.attempt, replay=original.replay,
                          deferred=original.deferred, run=original.run)
        elif action == "redeliver" and model.redeliverable():
            model.pending.append(data.draw(st.sampled_from(model.redeliverable())))
        elif action == "commit":
            model.commit()
        elif action == "lose_write":
            model.lose_write()
        if model.strict:  # the reconciler never re-drives a request something will still move
            assert stranded(model.state, lambda topic: model.committed.get(topic), model.now, 0) is None \
                if model.state is not None else True, model.log


def _drain(model: Model, data: st.DataObject) -> None:
    """Deliver and finish everything left (no more crashes, a bounded number of deferrals), asking the
    reconciler whenever nothing is left; every record the handler writes is delivered in turn."""
    for step in range(MAX_DRAIN_STEPS):
        if model.running:
            _finish_one(model, data, allow_crash=False, allow_deferral=step < 50)
        elif model.pending:
            model.deliver(data.draw(st.integers(0, len(model.pending) - 1)))
        else:
            model.commit()
            if not model.reconcile():
                return
    raise AssertionError(f"no end after {MAX_DRAIN_STEPS} steps: {model.log[-30:]}")


def _run(world: World, data: st.DataObject) -> Model:
    model = Model(world)
    model.produce(REQUESTS, "A", 1)  # the submission
    _chaos(model, data)
    _drain(model, data)
    assert not model.stalled(), (
        f"stalled: {model.state.status if model.state else None} with nothing left to deliver: {model.log}")
    return model


@PROPERTY
@given(st.data())
def test_without_crashes_every_invariant_holds_and_nothing_stalls(data: st.DataObject) -> None:
    _run("clean", data)


@PROPERTY
@given(st.data())
def test_with_crashes_nothing_stalls(data: st.DataObject) -> None:
    _run("crashes", data)


@PROPERTY
@given(st.data())
def test_with_crashes_and_lost_table_writes_the_reconciler_leaves_nothing_stalled(data: st.DataObject) -> None:
    _run("lost_writes", data)


# -- admission alone: any state, any record -------------------------------------------------------------------

_states = st.builds(
    RequestState,
    request_id=st.just(REQUEST_ID),
    status=st.sampled_from(list(RequestStatus)),
    input_hash=st.sampled_from([input_hash(Rec(REQUESTS, 0, body, 1).request()) for body in sorted(BODIES)]),
    attempts=st.integers(1, 8),
    last_error_code=st.sampled_from([None, CIRCUIT_OPEN, MODEL_PAUSED, "server_error"]),
    source_topic=st.sampled_from([None, REQUESTS, TIER]),
    source_offset=st.none() | st.integers(0, 3),
    run=st.integers(0, 3),
)
_records = st.builds(Rec, st.sampled_from([REQUESTS, TIER]), st.integers(0, 3), st.sampled_from(sorted(BODIES)),
                     st.integers(1, 8), st.booleans(), st.booleans(), st.integers(0, 3))


@settings(max_examples=500, deadline=None)
@given(st.none() | _states, _records)
def test_admission_of_any_record_against_any_state_follows_the_rules(before: RequestState | None, rec: Rec) -> None:
    admission = admit(before, rec.request(), rec.attempt, 5, source=rec.ref, replay=rec.replay,
                      deferred=rec.deferred, run=rec.run)
    check_admission(before, rec, admission)
    if isinstance(admission, Skip) and before is not None:  # a skip is one of the documented reasons
        assert before.status is not RequestStatus.PENDING or admission.reason in (
            SkipReason.EARLIER_RUN, SkipReason.ALREADY_FAILED, SkipReason.RESERVED), admission.reason


# -- found by the properties above: bugs in request_state.py / handler.py, each fixed ---------------------


def test_admission_hashes_a_body_nested_deeper_than_json_follows() -> None:
    deep = InferenceRequest(REQUEST_ID, "[" * 100_000 + "]" * 100_000)
    assert isinstance(admit(None, deep, 1, 5, source=RecordRef(REQUESTS, 0)), Start)


def test_a_crash_redelivery_cannot_undo_a_success() -> None:
    model = Model("crashes")
    model.produce(REQUESTS, "A", 1)
    model.deliver(0)  # the submission starts attempt 1
    model.finish(0, "failure", FailureLayer.SERVICE, "after_sends")  # its retry record is sent, then a crash
    [submission, retry] = sorted(model.pending, key=lambda rec: rec.topic)
    model.deliver(model.pending.index(submission))  # the redelivery runs attempt 1 again (rule 2)
    model.deliver(model.pending.index(retry))  # the retry record runs attempt 2 beside it (rule 9)
    model.finish(1, "success", FailureLayer.SERVICE, "none")  # attempt 2 succeeds: result, then 'succeeded'
    assert model.state is not None and model.state.status is RequestStatus.SUCCEEDED
    model.finish(0, "failure", FailureLayer.SERVICE, "none")  # the rerun of attempt 1 fails: a second retry record
    assert model.state.status is RequestStatus.SUCCEEDED, f"a success was overwritten: {model.state}"


def test_a_retry_record_left_from_before_a_replay_does_not_start_beside_it() -> None:
    model = Model("crashes")
    model.produce(REQUESTS, "A", 1)
    model.deliver(0)
    model.finish(0, "failure", FailureLayer.SERVICE, "after_sends")  # retry record 1 sent, then a crash
    [submission] = [rec for rec in model.pending if rec.topic == REQUESTS]
    model.deliver(model.pending.index(submission))  # attempt 1 again (rule 2) ...
    model.finish(0, "failure", FailureLayer.SERVICE, "none")  # ... and its own retry record 2
    stale, retry = sorted(model.pending, key=lambda rec: rec.offset)
    model.deliver(model.pending.index(retry))  # attempt 2 fails for good: the request failed
    model.finish(0, "failure", FailureLayer.BUSINESS, "none")
    assert model.state is not None and model.state.status is RequestStatus.FAILED
    model.produce(REQUESTS, "A", 1, replay=True)  # backfill replays it
    model.deliver(model.pending.index(model.pending[-1]))
    assert len(model.running) == 1
    model.deliver(model.pending.index(stale))  # the stale copy from before the replay arrives
    assert len(model.running) == 1, f"{stale} started a second call beside the replay's"
    assert model.log[-1].endswith("-> Skip"), model.log[-1]
