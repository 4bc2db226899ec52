"""Releases (``schemas/releases.json``): each names the schemas it writes, and a rolling upgrade writes them.

While ``STREAMPROC_UPGRADE_FROM`` names a release, every record must be readable by that release's code, which
knows only its own schemas: these tests read what the codec writes with nothing but that release's schema.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import fastavro
import pytest

import streamproc
from streamproc import codec
from streamproc.codec import releases
from streamproc.codec.framing import SINGLE_OBJECT_MAGIC
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RequestState
from tests.unit.codec.test_schema_evolution import SAMPLES

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def writing_as() -> Iterator[None]:
    yield
    releases.write_as_release(None)


def test_every_release_names_schemas_every_codec_knows_for_every_event_type() -> None:
    known = releases.releases()
    assert known, "schemas/releases.json lists no release"
    for release in known.values():
        assert re.fullmatch(r"[0-9a-f]{40}", release.commit), release
        names = sorted(writer.name.rsplit(".", 1)[1] for writer in release.writes)
        assert names == sorted(t.__name__ for t in (FailureEvent, InferenceRequest, InferenceResult, RequestState))


def test_the_package_version_is_a_release_or_the_next_one() -> None:
    """A version bump comes with its entry: the package is the newest release, or one not released yet."""
    newest = max(releases.releases(), key=lambda v: tuple(int(p) for p in v.split(".")))
    as_tuple = tuple(int(p) for p in streamproc.__version__.split(".")[:3])
    assert as_tuple >= tuple(int(p) for p in newest.split("."))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    for version in releases.releases():
        assert f"## v{version} " in changelog, f"CHANGELOG.md has no section for v{version}"


@pytest.mark.parametrize("version", list(releases.releases()))
@pytest.mark.parametrize("record", list(SAMPLES.values()), ids=lambda r: type(r).__name__)
def test_writing_as_a_release_writes_what_that_release_alone_reads(
    version: str, record: codec.Event, writing_as: None
) -> None:
    release = releases.releases()[version]
    writer = next(w for w in release.writes if w.name.endswith("." + type(record).__name__))
    releases.write_as_release(version)
    framed = codec.encode(record)
    assert framed[:2] == SINGLE_OBJECT_MAGIC and framed[2:10] == writer.fingerprint
    old_reader = fastavro.parse_schema(json.loads(json.dumps(writer.schema)))  # only the schema that release had
    body = fastavro.schemaless_reader(io.BytesIO(framed[10:]), old_reader, None)
    assert isinstance(body, dict) and body["request_id" if "request_id" in body else "request"]
    assert codec.decode(framed, type(record)) is not None  # and this release still reads it


def test_without_a_release_the_current_schemas_are_written(writing_as: None) -> None:
    releases.write_as_release(next(iter(releases.releases())))
    releases.write_as_release(None)
    request = SAMPLES[InferenceRequest]
    assert codec.encode(request)[2:10] == codec.schema_fingerprint(InferenceRequest)
    assert codec.decode(codec.encode(request), InferenceRequest) == request


def test_an_unknown_release_is_refused_naming_the_releases_there_are() -> None:
    with pytest.raises(releases.UnknownRelease, match=r"STREAMPROC_UPGRADE_FROM=0\.0\.9 .*the releases are 0\.1\.0"):
        releases.write_as_release("0.0.9")
