"""A view epoch's rows staged per partition by Spark tasks, and swapped in by the driver in one script.

When a view's operator runs in Spark's tasks (one per changelog partition), each task writes its
partition's changes to Kafka itself and stages the rows they leave, and the operator state its groups
leave (a GROUP BY view's; none for a filter), in Redis under keys of that epoch and partition
(:meth:`PartitionStaging.stage`). The driver then commits the epoch: one script checks
the MCE it follows and that every partition's staging is whole (the counts the tasks reported), applies
all of them to the view's rows, operator state and key order, and writes the epoch index and the MCE
(:meth:`PartitionStaging.commit`): the view's rows and MCE still change together, once per epoch.

Staging is redone by every attempt of a task (a retried task, or one of a restarted consumer, stages
again what its partition's epoch holds), so staged keys lost to a Redis restart or left by a dead
driver never matter: they expire (:data:`STAGE_TTL_S`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import redis

from mvlog.connectors.redis.chunked_writes import hset_chunked, sadd_chunked
from mvlog.connectors.redis.epoch_commit import JOURNAL_LIMIT, EpochCommit, ServingStateLostError
from mvlog.connectors.redis.epoch_index import IndexEntry, epoch_hex, index_member
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.packed_script import run_script
from mvlog.connectors.redis.view_meta import ViewMeta

STAGE_TTL_S = 3600

_COMMIT_SCRIPT = lua_script("partition_commit", lib=["refuse_epoch", "apply_staged"],
                            constants={"JOURNAL_LIMIT": JOURNAL_LIMIT})

#: The staging scope of a view's staged replacement (:class:`PartitionStaging`'s ``scope``): its tasks'
#: partitions are staged beside the view's own, under the replacement's keys.
REPLACEMENT_SCOPE = "replacement:"


class StagingIncompleteError(RuntimeError):
    """A partition's staged rows are not what its task reported (expired, or Redis restarted): nothing
    was applied; the epoch's tasks stage them again when the consumer redoes the epoch."""


@dataclass(frozen=True)
class StagedCounts:
    """What one task staged for one epoch and partition (the commit checks Redis holds exactly that)."""

    puts: int
    deletes: int
    order_puts: int
    order_deletes: int
    state_puts: int = 0
    state_deletes: int = 0

    def as_list(self) -> list[int]:
        """In the order of :meth:`PartitionStaging.staged_keys` (and the commit script's counts)."""
        return [self.puts, self.deletes, self.order_puts, self.order_deletes, self.state_puts, self.state_deletes]


@dataclass(frozen=True)
class BackfillCommit:
    """What a chunked backfill commits with an epoch of the task path: its hash's fields (positions,
    counters), journal lines, the view's lifecycle ('' keeps it), and keys to drop (its chunk record)."""

    fields: Mapping[str, bytes | str | int] = field(default_factory=dict)
    journal: Sequence[str] = ()
    lifecycle: str = ""
    drop: Sequence[str] = ()


