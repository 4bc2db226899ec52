"""The durable record of one provider batch (issue 31), kept on the compacted ``<prefix>.provider-batches`` topic
keyed by the gather's own id, and what a worker that takes it over does next. Pure: the codec is
``streamproc.codec.provider_batch_record``, the calls are ``streamproc.llm.provider_batches``.

The create-then-crash window: the record is written *before* the create call, in state ``creating``, with our
gather id, and the create call carries that id in the batch's ``metadata`` (OpenAI). A worker killed between the
create call and the ``open`` record leaves a ``creating`` record; whoever owns its partition next lists the
provider's newest batches for one with that metadata (:func:`next_step` says ``find``) and adopts it
(:meth:`ProviderBatchRecord.opened`), creating again only when none is found. So a provider batch is created
twice only when the provider's list does not yet show a batch it created (not seen on the mock; OpenAI does not
document the list's consistency). Anthropic's batches carry no metadata: for them ``find`` has nothing to match
on yet (design §8).

Members are the requests' ids in line order; a line's ``custom_id`` is its position (``m<index>``), since a
request id may hold any text and Anthropic takes 1-64 characters of ``[A-Za-z0-9_-]``.

Not wired into the worker yet (design §8).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final, Literal

from streamproc.core.provider_batch_objects import Provider, ProviderBatchView

GATHER_METADATA_KEY: Final = "streamproc_gather"  # the metadata key that carries the gather id on OpenAI
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

    def __post_init__(self) -> None:
        if not self.gather_id or not self.members or self.partition < 0:
            raise ValueError(f"a provider batch record needs a gather id, members and a partition: {self!r}")
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


def member_custom_id(index: int) -> str:
    """The ``custom_id`` of the member at ``index``: short, and of the characters both providers take."""
    return f"{_MEMBER_PREFIX}{index}"


Step = Literal["find", "poll", "forget"]
_STEPS: Final[dict[RecordState, Step]] = {RecordState.CREATING: "find", RecordState.OPEN: "poll",
                                          RecordState.ENDED: "forget"}


def next_step(record: ProviderBatchRecord) -> Step:
    """What the owner of a record's partition does with it after a takeover: ``find`` the batch a ``creating``
    record may have created (then adopt it, or create it), ``poll`` an open one, ``forget`` (tombstone) an ended
    one."""
    return _STEPS[record.state]
