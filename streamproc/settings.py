"""The one typed settings object: every ``STREAMPROC_*`` environment variable is read here and nowhere else."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_KAFKA_VERSION = "3.9.2"


class Settings(BaseSettings):
    """Configuration of streamproc, from ``STREAMPROC_<FIELD>`` environment variables (or keyword arguments)."""

    model_config = SettingsConfigDict(env_prefix="STREAMPROC_", frozen=True, extra="forbid")

    kafka_bootstrap: str | None = Field(
        default=None,
        description="host:port[,host:port] of a Kafka cluster; unset means the built-in local broker.",
    )
    llm_base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1."
    )
    llm_api_key: SecretStr | None = Field(default=None, description="Bearer key sent to the LLM endpoint.")
    topic_prefix: str = Field(default="llm", pattern=r"^[A-Za-z0-9._-]+$")
    data_dir: Path = Field(
        default=Path.home() / ".local" / "share" / "streamproc",
        description="Where RocksDB tables and the local broker's data live.",
    )
    cache_dir: Path = Field(
        default=Path.home() / ".cache" / "streamproc",
        description="Where the local broker's jars are cached (outside the work tree).",
    )
    local_kafka_version: str = Field(default=DEFAULT_KAFKA_VERSION, pattern=r"^\d+\.\d+\.\d+$")
    local_kafka_port: int = Field(
        default=9092, ge=0, le=65535, description="Client port of the local broker; 0 picks a free one."
    )
    local_kafka_controller_port: int = Field(default=9093, ge=0, le=65535)
    local_kafka_heap_mb: int = Field(default=512, ge=256)

    kafka_session_timeout_s: float = Field(
        default=30.0, ge=6.0, le=300.0,
        description="How long the group waits for a silent worker before handing its partitions over.",
    )

    app_id: str = Field(default="streamproc", pattern=r"^[A-Za-z0-9._-]+$",
                        description="Consumer group and state-table namespace of the workers.")
    partitions: int = Field(default=8, ge=1, description="Partition count of every request-carrying topic.")
    in_flight: int = Field(default=256, ge=1, description="LLM calls one worker keeps in flight.")
    retry_tiers: str = Field(
        default="5s,30s,2m,10m", pattern=r"^\d+(ms|s|m)(,\d+(ms|s|m))*$",
        description="Delays of the retry tier topics, shortest first.",
    )
    llm_timeout_s: float = Field(default=60.0, gt=0, description="Read timeout of one LLM call.")
    llm_connect_timeout_s: float = Field(default=5.0, gt=0)
    default_model: str = Field(default="mock-small", description="Model of simple-form input lines without one.")
    max_body_bytes: int = Field(default=1_048_576, ge=1024, description="Largest request body submit accepts.")
    worker_metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus /metrics port; 0 = off.")
    worker_metrics_host: str = Field(default="127.0.0.1", min_length=1,
                                     description="Address /metrics listens on (0.0.0.0 in a container).")

    @property
    def local_kafka_dir(self) -> Path:
        """State of the built-in broker: config, log dirs, pid file."""
        return self.data_dir / "kafka"

    @property
    def kafka_jars_dir(self) -> Path:
        return self.cache_dir / f"kafka-{self.local_kafka_version}" / "libs"
