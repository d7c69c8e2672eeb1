"""One way every mvlog process connects to Redis: a client that waits through a Redis restart.

redis-py's default policy retries a failed command three times within a second, so a redis-server
SIGKILLed and restarted from its append-only file (back within seconds) took down every running view
consumer, table writer, cache worker and lag sampler with a stack trace. A client made by :func:`connect`
retries connection errors, timeouts and ``LOADING`` replies (a server still reading its AOF) with
redis-py's own :class:`~redis.retry.Retry` and exponential backoff, for up to
``Settings.redis_outage_timeout_s`` per command, then raises the last error as before.

A retried command may have been applied before its reply was lost. Plain writes mvlog repeats are
idempotent (HSET of the same values, a lease renewal); an epoch commit is refused at or below the MCE by
its script, and its callers count a refused commit whose epoch *is* the MCE as applied
(:meth:`mvlog.connectors.redis.view_store.ViewStore.holds`). Lua scripts come back by themselves: redis-py's
``Script`` and :func:`mvlog.connectors.redis.packed_script.run_script` load a script again on ``NOSCRIPT``
(a restarted server has an empty script cache).

An outage is logged once per process and server, not per retry: a warning when the first command
fails ("Redis at 127.0.0.1:6379 unreachable: waiting up to 120 s") and one when a command succeeds
again ("Redis at 127.0.0.1:6379 back after 4.2 s").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    RedisClusterException,
    SlotNotCoveredError,
    TimeoutError,
)
from redis.retry import Retry

from mvlog.config import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Backoff between attempts: 0.1 s doubling up to 2 s, so a server back within seconds is found at once
#: and a long outage costs one attempt every 2 s.
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0
#: A connect that gets no answer (an unreachable host, not a refused port) fails after this, then retries.
CONNECT_TIMEOUT_S = 5.0
#: A connection idle this long is PINGed before its next command, so a connection to a server that
#: restarted meanwhile is replaced before use, not found broken by the command.
HEALTH_CHECK_INTERVAL_S = 30
RETRIED_ERRORS: tuple[type[Exception], ...] = (ConnectionError, TimeoutError, BusyLoadingError)


class Outage:
    """Whether a Redis server is away, as seen by the commands of one process (shared by its clients).

    Pure state (times are given by the caller): :meth:`failed` is true for the first failure of an
    outage, :meth:`recovered` gives the outage's length once, at the first success after it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.since: float | None = None
        self._lock = threading.Lock()

    def failed(self, now: float) -> bool:
        with self._lock:
            if self.since is not None:
                return False
            self.since = now
            return True

    def recovered(self, now: float) -> float | None:
        if self.since is None:  # the common case, without the lock
            return None
        with self._lock:
            since, self.since = self.since, None
        return None if since is None else now - since

    def __deepcopy__(self, memo: dict[int, Any]) -> Outage:
        return self  # redis-py copies its Retry for each connection: they all share the process's view


_outages: dict[str, Outage] = {}
_outages_lock = threading.Lock()


def outage_of(address: str) -> Outage:
    """The process's :class:`Outage` of the server at ``address`` (one per server, so one log line)."""
    with _outages_lock:
        return _outages.setdefault(address, Outage(address))


class BoundedRetry(Retry):
    """redis-py's Retry with exponential backoff, bounded by time rather than by a count of attempts, that
    logs an outage's start and end. Each command (each ``call_with_retry``) retries until ``bound_s``
    seconds have passed since it began; a connect nested in a command shares the command's bound."""

    def __init__(self, outage: Outage, bound_s: float) -> None:
        super().__init__(ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), retries=-1,
                         supported_errors=RETRIED_ERRORS)
        self.outage = outage
        self.bound_s = bound_s

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        started = time.monotonic()

        def failed(error: Exception, failures: int) -> None:
            if with_failure_count:
                fail(error, failures)  # redis-py's own handler (closes the connection) runs first
            else:
                fail(error)
            if self.bound_s <= 0:  # a probe: no waiting, nothing to say
                raise error
            now = time.monotonic()
            if self.outage.failed(now):
                log.warning("Redis at %s unreachable (%s): waiting up to %.0f s", self.outage.address,
                            error, self.bound_s)
            if now - started >= self.bound_s:
                log.error("Redis at %s still unreachable after %.0f s: giving up (%s)", self.outage.address,
                          now - started, error)
                raise error

        result = super().call_with_retry(do, failed, is_retryable, with_failure_count=True)
        if (down_s := self.outage.recovered(time.monotonic())) is not None:
            log.warning("Redis at %s back after %.1f s", self.outage.address, down_s)
        return result


def server_address(url: str) -> str:
    """``host:port`` of a Redis URL (no user or password), for messages."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def connect(settings: Settings, *, outage_timeout_s: float | None = None, **options: Any) -> redis.Redis:
    """A client of ``settings.redis_url`` whose commands wait through an outage of up to
    ``outage_timeout_s`` (default: ``settings.redis_outage_timeout_s``; 0 fails at once, for probes).
    ``options`` go to :meth:`redis.Redis.from_url` (socket timeouts, ...).

    With ``settings.redis_cluster`` the client is a :class:`ClusterClient` (a
    :class:`redis.cluster.RedisCluster`) started from that URL: it speaks the same commands for the
    keys mvlog uses, each routed to its slot's master, so it is typed as the standalone client here."""
    bound = settings.redis_outage_timeout_s if outage_timeout_s is None else outage_timeout_s
    options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_S)
    outage = outage_of(server_address(settings.redis_url))
    if settings.redis_cluster:
        def start() -> ClusterClient:
            return _unreachable_as_connection_error(lambda: ClusterClient.from_url(
                settings.redis_url, outage=outage, bound_s=bound, health_check_interval=HEALTH_CHECK_INTERVAL_S,
                **options))

        # Unlike a standalone client, a cluster client talks to the cluster when it is made (CLUSTER
        # SLOTS, COMMAND): made during an outage, it waits for it as its commands would.
        return cast(redis.Redis, BoundedRetry(outage, bound).call_with_retry(start, lambda _error: None))
    return redis.Redis.from_url(settings.redis_url, retry=BoundedRetry(outage, bound),
                                retry_on_error=list(RETRIED_ERRORS), health_check_interval=HEALTH_CHECK_INTERVAL_S,
                                **options)


