"""Whether a table's writer runs or stopped, and the epoch readers sealed a stopped table through:
``<prefix>:{table}:writer``, a hash of ``state`` (``open`` / ``stopped``), ``token`` (the open writer's)
and ``sealed``.

A join plans only through epochs that none of its upstreams can still commit (:mod:`mvlog.join_bound`).
A running writer commits only above its latest epoch; a writer that stopped cleanly commits nothing more,
so a join's consumer may plan past that table's last epoch once it has *sealed* the table through its
bound: the next writer to open takes the seal with its opening (one ``MULTI``) and starts its epoch clock
above it. Both the seal and the opening are atomic, so either the seal comes first (the writer starts
above it) or the opening does (the seal is refused: the table is no longer stopped).

Conservative by construction: only a writer that said ``stopped`` can be sealed. A killed writer leaves
``open`` (joins then wait for its restart, as they would for its epochs); a wiped Redis leaves no state at
all, which reads as *not stopped*, so nothing is ever sealed on a guess. A writer that opens after a wipe
has lost nothing it needs: no reader sealed a table without this key.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import redis

from mvlog.catalog import CatalogEntry
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.join_bound import UpstreamProgress, plan_bound

_CLOSE = lua_script("table_writer_close")
_SEAL = lua_script("table_writer_seal")


class TableWriters:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self._close = client.register_script(_CLOSE)
        self._seal = client.register_script(_SEAL)

    def _key(self, table: str) -> str:
        return view_key(self.prefix, table, "writer")

    def open(self, table: str) -> tuple[str, int]:
        """Say a writer of ``table`` runs: returns its token (for :meth:`close`) and the epoch the table is
        sealed through (0: none), above which the writer's epochs must start."""
        token = uuid.uuid4().hex
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self._key(table), mapping={"state": "open", "token": token})
        pipe.hget(self._key(table), "sealed")
        _, sealed = pipe.execute()
        return token, int(sealed) if sealed is not None else 0

    def close(self, table: str, token: str) -> bool:
        """Say the writer ``token`` of ``table`` stopped and commits nothing more (only if it is still the
        open one: a writer fenced by a newer one says nothing)."""
        return bool(self._close(keys=[self._key(table)], args=[token]))

    def seal(self, table: str, through: int) -> bool:
        """Promise readers that ``table`` commits no epoch at or below ``through``: only while its writer
        is stopped (False: a writer opened, or its state is unknown)."""
        return bool(self._seal(keys=[self._key(table)], args=[str(through)]))

    def stopped(self, tables: Sequence[str]) -> set[str]:
        """Those of ``tables`` whose writer stopped cleanly and none opened since."""
        pipe = self.redis.pipeline(transaction=False)
        for table in tables:
            pipe.hget(self._key(table), "state")
        return {t for t, state in zip(tables, pipe.execute(), strict=True) if state in (b"stopped", "stopped")}

    def forget(self, table: str) -> None:
        """Delete ``table``'s writer state (the table is dropped)."""
        self.redis.delete(self._key(table))

    def sealed(self, table: str) -> int:
        """The epoch ``table`` is sealed through (0: never sealed)."""
        found = self.redis.hget(self._key(table), "sealed")
        return int(found) if found is not None else 0


_SEAL_ATTEMPTS = 3  # a writer opening between the look and the seal makes the planner look again


def plan_through(index: EpochIndex, writers: TableWriters, upstreams: Sequence[CatalogEntry], *,
                 seal: bool = True) -> int:
    """The last epoch a view over ``upstreams`` may plan through now (:func:`mvlog.join_bound.plan_bound`),
    having sealed the stopped tables behind it (``seal=False``: only say where it would be, for a
    reader that plans nothing). One upstream: its latest epoch, as before joins had a bound."""
    def latest(entry: CatalogEntry) -> int:
        found = index.latest(entry.name, 0)
        return found.epoch if found is not None else 0

    if len(upstreams) == 1:
        return latest(upstreams[0])
    for _ in range(_SEAL_ATTEMPTS):
        stopped = writers.stopped([u.name for u in upstreams if u.kind == "table"])
        bound = plan_bound([UpstreamProgress(u.name, latest(u), u.name in stopped) for u in upstreams])
        if not seal or all(writers.seal(name, bound.epoch) for name in bound.seal):
            return bound.epoch
    return min(latest(u) for u in upstreams)  # writers keep opening and closing: the bound of running ones
