"""The one typed settings object: every ``STREAMPROC_*`` environment variable is read here and nowhere else.

:class:`Settings` keeps the variables' flat names; a module is handed only the small frozen value it needs
(as httpx takes a ``Timeout`` and ``Limits``): :attr:`Settings.llm_endpoint`, :attr:`Settings.guards`,
:attr:`Settings.durability`, :attr:`Settings.faust`, :attr:`Settings.input_limits`, :attr:`Settings.local_stack`,
the :meth:`Settings.topology` and the :meth:`Settings.retry_policy`. The Kafka connection is the one value not
made here: ``app.bootstrap.resolve_connection`` builds it, since it also reads files and finds the local broker.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamproc.core.replication import ReplicationRequest
from streamproc.core.retention import outcomes_retention_ms, parse_retention_ms
from streamproc.core.retry_policy import RetryPolicy
from streamproc.core.tenancy import tenant_problem
from streamproc.core.tenant_groups import pinning_problem
from streamproc.core.topology import DEFAULT_PREFIX, Topology, default_app_id, parse_tiers

DEFAULT_KAFKA_VERSION = "3.9.2"

LLMHttp = Literal["aiohttp", "httpcore"]
RecordFormat = Literal["avro", "json"]


ModelRoute = Literal["call", "provider-batch"]
BatchApi = Literal["openai", "anthropic"]


class SettingsValue(BaseModel):
    """A small part of the settings, made by :class:`Settings` (which validated every field already); each is
    built on first use (defer_build), so a command pays only for the parts it reads."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class LLMEndpoint(SettingsValue):
    """Where the LLM calls go and how they get there."""

    base_url: str | None
    api_key: SecretStr | None
    api_key_file: Path | None
    allow_insecure: bool  # a key may cross a network in clear text
    http: LLMHttp  # what carries the calls
    connect_timeout_s: float
    read_timeout_s: float  # the ceiling of each model's adaptive read timeout
    max_response_bytes: int


class RateLimitSettings(SettingsValue):
    """The per-model limits a worker paces its calls to (None: learned from the provider's headers)."""

    rpm: float | None
    tpm: float | None
    share: float  # this worker's fixed share of them (1 when it follows the fleet, which sets its share at run time)
    follows_fleet: bool  # the share is derived from the fleet's beats at run time (design §5.8), not fixed


class ProviderBatchSettings(SettingsValue):
    """The provider-batch route (design §8, issue 31): which models go by a provider's batch API instead of one call
    each, whose API it is, how their requests are gathered and how an open batch is polled."""

    routed_models: frozenset[str]
    api: BatchApi  # whose batch API answers them: the provider behind STREAMPROC_LLM_BASE_URL
    max_requests: int  # members of one provider batch (each holds a record slot while its batch is open)
    max_age_ms: int  # how long the first request of a gather waits for others
    first_poll_s: float
    max_poll_s: float


class InFlightSettings(SettingsValue):
    """The adaptive in-flight limit: it starts low and grows per round trip until latency says the server
    queues (a one-slot server must not meet hundreds of calls at once)."""

    floor: int
    ceiling: int
    start: int
    long_threshold_tokens: int  # a call estimated larger is long (0: no pool for long requests)
    long_share: float  # of a deployment's in-flight limit, what long calls may hold while short ones are about


class BreakerSettings(SettingsValue):
    """Each model's circuit breaker."""

    failure_rate: float  # transport/5xx failures, as a fraction of the calls in the window, that open it
    window_s: float
    min_calls: int  # calls in the window before the rate counts
    open_s: float  # how long it stays open before a half-open probe
    hold_s: float  # how long a call may wait (in memory) for an open breaker before it is parked


class TenantPauseSettings(SettingsValue):
    """When one tenant's calls of a model that fail alike pause that tenant there (core.guards.tenant_pauses)."""

    after: int  # calls of the tenant in a row that failed alike
    probe_s: float  # one probe call per interval while paused


class RetryBudgetSettings(SettingsValue):
    """Retries a batch may spend: ``ratio`` of its first attempts, and ``minimum`` whatever its size."""

    ratio: float
    minimum: int


class RouteSettings(SettingsValue):
    """Where a call goes instead of its model: a larger context, or another model while its breaker is open."""

    context_windows: dict[str, int]
    context_fallbacks: dict[str, str]
    model_fallbacks: dict[str, list[str]]


