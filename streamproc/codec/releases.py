"""The releases of streamproc and the Avro schemas each one writes (``schemas/releases.json``).

A rolling upgrade runs workers of two releases in one group: the new one reads everything the old one wrote
(``schemas/history``), but the old one knows only its own schemas. So while ``STREAMPROC_UPGRADE_FROM`` names
the release being upgraded from, every process writes that release's schemas (Kafka Streams' ``upgrade.from``
works the same way); once no worker of it is left, the setting is removed and a second restart writes the
current ones (design §6, "Releases and rolling upgrades").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from streamproc.codec.framing import write_with
from streamproc.codec.writer_schemas import CURRENT_WRITERS, PAST_WRITERS, WriterSchema
from streamproc.errors import UserFacingError

__all__ = ["Release", "UnknownRelease", "releases", "write_as_release"]

_NAMESPACE = "io.streamproc."


@dataclass(frozen=True, slots=True)
class Release:
    """A tagged release: its commit and, per record type, the schema it writes."""

    version: str  # e.g. 0.1.0 (tagged v0.1.0)
    commit: str
    writes: tuple[WriterSchema, ...]


class UnknownRelease(UserFacingError):
    """A version that is not in ``schemas/releases.json``, or one naming a schema no codec knows."""


def _writer(fingerprint_hex: str, record: str, version: str) -> WriterSchema:
    known = {writer.fingerprint.hex(): writer for writer in (*PAST_WRITERS, *CURRENT_WRITERS)}
    writer = known.get(fingerprint_hex)
    if writer is None or writer.name != _NAMESPACE + record:
        raise UnknownRelease(f"release {version} writes {record} with schema {fingerprint_hex}, which is neither "
                             "current nor in schemas/history: keep the schema it wrote there")
    return writer


def _release(version: str, entry: dict[str, Any]) -> Release:
    writes = tuple(_writer(fp, record, version) for record, fp in entry["writes"].items())
    return Release(version=version, commit=entry["commit"], writes=writes)


def releases() -> dict[str, Release]:
    """Every release, oldest first."""
    text = resources.files("streamproc.codec").joinpath("schemas", "releases.json").read_text(encoding="utf-8")
    return {version: _release(version, entry) for version, entry in json.loads(text).items()}


def write_as_release(version: str | None) -> None:
    """Encode every event as release ``version`` writes it (None: the current schemas). UnknownRelease names
    the releases there are when ``version`` is none of them."""
    if version is None:
        write_with(())
        return
    known = releases()
    if version not in known:
        raise UnknownRelease(f"STREAMPROC_UPGRADE_FROM={version} is not a release of streamproc; "
                             f"the releases are {', '.join(known) or 'none'}")
    write_with(known[version].writes)