class PartitionStaging(ViewMeta):
    """Staged partitions of views' epochs, and their commit. ``scope``: ``""``, the views' own staging;
    :data:`REPLACEMENT_SCOPE`, their staged replacements' (committed by
    :meth:`~mvlog.connectors.redis.replacement_store.ReplacementStore.commit_partitions`)."""

    def __init__(self, client: redis.Redis, prefix: str, scope: str = "") -> None:
        super().__init__(client, prefix)
        self.scope = scope
        self._commit = client.register_script(_COMMIT_SCRIPT)

    def staged_keys(self, view: str, epoch: int, partition: int) -> list[str]:
        base = f"{self.scope}pstage:{epoch_hex(epoch)}:{partition}"
        return [self._key(view, f"{base}:{what}") for what in ("rows", "dels", "oput", "odel", "sput", "sdel")]

    def stage(self, view: str, partition: int, commit: EpochCommit, *, rows: bool = True,
              state: bool = True, fresh: bool = True, beside: bool = False) -> StagedCounts:
        """Executor side: stage one partition's rows, key-order members and operator state of
        ``commit.epoch`` (replacing an earlier attempt's); the rest of ``commit`` is the driver's.
        ``rows`` / ``state`` False: leave that part's keys alone (a join stages its rows and its state in
        two tasks, :mod:`mvlog.services.pipeline.join_tasks`); its counts are then 0. ``fresh`` False:
        add to what this attempt staged already (a snapshot's epoch, staged batch after batch after one
        fresh empty stage; each batch's keys are new), the counts being this call's. ``beside``: the state is
        added to what another task staged for the partition (an aggregate over a join stages its groups'
        state beside the join-key task's buckets: other keys), not replacing it; its counts are this call's."""
        keys = self.staged_keys(view, commit.epoch, partition)
        empty: dict[bytes, bytes] = {}
        puts, deletes = (commit.row_puts, commit.row_deletes) if rows else (empty, ())
        order_puts, order_deletes = (commit.order_puts, commit.order_deletes) if rows else ((), ())
        state_puts, state_deletes = (commit.state_puts or {}, commit.state_deletes) if state else (empty, ())
        mine = [key for i, key in enumerate(keys) if (rows if i < 4 else state)]
        pipe = self.redis.pipeline(transaction=False)
        replaced = [key for i, key in enumerate(keys) if (rows if i < 4 else state and not beside)]
        for key in replaced if fresh else ():  # one DEL each: redis-py's cluster pipeline refuses a multi-key DEL
            pipe.delete(key)
        hset_chunked(pipe, keys[0], puts)
        hset_chunked(pipe, keys[4], state_puts)
        for key, members in zip((keys[1], keys[2], keys[3], keys[5]),
                                (deletes, order_puts, order_deletes, state_deletes), strict=True):
            sadd_chunked(pipe, key, members)
        for key in mine:
            pipe.expire(key, STAGE_TTL_S)
        pipe.execute()
        return StagedCounts(len(puts), len(deletes), len(order_puts), len(order_deletes), len(state_puts),
                            len(state_deletes))

    def clear(self, view: str, epoch: int, partition: int) -> None:
        """Drop what an earlier attempt staged for ``epoch`` and ``partition`` (before staging it in parts)."""
        pipe = self.redis.pipeline(transaction=False)
        for key in self.staged_keys(view, epoch, partition):  # one DEL each (see stage)
            pipe.delete(key)
        pipe.execute()

    def commit(self, view: str, epoch: int, follows: int, staged: Mapping[int, StagedCounts],
               index: Mapping[int, IndexEntry], backfill: BackfillCommit | None = None) -> bool:
        """Driver side: apply every partition's staging of ``epoch``, its index and the MCE (and
        ``backfill``'s fields), in one script. False (nothing changed) when Redis is at or above the epoch; raises
        :class:`ServingStateLostError` when Redis is not at ``follows``, :class:`StagingIncompleteError`
        when a partition's staging is not whole."""
        partitions = sorted(index)
        if sorted(staged) != partitions:
            raise ValueError(f"{view}: epoch {epoch} staged partitions {sorted(staged)}, indexed {partitions}")
        keys = [self._key(view, w) for w in ("meta", "rows", "keyorder", "opstate")]
        args: list[bytes | str | int] = [epoch_hex(epoch), epoch, int(time.time() * 1000),
                                         epoch_hex(follows) if follows > 0 else "none", len(partitions)]
        for p in partitions:
            keys += self.staged_keys(view, epoch, p)
            args += staged[p].as_list()
        keys += [self.index.key(view, p) for p in partitions]
        args += [index_member(epoch, index[p].offset, index[p].records) for p in partitions]
        backfill = backfill or BackfillCommit()
        keys += [self._key(view, "backfill"), self._key(view, "journal"), *backfill.drop]
        args += [len(backfill.fields), len(backfill.journal), backfill.lifecycle]
        for name, value in backfill.fields.items():
            args += [name, value]
        args += backfill.journal
        result = int(run_script(self.redis, self._commit, keys, args))
        if result == -1:
            raise ServingStateLostError(f"{view}: epoch {epoch} follows epoch {follows}, but Redis holds MCE "
                                        f"{self.mce(view)}: the serving state was wiped or rolled back")
        if result == -2:
            raise StagingIncompleteError(f"{view}: epoch {epoch}: a partition's staged rows are missing in Redis")
        return result == 1
