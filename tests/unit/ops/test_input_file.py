"""Batch input files: every error at its line, size caps, BOM and CRLF, streaming and duplicates."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamproc.ops.input_file import BatchFileError, DuplicateDetector, ValidationReport, iter_requests, validate_file
from streamproc.ops.input_lines import BatchLimits, LineError
from tests.unit.ops.test_input_lines import LIMITS, batch_line


def write(path: Path, *lines: str | bytes, newline: bytes = b"\n") -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + newline for x in lines))
    return path


def test_validate_file_reports_each_error_at_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path / "in.jsonl",
        batch_line("a"),  # 1
        "",  # 2: blank
        "{not json",  # 3
        batch_line("b", url="/v1/embeddings"),  # 4
        '{"id": "c", "prompt": "hello"}',  # 5
        batch_line("a"),  # 6: duplicate of 1
        '{"id": "b", "prompt": "again"}',  # 7: duplicate of 4, which was itself invalid
        "[]",  # 8
    )
    report = validate_file(path, LIMITS, "batch-1")
    assert report == ValidationReport(
        valid=2,
        errors=[
            LineError(3, None, "invalid JSON: Expecting property name enclosed in double quotes (column 2)"),
            LineError(4, "b", "unsupported url '/v1/embeddings': not a supported endpoint "
                                 "(supported: /v1/chat/completions)"),
            LineError(6, "a", "duplicate custom_id 'a' (first on line 1)"),
            LineError(7, "b", "duplicate custom_id 'b' (first on line 4)"),
            LineError(8, None, "expected a JSON object, got array"),
        ],
        error_count=5,
        lines=8,
    )


def test_an_invalid_line_reports_its_own_reason_even_when_its_id_is_taken(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", batch_line("a"), batch_line("a", method="GET"))
    assert validate_file(path, LIMITS, "b").errors == [
        LineError(2, "a", "unsupported method 'GET' (only POST is supported)")
    ]


def test_max_errors_keeps_the_first_and_counts_all(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", *["nope"] * 7, '{"id": "ok", "prompt": "p"}')
    report = validate_file(path, LIMITS, "b", max_errors=3)
    assert [e.line for e in report.errors] == [1, 2, 3]
    assert (report.error_count, report.valid, report.lines) == (7, 1, 8)


def test_bom_and_crlf_are_accepted(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", b"\xef\xbb\xbf" + batch_line("a").encode(), batch_line("b"), b"",
                 newline=b"\r\n")
    report = validate_file(path, LIMITS, "b")
    assert report == ValidationReport(valid=2, errors=[], error_count=0, lines=3)
    assert [r.request_id for r in iter_requests(path, LIMITS, "b", 0, skip_invalid=False)] == ["b/a", "b/b"]


def test_crlf_is_not_part_of_the_line_a_reason_describes(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", '{"id": "cut', newline=b"\r\n")  # a \r inside would be a control character
    assert validate_file(path, LIMITS, "b").errors == [
        LineError(1, None, "invalid JSON: Unterminated string starting at (column 8)")
    ]


def test_a_bom_after_line_one_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", batch_line("a"), b"\xef\xbb\xbf" + batch_line("b").encode())
    assert validate_file(path, LIMITS, "b").errors == [
        LineError(2, None, "invalid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) (column 1)")
    ]


def test_last_line_without_newline_is_read(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(batch_line("a") + "\n" + batch_line("b"))
    assert validate_file(path, LIMITS, "b") == ValidationReport(valid=2, errors=[], error_count=0, lines=2)


def test_a_non_utf8_line_is_an_error_not_a_crash(tmp_path: Path) -> None:
    latin1 = '{"id": "x", "prompt": "café"}'.encode("latin-1")
    path = write(tmp_path / "in.jsonl", batch_line("a"), latin1, batch_line("c"))
    report = validate_file(path, LIMITS, "b")
    assert report.errors == [LineError(2, None, "not valid UTF-8: byte 0xe9 at byte 27")]
    assert (report.valid, report.lines) == (2, 3)


def test_an_endless_line_is_refused_unread_and_the_next_line_keeps_its_number(tmp_path: Path) -> None:
    limits = BatchLimits(max_body_bytes=100)  # lines are capped at 800 bytes
    short = '{"id": "s", "prompt": "p"}'
    path = write(tmp_path / "in.jsonl", short, "x" * 5_000_000, '{"id": "t", "prompt": "q"}', "y" * 801, "z" * 800)
    report = validate_file(path, limits, "b")
    too_long = "line is over 800 bytes (8 times the body limit), not read"
    assert report.errors == [
        LineError(2, None, too_long),
        LineError(4, None, too_long),
        LineError(5, None, "invalid JSON: Expecting value (column 1)"),
    ]
    assert (report.valid, report.lines) == (2, 5)


def test_iter_requests_skips_invalid_and_duplicate_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", batch_line("a"), "oops", '{"id": "b", "prompt": "p"}', batch_line("a"),
                 batch_line("c"))
    requests = list(iter_requests(path, LIMITS, "batch-9", 42, skip_invalid=True))
    assert [r.request_id for r in requests] == ["batch-9/a", "batch-9/b", "batch-9/c"]
    assert all(r.batch_id == "batch-9" and r.submitted_ms == 42 for r in requests)
    assert len(requests) == validate_file(path, LIMITS, "batch-9").valid


def test_iter_requests_without_skip_raises_at_the_first_invalid_line_after_streaming_the_ones_before(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "in.jsonl", batch_line("a"), batch_line("b"), batch_line("a"), "oops")
    stream = iter_requests(path, LIMITS, "b", 0, skip_invalid=False)
    assert [next(stream).request_id, next(stream).request_id] == ["b/a", "b/b"]
    with pytest.raises(BatchFileError) as raised:
        next(stream)
    assert raised.value.error == LineError(3, "a", "duplicate custom_id 'a' (first on line 1)")
    assert str(raised.value) == "line 3 (custom_id 'a'): duplicate custom_id 'a' (first on line 1)"


def test_temporary_id_databases_are_removed(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = write(tmp_path / "in.jsonl", batch_line("a"), batch_line("a"))
    assert validate_file(path, LIMITS, "b", tmp_dir=scratch).error_count == 1
    assert len(list(iter_requests(path, LIMITS, "b", 0, skip_invalid=True, tmp_dir=scratch))) == 1
    assert list(scratch.iterdir()) == []


# --- the duplicate detector --------------------------------------------------------------------------------


def test_duplicate_detector_answers_the_first_line(tmp_path: Path) -> None:
    with DuplicateDetector(tmp_path) as ids:
        assert ids.seen("a", 1) is None
        assert ids.seen("ä", 2) is None
        assert ids.seen("b", 3) is None
        assert ids.seen("a", 4) == 1
        assert ids.seen("a", 5) == 1
        assert ids.seen("ä", 6) == 2
        assert ids.seen("A", 7) is None
        assert ids.seen("x" * 10_000, 3_000_000_000) is None
        assert ids.seen("x" * 10_000, 8) == 3_000_000_000
    assert list(tmp_path.iterdir()) == []


def test_duplicate_detector_refuses_use_outside_its_block() -> None:
    ids = DuplicateDetector()
    with pytest.raises(RuntimeError, match="outside its with block"):
        ids.seen("a", 1)
    with ids:
        assert ids.seen("a", 1) is None
    with pytest.raises(RuntimeError):
        ids.seen("a", 2)
