"""faust reads unprefixed environment variables (BROKER_URL, APP_WEB_ENABLED, ...) over the settings it is given;
the app streamproc builds ignores them."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamproc.app.faust_app import make_faust_app
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings

LOCAL = KafkaConnection(bootstrap="127.0.0.1:9")


def test_the_environment_cannot_override_the_apps_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"BROKER_URL": "kafka://10.9.9.9:1", "APP_WEB_ENABLED": "true", "WEB_ENABLED": "true",
                        "APP_STORE": "memory://", "BROKER_SESSION_TIMEOUT": "99", "PRODUCER_ACKS": "1",
                        "TOPIC_PARTITIONS": "3"}.items():
        monkeypatch.setenv(name, value)
    app = make_faust_app(Settings(data_dir=tmp_path).faust, LOCAL, "env-test", 8, 1)
    assert [str(url) for url in app.conf.broker] == ["kafka://127.0.0.1:9"]
    assert app.conf.web_enabled is False
    assert str(app.conf.store) == "rocksdb:"
    assert app.conf.broker_session_timeout == 10.0 and app.conf.producer_acks == -1
    assert app.conf.topic_partitions == 8
