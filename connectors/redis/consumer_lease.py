"""Who maintains a view right now, and the requests to stop it: ``<prefix>:{view}:consumer`` and
``<prefix>:{view}:stop`` in Redis.

A ``run-view`` process holds a lease per view it maintains (its holder id, with a TTL it renews every
second or so), so ``drop-view`` can tell a running consumer from none: it asks the holder to stop that
one view (a stop request, with the reason), waits until the lease is released, and only then deletes the
view. A killed process's lease lapses after its TTL; nothing else depends on it (fencing between two
consumers of one view is Kafka's transactional id, not this lease).
"""

from __future__ import annotations

import os
import socket

import redis

from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.redis_keys import view_key

#: How long a lease outlives its last renewal: a few of the supervisor's renewals (every second).
LEASE_TTL_MS = 5_000
STOP_REQUEST_TTL_MS = 300_000  # a request nobody picks up (its holder died) does not outlive the view

_RELEASE = lua_script("consumer_lease_release")


def holder_id() -> str:
    """This process: ``host:pid``, what a refusal shows the operator."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ConsumerLeases:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix

    def _key(self, view: str, what: str) -> str:
        return view_key(self.prefix, view, what)

    def hold(self, view: str, holder: str, ttl_ms: int = LEASE_TTL_MS) -> None:
        """Take or renew the lease of ``view`` (the latest holder wins: a second run-view fences the
        first through Kafka anyway)."""
        self.redis.set(self._key(view, "consumer"), holder, px=ttl_ms)

    def release(self, view: str, holder: str) -> None:
        """Give the lease back if ``holder`` still has it, and forget a stop request it answered."""
        self.redis.eval(_RELEASE, 2, self._key(view, "consumer"), self._key(view, "stop"), holder)

    def holder(self, view: str) -> str | None:
        found = self.redis.get(self._key(view, "consumer"))
        return found.decode() if isinstance(found, bytes) else found

    def request_stop(self, view: str, reason: str) -> None:
        self.redis.set(self._key(view, "stop"), reason, px=STOP_REQUEST_TTL_MS)

    def stop_requested(self, view: str) -> str | None:
        """The reason of a pending stop request for ``view`` (None: none)."""
        found = self.redis.get(self._key(view, "stop"))
        return found.decode() if isinstance(found, bytes) else found
