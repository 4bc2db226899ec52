"""Every producer is acks=all and idempotent, faust's too (faust itself turns idempotence on only in transactions)."""

from __future__ import annotations

from pathlib import Path

from streamproc.app.bootstrap import resolve_connection
from streamproc.app.faust_app import make_faust_app
from streamproc.settings import Settings


async def test_the_faust_producer_is_idempotent_with_acks_all(tmp_path: Path) -> None:
    settings = Settings(kafka_bootstrap="127.0.0.1:9", data_dir=tmp_path)
    app = make_faust_app(settings.faust, resolve_connection(settings), "durable-test", 4, replication_factor=3)
    client = app.producer._new_producer()  # type: ignore[attr-defined]  # faust's aiokafka driver
    assert client._sender._acks == -1
    assert client._txn_manager is not None  # aiokafka's idempotence: producer id and sequence numbers
    assert app.conf.topic_replication_factor == 3


async def test_idempotence_can_be_turned_off_for_clusters_that_refuse_it(tmp_path: Path) -> None:
    settings = Settings(kafka_bootstrap="127.0.0.1:9", data_dir=tmp_path, kafka_idempotence=False)
    assert settings.durability.producer_options() == {"acks": "all", "enable_idempotence": False}
    app = make_faust_app(settings.faust, resolve_connection(settings), "durable-test", 4, replication_factor=1)
    client = app.producer._new_producer()  # type: ignore[attr-defined]
    assert (client._sender._acks, client._txn_manager) == (-1, None)


async def test_the_faust_producer_lingers_30_ms_to_share_produce_requests(tmp_path: Path) -> None:
    settings = Settings(kafka_bootstrap="127.0.0.1:9", data_dir=tmp_path)
    app = make_faust_app(settings.faust, resolve_connection(settings), "linger-test", 4, replication_factor=1)
    client = app.producer._new_producer()  # type: ignore[attr-defined]
    assert client._sender._linger_time == 0.03