_task_clients: dict[tuple[str, bool, float], redis.Redis] = {}
_task_clients_lock = threading.Lock()


def task_client(settings: Settings) -> redis.Redis:
    """The process's client of ``settings``' Redis for code in Spark's tasks: made on first use, then
    shared by every task the process runs. Callers never close it.

    A Python worker runs task after task (``spark.python.worker.reuse``), and a client made per task
    connected anew each time: redis-py's connect, its handshake and its client-info lookup
    (``importlib.metadata``), about 2 ms of CPU and a round trip, where a shared client's commands cost
    0.3 ms (a live epoch's read makes two: which log-cache worker holds the partition, and the read's
    count). A client is safe to share across threads and across a fork (redis-py drops a forked parent's
    connections), and its connections are checked when idle (``HEALTH_CHECK_INTERVAL_S``) and replaced
    after an outage by its retry."""
    key = (settings.redis_url, settings.redis_cluster, settings.redis_outage_timeout_s)
    with _task_clients_lock:
        client = _task_clients.get(key)
        if client is None:
            client = _task_clients[key] = connect(settings)
        return client


def _unreachable_as_connection_error(do: Callable[[], T]) -> T:
    """``do()``, with redis-py's "Redis Cluster cannot be connected" (no master answered while it reloaded
    the slot map: a :class:`~redis.exceptions.RedisClusterException` caused by a connection error) raised as
    the :class:`~redis.exceptions.ConnectionError` it is, which the bounded retry waits through and callers
    catch as Redis being away."""
    try:
        return do()
    except RedisClusterException as error:
        if isinstance(error.__cause__, CLUSTER_RETRIED_ERRORS):
            raise redis.ConnectionError(str(error)) from error
        raise


#: Errors after which a cluster client tries a command again: the standalone ones, and those of a cluster
#: whose master is away or whose slots are being reassigned.
CLUSTER_RETRIED_ERRORS: tuple[type[Exception], ...] = (*RETRIED_ERRORS, ClusterDownError, SlotNotCoveredError)
#: Attempts redis-py's cluster client makes itself before an error reaches :class:`ClusterClient`'s bound
#: (each reloads the slot map from a master that answers): few, back to back.
CLUSTER_INNER_ATTEMPTS = 2


class ClusterClient(RedisCluster):
    """redis-py's cluster client with the standalone client's outage policy, as far as redis-py allows.

    redis-py's cluster client takes its ``retry`` only as a count of attempts, made back to back with a
    reload of the slot map between them, without backoff; and a ``Retry`` of no bound (-1 attempts) makes
    it run a command zero times. So each command (``execute_command``: every single-key command, script
    and multi-slot command the client splits) runs inside a :class:`BoundedRetry`, as a standalone
    command does: exponential backoff, bounded by time, an outage logged once. Pipelines are not:
    redis-py's cluster pipeline makes its own attempts (:data:`CLUSTER_INNER_ATTEMPTS`, back to back) and
    empties its command stack when it fails, so it cannot be run again from outside; a pipeline that meets
    a master's restart raises (a Spark task staging its partition is then retried by Spark; a standalone
    client's pipeline would have waited). Wrapping it needs the stack kept across attempts: not done."""

    def __init__(self, *args: Any, outage: Outage | None = None, bound_s: float = 0.0, **kwargs: Any) -> None:
        kwargs.setdefault("retry", Retry(NoBackoff(), retries=CLUSTER_INNER_ATTEMPTS))
        # Set first: the parent's __init__ runs commands (COMMAND, to learn every command's keys).
        self.bounded = BoundedRetry(outage or outage_of("cluster"), bound_s)
        self.bounded.update_supported_errors(list(CLUSTER_RETRIED_ERRORS))
        super().__init__(*args, **kwargs)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> ClusterClient:
        return cls(url=url, **kwargs)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        run: Callable[..., Any] = super().execute_command
        return self.bounded.call_with_retry(lambda: _unreachable_as_connection_error(lambda: run(*args, **kwargs)),
                                            lambda _error: None)


def is_cluster(client: object) -> bool:
    """Whether ``client`` talks to a Redis Cluster (a :class:`redis.cluster.RedisCluster`)."""
    return isinstance(client, RedisCluster)


def node_pool(client: redis.Redis, key: str) -> redis.ConnectionPool:
    """The connection pool of the server that holds ``key``: the client's own, or on a cluster that of
    the master serving ``key``'s slot (for a caller that drives a connection itself, such as a WATCH/MULTI
    transaction on one view's keys)."""
    if not is_cluster(client):
        return client.connection_pool
    node_of: Callable[[str], Any] = cast(RedisCluster, client).get_node_from_key
    node = node_of(key)
    server = node.redis_connection if node is not None else None
    if server is None:
        raise redis.ConnectionError(f"no master of the cluster serves the slot of {key!r}")
    return cast(redis.ConnectionPool, server.connection_pool)
