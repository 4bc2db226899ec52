"""STREAMPROC_STANDBY_REPLICAS reaches faust's partition assignor, and what more standbys than workers means."""

from __future__ import annotations

from pathlib import Path

import pytest
from faust.assignor.client_assignment import CopartitionedAssignment
from faust.assignor.copartitioned_assignor import CopartitionedAssignor
from pydantic import ValidationError

from streamproc.app.faust_app import make_faust_app
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings

LOCAL = KafkaConnection(bootstrap="127.0.0.1:9")


@pytest.mark.parametrize(("env", "expected"), [(None, 1), ("0", 0), ("2", 2)])
def test_the_setting_reaches_the_faust_apps_assignor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, expected: int
) -> None:
    if env is not None:
        monkeypatch.setenv("STREAMPROC_STANDBY_REPLICAS", env)
    app = make_faust_app(Settings(data_dir=tmp_path).faust, LOCAL, "standby-test", 8, 1)
    assert app.conf.table_standby_replicas == expected
    assert app.assignor.replicas == expected  # what assigns the standby partitions


def test_a_negative_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROC_STANDBY_REPLICAS", "-1")
    with pytest.raises(ValidationError, match="standby_replicas"):
        Settings()


def test_more_standbys_than_other_workers_means_a_copy_on_every_other_worker() -> None:
    """faust caps the count at workers - 1: with 2 workers, 3 standbys give each worker a copy of every
    partition it does not own, and no worker keeps a standby of its own partition."""
    clients = {name: CopartitionedAssignment(topics={"requests"}) for name in ("w1", "w2")}
    assignment = CopartitionedAssignor({"requests"}, clients, num_partitions=8, replicas=3).get_assignment()
    for client in assignment.values():
        assert client.standbys == set(range(8)) - client.actives
    assert sorted(len(client.actives) for client in assignment.values()) == [4, 4]
