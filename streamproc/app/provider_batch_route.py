"""The provider-batch route (issue 31, design §8): requests of a routed model are answered by OpenAI's Batch API or
Anthropic's Message Batches (``STREAMPROC_PROVIDER_BATCH_API``) instead of one call each, and each comes back to the
handler as the :class:`CallResult` a synchronous call gives. A request Anthropic's Messages API cannot carry fails
as a business failure (``provider_batch_not_convertible``): the user routed the model for the discount.

The handler admits a request as for a call (its state ``in_flight``, its record unacked) and awaits
:meth:`ProviderBatchRoute.call`. The route gathers the request into its partition's open batch of its model
(``core/provider_batch_gatherer``); a sealed gather is recorded ``creating`` on ``<prefix>.provider-batches``, uploaded
and created (carrying the gather id in its metadata), recorded ``open``, polled until it ends, and each member's line
resolves its waiting call. So a request's record is acked only once its outcome is written, as with a call: nothing
is acked while its batch is open, and a crash redelivers every member whose outcome is not written.

A worker that takes a partition over reads its records first (:meth:`_take_over`, before any request of the
partition is gathered): an ``open`` batch is polled again and a redelivered member waits for its line instead of
being gathered twice, if its attempt is the one the record says its line was gathered for (a later attempt is
gathered anew, and the earlier attempt's line dropped: ``core.provider_batch_takeover.line_fate``); a
``creating`` one is looked for at the provider and adopted when found, else forgotten (its members, redelivered,
are gathered anew). A record is ended and tombstoned once every member that waited has had
its outcome written by the handler (:meth:`written`). An ``open`` batch's members whose outcome its killed owner
wrote already (results and terminal failures on their partition since the batch was opened: ``app.written_outcomes``)
are not answered again: their redelivered records get that outcome back (:class:`WrittenOutcome`), whose state the
handler writes, sending nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from streamproc.app.provider_batch_log import ProviderBatchLog, owned_records
from streamproc.app.topic_reader import TopicReader
from streamproc.codec.provider_batch_record import member_bytes
from streamproc.core.events import InferenceRequest
from streamproc.core.outcome import Failure, Outcome
from streamproc.core.provider_batch_gatherer import (
    BatchGatherer,
    LineTooLarge,
    PendingLine,
    SealedBatch,
)
from streamproc.core.provider_batch_lines import PROVIDER_BATCH_CANCELLED as BATCH_CANCELLED
from streamproc.core.provider_batch_lines import AnsweredLine, LineOutcome
from streamproc.core.provider_batch_objects import ProviderBatchView
from streamproc.core.provider_batch_polling import PollPolicy
from streamproc.core.provider_batch_requests import NotConvertible
from streamproc.core.provider_batch_takeover import (
    CLOCK_SKEW_MS,
    ProviderBatchRecord,
    RecordState,
    line_fate,
    member_custom_id,
    next_step,
)
from streamproc.core.request_state import REBALANCING
from streamproc.core.vocabulary import FailureLayer
from streamproc.core.written_outcome import WrittenOutcome, for_attempt
from streamproc.llm.client import CallResult
from streamproc.llm.provider_batch_poller import member_outcomes, wait_until_ended
from streamproc.llm.provider_batches import BatchCallFailed, ProviderBatches, find_created
from streamproc.llm.routed import Deferred
from streamproc.llm.schema_check import checked_completion
from streamproc.settings import ProviderBatchSettings

log = logging.getLogger(__name__)

RECORD_FAILED: Final = "provider_batch_record_failed"  # the provider-batch record could not be written (service)
LINE_TOO_LARGE: Final = "provider_batch_line_too_large"  # a request no provider batch can hold (business)
NOT_CONVERTIBLE: Final = "provider_batch_not_convertible"  # a request Anthropic's Messages API cannot carry (business)
TAKEOVER_FAILED: Final = "provider_batch_takeover_failed"  # a partition's records unread: retried (service)
_TICK_S: Final = 0.2
_CANCEL_CHECK_S: Final = 1.0  # how often the followed batches are checked against the cancelled batches
_ENDED_REMEMBERED: Final = 4096  # gathers ended here whose records a later takeover forgets instead of following


def _never_closed(batch_id: str | None) -> str | None:
    return None


def _never_gives_way() -> bool:
    return False


class OutcomesWritten(Protocol):
    """The outcomes written on a request partition since a time (``app.written_outcomes``)."""

    async def since(self, partition: int, since_ms: int, members: Collection[str],
                    ) -> dict[str, list[WrittenOutcome]]: ...


class _NoneWritten:
    async def since(self, partition: int, since_ms: int, members: Collection[str],
                    ) -> dict[str, list[WrittenOutcome]]:
        return {}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _gave_way(body: dict[str, Any]) -> Deferred:
    return Deferred(0.0, str(body.get("model", "")), REBALANCING, "a rebalance or stop began while it waited for "
                    "its provider batch's line: parked for whoever reads its partition next, who follows the batch")


@dataclass
class _Waiter:
    """A handler awaiting its member's line: the body it asked with (to check the answer against), when, and for
    which attempt of its request (a line answers only the attempt it was gathered for)."""

    body: dict[str, Any]
    since_ms: int
    answer: asyncio.Future[CallResult | Deferred]
    batch_id: str | None  # the user's batch it belongs to, whose cancel may cancel its provider batch
    attempt: int


@dataclass
class _Following:
    """A provider batch this worker polls, and the members answered whose outcomes it waits to see written."""

    record: ProviderBatchRecord
    task: asyncio.Task[None] | None = None
    attempt_of: dict[str, int | None] = field(default_factory=dict)  # member -> the attempt its line answers
    cancel_sent: bool = False  # the provider was asked to cancel it
    written_before: frozenset[str] = frozenset()  # members ended already when it was taken over: lines dropped
    unwritten: set[str] = field(default_factory=set)
    all_written: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_all_written(self) -> None:
        while self.unwritten:
            self.all_written.clear()
            await self.all_written.wait()


class ProviderBatchRoute:
    """Gathers, creates, follows and takes over the provider batches of a worker's partitions."""

    def __init__(self, settings: ProviderBatchSettings, api: ProviderBatches, batch_log: ProviderBatchLog,
                 open_reader: Callable[[], TopicReader], clock_ms: Callable[[], int] = _now_ms,
                 closed: Callable[[str | None], str | None] = _never_closed,
                 outcomes: OutcomesWritten | None = None,
                 giving_way: Callable[[], bool] = _never_gives_way) -> None:
        self._settings = settings
        self._api = api
        self._log = batch_log
        self._open_reader = open_reader
        self._clock_ms = clock_ms
        self._closed = closed  # why a user's batch no longer has its requests called (cancelled...), or None
        self._outcomes = outcomes or _NoneWritten()
        self._giving_way = giving_way  # a rebalance or a stop began: the worker gives its records back (§5.7)
        self._limits = replace(api.limits, max_requests=min(settings.max_requests, api.limits.max_requests),
                               max_age_ms=settings.max_age_ms)
        self._policy = PollPolicy(first_s=settings.first_poll_s, max_s=settings.max_poll_s)
        self._gatherers: dict[int, BatchGatherer] = {}
        # request id -> attempt -> its handler, while its line is awaited: after a crash two attempts of one request
        # can wait at once (its redelivered record, a crash redelivery, beside its retry record's attempt, §4)
        self._waiters: dict[str, dict[int, _Waiter]] = {}
        self._gathered: dict[str, tuple[dict[str, Any], int]] = {}  # request id -> body, attempt, until sealed
        self._member_of: dict[str, _Following] = {}  # request id -> the batch whose line for it is still to come
        self._answered_by: dict[str, _Following] = {}  # request id -> the batch that answered it, until written
        # lines of adopted batches whose record is not back yet, with the attempt each was gathered for (or the
        # outcome its killed owner wrote already, for the attempt it ended)
        self._unclaimed: dict[str, tuple[LineOutcome | WrittenOutcome, int | None]] = {}
        self._following: dict[str, _Following] = {}  # gather id -> the batch followed
        self._taken_over: dict[int, asyncio.Task[None]] = {}
        # gathers this worker ended (the latest ones): a takeover that reads one back still open (read before the end
        # was written, or the end's write failed) tombstones it instead of polling it and answering its lines again
        self._ended: deque[str] = deque(maxlen=_ENDED_REMEMBERED)
        self._ticker: asyncio.Task[None] | None = None
        self._cancel_watch: asyncio.Task[None] | None = None
        self._give_way_watch: asyncio.Task[None] | None = None

    def routes(self, model: object) -> bool:
        return isinstance(model, str) and model in self._settings.routed_models

    async def call(self, request: InferenceRequest, body: dict[str, Any], attempt: int, partition: int,
                   ) -> CallResult | WrittenOutcome | Deferred:
        """The outcome of attempt ``attempt`` of ``request`` as its provider batch answers it, or as it was written
        already by the worker that held its batch before (nothing to send again). Deferred (``rebalancing``) once a
        rebalance or a stop begins while it waits: the record is parked, and whoever reads it next follows the
        batch. Cancelled (never a failure) when its partition is revoked."""
        try:
            await self._take_over(partition)
        except Exception as exc:  # the partition's records could not be read: nothing may be gathered yet
            log.exception("provider batches of partition %d: the takeover failed", partition)
            failure = Failure(FailureLayer.SERVICE, TAKEOVER_FAILED, f"{type(exc).__name__}: {exc}")
            return CallResult(failure, b"", 0, {}, str(body.get("model", "")))
        if self._giving_way():
            return _gave_way(body)
        request_id = request.request_id
        if (same := self._waiter(request_id, attempt)) is not None and not same.answer.done():
            # the same attempt admitted twice at once (its record handled again while the first handling waits):
            # it shares the line awaited; taking its place would leave the first waiting for ever, its record unacked
            log.info("request %s: attempt %d is awaited already; sharing its line", request_id, attempt)
            return await asyncio.shield(same.answer)
        now = self._clock_ms()
        answer: asyncio.Future[CallResult | Deferred] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(body, now, answer, request.batch_id, attempt)
        if (kept := self._unclaimed.get(request_id)) is not None:
            fate = line_fate(kept[1], attempt)
            if fate != "keep":
                del self._unclaimed[request_id]
            if fate == "answer":
                return kept[0] if isinstance(kept[0], WrittenOutcome) else await self._result(waiter, kept[0])
            if fate == "drop":
                log.info("request %s: its attempt %d is not the one its kept line answers (%s); dropped the line",
                         request_id, attempt, kept[1])
        self._waiters.setdefault(request_id, {})[attempt] = waiter
        self._watch_giving_way()
        if not self._awaits_line(request_id, attempt):  # not a member of a batch taken over: gather it
            gatherer = self._gatherers.setdefault(partition, BatchGatherer(self._limits))
            self._gathered[request_id] = (body, attempt)
            try:
                # counted with the longest custom id a member gets, written with its own once sealed
                pending = PendingLine(request_id, str(body["model"]),
                                      self._api.line(member_custom_id(self._limits.max_requests), body),
                                      member_bytes(request_id))
                sealed_now = gatherer.add(pending, now)
            except (LineTooLarge, NotConvertible) as exc:  # no provider batch can carry it: as the pre-check refuses
                self._unwait(request_id, waiter)
                self._gathered.pop(request_id, None)
                code = LINE_TOO_LARGE if isinstance(exc, LineTooLarge) else NOT_CONVERTIBLE
                return CallResult(Failure(FailureLayer.BUSINESS, code, str(exc)), b"", 0, {},
                                  str(body.get("model", "")))
            for sealed in sealed_now:
                self._start(partition, sealed)
            self._tick()
        try:
            return await answer
        finally:
            self._unwait(request_id, waiter)

    async def held(self, request_id: str, attempt: int, partition: int) -> bool:
        """Whether a provider batch already holds this attempt of the request (a member of a batch taken over, or
        its line kept, gathered for that attempt): its
        line is awaited even past its batch's deadline, as a call beside it would be paid twice. A partition whose
        records cannot be read counts as holding it: :meth:`call` then fails it as the takeover's failure (retried)."""
        try:
            await self._take_over(partition)
        except Exception:
            return True
        kept = self._unclaimed.get(request_id)
        return self._awaits_line(request_id, attempt) or (kept is not None and line_fate(kept[1], attempt) == "answer")

    def _awaits_line(self, request_id: str, attempt: int) -> bool:
        """Whether a followed batch's line for the request, still to come, answers this attempt of it."""
        following = self._member_of.get(request_id)
        return following is not None and line_fate(following.attempt_of.get(request_id), attempt) == "answer"

    def written(self, request_id: str) -> None:
        """The handler has written the outcome of a member (or given the record up): its batch may end."""
        following = self._answered_by.pop(request_id, None)
        if following is not None:
            following.unwritten.discard(request_id)
            if not following.unwritten:
                following.all_written.set()

    def revoked(self, partitions: Collection[int]) -> None:
        """Stop gathering and following the batches of ``partitions``: their new owner takes them over (its records
        are still ``creating``/``open``), and the waiting handlers are cancelled so their records stay unacked."""
        for partition in partitions:
            if (takeover := self._taken_over.pop(partition, None)) is not None and not takeover.done():
                # still reading: cancelled, so the handlers awaiting it are cancelled as a waiter is (their records
                # stay unacked) and it follows no batch of a partition this worker no longer owns
                takeover.cancel()
            gatherer = self._gatherers.pop(partition, None)
            pending = [line.custom_id for sealed in (gatherer.flush() if gatherer else []) for line in sealed.lines]
            for request_id in pending:
                self._gathered.pop(request_id, None)
            self._cancel_waiters(pending)
        for gather_id, following in list(self._following.items()):
            if following.record.partition in partitions:
                self._stop_following(gather_id, following)
                self._cancel_waiters(following.record.members)

    def _watch_giving_way(self) -> None:
        if self._give_way_watch is None or self._give_way_watch.done():
            self._give_way_watch = asyncio.create_task(self._give_way_when_asked(), name="provider-batch-give-way")

    async def _give_way_when_asked(self) -> None:
        while self._waiters:
            await asyncio.sleep(_TICK_S)
            if self._giving_way():
                self._give_way()

    def _give_way(self) -> None:
        """A rebalance or a stop began, and faust waits for every record in hand before it goes on (§5.7): the
        calls waiting for lines (for minutes, or hours) give way, parked as ``rebalancing`` for whoever reads them
        next, and this worker stops following and gathering. Its batches' records stay ``creating``/``open``:
        whoever owns each partition after the rebalance, this worker included, takes them over, and the parked
        records wait for their lines there. A takeover still reading is let finish (cancelling it would cancel
        the calls awaiting it, whose records would then never be acked); its calls give way after it."""
        waiting = sum(len(calls) for calls in self._waiters.values())
        log.info("a rebalance or stop began: %d calls waiting for provider batch lines give way; %d batches are "
                 "left to whoever owns their partitions next", waiting, len(self._following))
        self._taken_over.clear()
        for gatherer in self._gatherers.values():
            gatherer.flush()
        self._gatherers.clear()
        self._gathered.clear()
        for gather_id, following in list(self._following.items()):
            self._stop_following(gather_id, following)
        self._unclaimed.clear()
        for calls in self._waiters.values():
            for waiter in calls.values():
                if not waiter.answer.done():
                    waiter.answer.set_result(_gave_way(waiter.body))
        self._waiters.clear()

    async def aclose(self) -> None:
        for task in (self._ticker, self._cancel_watch, self._give_way_watch):
            if task is not None:
                task.cancel()
        for following in list(self._following.values()):
            if following.task is not None:
                following.task.cancel()
        await self._api.aclose()

    # -- gathering -----------------------------------------------------------------------------------------
    def _tick(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._seal_when_due(), name="provider-batch-gathers")

    async def _seal_when_due(self) -> None:
        while any(g.open_count() for g in self._gatherers.values()):
            await asyncio.sleep(_TICK_S)
            now = self._clock_ms()
            for partition, gatherer in list(self._gatherers.items()):
                for sealed in gatherer.due(now):
                    self._start(partition, sealed)

    def _start(self, partition: int, sealed: SealedBatch) -> None:
        now = self._clock_ms()
        members = tuple(line.custom_id for line in sealed.lines if not self._ended_by_close(line.custom_id))
        if not members:
            return
        gathered = [self._gathered.pop(member) for member in members]
        record = ProviderBatchRecord(uuid.uuid4().hex, self._api.provider, sealed.model, partition, members,
                                     RecordState.CREATING, now, now,
                                     attempts=tuple(attempt for _, attempt in gathered))
        following = self._follow(record)
        lines = [self._api.line(member_custom_id(index), body) for index, (body, _) in enumerate(gathered)]
        following.task = asyncio.create_task(self._create_and_follow(following, lines),
                                             name=f"provider-batch-{record.gather_id}")

    async def _create_and_follow(self, following: _Following, lines: list[bytes]) -> None:
        record = following.record
        try:
            await self._log.write(record)  # durable before the create call it announces
        except Exception as exc:
            log.exception("provider batch %s: could not record it; its members fail (retried)", record.gather_id)
            self._fail_all(following, Failure(FailureLayer.SERVICE, RECORD_FAILED, f"{type(exc).__name__}: {exc}"))
            return
        try:
            submitted = await self._api.submit(lines, record.gather_id)
        except BatchCallFailed as exc:  # as a call failing the same way; the record goes with it
            log.warning("provider batch %s of %d requests: %s", record.gather_id, len(record.members), exc)
            if (made := await self._created_anyway(record, exc)) is None:
                self._fail_all(following, exc.outcome)
                await self._end(following)
                return
            following.record = record.opened(made, self._clock_ms())
            log.info("provider batch %s: created as %s although its create call failed; following it",
                     record.gather_id, made.batch_id)
        else:
            following.record = replace(record.opened(submitted.view, self._clock_ms()),
                                       input_file_id=submitted.input_file_id)
            log.info("provider batch %s created as %s (%d requests of %s)", record.gather_id,
                     submitted.view.batch_id, len(record.members), record.model)
        await self._poll_and_answer(following)

    async def _created_anyway(self, record: ProviderBatchRecord, failed: BatchCallFailed) -> ProviderBatchView | None:
        """The batch a create call that failed in transport or on the service's side made all the same (its answer
        lost, a timeout), looked for as a takeover looks for a ``creating`` record's: followed, it is not billed
        unread while its members go into a new batch. None when refused outright (a business failure) or not
        found."""
        if not isinstance(failed.outcome, Failure) or failed.outcome.layer is FailureLayer.BUSINESS:
            return None
        taken = {f.record.provider_batch_id for f in self._following.values() if f.record.provider_batch_id}
        try:
            return await find_created(self._api, record, taken)
        except BatchCallFailed as exc:
            log.warning("provider batch %s: could not look for it after its create call failed: %s",
                        record.gather_id, exc)
            return None

    def _ended_by_close(self, request_id: str) -> bool:
        """A gathered request whose user batch was closed (cancelled, expired) before its provider batch was sent:
        it ends as the close says, as a request not called yet does, and goes in no provider batch."""
        gathered = self._gathered.get(request_id)
        waiter = None if gathered is None else self._waiter(request_id, gathered[1])
        why = None if waiter is None else self._closed(waiter.batch_id)
        if waiter is None or why is None:
            return False
        self._gathered.pop(request_id, None)
        self._unwait(request_id, waiter)
        if not waiter.answer.done():
            waiter.answer.set_result(CallResult(Failure(FailureLayer.BUSINESS, why, f"its batch closed ({why}) "
                                                        "before its provider batch was sent"), b"", 0, {},
                                                str(waiter.body.get("model", ""))))
        return True

    # -- following -----------------------------------------------------------------------------------------
    def _follow(self, record: ProviderBatchRecord, written_before: frozenset[str] = frozenset()) -> _Following:
        following = _Following(record, attempt_of=record.member_attempts(), written_before=written_before)
        self._following[record.gather_id] = following
        for member in record.members:
            if member not in written_before and not self._follows_later_attempt(member, following):
                self._member_of[member] = following
        if self._cancel_watch is None or self._cancel_watch.done():
            self._cancel_watch = asyncio.create_task(self._cancel_when_closed(), name="provider-batch-cancels")
        return following

    def _follows_later_attempt(self, request_id: str, following: _Following) -> bool:
        """Whether the request's line already followed is for a later attempt than its line in ``following`` (two
        records taken over holding one request: the earlier attempt's batch, not ended when the worker was killed,
        and the batch its retry went into). The later attempt's line is the one awaited; the earlier one's is
        dropped when it comes back to a call of the later attempt."""
        current = self._member_of.get(request_id)
        if current is None:
            return False
        held, new = current.attempt_of.get(request_id), following.attempt_of.get(request_id)
        return held is not None and new is not None and held > new

    async def _cancel_when_closed(self) -> None:
        """Cancel at the provider every followed batch whose awaited members all belong to cancelled batches: its
        lines not run come back ``batch_cancelled``, as the cancel ends a request not called yet. A batch that also
        holds live requests runs on (cancelling it would fail them): its cancelled members finish, as calls in
        flight do."""
        while self._following:
            await asyncio.sleep(_CANCEL_CHECK_S)
            for following in list(self._following.values()):
                batch_id = following.record.provider_batch_id
                if following.cancel_sent or batch_id is None or not self._all_cancelled(following):
                    continue
                following.cancel_sent = True
                try:
                    await self._api.cancel(batch_id)
                    log.info("provider batch %s (%s): its requests' batches are cancelled; cancelled it",
                             following.record.gather_id, batch_id)
                except BatchCallFailed as exc:  # tried again at the next check
                    following.cancel_sent = False
                    log.warning("provider batch %s (%s): cancel failed: %s", following.record.gather_id, batch_id,
                                exc)

    def _all_cancelled(self, following: _Following) -> bool:
        """Whether every member still awaiting its line is known, waiting, and of a cancelled batch (a member of
        a batch taken over whose record has not come back is not known: the batch runs on)."""
        awaited = [m for m in following.record.members if self._member_of.get(m) is following]
        waiters = [self._waiter_for(following, m) for m in awaited]
        return bool(awaited) and all(w is not None and self._closed(w.batch_id) == BATCH_CANCELLED for w in waiters)

    def _waiter_for(self, following: _Following, request_id: str) -> _Waiter | None:
        """The handler waiting for the batch's line of a member: one asking for the attempt the line answers."""
        return self._waiter(request_id, following.attempt_of.get(request_id))

    def _waiter(self, request_id: str, attempt: int | None) -> _Waiter | None:
        """The call waiting for this attempt of the request (None, a line whose attempt is unknown: the latest)."""
        if attempt is None:
            return self._latest_waiter(request_id)
        calls = self._waiters.get(request_id)
        return None if calls is None else calls.get(attempt)

    def _latest_waiter(self, request_id: str) -> _Waiter | None:
        calls = self._waiters.get(request_id)
        return calls[max(calls)] if calls else None

    def _unwait(self, request_id: str, waiter: _Waiter) -> None:
        """The call no longer waits (answered, failed or gone); another call's waiter is left as it is."""
        calls = self._waiters.get(request_id)
        if calls is not None and calls.get(waiter.attempt) is waiter:
            del calls[waiter.attempt]
            if not calls:
                del self._waiters[request_id]

    async def _poll_and_answer(self, following: _Following) -> None:
        """Write the ``open`` record, poll until the batch ends, answer every member, then end the record once the
        members that waited have their outcomes written."""
        record = following.record
        assert record.provider_batch_id is not None
        try:
            await self._log.write(record)
            view = await wait_until_ended(self._api, record.provider_batch_id, self._policy)
            async for line in member_outcomes(self._api, view, record.custom_ids(), self._unusable):
                request_id = record.member(line.custom_id)
                if request_id is not None:
                    await self._answer(following, request_id, line)
        except BatchCallFailed as exc:  # a refused poll or a broken download: as a call failing the same way
            log.warning("provider batch %s (%s): %s", record.gather_id, record.provider_batch_id, exc)
            self._fail_all(following, exc.outcome)
            await self._end(following)
            return
        except Exception as exc:  # the record could not be written
            log.exception("provider batch %s (%s): stopped following it", record.gather_id, record.provider_batch_id)
            self._fail_all(following, Failure(FailureLayer.SERVICE, RECORD_FAILED, f"{type(exc).__name__}: {exc}"))
            await self._end(following)
            return
        await following.wait_all_written()
        await self._end(following)

    async def _answer(self, following: _Following, request_id: str, line: LineOutcome) -> None:
        """Resolve the member's waiting call; a later call for its id is a new attempt, gathered anew. A line no
        call waits for is kept for the attempt it was gathered for; one of an attempt earlier than the call waiting
        (gathered anew) is dropped: its outcome was written before the batch was taken over."""
        if self._member_of.get(request_id) is following:
            del self._member_of[request_id]
        if request_id in following.written_before:  # its outcome was written by the batch's killed owner
            return
        gathered_for = following.attempt_of.get(request_id)
        waiter = self._waiter(request_id, gathered_for)  # the call of the line's attempt, beside any other
        if waiter is None:
            latest = self._latest_waiter(request_id)
            if latest is not None and line_fate(gathered_for, latest.attempt) == "drop":
                log.info("provider batch %s: its line for %s answers attempt %s, not %d; dropped",
                         following.record.gather_id, request_id, gathered_for, latest.attempt)
                return
            # a member of a batch taken over whose record has not come back (or was acked before), or a line of a
            # later attempt than the call waiting
            self._keep(request_id, line, gathered_for)
            return
        self._unwait(request_id, waiter)
        following.unwritten.add(request_id)
        self._answered_by[request_id] = following
        await self._resolve(waiter, line)

    def _keep(self, request_id: str, line: LineOutcome | WrittenOutcome, gathered_for: int | None) -> None:
        """Keep a line no call waits for, for the attempt it answers. Of two lines of one request (two batches taken
        over holding it), the later attempt's stays: the earlier attempt's outcome was written before the takeover
        (its retry is the later one), and it would only be dropped by the later attempt's call."""
        kept = self._unclaimed.get(request_id)
        if kept is not None and kept[1] is not None and gathered_for is not None and kept[1] > gathered_for:
            log.info("request %s: its line of attempt %d is kept; the line of attempt %d dropped", request_id,
                     kept[1], gathered_for)
            return
        self._unclaimed[request_id] = (line, gathered_for)

    async def _resolve(self, waiter: _Waiter, line: LineOutcome) -> None:
        try:
            result = await self._result(waiter, line)
        except Exception as exc:
            if not waiter.answer.done():
                waiter.answer.set_exception(exc)
            return
        if not waiter.answer.done():
            waiter.answer.set_result(result)

    async def _result(self, waiter: _Waiter, line: LineOutcome) -> CallResult:
        """A member's line as a synchronous call's result: a 200 line checked as a 200 answer is."""
        latency_ms = max(0, self._clock_ms() - waiter.since_ms)
        verdict = line.verdict
        if isinstance(verdict, AnsweredLine):
            outcome: Outcome = await checked_completion(verdict.body, waiter.body)
            headers = {} if verdict.provider_request_id is None else {"x-request-id": verdict.provider_request_id}
            return CallResult(outcome, verdict.body, latency_ms, headers, str(waiter.body.get("model", "")))
        return CallResult(verdict, b"", latency_ms, {}, str(waiter.body.get("model", "")))

    def _fail_all(self, following: _Following, outcome: Outcome) -> None:
        for member in following.record.members:
            if (waiter := self._waiter_for(following, member)) is None:
                continue
            self._unwait(member, waiter)
            if not waiter.answer.done():
                waiter.answer.set_result(CallResult(outcome, b"", max(0, self._clock_ms() - waiter.since_ms), {},
                                                    following.record.model))
        self._forget_following(following.record.gather_id)

    async def _end(self, following: _Following) -> None:
        record = following.record
        self._forget_following(record.gather_id)
        self._ended.append(record.gather_id)  # before the writes: a revoke may cancel them
        try:
            await self._log.write(record.ended(self._clock_ms()))
            await self._log.forget(record.gather_id)
        except Exception:  # the next owner meets it open, polls the ended batch and finds no member waiting
            log.exception("provider batch %s: could not end its record", record.gather_id)

    def _stop_following(self, gather_id: str, following: _Following) -> None:
        """Stop polling a batch from outside its task (a revoke, a rebalance) and forget it."""
        if following.task is not None:
            following.task.cancel()
        self._forget_following(gather_id)

    def _forget_following(self, gather_id: str) -> None:
        following = self._following.pop(gather_id, None)
        if following is None:
            return
        for member in following.record.members:
            if self._member_of.get(member) is following:
                del self._member_of[member]
            if self._answered_by.get(member) is following:
                del self._answered_by[member]

    def _cancel_waiters(self, request_ids: Collection[str]) -> None:
        for request_id in request_ids:
            for waiter in self._waiters.pop(request_id, {}).values():
                waiter.answer.cancel()

    @staticmethod
    def _unusable(message: str) -> None:
        log.warning("%s", message)

    # -- takeover ------------------------------------------------------------------------------------------
    async def _take_over(self, partition: int) -> None:
        """Once per ownership of ``partition``: adopt its recorded batches before any of its requests is gathered."""
        task = self._taken_over.get(partition)
        if task is None:
            task = self._taken_over[partition] = asyncio.create_task(self._adopt(partition))
        try:
            await asyncio.shield(task)
        except Exception:
            if self._taken_over.get(partition) is task:
                del self._taken_over[partition]  # the next request of the partition tries again
            raise

    async def _adopt(self, partition: int) -> None:
        async with self._open_reader() as reader:
            records = await owned_records(reader, {partition}, self._unusable)
        taken = {r.provider_batch_id for r in records.values() if r.provider_batch_id is not None}
        polled: list[ProviderBatchRecord] = []  # open: its killed owner may have written outcomes of its lines
        found: list[ProviderBatchRecord] = []  # created but never recorded open: no line of it was read
        for gather_id, record in records.items():
            if gather_id in self._following:  # this worker's own, still followed
                continue
            if gather_id in self._ended:  # this worker's own, ended: its lines were answered once already
                log.info("provider batch %s was ended here; forgetting its record read back open", gather_id)
                await self._log.forget(gather_id)
                continue
            match next_step(record):
                case "forget":
                    await self._log.forget(gather_id)
                case "find":
                    view = await find_created(self._api, record, taken - {record.provider_batch_id})
                    if view is None:  # never created: its members are gathered again when they come back
                        log.info("provider batch %s was never created; forgetting it", gather_id)
                        await self._log.forget(gather_id)
                        continue
                    found.append(record.opened(view, self._clock_ms()))
                case "poll":
                    polled.append(record)
        written = await self._written_before(partition, polled)
        for record in (*polled, *found):
            self._adopt_open(record, written)

    async def _written_before(self, partition: int, polled: list[ProviderBatchRecord],
                              ) -> dict[str, list[WrittenOutcome]]:
        """The outcomes of the open batches' members written since the earliest of them was opened (less the
        clock skew: the record's time is its writer's clock, an outcome's its producer's)."""
        if not polled:
            return {}
        since_ms = min(record.updated_ms for record in polled) - CLOCK_SKEW_MS
        return await self._outcomes.since(partition, since_ms, {m for r in polled for m in r.members})

    def _adopt_open(self, record: ProviderBatchRecord, written: Mapping[str, list[WrittenOutcome]]) -> None:
        ended = {member: outcome for member, attempt in record.member_attempts().items()
                 if (outcome := for_attempt(written.get(member, []), attempt)) is not None}
        log.info("taking over provider batch %s (%s, %d requests, %d of them ended already)", record.gather_id,
                 record.provider_batch_id, len(record.members), len(ended))
        following = self._follow(record, frozenset(ended))
        for member, outcome in ended.items():
            self._keep(member, outcome, outcome.attempt)
        following.task = asyncio.create_task(self._poll_and_answer(following),
                                             name=f"provider-batch-{record.gather_id}")