class GuardSettings(SettingsValue):
    """What protects the provider and the budget (design §5.5)."""

    rate: RateLimitSettings
    in_flight: InFlightSettings
    breaker: BreakerSettings | None  # None: no breakers
    tenant_pause: TenantPauseSettings | None  # None: no tenant is paused
    retry_budget: RetryBudgetSettings
    routes: RouteSettings
    hedge_ratio: float  # at most this share of calls is sent a second time when slower than its model's p99


class Durability(SettingsValue):
    """How every topic streamproc creates is replicated and every producer writes (design §3 "Durability")."""

    replication: ReplicationRequest
    idempotence: bool

    def producer_options(self) -> dict[str, str | bool]:
        """Acknowledged only once on all in-sync replicas (the guarantees of design §5.1 rest on it, so it is
        not a setting), and written once however often a send is retried."""
        return {"acks": "all", "enable_idempotence": self.idempotence}


class FaustSettings(SettingsValue):
    """How a faust app of streamproc runs, besides its connection and topics."""

    data_dir: Path  # its RocksDB tables live under data_dir/faust/<app id>
    session_timeout_s: float
    standby_replicas: int
    durability: Durability
    bulk_restore: bool = True  # a table restore reads its changelog in bulk (app/bulk_restore.py), not via faust


class InputLimits(SettingsValue):
    """What a line of an input file may hold."""

    max_body_bytes: int
    default_model: str  # the model of simple-form lines without one


class LocalStackSettings(SettingsValue):
    """The built-in broker (or local cluster) and where its files live."""

    data_dir: Path
    cache_dir: Path
    kafka_version: str
    kafka_port: int
    kafka_controller_port: int
    kafka_heap_mb: int
    kafka_node_heap_mb: int

    @property
    def kafka_dir(self) -> Path:
        """State of the built-in broker: config, log dirs, pid file."""
        return self.data_dir / "kafka"

    @property
    def kafka_jars_dir(self) -> Path:
        return self.cache_dir / f"kafka-{self.kafka_version}" / "libs"


class RegistryAccess(SettingsValue):
    """Where a schema registry's Confluent API is, its HTTP basic auth, and the CA(s) an https one is checked
    against (None: the system's trust store)."""

    url: str
    username: str | None
    password: SecretStr | None
    ca_file: Path | None = None


