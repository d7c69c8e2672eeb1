"""A view's max committed epoch (MCE) and lifecycle: the ``meta`` hash every reader and writer checks.

``<prefix>:{view}:meta`` holds ``mce`` (and ``mce_hex``, the form the commit scripts compare),
``mce_ts_ms``, the lifecycle ``state`` with its ``reason``, and ``rederive`` while a rebuild's operator state
is left for the view's consumer to re-derive. The MCE moves only with an epoch's commit
(:mod:`~mvlog.connectors.redis.epoch_commit`, :mod:`~mvlog.connectors.redis.load_staging`); the lifecycle
also by itself (:meth:`ViewMeta.set_lifecycle`) or with an epoch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import StrEnum
from typing import cast

from mvlog.connectors.redis.view_keyspace import ViewKeyspace


class Lifecycle(StrEnum):
    CREATING = "creating"
    BACKFILLING = "backfilling"
    REPLAYING = "replaying"
    LIVE = "live"
    PAUSED = "paused"
    FAILED = "failed"


class ViewMeta(ViewKeyspace):
    """The MCE and lifecycle of views (read, and the lifecycle set outside an epoch)."""

    def mce(self, view: str) -> int | None:
        value = self.redis.hget(self._key(view, "meta"), "mce")
        return int(value) if value is not None else None

    def holds(self, view: str, epoch: int) -> bool:
        """After a commit of ``epoch`` was refused: True when the MCE is exactly ``epoch``, which then counts
        as applied. The client retries a command whose reply a Redis restart lost, and the retry of an
        applied commit is refused (at the MCE); a commit is retried only by the writer that owns the epoch
        (its Kafka transaction committed it), so the MCE at that epoch is this commit's. An MCE above it
        is another writer's: still a refusal."""
        return self.mce(view) == epoch

    def mce_and_rederive(self, view: str) -> tuple[int | None, bool]:
        """The MCE, and whether a rebuild left the view's operator state for its consumer to re-derive
        (:meth:`mark_rederive`), in one round trip: what a view's writer checks before each epoch."""
        mce, rederive = self.redis.hmget(self._key(view, "meta"), ["mce", "rederive"])
        return (int(mce) if mce is not None else None), rederive is not None

    def mark_rederive(self, view: str) -> None:
        """A rebuild after a Redis wipe restored the view's rows and MCE and left its operator state for
        the view's consumer to re-derive in Spark's tasks (:mod:`mvlog.services.rederive.state_rebuild`)."""
        self.redis.hset(self._key(view, "meta"), "rederive", 1)

    def clear_rederive(self, view: str) -> None:
        self.redis.hdel(self._key(view, "meta"), "rederive")

    def mce_many(self, views: Sequence[str]) -> dict[str, int | None]:
        pipe = self.redis.pipeline(transaction=False)
        for view in views:
            pipe.hget(self._key(view, "meta"), "mce")
        return {v: (int(m) if m is not None else None) for v, m in zip(views, pipe.execute(), strict=True)}

    def set_lifecycle(self, view: str, state: Lifecycle, reason: str = "") -> None:
        self.redis.hset(self._key(view, "meta"), mapping={"state": state.value, "reason": reason,
                                                          "state_ts_ms": int(time.time() * 1000)})

    def lifecycle(self, view: str) -> Lifecycle | None:
        value = cast(bytes | None, self.redis.hget(self._key(view, "meta"), "state"))
        return Lifecycle(value.decode()) if value is not None else None

    def meta(self, view: str) -> dict[str, str]:
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self._key(view, "meta")))
        return {k.decode(): v.decode() for k, v in raw.items()}
