"""One configuration object for every mvlog process.

Values come, in increasing priority, from the defaults (the local stack on one laptop), a TOML file
(``MVLOG_CONFIG``, default ``./mvlog.toml`` when present) and ``MVLOG_*`` environment variables, so the
same code reaches a real Kafka cluster and Redis by changing settings only.
"""

from __future__ import annotations

import os
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_CONFIG_FILE = Path("mvlog.toml")


class Settings(BaseSettings):
    """Settings shared by the CLI, the writers, the Faust workers and the Spark jobs."""

    model_config = SettingsConfigDict(env_prefix="MVLOG_", extra="ignore", frozen=True)

    bootstrap_servers: str = "127.0.0.1:19092"
    redis_url: str = "redis://127.0.0.1:16379/0"
    topic_prefix: str = "mvlog"
    partitions: int = Field(default=4, ge=1, le=256)
    replication_factor: int = Field(default=1, ge=1)
    barrier_interval_ms: int = Field(default=1000, ge=10)
    checkpoint_frequency: int = Field(default=1, ge=1, description="every Nth barrier is a checkpoint")
    session_timeout_ms: int = Field(default=6000, ge=1000)
    transaction_timeout_ms: int = Field(default=60000, ge=1000)
    # Extra librdkafka settings (SASL, TLS, ...), e.g. MVLOG_KAFKA='{"security.protocol": "SASL_SSL"}'.
    kafka: dict[str, str] = Field(default_factory=dict)
    kafka_password: SecretStr | None = None
    spark_master: str = "local[2]"
    stack_dir: Path = Path(".mvlog")
    bind_host: str = "127.0.0.1"
    # Records above this size are not decoded: they go to the view's dead-letter topic (memory stays bounded).
    max_record_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    dashboard_port: int = 8321

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_a_topic_name(cls, value: str) -> str:
        if not value or any(not (c.isalnum() or c in "._-") for c in value):
            raise ValueError(f"topic_prefix {value!r} may only hold letters, digits, '.', '_' and '-'")
        return value

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
        """librdkafka settings common to producers, consumers and admin clients."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        config.update(self.kafka)
        if self.kafka_password is not None:
            config["sasl.password"] = self.kafka_password.get_secret_value()
        return config


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build settings from the TOML file, the environment and explicit overrides (highest first)."""
    path = config_file or Path(os.environ.get("MVLOG_CONFIG", DEFAULT_CONFIG_FILE))
    file_values: dict[str, Any] = {}
    if path.is_file():
        with path.open("rb") as handle:
            file_values = tomllib.load(handle).get("mvlog", {})
    elif "MVLOG_CONFIG" in os.environ:
        raise FileNotFoundError(f"MVLOG_CONFIG points to {path}, which does not exist")
    env_values = Settings().model_dump(exclude_unset=True)
    return Settings(**{**file_values, **env_values, **overrides})


@lru_cache(maxsize=1)
def default_settings() -> Settings:
    return load_settings()
