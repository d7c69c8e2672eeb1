"""One configuration object for every mvlog process.

Values come, in increasing priority, from the defaults (the local stack on one laptop), a TOML file
(``MVLOG_CONFIG``, default ``./mvlog.toml`` when present) and ``MVLOG_*`` environment variables, so the
same code reaches a real Kafka cluster and Redis by changing settings only.
"""

from __future__ import annotations

import json
import os
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, FieldSerializationInfo, SecretStr, field_serializer, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mvlog.client_log import KAFKA_LOG

DEFAULT_CONFIG_FILE = Path("mvlog.toml")

#: librdkafka settings whose values are secrets: kept as SecretStr, never shown.
_SECRET_WORDS = ("password", "secret", "jaas", "key.pem", "oauthbearer.config", "token")


def is_secret_kafka_setting(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_WORDS)


def redact_url(url: str) -> str:
    """``url`` without its password (``redis://user:***@host``), for messages and displays."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.hostname or ""
    netloc = f"{user}***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class Settings(BaseSettings):
    """Settings shared by the CLI, the writers, the Faust workers and the Spark jobs."""

    model_config = SettingsConfigDict(env_prefix="MVLOG_", extra="ignore", frozen=True)

    bootstrap_servers: str = "127.0.0.1:19092"
    redis_url: str = "redis://127.0.0.1:16379/0"
    # How long a Redis command waits for Redis to answer again (a redis-server restarted from its
    # append-only file, a failover) before it raises: every mvlog process rides out shorter outages
    # (mvlog.connectors.redis.redis_client). 0: raise at once.
    redis_outage_timeout_s: float = Field(default=120.0, ge=0, le=86_400)
    # ``redis_url`` names one master of a Redis Cluster: processes connect with redis-py's cluster client,
    # which finds the other masters and routes each command by its key's slot (every multi-key command and
    # script of mvlog touches one slot: mvlog.connectors.redis.redis_keys). False: a standalone redis-server.
    redis_cluster: bool = False
    # A failed view consumer of `mvlog run-view` is started again, alone, after a growing delay, at most
    # this many times within `view_restart_window_s` (mvlog.restart_budget); then its view is marked failed.
    view_restarts: int = Field(default=5, ge=0, le=1000)
    view_restart_window_s: float = Field(default=600.0, gt=0)
    topic_prefix: str = "mvlog"
    partitions: int = Field(default=4, ge=1, le=256)
    replication_factor: int = Field(default=1, ge=1)
    barrier_interval_ms: int = Field(default=1000, ge=10)
    checkpoint_frequency: int = Field(default=1, ge=1, description="every Nth barrier is a checkpoint")
    session_timeout_ms: int = Field(default=6000, ge=1000)
    transaction_timeout_ms: int = Field(default=60000, ge=1000)
    # Extra librdkafka settings (SASL, TLS, ...), e.g. MVLOG_KAFKA='{"security.protocol": "SASL_SSL"}'.
    # Secret entries of ``kafka`` (sasl.password, ssl.key.password, sasl.jaas.config, ...) are moved to
    # ``kafka_secrets`` when the settings load, so they never show in repr, logs or JSON dumps.
    kafka: dict[str, str] = Field(default_factory=dict)
    kafka_secrets: dict[str, SecretStr] = Field(default_factory=dict)
    kafka_password: SecretStr | None = None
    # Bearer token that HTTP endpoints which change state require (unset: they are refused);
    # see mvlog.services.http_auth. Read-only endpoints need none.
    http_token: SecretStr | None = None
    spark_master: str = "local[2]"
    # Extra Spark settings of mvlog's sessions, over its own defaults, e.g.
    # MVLOG_SPARK_CONF='{"spark.executor.memory": "4g", "spark.sql.shuffle.partitions": "64"}'.
    spark_conf: dict[str, str] = Field(default_factory=dict)
    # The Confluent-compatible Schema Registry of Avro source tables (a table's own overrides it).
    schema_registry_url: str | None = None
    stack_dir: Path = Path(".mvlog")
    bind_host: str = "127.0.0.1"
    # Records above this size are not decoded: they go to the view's dead-letter topic (memory stays bounded).
    max_record_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    dashboard_port: int = 8321
    # Faust log-cache workers: cache bounds (bytes over all upstreams, epochs per upstream), web port,
    # how often a worker renews its entry in Redis (it expires after 5 missed beats), and how long a Spark
    # task waits for a committed epoch the worker has not aligned yet before reading Kafka instead.
    cache_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    cache_max_epochs: int = Field(default=1000, ge=1)
    # The largest epoch (encoded bytes of its changes) a cache worker holds to cache; a larger one is
    # skipped (read from Kafka), since it is held decoded, several times that size, until it commits.
    cache_max_epoch_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    cache_port: int = Field(default=8322, ge=0, le=65535)
    # A view consumer's micro-batch: at most this many upstream epochs and change events (one epoch at
    # least, whatever its size), so catching up after a long stop does not hold the whole lag at once.
    max_epochs_per_trigger: int = Field(default=50, ge=1)
    max_records_per_trigger: int = Field(default=100_000, ge=1)
    # A read of the changelogs (format("mvlog")) of at most this many change events runs as one Spark task
    # over all its partitions instead of one task per partition: a task costs ~50-100 ms to schedule and to
    # open its Kafka consumer, more than it takes to read a few thousand events, and a live view's
    # micro-batch is that small. 0: always one task per partition.
    small_read_records: int = Field(default=10_000, ge=0)
    # Issue 19, opt-in: a filter/project view whose key is its upstream's (same partition count), or a
    # GROUP BY over one upstream (its input shuffled by its groups' partitions, mvlog.views.routing), or an
    # inner equi-join of two views (shuffled by join key, then by view key, mvlog.views.join_routing), runs
    # its operator in Spark's tasks, one per changelog partition, each committing its partition of an epoch
    # in a Kafka transaction of its own (mvlog.services.pipeline.partition_tasks). Off: the driver applies
    # every epoch, as before. Outer, semi and anti joins, self-joins, GROUP BYs over joins, global aggregates,
    # windows, top-N of one view and renamed keys take it too; other views (chains of joins) ignore it
    # (docs/scaling.md).
    operators_in_tasks: bool = False
    # With operators_in_tasks: epochs pending upstream holding fewer change events than this (a live view's
    # usual micro-batch) go the driver's way, for latency (a task path micro-batch pays a producer, a
    # transaction and a staging per partition: ~4 s from upstream commit to view commit against ~0.6 s,
    # bench/views.py --live-in-tasks, docs/scaling.md). 0: every epoch in tasks.
    tasks_min_records: int = Field(default=5000, ge=0)
    # With operators_in_tasks: how many view partitions' transactional writers a Spark Python worker keeps
    # from one task to the next (each saves a producer and its init_transactions, 60-80 ms, per task;
    # mvlog.services.pipeline.kept_writers). 0: a new writer per task.
    task_writers_kept: int = Field(default=8, ge=0)
    cache_heartbeat_ms: int = Field(default=1000, ge=50)
    cache_wait_ms: int = Field(default=2000, ge=0)
    # Lag sampling (dashboard, `mvlog lag-sampler`): every interval, each view's lag is measured and kept
    # in Redis; the status rules judge the last `lag_window` samples; `lag_history` samples are kept.
    lag_sample_interval_ms: int = Field(default=1000, ge=50)
    lag_window: int = Field(default=10, ge=2)
    lag_history: int = Field(default=3600, ge=10)
    # Chunked backfill: first chunk size, its upper bound, and the share of the barrier interval an epoch
    # with a chunk may take (the batch size adapts to keep it there).
    backfill_batch_rows: int = Field(default=1000, ge=1)
    backfill_max_batch_rows: int = Field(default=200_000, ge=1)
    backfill_target_share: float = Field(default=0.8, gt=0, le=4)
    # Snapshots (`mvlog snapshot`): their folder (default: <stack_dir>/snapshots), how many per view are
    # kept, how often they are expected to be taken (Kafka retention must cover it), and the upstream size
    # above which `--backfill auto` backfills from a snapshot rather than in chunks.
    snapshot_dir: Path | None = None
    snapshot_keep: int = Field(default=3, ge=1)
    snapshot_interval_ms: int = Field(default=3_600_000, ge=1)
    snapshot_backfill_min_rows: int = Field(default=100_000, ge=0)
    # Snapshot backfill: rows of the view's first epoch the driver holds at a time while it writes them
    # (I4), and the Kafka transaction timeout of that epoch, which holds the whole view at the snapshot's
    # epoch (Kafka brokers cap it with transaction.max.timeout.ms, 15 min by default).
    snapshot_load_batch_rows: int = Field(default=20_000, ge=1)
    snapshot_load_transaction_timeout_ms: int = Field(default=900_000, ge=1000)

    @model_validator(mode="before")
    @classmethod
    def _secrets_out_of_kafka(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("kafka"), dict):
            kafka = dict(data["kafka"])
            secrets = {k: kafka.pop(k) for k in [k for k in kafka if is_secret_kafka_setting(k)]}
            if secrets:
                data = {**data, "kafka": kafka, "kafka_secrets": {**dict(data.get("kafka_secrets") or {}), **secrets}}
        return data

    @field_serializer("kafka_password", "http_token")
    def _dump_secret(self, value: SecretStr | None, info: FieldSerializationInfo) -> str | None:
        if value is None:
            return None
        return value.get_secret_value() if _reveal(info) else str(value)

    @field_serializer("redis_url")
    def _dump_redis_url(self, value: str, info: FieldSerializationInfo) -> str:
        return value if _reveal(info) else redact_url(value)

    @field_serializer("kafka_secrets")
    def _dump_secrets(self, value: dict[str, SecretStr], info: FieldSerializationInfo) -> dict[str, str]:
        return {k: v.get_secret_value() if _reveal(info) else str(v) for k, v in value.items()}

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (redact_url(value) if name == "redis_url" and isinstance(value, str) else value)

    def to_env(self) -> dict[str, str]:
        """``MVLOG_*`` variables that give a child process exactly these settings (secrets included)."""
        data = json.loads(self.to_executor_json())
        return {f"MVLOG_{name.upper()}": value if isinstance(value, str) else json.dumps(value)
                for name, value in data.items() if value is not None}

    def to_executor_json(self) -> str:
        """The settings with their secrets, for Spark executors (which connect to Kafka themselves);
        ``model_dump_json()`` masks secrets."""
        return self.model_dump_json(context={"reveal_secrets": True})

    @classmethod
    def from_executor_json(cls, text: str) -> Settings:
        """The settings a Spark task was handed (:meth:`to_executor_json`). Parsed once per process: a
        Python worker runs many tasks of one job, each parse costs about 2 ms, and settings are frozen, so
        the tasks can share one object."""
        return _parsed_settings(text)

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_a_topic_name(cls, value: str) -> str:
        if not value or any(not (c.isalnum() or c in "._-") for c in value):
            raise ValueError(f"topic_prefix {value!r} may only hold letters, digits, '.', '_' and '-'")
        return value

    @property
    def snapshot_root(self) -> Path:
        """Where snapshots are written: ``snapshot_dir``, else the local stack's data folder."""
        return self.snapshot_dir if self.snapshot_dir is not None else self.stack_dir / "snapshots"

    def changelog_topic(self, view: str) -> str:
        return f"{self.topic_prefix}.{view}.changelog"

    @property
    def catalog_topic(self) -> str:
        return f"{self.topic_prefix}.catalog"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic_prefix}.dead-letter"

    def dead_letter_topic_of(self, view: str) -> str:
        """Where a reader of ``view``'s changelog puts the records it cannot use (with headers saying why)."""
        return f"{self.topic_prefix}.{view}.dlq"

    def kafka_client_config(self) -> dict[str, Any]:
        """librdkafka settings common to producers, consumers and admin clients (their log goes to
        :data:`~mvlog.client_log.KAFKA_LOG`: one line per state change, not one per reconnect)."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers, "logger": KAFKA_LOG}
        config.update(self.kafka)
        config.update({k: v.get_secret_value() for k, v in self.kafka_secrets.items()})
        if self.kafka_password is not None:
            config["sasl.password"] = self.kafka_password.get_secret_value()
        return config


def _reveal(info: FieldSerializationInfo) -> bool:
    return isinstance(info.context, dict) and bool(info.context.get("reveal_secrets"))


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build settings from the TOML file, the environment and explicit overrides (highest first)."""
    path = config_file or Path(os.environ.get("MVLOG_CONFIG", DEFAULT_CONFIG_FILE))
    file_values: dict[str, Any] = {}
    if path.is_file():
        with path.open("rb") as handle:
            file_values = tomllib.load(handle).get("mvlog", {})
    elif "MVLOG_CONFIG" in os.environ:
        raise FileNotFoundError(f"MVLOG_CONFIG points to {path}, which does not exist")
    env_values = Settings().model_dump(exclude_unset=True, context={"reveal_secrets": True})
    return Settings(**{**file_values, **env_values, **overrides})


@lru_cache(maxsize=16)
def _parsed_settings(text: str) -> Settings:
    return Settings.model_validate_json(text)


@lru_cache(maxsize=1)
def default_settings() -> Settings:
    return load_settings()
