"""The provider batches' phases and progress as pure functions of time, how their settings are given (the
profile's ``batches`` key, ``--batch-seconds``, the ``x-mock-batch`` header), and OpenAI input-file validation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.mockllm.batch_settings import BatchSettings, BatchSettingsError, apply_batch_header
from streamproc.mockllm.batch_timeline import ENDED, Phase, answered_by, phase_at, timeline
from streamproc.mockllm.openai_batches import read_input
from streamproc.mockllm.profiles import Overrides, ProfileError, customize, load_profile, profile_from_mapping

TIMED = BatchSettings(validating_seconds=1, in_progress_seconds=10, finalizing_seconds=2, cancelling_seconds=3)


def phases(settings: BatchSettings, cancelled_at: float | None = None) -> list[Phase]:
    return [phase for phase, _ in timeline(settings, cancelled_at)]


def test_each_end_has_its_documented_path() -> None:
    assert timeline(TIMED) == [(Phase.VALIDATING, 0), (Phase.IN_PROGRESS, 1), (Phase.FINALIZING, 11),
                               (Phase.COMPLETED, 13)]
    assert phases(BatchSettings(fail_validation=True)) == [Phase.VALIDATING, Phase.FAILED]
    assert phases(BatchSettings(expire_after=0.5)) == [Phase.VALIDATING, Phase.IN_PROGRESS, Phase.EXPIRED]
    assert timeline(TIMED, cancelled_at=4) == [(Phase.VALIDATING, 0), (Phase.IN_PROGRESS, 1),
                                               (Phase.CANCELLING, 4), (Phase.CANCELLED, 7)]
    assert timeline(TIMED, cancelled_at=12) == timeline(TIMED)  # finalizing: too late to cancel


def test_phase_at_reads_the_timeline() -> None:
    steps = timeline(TIMED)
    assert [phase_at(steps, t) for t in (0, 0.99, 1, 10.9, 11, 12.9, 13, 1e9)] == [
        Phase.VALIDATING, Phase.VALIDATING, Phase.IN_PROGRESS, Phase.IN_PROGRESS, Phase.FINALIZING,
        Phase.FINALIZING, Phase.COMPLETED, Phase.COMPLETED]


def test_lines_are_answered_evenly_while_in_progress() -> None:
    assert [answered_by(TIMED, 100, t) for t in (0, 1, 2, 6, 11, 50)] == [0, 0, 10, 50, 100, 100]
    assert answered_by(TIMED, 100, 50, cancelled_at=3.5) == 25
    assert answered_by(BatchSettings(in_progress_seconds=0), 7, 0) == 7


@given(
    total=st.integers(0, 10_000),
    times=st.lists(st.floats(0, 100, allow_nan=False), min_size=2, max_size=10),
    expire=st.none() | st.floats(0, 0.999),
    cancelled_at=st.none() | st.floats(0, 100, allow_nan=False),
    seconds=st.floats(0, 20, allow_nan=False),
)
def test_progress_only_grows_and_ends_where_the_end_says(
    total: int, times: list[float], expire: float | None, cancelled_at: float | None, seconds: float
) -> None:
    settings = BatchSettings(validating_seconds=1, in_progress_seconds=seconds, expire_after=expire)
    counts = [answered_by(settings, total, t, cancelled_at) for t in sorted(times)]
    assert counts == sorted(counts) and all(0 <= c <= total for c in counts)
    steps = timeline(settings, cancelled_at)
    last, at = steps[-1]
    assert last in ENDED and [p for p, _ in steps].count(last) == 1
    final = answered_by(settings, total, at + 1, cancelled_at)
    if last is Phase.COMPLETED:
        assert final == total
    elif last is Phase.EXPIRED:
        assert expire is not None and final == min(total, math.floor(total * expire))


def test_the_header_changes_one_batch() -> None:
    assert apply_batch_header(TIMED, None) == TIMED
    assert apply_batch_header(TIMED, "expire=0.25, seconds=3").expire_after == 0.25
    assert apply_batch_header(TIMED, "seconds=3").in_progress_seconds == 3
    assert apply_batch_header(TIMED, "invalid").fail_validation
    for bad in ("expire=1", "expire=x", "seconds=-1", "fast", "invalid=1"):
        with pytest.raises(BatchSettingsError):
            apply_batch_header(TIMED, bad)


def test_a_profile_file_sets_them(tmp_path: Path) -> None:
    path = tmp_path / "batchy.yaml"
    path.write_text("base: realistic\nbatches: {in_progress_seconds: 5, expire_after: 0.5, openai_max_requests: 10}\n")
    settings = load_profile(str(path)).batches
    assert (settings.in_progress_seconds, settings.expire_after, settings.openai_max_requests) == (5, 0.5, 10)
    assert settings.anthropic_max_requests == 100_000 and settings.openai_max_bytes == 200 * 1024 * 1024


@pytest.mark.parametrize(
    ("batches", "message"),
    [
        ([], "batches: a mapping"),
        ({"speed": 1}, "unknown keys ['speed']"),
        ({"in_progress_seconds": -1}, "batches.in_progress_seconds"),
        ({"expire_after": 1.5}, "batches.expire_after"),
        ({"fail_validation": "yes"}, "batches.fail_validation"),
        ({"openai_max_requests": 0}, "batches.openai_max_requests"),
    ],
)
def test_bad_batch_settings_name_their_key(batches: object, message: str) -> None:
    with pytest.raises(ProfileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        profile_from_mapping({"batches": batches})


def test_batch_seconds_override() -> None:
    assert customize(load_profile("clean"), Overrides(batch_seconds=0.2)).batches.in_progress_seconds == 0.2


def test_batch_faults_by_number_change_only_that_batch() -> None:
    settings = customize(load_profile("clean"), Overrides(batch_faults={3: "invalid", 2: "expire=0.5"})).batches
    assert settings.by_number == ((2, "expire=0.5"), (3, "invalid"))
    assert settings.for_number(1, None) == settings and settings.for_number(4, None) == settings
    assert settings.for_number(2, None).expire_after == 0.5 and not settings.for_number(2, None).fail_validation
    assert settings.for_number(3, None).fail_validation and settings.for_number(3, None).expire_after is None
    assert settings.for_number(1, "seconds=3").in_progress_seconds == 3  # the header still applies, on top
    with pytest.raises(ProfileError, match="unknown part 'fast'"):
        customize(load_profile("clean"), Overrides(batch_faults={2: "fast"}))
    with pytest.raises(ProfileError, match=r"batches\.by_number"):
        profile_from_mapping({"batches": {"by_number": {0: "invalid"}}})


LINE_PARTS = st.sampled_from([
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}',
    b'{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "n"}}',
    b'{"custom_id": 1, "body": []}', b"[]", b"{", b"\xff", b"", b'{"custom_id": "a", "url": "/v1/x", "body": {}}',
]) | st.binary(max_size=20)


@given(lines=st.lists(LINE_PARTS, max_size=12))
def test_any_input_file_gives_requests_or_reasons_never_an_exception(lines: list[bytes]) -> None:
    content = b"\n".join(lines)
    requests, problems, model = read_input(content, "/v1/chat/completions", 5, 10_000)
    assert requests or problems  # an empty or wholly invalid file is a failed batch, not an empty one
    for problem in problems:
        assert set(problem) == {"code", "message", "param", "line"} and problem["message"]
    ids = [r.custom_id for r in requests]
    assert len(ids) == len(set(ids))
    if not problems:
        assert 1 <= len(requests) <= 5 and model is not None
