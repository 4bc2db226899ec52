"""The faust App, configured the one way streamproc runs it (its recovery fixes applied first)."""

from __future__ import annotations

import faust

import streamproc.app.faust_fixes  # noqa: F401  (applies the recovery fixes to faust before any app exists)
from streamproc.app.bootstrap import resolve_bootstrap
from streamproc.settings import Settings


def make_faust_app(settings: Settings, app_id: str, partitions: int) -> faust.App:
    """A faust App with RocksDB (rocksdict) tables under the data dir, no web server, full acks."""
    datadir = settings.data_dir / "faust" / app_id
    datadir.mkdir(parents=True, exist_ok=True)
    return faust.App(
        app_id,
        broker=f"kafka://{resolve_bootstrap(settings)}",
        store="rocksdb://",
        datadir=str(datadir),
        topic_partitions=partitions,
        topic_replication_factor=1,
        producer_acks=-1,
        # batch sends for up to 10 ms (faust's default is 0): results and table changelog records from
        # hundreds of concurrent calls then share produce requests, which halves the broker's CPU per
        # request (scripts/bench); the delay is nothing next to an LLM call, and sends are still awaited
        producer_linger=0.01,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        # a worker that died is noticed (and its partitions handed over) after this long
        broker_session_timeout=settings.kafka_session_timeout_s,
        broker_heartbeat_interval=settings.kafka_session_timeout_s / 10,
    )
