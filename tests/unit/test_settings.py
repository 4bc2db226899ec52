"""The settings object reads STREAMPROC_* variables and validates them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from streamproc.core.replication import ReplicationRequest
from streamproc.settings import BreakerSettings, InFlightSettings, Settings, TenantPauseSettings


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
    assert settings.local_stack.kafka_dir == Path("/tmp/somewhere/kafka")


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


def test_each_module_s_value_reads_the_same_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {"LLM_BASE_URL": "https://llm.example/v1", "LLM_API_KEY_FILE": str(tmp_path / "key"),
                        "LLM_ALLOW_INSECURE": "1", "LLM_HTTP": "httpcore", "LLM_CONNECT_TIMEOUT_S": "2",
                        "LLM_TIMEOUT_S": "30", "LLM_MAX_RESPONSE_BYTES": "4096", "LLM_RPM": "600", "LLM_TPM": "0",
                        "LLM_LIMIT_SHARE": "0.5", "IN_FLIGHT": "64", "ADAPTIVE_MIN_IN_FLIGHT": "2",
                        "ADAPTIVE_INITIAL_IN_FLIGHT": "8", "BREAKER_FAILURE_RATE": "0.25", "BREAKER_WINDOW_S": "20",
                        "BREAKER_MIN_CALLS": "4", "BREAKER_OPEN_S": "3", "BREAKER_HOLD_S": "0",
                        "RETRY_BUDGET_RATIO": "0.1", "RETRY_BUDGET_MIN": "7", "LLM_HEDGE_RATIO": "0",
                        "CONTEXT_WINDOWS": '{"small": 4096}', "CONTEXT_FALLBACKS": '{"small": "large"}',
                        "MODEL_FALLBACKS": '{"a": ["b", "c"]}', "REPLICATION_FACTOR": "3",
                        "MIN_INSYNC_REPLICAS": "2", "KAFKA_IDEMPOTENCE": "0", "KAFKA_SESSION_TIMEOUT_S": "12",
                        "STANDBY_REPLICAS": "0", "DATA_DIR": str(tmp_path), "MAX_BODY_BYTES": "2048",
                        "DEFAULT_MODEL": "small"}.items():
        monkeypatch.setenv(f"STREAMPROC_{name}", value)
    monkeypatch.delenv("STREAMPROC_LLM_API_KEY", raising=False)
    settings = Settings()

    endpoint = settings.llm_endpoint
    assert (endpoint.base_url, endpoint.api_key, endpoint.api_key_file) == ("https://llm.example/v1", None,
                                                                             tmp_path / "key")
    assert (endpoint.allow_insecure, endpoint.http, endpoint.connect_timeout_s, endpoint.read_timeout_s,
            endpoint.max_response_bytes) == (True, "httpcore", 2.0, 30.0, 4096)
    guards = settings.guards
    assert (guards.rate.rpm, guards.rate.tpm, guards.rate.share) == (600.0, None, 0.5)  # 0: learned
    assert (guards.in_flight.floor, guards.in_flight.ceiling, guards.in_flight.start) == (2, 64, 8)
    assert guards.breaker == BreakerSettings(failure_rate=0.25, window_s=20, min_calls=4, open_s=3, hold_s=0)
    assert (guards.retry_budget.ratio, guards.retry_budget.minimum, guards.hedge_ratio) == (0.1, 7, 0.0)
    assert guards.routes.context_windows == {"small": 4096}
    assert guards.routes.context_fallbacks == {"small": "large"}
    assert guards.routes.model_fallbacks == {"a": ["b", "c"]}
    assert settings.durability.replication == ReplicationRequest(factor=3, min_insync=2)
    assert settings.durability.producer_options() == {"acks": "all", "enable_idempotence": False}
    faust = settings.faust
    assert (faust.data_dir, faust.session_timeout_s, faust.standby_replicas) == (tmp_path, 12.0, 0)
    assert faust.durability == settings.durability
    assert (settings.input_limits.max_body_bytes, settings.input_limits.default_model) == (2048, "small")


def test_the_in_flight_limit_starts_and_stays_within_its_ceiling() -> None:
    assert Settings(in_flight=4, adaptive_min_in_flight=8, adaptive_initial_in_flight=16).guards.in_flight == \
        InFlightSettings(floor=4, ceiling=4, start=4, long_threshold_tokens=2000, long_share=0.25)
    assert Settings(in_flight=256, adaptive_min_in_flight=32, adaptive_initial_in_flight=16, long_request_tokens=0,
                    long_request_share=0.5).guards.in_flight == \
        InFlightSettings(floor=32, ceiling=256, start=32, long_threshold_tokens=0, long_share=0.5)


def test_tenant_pauses_are_on_by_default_and_off_at_zero_or_in_a_rolling_upgrade() -> None:
    assert Settings(tenant_pause_probe_s=10).guards.tenant_pause == TenantPauseSettings(after=5, probe_s=10.0)
    assert Settings(tenant_pause_after=0).guards.tenant_pause is None
    assert Settings(upgrade_from="0.1.0").guards.tenant_pause is None  # its workers know no tenant_paused record


def test_breakers_turned_off_are_no_breaker_settings() -> None:
    assert Settings(breaker_enabled=False).guards.breaker is None


def test_the_local_stack_s_files_live_under_its_dirs(tmp_path: Path) -> None:
    local = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", local_kafka_version="3.8.1",
                     local_kafka_port=0, local_kafka_controller_port=9193, local_kafka_heap_mb=600,
                     local_kafka_node_heap_mb=400).local_stack
    assert (local.kafka_dir, local.kafka_jars_dir) == (tmp_path / "data" / "kafka",
                                                       tmp_path / "cache" / "kafka-3.8.1" / "libs")
    assert (local.kafka_port, local.kafka_controller_port, local.kafka_heap_mb, local.kafka_node_heap_mb) == \
        (0, 9193, 600, 400)


def test_the_values_are_frozen() -> None:
    guards = Settings().guards
    with pytest.raises(ValidationError, match="frozen"):
        guards.hedge_ratio = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        guards.rate.share = 0.1  # type: ignore[misc]


def test_retention_of_finished_batches_is_off_unless_set_and_refuses_what_is_no_duration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().retain_finished_ms is None
    monkeypatch.setenv("STREAMPROC_RETAIN_FINISHED", "")
    assert Settings().retain_finished_ms is None
    monkeypatch.setenv("STREAMPROC_RETAIN_FINISHED", "30d")
    assert Settings().retain_finished_ms == 30 * 86_400_000
    for wrong in ("a month", "0", "0d"):
        monkeypatch.setenv("STREAMPROC_RETAIN_FINISHED", wrong)
        with pytest.raises(ValidationError, match="is not a retention such as 30d"):
            Settings()


def test_model_routes_name_the_provider_batch_models() -> None:
    settings = Settings(model_routes={"a": "provider-batch", "b": "call"})
    assert settings.provider_batches.routed_models == {"a"}


def test_provider_batch_api_chooses_openai_unless_anthropic_is_named() -> None:
    assert Settings().provider_batches.api == "openai"
    assert Settings(provider_batch_api="anthropic").provider_batches.api == "anthropic"
    with pytest.raises(ValidationError):
        Settings(provider_batch_api="gemini")


def test_the_settings_turn_the_priority_topics_off_while_an_older_release_runs() -> None:
    assert Settings(upgrade_from=None).topology().by_priority
    assert not Settings(upgrade_from="0.1.0").topology().by_priority


def test_tenant_groups_route_requests_and_refuse_pins_they_cannot_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROC_TENANT_GROUPS", "3")
    monkeypatch.setenv("STREAMPROC_TENANT_GROUP_OF", '{"team-a": 2}')
    assert Settings().topology().request_topic("low", "team-a") == "llm.requests.low.g2"
    monkeypatch.setenv("STREAMPROC_TENANT_GROUP_OF", '{"team-a": 3}')
    with pytest.raises(ValidationError, match=r"pinned outside groups 0\.\.2"):
        Settings()
    monkeypatch.setenv("STREAMPROC_TENANT_GROUP_OF", '{"no spaces": 1}')
    with pytest.raises(ValidationError, match="STREAMPROC_TENANT_GROUP_OF: tenant"):
        Settings()