class Settings(BaseSettings):
    """Configuration of streamproc, from ``STREAMPROC_<FIELD>`` environment variables (or keyword arguments)."""

    # an empty variable counts as unset (docker compose passes `${STREAMPROC_X:-}` as an empty string)
    model_config = SettingsConfigDict(env_prefix="STREAMPROC_", frozen=True, extra="forbid", env_ignore_empty=True)

    kafka_bootstrap: str | None = Field(
        default=None,
        description="host:port[,host:port] of a Kafka cluster; unset means the built-in local broker.",
    )
    llm_base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1."
    )
    llm_api_key: SecretStr | None = Field(default=None, description="Bearer key sent to the LLM endpoint.")
    models_file: Path | None = Field(
        default=None, description="A LiteLLM model_list YAML file: the deployments of each model (api_base, "
        "api_key, rpm, tpm, timeout, weight), load-balanced, a sick one taken out; unset: STREAMPROC_LLM_BASE_URL "
        "serves every model.")
    topic_prefix: str = Field(default=DEFAULT_PREFIX, pattern=r"^[A-Za-z0-9._-]+$",
                              description="The deployment's namespace: its topics, and its app id when that is unset.")
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
    local_kafka_node_heap_mb: int = Field(default=320, ge=256, description="Heap of each node of a local cluster "
                                          "(`broker start --nodes 3`: three JVMs share the machine).")
    replication_factor: int = Field(default=0, ge=0, description="Replicas of every topic streamproc creates; "
                                    "0: min(3, brokers in the cluster), read from the cluster at creation.")
    min_insync_replicas: int = Field(default=0, ge=0, description="min.insync.replicas of every topic streamproc "
                                     "creates (writes use acks=all); 0: 2 with 3 or more replicas, else 1.")
    kafka_idempotence: bool = Field(default=True, description="Idempotent producers (a retried send is written "
                                    "once); off only for a cluster whose ACLs refuse IdempotentWrite.")

    # -- how clients prove who they are to Kafka (design §6 "Connecting"): Kafka's own names, as environment
    kafka_client_properties: Path | None = Field(
        default=None, description="A Java client properties file (as kafka-console-consumer --consumer.config "
        "reads: security.protocol, sasl.*, ssl.* with PEM files); the variables below override its values.")
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = Field(
        default=None, description="PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL.")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_sasl_password_file: Path | None = Field(default=None, description="A file holding the SASL password.")
    kafka_ssl_cafile: Path | None = Field(default=None, description="PEM file of the CA(s) that signed the brokers' "
                                          "certificates; unset: the system's trust store.")
    kafka_ssl_certfile: Path | None = Field(default=None, description="PEM client certificate (mTLS); may hold the "
                                            "key too.")
    kafka_ssl_keyfile: Path | None = None
    kafka_ssl_key_password: SecretStr | None = None
    kafka_ssl_check_hostname: bool | None = Field(default=None, description="Check the broker's certificate names "
                                                  "its host (default: yes).")
    kafka_oauth_token_file: Path | None = Field(default=None, description="OAUTHBEARER: a file holding the token, "
                                                "re-read before it expires.")
    kafka_oauth_token_endpoint_url: str | None = Field(default=None, description="OAUTHBEARER: an OIDC token "
                                                       "endpoint (client credentials grant).")
    kafka_oauth_client_id: str | None = None
    kafka_oauth_client_secret: SecretStr | None = None
    kafka_oauth_scope: str | None = None
    kafka_oauth_token_provider: str | None = Field(default=None, description="OAUTHBEARER: package.module:factory "
                                                   "returning an aiokafka AbstractTokenProvider (a cloud signer).")

    kafka_session_timeout_s: float = Field(
        default=10.0, ge=6.0, le=300.0,
        description="How long the group waits for a silent worker before handing its partitions over.",
    )
    standby_replicas: int = Field(
        default=1, ge=0, description="Warm copies of each state-table partition that other workers keep (faust's "
        "table_standby_replicas): a worker taking over a partition it kept a copy of skips most of the changelog "
        "recovery, but each copy costs its worker CPU for every request handled elsewhere; more than the other "
        "workers there are counts as all of them (a copy on every other worker); 0: none.")
    bulk_restore: bool = Field(
        default=True, description="Restore the state table from its changelog in bulk (large fetches, a RocksDB "
        "write batch per fetch), about ten times faust's record-by-record restore; false: faust's own restore.")

    app_id: str = Field(default=default_app_id(DEFAULT_PREFIX), pattern=r"^[A-Za-z0-9._-]+$",
                        description="Consumer group and state-table namespace of the workers; unset or empty: "
                        "derived from the topic prefix (<prefix>.streamproc; streamproc for the prefix llm).")
    partitions: int = Field(default=8, ge=1, description="Partition count of every request-carrying topic.")
    in_flight: int = Field(default=256, ge=1, description="LLM calls one worker keeps in flight.")
    retry_tiers: str = Field(
        default="5s,30s,2m,10m", pattern=r"^\d+(ms|s|m)(,\d+(ms|s|m))*$",
        description="Delays of the retry tier topics, shortest first.",
    )
    llm_timeout_s: float = Field(default=60.0, gt=0, description="Read timeout of one LLM call.")
    llm_hedge_ratio: float = Field(
        default=0.03, ge=0, le=1, description="Hedged calls, at most this share of calls: a call slower than its "
        "model's p99 is sent once more and the first answer wins (a hang costs the p99, not the timeout); 0: off.")
    retry_base_delay_s: float = Field(
        default=1.0, ge=0, description="Base of the retry backoff: the n-th retry waits the server's hint plus "
        "uniform(0, base x 2^(n-1)) seconds (full jitter; OpenAI's client starts at 0.5 s).")
    reconcile_interval_s: float = Field(
        default=30.0, ge=0, description="How often a worker looks for stranded requests (its record handled, its "
        "state still waiting) and sends their record again; 0 turns the reconciler off.")
    reconcile_grace_s: float = Field(
        default=60.0, ge=0, description="How long a state must have been unchanged before it counts as stranded.")
    state_write_buffer_mb: float = Field(
        default=1.0, gt=0, description="RocksDB write buffer (memtable) of each request_state partition, two at "
        "most: the table's memory is bounded by these and the block cache, not by its entries (faust's defaults, "
        "3 x 64 MB, held a million finished states in memory).")
    state_block_cache_mb: float = Field(
        default=1.0, gt=0, description="RocksDB block cache of each request_state partition (faust's default: 2 GB; "
        "the reconciler's full sweep fills it, and the worker reads mostly keys that are not there yet).")
    retain_finished: str | None = Field(
        default=None, description="Forget a finished batch (its request states, as streamproc forget does) this "
        "long after its last request ended, e.g. 30d or 12h; the results and failure topics created while it is "
        "set keep their records 7 days longer. Unset: batches are forgotten only by streamproc forget.")
    stall_after_s: float = Field(
        default=120.0, gt=0, description="How long no request of a batch may end, while some have not, before "
        "status and run say the batch is not moving, how many of its requests wait and why.")
    llm_connect_timeout_s: float = Field(default=5.0, gt=0)
    llm_http: LLMHttp = Field(
        default="aiohttp", description="What carries the LLM calls: aiohttp's client (a quarter of the CPU per "
        "call) or httpx on httpcore.")
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop", description="The worker's event loop: uvloop (less CPU per request) or asyncio's own.")
    default_model: str = Field(default="mock-small", description="Model of simple-form input lines without one.")
    max_body_bytes: int = Field(default=1_048_576, ge=1024, description="Largest request body submit accepts.")
    record_format: RecordFormat = Field(
        default="avro", description="How the worker writes the results and failure topics: Avro single-object "
        "encoding, or one JSON object a record (schemas/*.schema.json); every reader reads both.")
    schema_registry_url: str | None = Field(
        default=None, pattern=r"^https?://", description="Base URL of a schema registry's Confluent API: the "
        "worker checks and registers its Avro schemas under <topic>-value at start.")
    schema_registry_username: str | None = Field(default=None, description="HTTP basic auth user of the registry.")
    schema_registry_password: SecretStr | None = Field(default=None, description="Its password (never printed).")
    upgrade_from: str | None = Field(
        default=None, pattern=r"^\d+\.\d+\.\d+$", description="During a rolling upgrade, the release the "
        "workers are upgraded from (e.g. 0.1.0): every record is written with that release's schemas, so its "
        "workers still read them; unset once none is left.")
    schema_registry_ca_file: Path | None = Field(
        default=None, description="PEM file of the CA(s) that signed an https registry's certificate, in place of "
        "the system's trust store (a registry's CA is often not the brokers': STREAMPROC_KAFKA_SSL_CAFILE is unused).")
    # -- guards (design §5): protect the provider and the budget --------------------------------------------
    llm_rpm: float = Field(default=0, ge=0, description="Requests/min per model this account may send; 0 = learn "
                           "it from the provider's x-ratelimit-limit-requests header.")
    llm_tpm: float = Field(default=0, ge=0, description="Tokens/min (prompt + max_tokens) per model; 0 = learn it "
                           "from x-ratelimit-limit-tokens.")
    llm_limit_share: float | None = Field(
        default=None, gt=0, le=1, description="This worker's fixed share of the rate limits; unset: derived from "
        "the fleet's demand and re-derived as workers come and go (design §5.8).")
    adaptive_min_in_flight: int = Field(default=1, ge=1, description="Floor of the adaptive in-flight limit "
                                        "(latency gradient); STREAMPROC_IN_FLIGHT is its ceiling.")
    adaptive_initial_in_flight: int = Field(default=16, ge=1, description="Where the adaptive in-flight limit "
                                            "starts; it doubles per round trip while latency does not rise.")
    long_request_tokens: int = Field(default=2000, ge=0, description="A request whose estimated size (prompt "
                                     "characters / 4 + max_tokens) is over this is long: long calls hold at most "
                                     "STREAMPROC_LONG_REQUEST_SHARE of the in-flight slots while short ones are "
                                     "about, and are timed apart; 0 = no pool.")
    long_request_share: float = Field(default=0.25, gt=0, le=1, description="The share of a deployment's in-flight "
                                      "limit long requests may hold while short ones are in flight or waiting "
                                      "(at least one slot).")
    breaker_enabled: bool = Field(default=True, description="Circuit breaker per model (off only to measure it).")
    breaker_failure_rate: float = Field(default=0.5, gt=0, le=1, description="Transport/5xx failure fraction "
                                        "that opens a model's breaker.")
    breaker_window_s: float = Field(default=10.0, gt=0, description="Window the failure rate is measured over.")
    breaker_min_calls: int = Field(default=10, ge=1, description="Calls in the window before the rate counts.")
    breaker_open_s: float = Field(default=5.0, gt=0, description="How long an open breaker waits before a "
                                  "half-open probe.")
    breaker_hold_s: float = Field(default=10.0, ge=0, description="How long a call waits in memory for an open "
                                  "breaker (holding its slot) before it is parked in a retry tier.")
    tenant_pause_after: int = Field(default=5, ge=0, description="A tenant whose calls of a model failed alike this "
                                    "many times in a row while other tenants' calls of it were answered is paused "
                                    "on that model (its requests wait); 0 = never.")
    tenant_pause_probe_s: float = Field(default=30.0, gt=0, description="While a tenant is paused, one of its calls "
                                        "per this many seconds probes whether it was fixed.")
    retry_budget_ratio: float = Field(default=0.2, ge=0, description="Retries allowed per batch, as a fraction "
                                      "of its first attempts; beyond it failures end retry_budget_exhausted.")
    retry_budget_min: int = Field(default=10, ge=0, description="Retries every batch may spend whatever its size.")
    model_fallbacks: dict[str, list[str]] = Field(
        default_factory=dict, description='JSON: models to use while a model\'s breaker is open, in order, '
        'e.g. {"gpt-4o": ["gpt-4o-mini"]}.')
    context_fallbacks: dict[str, str] = Field(
        default_factory=dict, description='JSON: the larger-context model for inputs over a model\'s window, '
        'e.g. {"mock-small": "mock-large"}.')
    tenants_file: Path | None = Field(
        default=None, description='A JSON or TOML (.toml) file of tenant -> weight, or tenant -> {"weight", "rpm", '
        '"tpm", "max_cost_usd_per_day"}, e.g. {"team-a": 3, "team-b": {"rpm": 600}}: a worker shares its records in '
        'hand and its call slots among the tenants with work by these weights (a tenant not named weighs 1); a '
        'tenant at its quota waits; the tenants named are the metric labels. Unset: all equal, no quota.')
    tenant_groups: int = Field(
        default=1, ge=1, le=64, description="Each priority's requests topic split in this many (<prefix>.requests"
        "[.<priority>][.g<k>]), a tenant's requests all on one (hashed, or STREAMPROC_TENANT_GROUP_OF): a tenant in "
        "another group is never read behind a flood. Set it on every worker before on submit; never lower it while "
        "requests wait on the last group's topics.")
    tenant_group_of: dict[str, int] = Field(
        default_factory=dict, description='JSON: tenants pinned to a group, e.g. {"team-a": 1, "team-b": 2}; the '
        "others are hashed into STREAMPROC_TENANT_GROUPS, the default tenant is in group 0.")
    tenant_read_ahead: int = Field(
        default=512, ge=1, description="Records of new requests a worker holds waiting in memory for their "
        "tenant's turn, shared by the tenants' weights; a tenant's records past its part are parked on the backlog "
        "topic (at most half of the stream buffer).")
    metrics_tenants: list[str] = Field(
        default_factory=list, description='JSON: the tenants the worker\'s metrics name, e.g. ["team-a", "team-b"]; '
        'any other is "other". Empty: those of STREAMPROC_TENANTS_FILE, else the first 20 tenants a worker sees.')
    context_windows: dict[str, int] = Field(
        default_factory=dict, description='JSON: context window (tokens) per model, for the pre-check, '
        'e.g. {"mock-small": 4096}; a model not listed is not pre-checked.')
    model_prices: dict[str, tuple[NonNegativeFloat, NonNegativeFloat]] = Field(
        default_factory=dict, description='JSON: US dollars per million input and output tokens per model, e.g. '
        '{"gpt-4o-mini": [0.15, 0.6]}, for the metrics\' estimated cost and the spend caps; a model not listed '
        'has none (a cap counts its tokens only).')
    max_cost_usd_per_day: NonNegativeFloat | None = Field(
        default=None, description="US dollars the deployment's workers may spend per UTC day, at the prices of "
        "STREAMPROC_MODEL_PRICES; at the cap no new call starts and requests wait (budget_exhausted). Unset: no "
        "cap.")
    model_routes: dict[str, ModelRoute] = Field(
        default_factory=dict, description='JSON: how each model\'s requests are sent, e.g. {"gpt-4o-mini": '
        '"provider-batch"}: "provider-batch" gathers them into provider batches (STREAMPROC_PROVIDER_BATCH_API; half '
        'the price, answers within 24 h), "call" (any model not listed) calls once per request.')
    provider_batch_api: BatchApi = Field(
        default="openai", description='Whose batch API the provider-batch route uses at STREAMPROC_LLM_BASE_URL: '
        '"openai" (Files and Batches) or "anthropic" (Message Batches; a request the Messages API cannot carry fails '
        'as a business failure, provider_batch_not_convertible).')
    provider_batch_max_requests: int = Field(
        default=1000, ge=1, le=50_000, description="Requests in one provider batch at most (each holds its record "
        "unacked, and a place of the worker's hand, until its batch ends).")
    provider_batch_max_age_s: NonNegativeFloat = Field(
        default=60.0, description="How long the first request of a provider batch waits for others before it is sent.")
    provider_batch_poll_s: float = Field(
        default=5.0, gt=0, description="First wait between polls of an open provider batch (doubling while nothing "
        "changes, up to 300 s).")
    worker_metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus /metrics port; 0 = off.")
    worker_metrics_host: str = Field(default="127.0.0.1", min_length=1,
                                     description="Address /metrics listens on (0.0.0.0 in a container).")
    llm_api_key_file: Path | None = Field(default=None, description="A file holding the LLM key (instead of "
                                          "STREAMPROC_LLM_API_KEY, never both).")
    llm_allow_insecure: bool = Field(default=False, description="Send the key over plain http:// to a host that "
                                     "is not loopback (refused at worker start otherwise).")
    llm_max_response_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="Largest answer the worker "
                                        "reads, decoded (a gzip bomb stops here); past it: response_too_large.")

    @model_validator(mode="before")
    @classmethod
    def _app_id_from_prefix(cls, values: Any) -> Any:
        """An app id that is not set lives in the topic prefix's namespace (design §3)."""
        if isinstance(values, dict) and not values.get("app_id"):
            prefix = values.get("topic_prefix") or DEFAULT_PREFIX
            return {**values, "app_id": default_app_id(prefix) if isinstance(prefix, str) else None}
        return values

    @field_validator("metrics_tenants")
    @classmethod
    def _tenant_names(cls, value: list[str]) -> list[str]:
        for tenant in value:
            if (problem := tenant_problem(tenant)) is not None:
                raise ValueError(f"tenant {problem}")
        return value

    @model_validator(mode="after")
    def _tenant_pins(self) -> Settings:
        for tenant in self.tenant_group_of:
            if (problem := tenant_problem(tenant)) is not None:
                raise ValueError(f"STREAMPROC_TENANT_GROUP_OF: tenant {problem}")
        if (problem := pinning_problem(self.tenant_groups, self.tenant_group_of)) is not None:
            raise ValueError(f"STREAMPROC_TENANT_GROUP_OF: {problem}")
        return self

    @field_validator("retain_finished")
    @classmethod
    def _retention(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not parse_retention_ms(value):
            raise ValueError(f"{value!r} is not a retention such as 30d, 12h or 90m")
        return value

    @property
    def retain_finished_ms(self) -> int | None:
        """STREAMPROC_RETAIN_FINISHED in ms; None: off."""
        return None if self.retain_finished is None else parse_retention_ms(self.retain_finished)

    @property
    def llm_endpoint(self) -> LLMEndpoint:
        return LLMEndpoint(base_url=self.llm_base_url, api_key=self.llm_api_key, api_key_file=self.llm_api_key_file,
                           allow_insecure=self.llm_allow_insecure, http=self.llm_http,
                           connect_timeout_s=self.llm_connect_timeout_s, read_timeout_s=self.llm_timeout_s,
                           max_response_bytes=self.llm_max_response_bytes)

    @property
    def guards(self) -> GuardSettings:
        ceiling = self.in_flight
        floor = min(self.adaptive_min_in_flight, ceiling)
        return GuardSettings(
            rate=RateLimitSettings(rpm=self.llm_rpm or None, tpm=self.llm_tpm or None,
                                   share=self.llm_limit_share or 1.0, follows_fleet=self.llm_limit_share is None),
            in_flight=InFlightSettings(floor=floor, ceiling=ceiling,
                                       start=max(floor, min(self.adaptive_initial_in_flight, ceiling)),
                                       long_threshold_tokens=self.long_request_tokens,
                                       long_share=self.long_request_share),
            breaker=BreakerSettings(failure_rate=self.breaker_failure_rate, window_s=self.breaker_window_s,
                                    min_calls=self.breaker_min_calls, open_s=self.breaker_open_s,
                                    hold_s=self.breaker_hold_s) if self.breaker_enabled else None,
            # off in a rolling upgrade: a worker of an earlier release does not know a record parked as
            # tenant_paused for a parked attempt, and would not take it up
            tenant_pause=TenantPauseSettings(after=self.tenant_pause_after, probe_s=self.tenant_pause_probe_s)
            if self.tenant_pause_after and self.upgrade_from is None else None,
            retry_budget=RetryBudgetSettings(ratio=self.retry_budget_ratio, minimum=self.retry_budget_min),
            routes=RouteSettings(context_windows=self.context_windows, context_fallbacks=self.context_fallbacks,
                                 model_fallbacks=self.model_fallbacks),
            hedge_ratio=self.llm_hedge_ratio,
        )

    @property
    def provider_batches(self) -> ProviderBatchSettings:
        return ProviderBatchSettings(
            routed_models=frozenset(m for m, route in self.model_routes.items() if route == "provider-batch"),
            api=self.provider_batch_api, max_requests=self.provider_batch_max_requests,
            max_age_ms=round(self.provider_batch_max_age_s * 1000),
            first_poll_s=self.provider_batch_poll_s, max_poll_s=max(self.provider_batch_poll_s, 300.0))

    @property
    def durability(self) -> Durability:
        """The replication is settled against the cluster's size when the topics are created."""
        return Durability(replication=ReplicationRequest(self.replication_factor, self.min_insync_replicas),
                          idempotence=self.kafka_idempotence)

    @property
    def faust(self) -> FaustSettings:
        return FaustSettings(data_dir=self.data_dir, session_timeout_s=self.kafka_session_timeout_s,
                             standby_replicas=self.standby_replicas, durability=self.durability,
                             bulk_restore=self.bulk_restore)

    @property
    def input_limits(self) -> InputLimits:
        return InputLimits(max_body_bytes=self.max_body_bytes, default_model=self.default_model)

    @property
    def schema_registry(self) -> RegistryAccess | None:
        """The schema registry, when one is configured."""
        if self.schema_registry_url is None:
            return None
        return RegistryAccess(url=self.schema_registry_url, username=self.schema_registry_username,
                              password=self.schema_registry_password, ca_file=self.schema_registry_ca_file)

    @property
    def local_stack(self) -> LocalStackSettings:
        return LocalStackSettings(
            data_dir=self.data_dir, cache_dir=self.cache_dir, kafka_version=self.local_kafka_version,
            kafka_port=self.local_kafka_port, kafka_controller_port=self.local_kafka_controller_port,
            kafka_heap_mb=self.local_kafka_heap_mb, kafka_node_heap_mb=self.local_kafka_node_heap_mb)

    def topology(self) -> Topology:
        """Every topic name and size, derived from these settings in one place."""
        return Topology(self.topic_prefix, self.partitions, parse_tiers(self.retry_tiers), self.app_id,
                        outcomes_retention_ms(self.retain_finished_ms), by_priority=self.upgrade_from is None,
                        tenant_groups=self.tenant_groups, pinned_groups=MappingProxyType(dict(self.tenant_group_of)))

    def retry_policy(self) -> RetryPolicy:
        """The retry policy the workers apply: the tiers and the backoff base."""
        return RetryPolicy(tiers=self.topology().tiers, base_delay_ms=round(self.retry_base_delay_s * 1000))
