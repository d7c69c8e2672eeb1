"""Reaching Redis and Kafka from a command, and turning their failures into one clean line.

A command connects through :func:`connect_redis` and :func:`require_kafka`, which answer within a few
seconds and name the setting to fix (``MVLOG_REDIS_URL``, ``MVLOG_BOOTSTRAP_SERVERS``) when the server
does not answer, instead of librdkafka retrying for a minute or a traceback. Failures later in the
command (a server that goes away, a fenced writer) go through :func:`backend_errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
import redis
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from mvlog.config import Settings
from mvlog.connectors.kafka.broker_probe import unreachable_broker
from mvlog.connectors.kafka.changelog_writer import EpochWriteError, WriterFencedError
from mvlog.connectors.kafka.kafka_security import KafkaAccessError, RefusalWatch, cluster_metadata
from mvlog.connectors.kafka.topics import TopicError
from mvlog.connectors.redis import redis_client
from mvlog.snapshot_plan import SnapshotError

CONNECT_TIMEOUT_S = 5.0

_quiet = logging.getLogger("mvlog.commands.kafka-probe")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def redis_address(settings: Settings) -> str:
    """The Redis URL without its password (for messages)."""
    parts = urlsplit(settings.redis_url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redis_unreachable(settings: Settings, error: BaseException) -> click.ClickException:
    return click.ClickException(f"cannot reach Redis at {redis_address(settings)} ({error}); "
                                "is it running? Set MVLOG_REDIS_URL to point mvlog at it.")


def kafka_unreachable(settings: Settings, error: object) -> click.ClickException:
    return click.ClickException(f"cannot reach Kafka at {settings.bootstrap_servers} ({error}); "
                                "is it running? Set MVLOG_BOOTSTRAP_SERVERS to point mvlog at it.")


def connect_redis(settings: Settings, *, wait: bool = False) -> redis.Redis:
    """A Redis client (:func:`mvlog.connectors.redis.redis_client.connect`: it waits through a later Redis
    restart) after a first PING.

    A short command (``wait=False``) pings without waiting: started while Redis is not there, it says so at
    once (a clean ClickException) instead of waiting ``redis_outage_timeout_s``. A long-running process
    (run-view, run-source, cache-worker, lag-sampler) started during a Redis restart waits for it like it
    would later on, and only then gives up with the same message."""
    try:
        if not wait:  # probed first: a Redis Cluster's client talks to it when made, and would wait
            probe = redis_client.connect(settings, outage_timeout_s=0, socket_connect_timeout=CONNECT_TIMEOUT_S)
            try:
                probe.ping()
            finally:
                probe.close()
        client = redis_client.connect(settings)
        if wait:
            client.ping()
    except redis.RedisError as error:
        raise redis_unreachable(settings, error) from error
    return client


def _kafka_detail(error: KafkaException) -> str:
    detail = error.args[0] if error.args else error
    return str(detail.str()) if isinstance(detail, KafkaError) else str(detail)


def require_kafka(settings: Settings, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise a clean ClickException unless a broker answers a metadata request within ``timeout``."""
    if (problem := unreachable_broker(settings.bootstrap_servers, timeout)) is not None:
        raise kafka_unreachable(settings, problem)
    watch = RefusalWatch(settings.bootstrap_servers)
    config: dict[str, Any] = {**settings.kafka_client_config(), "logger": _quiet, "error_cb": watch,
                              "socket.timeout.ms": int(timeout * 1000)}
    admin = AdminClient(config)
    try:
        brokers = cluster_metadata(admin, watch, timeout=timeout).brokers
    except KafkaAccessError as error:  # it answers, but refuses this client: say so, not "is it running?"
        raise click.ClickException(str(error)) from error
    except KafkaException as error:
        raise kafka_unreachable(settings, _kafka_detail(error)) from error
    if not brokers:
        raise kafka_unreachable(settings, "no broker in the metadata")


@contextmanager
def backend_errors(settings: Settings) -> Iterator[None]:
    """Show Redis and Kafka failures that happen while a command runs as one line naming the server."""
    try:
        yield
    except redis.ConnectionError as error:
        raise redis_unreachable(settings, error) from error
    except redis.RedisError as error:
        raise click.ClickException(f"Redis at {redis_address(settings)}: {error}") from error
    except KafkaException as error:
        raise click.ClickException(f"Kafka at {settings.bootstrap_servers}: {_kafka_detail(error)}") from error
    except (TopicError, WriterFencedError, EpochWriteError, SnapshotError) as error:
        raise click.ClickException(str(error)) from error
