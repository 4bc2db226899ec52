"""What a table restore still reads of a changelog, and what one fetch of it writes (issue 29)."""

from __future__ import annotations

from streamproc.core.changelog_reads import Applied, Span, changelog_reads


def test_a_partition_is_read_from_past_its_last_applied_record_to_the_highwater() -> None:
    reads = changelog_reads(["fresh", "behind", "done", "empty", "unknown"],
                            {"fresh": None, "behind": 41, "done": 99, "empty": -1},
                            {"fresh": 9, "behind": 99, "done": 99, "empty": -1})
    assert reads == {"fresh": Span(0, 9), "behind": Span(42, 99)}
    assert reads["behind"].records == 58


def test_a_fresh_store_reads_a_partition_from_its_first_record() -> None:
    assert changelog_reads([0], {0: -1}, {0: 0}) == {0: Span(0, 0)}


def test_the_latest_write_of_a_key_wins_and_a_tombstone_deletes() -> None:
    records = [(10, b"a", b"1"), (11, b"b", b"1"), (12, b"a", b"2"), (13, b"b", None), (14, b"c", None),
               (15, b"c", b"3")]
    applied = Applied.of(records, Span(10, 20))
    assert applied.writes == {b"a": b"2", b"b": None, b"c": b"3"}
    assert applied.last_offset == 15


def test_records_past_the_highwater_taken_are_left_out() -> None:
    applied = Applied.of([(5, b"a", b"1"), (6, b"a", b"2"), (7, b"b", b"1")], Span(0, 5))
    assert applied.writes == {b"a": b"1"}
    assert applied.last_offset == 5


def test_a_record_without_a_key_moves_the_offset_only() -> None:
    applied = Applied.of([(3, None, b"x")], Span(0, 9))
    assert (applied.writes, applied.last_offset) == ({}, 3)
    assert Applied.of([], Span(0, 9)).last_offset is None
