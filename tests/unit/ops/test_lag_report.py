"""The output of ``streamproc lag``: the table, its summary lines, durations and the JSON document."""

from __future__ import annotations

import json

import pytest

from streamproc.core.durations import format_duration
from streamproc.core.lag import GroupLag, LagReport, PartitionLag
from streamproc.ops.lag_report import COLUMNS, format_table, to_json
from tests.unit.core.test_lag_model import CHANGELOG, REQ, G, part


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.0, "0s"), (0.2, "1s"), (42.0, "42s"), (185.0, "3m05s"), (7620.0, "2h07m"),
    (3 * 86400 + 4 * 3600, "3d04h"),
])
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def sample_report() -> LagReport:
    group = GroupLag(G, (
        PartitionLag(G, REQ, 0, 120, 500, 0, rate=12.5, eta_seconds=30.4),
        PartitionLag(G, REQ, 1, None, 40, 0),
        PartitionLag(G, CHANGELOG, 0, 3, 9, 0),
    ), state="Stable", members=1, rate=12.5, eta_seconds=34.0)
    return LagReport((group,), taken_at=1_700_000_000.0, interval_s=5.0)


def test_table_has_the_kafka_columns_aligned() -> None:
    lines = format_table(sample_report()).splitlines()
    assert lines[0].split() == list(COLUMNS)
    assert lines[1].split() == [G, REQ, "0", "120", "500", "380", "12.5", "31s"]
    assert lines[2].split() == [G, REQ, "1", "-", "40", "40", "-", "-"]
    assert lines[3].split() == [G, CHANGELOG + "*", "0", "3", "9", "6", "-", "-"]
    column = lines[0].index("CURRENT-OFFSET")  # every row's cell starts where its header does
    assert [line[column:].split()[0] for line in lines[1:4]] == ["120", "-", "3"]
    assert lines[5] == f"{G}: lag 420, consuming 12.5 records/s, drained in ~34s (Stable, 1 member)"
    assert lines[6].startswith("* faust's internal topic")


def test_table_without_rates_and_without_lag() -> None:
    report = LagReport((GroupLag(G, (part(REQ, 0, 5, 5),), state="Empty", members=0),), taken_at=0.0)
    text = format_table(report)
    assert text.splitlines()[-1] == f"{G}: lag 0 (Empty, 0 members)"
    assert "*" not in text
    estimated = LagReport(report.groups, taken_at=0.0, interval_s=5.0)
    assert format_table(estimated).splitlines()[-1] == \
        f"{G}: lag 0, consuming - records/s, nothing to drain (Empty, 0 members)"


def test_table_says_when_the_backlog_does_not_drain() -> None:
    group = GroupLag(G, (part(REQ, 0, 5, 50),), rate=0.0)
    line = format_table(LagReport((group,), taken_at=0.0, interval_s=5.0)).splitlines()[-1]
    assert line.startswith(f"{G}: lag 45, consuming 0.0 records/s, not draining")


def test_json_document_keys_are_stable() -> None:
    document = to_json(sample_report(), max_lag=100)
    assert list(document) == ["taken_at", "interval_s", "max_lag", "over_max_lag", "groups"]
    assert document["over_max_lag"] == [G]
    [group] = document["groups"]
    assert list(group) == ["group", "state", "members", "lag", "rate", "eta_seconds", "partitions"]
    assert (group["lag"], group["rate"], group["eta_seconds"]) == (420, 12.5, 34.0)
    first, second, changelog = group["partitions"]
    assert list(first) == ["topic", "partition", "internal", "committed", "end", "start", "lag", "rate",
                           "eta_seconds"]
    assert first == {"topic": REQ, "partition": 0, "internal": False, "committed": 120, "end": 500, "start": 0,
                     "lag": 380, "rate": 12.5, "eta_seconds": 30.4}
    assert second["committed"] is None and second["rate"] is None
    assert changelog["internal"] is True
    json.dumps(document)  # serialisable as is
    assert to_json(sample_report())["over_max_lag"] == []
