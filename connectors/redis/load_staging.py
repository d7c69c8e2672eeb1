"""A snapshot backfill's first epoch, staged in Redis batch by batch and swapped in with its MCE in one step.

Rows, operator state and key-order members are added under ``*.load`` keys (so no process holds them
all, and readers see none of them) and :meth:`LoadStaging.commit_load` renames them into place with the
MCE and the epoch index in one script: refused when the view has an MCE already, and
:class:`~mvlog.connectors.redis.epoch_commit.ServingStateLostError` when the staged rows are not all
there (Redis was wiped meanwhile): the caller then rolls Redis forward from Kafka instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import redis

from mvlog.changes import IndexEntry
from mvlog.connectors.redis.epoch_commit import ServingStateLostError
from mvlog.connectors.redis.epoch_index import epoch_hex, index_member
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.view_keyspace import ViewKeyspace

# A snapshot backfill's first epoch: rows, operator state and key-order index staged under ``*.load`` keys
# (batch by batch, so no process holds them all) are swapped in with the MCE and the epoch index, in one
# script. Refused (0) when the view has an MCE already; -1 when the staged rows are not all there (Redis
# was wiped or flushed meanwhile): the caller then rolls Redis forward from Kafka instead.
_COMMIT_LOAD_SCRIPT = lua_script("view_commit_load", lib=["swap_staged"])


LOAD_KEYS = ("rows.load", "opstate.load", "keyorder.load")


class LoadStaging(ViewKeyspace):
    """The staged first epoch of a snapshot backfill, per view."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self._commit_load = client.register_script(_COMMIT_LOAD_SCRIPT)

    def clear_load(self, view: str) -> None:
        """Forget what an interrupted load staged."""
        self.redis.delete(*(self._key(view, w) for w in LOAD_KEYS))

    def stage_load(self, view: str, rows: Mapping[bytes, bytes], state: Mapping[bytes, bytes],
                   order: Sequence[bytes]) -> None:
        """Add one batch of the first epoch's rows, operator state and key-order members (invisible to
        readers until :meth:`commit_load`)."""
        rows_key, state_key, order_key = (self._key(view, w) for w in LOAD_KEYS)
        pipe = self.redis.pipeline(transaction=False)
        if rows:
            pipe.hset(rows_key, mapping=dict(rows))  # type: ignore[arg-type]
        if state:
            pipe.hset(state_key, mapping=dict(state))  # type: ignore[arg-type]
        if order:
            pipe.zadd(order_key, dict.fromkeys(order, 0))
        pipe.execute()

    def commit_load(self, view: str, epoch: int, index: Mapping[int, IndexEntry], rows: int,
                    lifecycle: str = "") -> bool:
        """Make the staged rows (``rows`` of them), state and key order the view's, at MCE ``epoch``, in
        one script; False (nothing changed) when the view has an MCE already.

        Raises :class:`ServingStateLostError` when the staged rows are not all there (Redis was wiped)."""
        partitions = sorted(index)
        keys = [self._key(view, w) for w in ("meta", "rows", "opstate", "keyorder")]
        keys += [self._key(view, w) for w in LOAD_KEYS] + [self.index.key(view, p) for p in partitions]
        args: list[bytes | str | int] = [epoch_hex(epoch), epoch, int(time.time() * 1000), lifecycle, rows]
        args += [index_member(epoch, index[p].offset, index[p].records) for p in partitions]
        result = int(self._commit_load(keys=keys, args=args))
        if result < 0:
            raise ServingStateLostError(f"{view}: the {rows} rows staged for epoch {epoch} are no longer all in "
                                        "Redis: it was wiped while the snapshot backfill ran")
        return result == 1
