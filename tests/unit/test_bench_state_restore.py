"""The pure part of ``scripts/bench state --restore-only --forgotten N`` (benchmarks/state_restore.py): the
broker-compacted restores judged against the live ones they alternated with, by the ratio of the medians."""

from __future__ import annotations

from benchmarks.state_restore import Restore, paired_row


def restored(shape: str, seconds: float) -> Restore:
    return Restore(shape, 200_000, seconds, 200_000, seconds, 5.0, None)


def pairs(*seconds: tuple[float, float]) -> list[tuple[Restore, Restore]]:
    return [(restored("live", live), restored("compacted", compacted)) for live, compacted in seconds]


def test_the_ratio_is_of_the_medians_so_one_slow_round_under_load_does_not_decide() -> None:
    label, figure, target, status = paired_row(pairs((2.0, 2.2), (2.0, 9.0), (2.0, 2.3)))
    assert label.endswith("3 alternated rounds") and target == "<= 1.2 x live"
    assert status == "1.15 x: met", status
    assert "medians 2.3s compacted / 2.0s live" in figure and "2.0/9.0" in figure


def test_a_compacted_restore_slower_than_1_2_times_the_live_one_misses() -> None:
    assert paired_row(pairs((2.0, 2.6), (2.0, 2.6)))[3] == "1.30 x: MISSED"
