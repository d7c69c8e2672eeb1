"""The options of a ``format("mvlog")`` read that carry a process's connection settings to the data source.

A Spark session registers the data source with the settings of the process that made it; a reader of
other settings (another topic prefix, another broker, a Redis Cluster) passes them as options, which the
data source lays over the session's. Both directions are here, so the options a reader sets and those the
data source reads cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mvlog.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Option name -> the :class:`~mvlog.config.Settings` field it overrides.
OPTION_FIELDS = {"bootstrapServers": "bootstrap_servers", "redisUrl": "redis_url", "redisCluster": "redis_cluster",
                 "topicPrefix": "topic_prefix"}
#: The option that overrides ``Settings.small_read_records`` (a read of at most this many change events is
#: one Spark task; 0: a task per partition).
SMALL_READ_OPTION = "smallReadRecords"


def connection_options(settings: Settings) -> dict[str, str]:
    """The options that point a read at ``settings``' broker, Redis (``redisCluster``: ``true`` when
    ``redisUrl`` is a Redis Cluster's) and topic prefix."""
    return {"bootstrapServers": settings.bootstrap_servers, "redisUrl": settings.redis_url,
            "redisCluster": "true" if settings.redis_cluster else "false", "topicPrefix": settings.topic_prefix}


def changelog_read(spark: SparkSession, settings: Settings, view: str, after: int | None, upto: int,
                   **options: str) -> DataFrame:
    """The batch read of ``view``'s changelog in ``settings``' stack: its epochs in ``(after, upto]`` (from
    the log's start when ``after`` is None) as the data source's signed rows, not run yet. ``options``:
    more options of the read (:data:`SMALL_READ_OPTION`, say)."""
    reader = spark.read.format("mvlog").options(**connection_options(settings)).option("view", view)
    if after is not None:
        reader = reader.option("startingEpoch", str(after))
    return reader.option("endingEpoch", str(upto)).options(**options).load()


def settings_overrides(options: Mapping[str, str]) -> dict[str, Any]:
    """The settings that the given options override (those not given, or empty, are left alone)."""
    overrides: dict[str, Any] = {OPTION_FIELDS[name]: value for name in OPTION_FIELDS
                                 if (value := options.get(name))}
    if "redis_cluster" in overrides:
        overrides["redis_cluster"] = str(overrides["redis_cluster"]).strip().lower() in ("true", "1", "yes")
    if (small := options.get(SMALL_READ_OPTION)) is not None:
        overrides["small_read_records"] = int_option(small, SMALL_READ_OPTION, minimum=0)
    return overrides


def int_option(value: str, name: str, *, minimum: int) -> int:
    """``value`` of option ``name`` as an integer of at least ``minimum`` (0 or 1); a ValueError naming the
    option otherwise."""
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        kind = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise ValueError(f"option {name} must be {kind}, not {value!r}")
    return number
