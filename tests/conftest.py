"""Shared fixtures: one real Kafka broker for the whole session.

``scripts/test`` starts the built-in broker and exports ``STREAMPROC_KAFKA_BOOTSTRAP``; a bare ``pytest``
starts its own broker in a temporary directory and stops it at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from streamproc.devstack.broker import LocalBroker
from streamproc.settings import Settings

# Properties are judged by what they assert, not by how fast an example runs: on a machine whose cores other
# jobs take, hypothesis's default 200 ms deadline failed examples that were merely scheduled late.
hypothesis_settings.register_profile("streamproc", deadline=None)
hypothesis_settings.load_profile("streamproc")


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("STREAMPROC_KAFKA_BOOTSTRAP")
    if configured:
        yield configured
        return
    broker = LocalBroker(Settings(data_dir=tmp_path_factory.mktemp("session-broker"),
                                  local_kafka_port=0, local_kafka_controller_port=0))
    status = broker.start()
    assert status.bootstrap is not None
    try:
        yield status.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> Settings:
    """Settings for one test: the session broker, a private data dir, a unique topic prefix and short retry
    tiers (the policy is the same, the tests are faster)."""
    prefix = f"t{os.getpid()}-{tmp_path.name[-12:]}".replace("_", "-")
    return Settings(kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path / "data", retry_tiers="1s,2s,4s",
                    topic_prefix=prefix, app_id=f"{prefix}-app")
