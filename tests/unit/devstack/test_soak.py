"""The soak run's arithmetic: slopes within incarnations, the leak verdict, and what it reads of logs and disks."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from streamproc.devstack.soak.probes import (
    changelog_bytes,
    open_file_kind,
    open_files_by_kind,
    read_process,
    recovered_at,
)
from streamproc.devstack.soak.soak_run import BOUNDS
from streamproc.devstack.soak.trend import Point, judge, pooled_slope, slope


def test_a_slope_within_incarnations_ignores_the_drop_at_each_restart() -> None:
    """Memory that grows 2 MB a minute and falls back at every restart: the slope is 2, not the sawtooth's."""
    points = [Point(incarnation, minute, 100 + 2 * (minute - 10 * incarnation))
              for incarnation in range(3) for minute in range(10 * incarnation, 10 * incarnation + 8)]
    assert pooled_slope(points) == pytest.approx(2.0)
    through_all = slope((p.minute, p.value) for p in points)
    assert through_all is not None and through_all < 1.0  # one line through the sawtooth hides the leak


def test_flat_incarnations_at_different_levels_have_no_slope() -> None:
    points = [Point(i, minute, 100.0 + 40 * i) for i in range(3) for minute in range(10 * i, 10 * i + 8)]
    assert pooled_slope(points) == pytest.approx(0.0)


def test_too_few_samples_give_no_slope_and_no_leak() -> None:
    assert pooled_slope([Point("a", 1.0, 5.0), Point("b", 2.0, 9.0)]) is None
    assert not judge(BOUNDS["rss"], None).leaks


def test_a_slope_past_its_bound_is_a_leak() -> None:
    assert judge(BOUNDS["fds"], 0.6).leaks
    assert not judge(BOUNDS["fds"], 0.4).leaks
    assert "LEAK" in judge(BOUNDS["fds"], 0.6).line()


def test_the_restore_is_read_from_the_first_recovery_after_the_start() -> None:
    log = ("[2026-12-02 11:08:00,248] [24900] [INFO] [^---Recovery]: Highwater for active changelog partitions:\n"
           "[2026-12-02 11:08:00,331] [24900] [INFO] [^---Recovery]: Recovery complete \n"
           "[2026-12-02 11:08:25,968] [24900] [INFO] [^---Recovery]: Recovery complete \n")
    assert recovered_at(log) == datetime(2026, 12, 2, 11, 8, 0, 331000)
    assert recovered_at("[2026-12-02 11:08:00,248] [1] [INFO] [^Worker]: Starting...\n") is None


def test_the_changelog_is_its_log_segments_of_every_partition(tmp_path: Path) -> None:
    for partition, size in ((0, 100), (1, 50)):
        directory = tmp_path / "kraft" / f"app-request_state-changelog-{partition}"
        directory.mkdir(parents=True)
        (directory / "00000000000000000000.log").write_bytes(b"x" * size)
        (directory / "00000000000000000000.index").write_bytes(b"\0" * 10_000)  # allocated up front: not counted
    (tmp_path / "kraft" / "other-topic-0").mkdir()
    (tmp_path / "kraft" / "other-topic-0" / "00000000000000000000.log").write_bytes(b"y" * 999)
    assert changelog_bytes(tmp_path, "app-request_state-changelog") == 150


def test_a_process_is_read_from_proc_and_a_gone_one_is_none() -> None:
    import os

    reading = read_process(os.getpid())
    assert reading is not None and reading.rss_mb > 1 and reading.open_files >= 3 and reading.cpu_s > 0
    assert read_process(2**22 + 12345) is None


def test_open_files_are_told_apart_by_what_they_are() -> None:
    assert open_file_kind("socket:[123456]") == "sockets"
    assert open_file_kind("pipe:[42]") == "pipes"
    assert open_file_kind("anon_inode:[eventpoll]") == "event fds"
    assert open_file_kind("/data/w1/tables/state-3.db/000012.sst") == "rocksdb tables"
    assert open_file_kind("/data/w1/tables/state-3.db/000011.log") == "rocksdb other"
    assert open_file_kind("/data/w1/tables/state-3.db/MANIFEST-000005") == "rocksdb other"
    assert open_file_kind("/usr/lib/python3.11/site-packages/x.so") == "other files"


def test_a_process_s_open_files_by_kind_add_up_to_its_open_files() -> None:
    import os
    import socket

    with socket.socket() as _held:
        kinds = open_files_by_kind(os.getpid())
        reading = read_process(os.getpid())
    assert kinds["sockets"] >= 1
    assert reading is not None and abs(sum(kinds.values()) - reading.open_files) <= 2  # listing's own fd, races
    assert open_files_by_kind(2**22 + 7) == {}
