"""The settings object reads STREAMPROC_* variables and validates them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from streamproc.settings import Settings


def test_reads_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROC_KAFKA_BOOTSTRAP", "127.0.0.1:1234")
    monkeypatch.setenv("STREAMPROC_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("STREAMPROC_LLM_API_KEY", "sk-test")
    monkeypatch.setenv("STREAMPROC_TOPIC_PREFIX", "batch7")
    monkeypatch.setenv("STREAMPROC_DATA_DIR", "/tmp/somewhere")

    settings = Settings()

    assert settings.kafka_bootstrap == "127.0.0.1:1234"
    assert settings.llm_base_url == "http://127.0.0.1:9/v1"
    assert settings.llm_api_key is not None and settings.llm_api_key.get_secret_value() == "sk-test"
    assert "sk-test" not in repr(settings)
    assert settings.topic_prefix == "batch7"
    assert settings.local_kafka_dir == Path("/tmp/somewhere/kafka")


def test_rejects_invalid_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROC_TOPIC_PREFIX", "no spaces/allowed")
    with pytest.raises(ValidationError, match="topic_prefix"):
        Settings()
    monkeypatch.delenv("STREAMPROC_TOPIC_PREFIX")
    monkeypatch.setenv("STREAMPROC_LOCAL_KAFKA_PORT", "70000")
    with pytest.raises(ValidationError, match="local_kafka_port"):
        Settings()


def test_the_app_id_lives_in_the_topic_prefixs_namespace_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMPROC_APP_ID", raising=False)
    monkeypatch.delenv("STREAMPROC_TOPIC_PREFIX", raising=False)
    assert Settings().app_id == "streamproc"  # the default deployment keeps its group and state
    monkeypatch.setenv("STREAMPROC_TOPIC_PREFIX", "team-a")
    topology = Settings().topology()
    assert topology.app_id == "team-a.streamproc"
    assert topology.state_changelog == "team-a.streamproc-request_state-changelog"
    assert Settings(topic_prefix="team-b").app_id == "team-b.streamproc"
    monkeypatch.setenv("STREAMPROC_APP_ID", "")  # empty: unset
    assert Settings().app_id == "team-a.streamproc"
    monkeypatch.setenv("STREAMPROC_APP_ID", "mine")
    assert Settings().app_id == "mine"
    assert Settings(app_id="given").app_id == "given"
