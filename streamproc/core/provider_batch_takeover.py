"""The durable record of one provider batch (issue 31), kept on the compacted ``<prefix>.provider-batches`` topic
keyed by the gather's own id, and what a worker that takes it over does next. Pure: the codec is
``streamproc.codec.provider_batch_record``, the calls are ``streamproc.llm.provider_batches``.

The create-then-crash window: the record is written *before* the create call, in state ``creating``, with our
gather id, and the create call carries that id in the batch's ``metadata`` (OpenAI). A worker killed between the
create call and the ``open`` record leaves a ``creating`` record; whoever owns its partition next lists the
provider's newest batches for one with that metadata (:func:`next_step` says ``find``) and adopts it
(:meth:`ProviderBatchRecord.opened`), creating again only when none is found. So a provider batch is created
twice only when the provider's list does not yet show a batch it created (not seen on the mock; OpenAI does not
document the list's consistency). Anthropic's batches carry no metadata: for them :func:`adoptable` matches the
request count and the creation time, which two gathers of one size created at once make ambiguous.

Members are the requests' ids in line order; a line's ``custom_id`` is its position (``m<index>``), since a
request id may hold any text and Anthropic takes 1-64 characters of ``[A-Za-z0-9_-]``. Beside them, each member's
attempt (the hop's attempt it was gathered for): a line answers only that attempt of its request
(:func:`line_fate`). A record written without attempts (``attempts`` None) matches by request id alone.

Used by the worker's route, ``app.provider_batch_route`` (design §8).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final, Literal

from streamproc.core.provider_batch_objects import Provider, ProviderBatchView

GATHER_METADATA_KEY: Final = "streamproc_gather"  # the metadata key that carries the gather id on OpenAI
CLOCK_SKEW_MS: Final = 5 * 60_000  # how far the provider's clock and ours may differ, and a create call take
_MEMBER_PREFIX: Final = "m"


class RecordState(StrEnum):
    CREATING = "creating"  # written before the create call: the batch may or may not exist at the provider
    OPEN = "open"  # created: its provider id is known; poll it
    ENDED = "ended"  # every member's outcome is written; the record's tombstone follows


@dataclass(frozen=True)
class ProviderBatchRecord:
    """One provider batch as the workers record it; ``partition`` is the request partition whose owner polls it."""

    gather_id: str
    provider: Provider
    model: str
    partition: int
    members: tuple[str, ...]
    state: RecordState
    created_ms: int
    updated_ms: int
    provider_batch_id: str | None = None
    input_file_id: str | None = None  # OpenAI's uploaded file
    attempts: tuple[int, ...] | None = None  # each member's attempt, in line order; None: a record written before

    def __post_init__(self) -> None:
        if not self.gather_id or not self.members or self.partition < 0:
            raise ValueError(f"a provider batch record needs a gather id, members and a partition: {self!r}")
        if self.attempts is not None and (len(self.attempts) != len(self.members)
                                          or any(a < 1 for a in self.attempts)):
            raise ValueError(f"provider batch record {self.gather_id!r}: one attempt (from 1) per member needed")
        if self.state is not RecordState.CREATING and self.provider_batch_id is None:
            raise ValueError(f"provider batch record {self.gather_id!r} is {self.state.value} without a provider id")

    def opened(self, view: ProviderBatchView, now_ms: int) -> ProviderBatchRecord:
        """The record once the provider's batch is known (created, or found after a takeover)."""
        if view.provider != self.provider:
            raise ValueError(f"record {self.gather_id!r} is {self.provider}'s; the batch found is {view.provider}'s")
        return replace(self, state=RecordState.OPEN, provider_batch_id=view.batch_id, updated_ms=now_ms)

    def ended(self, now_ms: int) -> ProviderBatchRecord:
        return replace(self, state=RecordState.ENDED, updated_ms=now_ms)

    def member(self, custom_id: str) -> str | None:
        """The request id of a line's ``custom_id``, or None when it names no member."""
        if not custom_id.startswith(_MEMBER_PREFIX) or not custom_id[1:].isdigit():
            return None
        index = int(custom_id[1:])
        return self.members[index] if index < len(self.members) and custom_id == member_custom_id(index) else None

    def custom_ids(self) -> list[str]:
        return [member_custom_id(index) for index in range(len(self.members))]

    def member_attempts(self) -> dict[str, int | None]:
        """Each member's request id and the attempt its line answers (None: unknown, a record without attempts)."""
        if self.attempts is None:
            return dict.fromkeys(self.members)
        return dict(zip(self.members, self.attempts, strict=True))


def member_custom_id(index: int) -> str:
    """The ``custom_id`` of the member at ``index``: short, and of the characters both providers take."""
    return f"{_MEMBER_PREFIX}{index}"


LineFate = Literal["answer", "drop", "keep"]


def line_fate(gathered_for: int | None, asked: int) -> LineFate:
    """What a member's line does for a call of attempt ``asked`` of its request: ``answer`` it when the line was
    gathered for that attempt (or for an attempt unknown: a record written without attempts); ``drop`` a line of
    an earlier attempt (its outcome was written before, by whoever held the batch then: the call is a later
    attempt, gathered anew); ``keep`` a line of a later attempt than the one asking (that call is gathered anew,
    the line waits for its own attempt)."""
    if gathered_for is None or gathered_for == asked:
        return "answer"
    return "drop" if gathered_for < asked else "keep"


Step = Literal["find", "poll", "forget"]
_STEPS: Final[dict[RecordState, Step]] = {RecordState.CREATING: "find", RecordState.OPEN: "poll",
                                          RecordState.ENDED: "forget"}


def adoptable(record: ProviderBatchRecord, candidates: Iterable[ProviderBatchView], taken: Collection[str],
              skew_ms: int = CLOCK_SKEW_MS) -> ProviderBatchView | None:
    """The batch a ``creating`` record's create call made, among the provider's newest ``candidates``, or None.

    On OpenAI the batch whose metadata carries the gather id. Anthropic's batches carry no metadata: there, the
    one batch with as many requests as the record has members, created within ``skew_ms`` of the record, that
    no other record holds (``taken``: the provider ids of the other records). Two such batches (two gathers of
    the same size created within the skew, one of them not yet recorded) are ambiguous: None, and the caller
    creates again; the batch it did not adopt is billed, but no record names it, so none of its lines becomes
    an outcome."""
    mine = [c for c in candidates if c.provider == record.provider]
    if record.provider == "openai":
        return next((c for c in mine if c.metadata and c.metadata.get(GATHER_METADATA_KEY) == record.gather_id),
                    None)
    fitting = [c for c in mine if c.batch_id not in taken and c.total == len(record.members)
               and c.created_ms is not None and abs(c.created_ms - record.created_ms) <= skew_ms]
    return fitting[0] if len(fitting) == 1 else None


def next_step(record: ProviderBatchRecord) -> Step:
    """What the owner of a record's partition does with it after a takeover: ``find`` the batch a ``creating``
    record may have created (then adopt it, or create it), ``poll`` an open one, ``forget`` (tombstone) an ended
    one."""
    return _STEPS[record.state]
