"""The faust App, configured the one way streamproc runs it (its recovery fixes applied first)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import faust
from faust.auth import OAuthCredentials, SASLCredentials, SSLCredentials
from faust.transport.drivers.aiokafka import Producer
from faust.types import ProducerT

import streamproc.app.faust_fixes  # noqa: F401  (applies the recovery fixes to faust before any app exists)
from streamproc.app.bulk_restore import enable_bulk_restore
from streamproc.kafka.clients import shared_token_provider, tls_context
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import FaustSettings


class _DurableProducer(Producer):
    """faust's producer with the deployment's producer options: faust turns idempotence on only inside
    transactions, so a send it retries after a broker failure could otherwise be written twice."""

    options: Mapping[str, Any] = {}

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), **self.options}


class _DurableApp(faust.App):
    """A faust App whose producer carries :meth:`~streamproc.settings.Durability.producer_options`."""

    producer_options: Mapping[str, Any] = {}

    def _new_producer(self) -> ProducerT:
        producer = _DurableProducer(self.transport, loop=self.loop, beacon=self.beacon)
        producer.options = self.producer_options
        return producer


RECORDS_PER_FETCH = 1000  # faust's broker_max_poll_records (below)
_PRESSURE_RATIO = 1.25  # mode's FlowControlQueue: a partition stops being fetched at maxsize / 1.25 records queued


def input_buffer(stream_buffer: int, records_per_fetch: int = RECORDS_PER_FETCH) -> int:
    """The buffer of an input topic's agent that a fetch never fills: faust stops fetching a partition once its
    agent's buffer holds ``maxsize / 1.25`` records, but hands over the rest of the fetch already made, and waits,
    for every topic, while that buffer is full. So one agent that takes its records slowly (a ``low`` flood's,
    the backlog's) would hold back the records of every other topic, a ``high`` batch's among them (design §5.11,
    reading). Records waiting there are not yet taken (no state, no ack) and faust clears them at a rebalance."""
    return max(stream_buffer, round(records_per_fetch * _PRESSURE_RATIO / (_PRESSURE_RATIO - 1)))


def fetch_fits(queued: int, maxsize: int, records_per_fetch: int = RECORDS_PER_FETCH) -> bool:
    """Whether an agent's buffer holding ``queued`` of ``maxsize`` records takes a whole fetch without filling up
    (a full buffer makes faust wait, for every topic, until its agent takes a record)."""
    return queued + records_per_fetch <= maxsize


def under_pressure(queued: int, maxsize: int) -> bool:
    """Whether an agent's buffer holding ``queued`` of ``maxsize`` records is at the mark where faust stops fetching
    its partitions."""
    return queued * _PRESSURE_RATIO >= maxsize


def faust_credentials(connection: KafkaConnection) -> faust.types.auth.CredentialsT | None:
    """The connection's security as faust's ``broker_credentials``, which faust hands to each client it builds."""
    context = tls_context(connection)
    if connection.sasl_mechanism == "OAUTHBEARER":
        provider = shared_token_provider(connection)
        assert provider is not None  # KafkaConnection requires a token source for OAUTHBEARER
        return OAuthCredentials(oauth_cb=provider, ssl_context=context)
    if connection.uses_sasl:
        return SASLCredentials(username=connection.sasl_username, mechanism=connection.sasl_mechanism,
                               password=connection.sasl_password.get_secret_value() if connection.sasl_password
                               else None, ssl_context=context)
    return SSLCredentials(context) if context is not None else None


def make_faust_app(settings: FaustSettings, connection: KafkaConnection, app_id: str, partitions: int,
                   replication_factor: int) -> faust.App:
    """A faust App on ``connection`` with RocksDB (rocksdict) tables under the data dir, no web server, acks=all
    and idempotent sends; the topics faust creates itself (its leader topic) get ``replication_factor`` replicas."""
    datadir = settings.data_dir / "faust" / app_id
    datadir.mkdir(parents=True, exist_ok=True)
    app = _DurableApp(
        app_id,
        # faust would let unprefixed variables (BROKER_URL, APP_WEB_ENABLED, ...) override every setting below
        env={},
        broker=f"kafka://{connection.bootstrap}",
        broker_credentials=faust_credentials(connection),
        store="rocksdb://",
        datadir=str(datadir),
        topic_partitions=partitions,
        topic_replication_factor=replication_factor,
        producer_acks=-1,
        # batch sends for up to 30 ms (faust's default is 0): the outcomes and changelog records of hundreds
        # of concurrent calls then share produce requests, which saves the broker and the worker CPU per
        # record; the delay is nothing next to an LLM call, and sends are still awaited
        producer_linger=0.03,
        # a partition's batch may grow to 256 KiB while the one produce request per broker is under way
        # (aiokafka's default 16 KiB fills at a few hundred results/s, and every further send then waits for
        # the batch to drain and wakes with all the others)
        producer_max_batch_size=262_144,
        web_enabled=False,
        # at most this many records per fetch handed over (faust's default, all that came, holds megabytes of
        # changelog per fetch while a table is restored). The fetch size per partition stays faust's 1 MiB:
        # a smaller one is suspected of a lost record (design §4, "A million requests of state")
        broker_max_poll_records=RECORDS_PER_FETCH,
        consumer_auto_offset_reset="earliest",
        # a worker that died is noticed (and its partitions handed over) after this long; and every worker hears
        # of a rebalance at its next heartbeat, so a second apart, every worker of the group waits at most that
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(1.0, settings.session_timeout_s / 3),
        # warm copies of the state table on other workers: faster failover against CPU per request (design §5.6)
        table_standby_replicas=settings.standby_replicas,
    )
    app.producer_options = settings.durability.producer_options()
    if settings.bulk_restore:  # a table restore reads its changelog in bulk, not through faust's stream
        enable_bulk_restore(app, connection)
    return app
