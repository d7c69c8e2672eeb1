"""An epoch's commit to a view's serving state: rows, operator state, key order, backfill progress, epoch
index and MCE, together, in one Lua script.

The script also refuses an epoch at or below the MCE: applying an epoch twice is impossible, whoever
retries it; and, given the MCE the epoch follows, it refuses a Redis that was wiped or rolled back
(:class:`ServingStateLostError`) instead of overwriting it. An epoch of many rows may instead be queued
while Kafka is written (:meth:`EpochCommits.stream_commit`, :mod:`~mvlog.connectors.redis.streamed_commit`);
a view rebuilt from its changelog is swapped in whole (:meth:`EpochCommits.replace_state`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from mvlog.changes import Change
from mvlog.connectors.kafka.changelog_writer import EncodedBatch
from mvlog.connectors.redis.chunked_writes import CHUNK, hset_chunked, zadd_chunked
from mvlog.connectors.redis.epoch_index import IndexEntry, epoch_hex, index_member
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.packed_script import run_script
from mvlog.connectors.redis.view_meta import ViewMeta
from mvlog.key_order import order_member, order_members
from mvlog.row_schema import Key
from mvlog.schemas.codec import encode_key, encode_row
from mvlog.vnode import vnode_of

if TYPE_CHECKING:
    from mvlog.connectors.redis.streamed_commit import StreamedCommit

JOURNAL_LIMIT = 100_000  # committed backfill chunks kept per view (the I5 audit trail, newest last)

_COMMIT_SCRIPT = lua_script("view_commit", lib=["each_chunk", "refuse_epoch"],
                            constants={"JOURNAL_LIMIT": JOURNAL_LIMIT})
# A view rebuilt for the MCE in ARGV[1], staged under KEYS[5..7], replaces KEYS[2..4] if the MCE is still it.
_REPLACE_SCRIPT = lua_script("view_replace", lib=["swap_staged"])


@dataclass(frozen=True)
class EpochCommit:
    """What one epoch changes in a view's serving state."""

    epoch: int
    row_puts: Mapping[bytes, bytes]
    row_deletes: Sequence[bytes]
    index: Mapping[int, IndexEntry]  # partition -> barrier entry of this epoch
    state_puts: Mapping[bytes, bytes] | None = None
    state_deletes: Sequence[bytes] = ()
    # Key-order index (see mvlog.key_order): members of rows put and of rows deleted.
    order_puts: Sequence[bytes] = ()
    order_deletes: Sequence[bytes] = ()
    # Backfill: fields of the view's backfill hash (positions, counters) and journal entries, committed
    # with the epoch so a resumed backfill starts from exactly what the view's rows reflect.
    backfill: Mapping[str, bytes | str | int] = field(default_factory=dict)
    journal: Sequence[str] = ()
    lifecycle: str = ""  # set the view's lifecycle state with the epoch ('' keeps it)
    # The MCE this epoch must follow (0: none yet); None skips the check. A writer that knows its last
    # committed epoch passes it, so a wiped (or rolled back) Redis is detected instead of overwritten.
    follows: int | None = None


class ServingStateLostError(RuntimeError):
    """Redis no longer holds the MCE an epoch follows: it was wiped (or rolled back); rebuild from Kafka."""


class EpochCommits(ViewMeta):
    """Commits of epochs to views' serving state (and the MCE they move, :class:`ViewMeta`)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self._commit = client.register_script(_COMMIT_SCRIPT)
        self._replace = client.register_script(_REPLACE_SCRIPT)

    def commit(self, view: str, commit: EpochCommit) -> bool:
        """Apply one epoch atomically; False (and nothing changed) when it is at or below the MCE.

        Raises :class:`ServingStateLostError` (nothing changed) when ``commit.follows`` is not the MCE."""
        state_puts = commit.state_puts or {}
        row_kv: list[bytes] = []
        for field_, value in commit.row_puts.items():
            row_kv += (field_, value)
        return self._apply(view, commit.epoch, row_kv, commit.row_deletes, commit.order_puts, commit.order_deletes,
                           commit.index, commit.follows, state_puts=state_puts, state_deletes=commit.state_deletes,
                           backfill=commit.backfill, journal=commit.journal, lifecycle=commit.lifecycle)

    def commit_rows(self, view: str, epoch: int, row_kv: Sequence[bytes], row_deletes: Sequence[bytes],
                    order_puts: Sequence[bytes], order_deletes: Sequence[bytes], index: Mapping[int, IndexEntry],
                    follows: int | None = None) -> bool:
        """:meth:`commit` of rows given flat (``row_kv``: key, row, key, row, ...), as a writer that encodes
        them builds them (no mapping to flatten again)."""
        return self._apply(view, epoch, row_kv, row_deletes, order_puts, order_deletes, index, follows)

    def _apply(self, view: str, epoch: int, row_kv: Sequence[bytes], row_deletes: Sequence[bytes],
               order_puts: Sequence[bytes], order_deletes: Sequence[bytes], index: Mapping[int, IndexEntry],
               follows: int | None, *, state_puts: Mapping[bytes, bytes] | None = None,
               state_deletes: Sequence[bytes] = (), backfill: Mapping[str, bytes | str | int] | None = None,
               journal: Sequence[str] = (), lifecycle: str = "") -> bool:
        state_puts = state_puts or {}
        backfill = backfill or {}
        partitions = sorted(index)
        keys = [self._key(view, w) for w in ("meta", "rows", "opstate", "keyorder", "backfill", "journal")]
        keys += [self.index.key(view, p) for p in partitions]
        args: list[bytes | str | int] = [
            epoch_hex(epoch), epoch, int(time.time() * 1000),
            len(row_kv) // 2, len(row_deletes), len(state_puts), len(state_deletes),
            len(order_puts), len(order_deletes), len(backfill), len(journal),
            lifecycle,
            "" if follows is None else (epoch_hex(follows) if follows > 0 else "none"),
        ]
        args += row_kv
        args += row_deletes
        for field_, value in state_puts.items():
            args += [field_, value]
        args += state_deletes
        args += order_puts
        args += order_deletes
        for name, setting in backfill.items():
            args += [name, setting]
        args += journal
        args += [index_member(epoch, index[p].offset, index[p].records) for p in partitions]
        result = int(run_script(self.redis, self._commit, keys, args))
        if result < 0:
            raise ServingStateLostError(f"{view}: epoch {epoch} follows epoch {follows}, but Redis "
                                        f"holds MCE {self.mce(view)}: the serving state was wiped or rolled back")
        return result == 1

    def stream_commit(self, view: str, epoch: int, follows: int) -> StreamedCommit:
        """An epoch commit of rows and key order whose commands are sent as they are encoded (see
        :mod:`mvlog.connectors.redis.streamed_commit`)."""
        from mvlog.connectors.redis.streamed_commit import StreamedCommit

        return StreamedCommit(self, view, epoch, follows)

    def replace_state(self, view: str, expected_mce: int, rows: Mapping[bytes, bytes],
                      state: Mapping[bytes, bytes], order: Sequence[bytes] = (), chunk: int = CHUNK) -> bool:
        """Replace the view's rows, operator state and key-order index (``order``: the members of
        ``rows``) with ones rebuilt for epoch ``expected_mce``.

        They are staged under temporary keys and swapped in by one script that checks the MCE is still
        ``expected_mce``; False (and nothing changed) when it moved (a consumer committed meanwhile).
        """
        self.clear_rebuild(view)
        self.stage_rebuild(view, rows, state, order, chunk)
        return self.swap_rebuild(view, expected_mce)

    def _rebuild_keys(self, view: str) -> list[str]:
        return [self._key(view, w) for w in ("rows.rebuild", "opstate.rebuild", "keyorder.rebuild")]

    def clear_rebuild(self, view: str) -> None:
        """Drop what an earlier rebuild left staged (before one starts staging)."""
        self.redis.delete(*self._rebuild_keys(view))

    def stage_rebuild(self, view: str, rows: Mapping[bytes, bytes], state: Mapping[bytes, bytes],
                      order: Sequence[bytes] = (), chunk: int = CHUNK) -> None:
        """Add rebuilt rows, operator state and key-order members to the staging of a rebuild. Several
        writers may stage disjoint parts (Spark tasks, one per partition), and staging a part again writes
        the same values (a retried task)."""
        rows_key, state_key, order_key = self._rebuild_keys(view)
        hset_chunked(self.redis, rows_key, rows, chunk)
        hset_chunked(self.redis, state_key, state, chunk)
        zadd_chunked(self.redis, order_key, list(order), chunk)

    def swap_rebuild(self, view: str, expected_mce: int) -> bool:
        """Swap the staged rebuild in, in one script, if the MCE is still ``expected_mce``; False (the
        staging dropped, nothing else changed) when it moved."""
        keys = [self._key(view, w) for w in ("meta", "rows", "opstate", "keyorder")] + self._rebuild_keys(view)
        return bool(self._replace(keys=keys, args=[epoch_hex(expected_mce)]))


def commit_from_changes(key_columns: Sequence[str], epoch: int, changes: Sequence[Change],
                        index: Mapping[int, IndexEntry], **extra: Any) -> EpochCommit:
    """The serving-state update of an epoch whose changes are ``changes`` (last change of a key wins);
    ``extra`` are further :class:`EpochCommit` fields (operator state, backfill positions)."""
    columns = tuple(key_columns)
    puts: dict[bytes, bytes] = {}
    deletes: dict[bytes, None] = {}
    members: dict[bytes, bytes] = {}
    for change in changes:
        key = encode_key(columns, change.key)
        if key not in members:
            members[key] = order_member(vnode_of(key), change.key, key)
        if change.after is None:
            puts.pop(key, None)
            deletes[key] = None
        else:
            deletes.pop(key, None)
            puts[key] = encode_row(change.after)
    return EpochCommit(epoch, puts, list(deletes), index, order_puts=[members[k] for k in puts],
                       order_deletes=[members[k] for k in deletes], **extra)


def commit_from_encoded(epoch: int, keys: Sequence[Key], encoded: EncodedBatch, index: Mapping[int, IndexEntry],
                        **extra: Any) -> EpochCommit:
    """:func:`commit_from_changes` of changes already encoded for the changelog by ``encode_batch``
    (``keys``: each change's key, ``ChangeBatch.keys``): the same rows, without encoding any of them again."""
    first = dict(zip(encoded.keys, keys, strict=True))  # Avro key -> key
    members = dict(zip(first, order_members(list(first.values()), list(first)), strict=True))
    return EpochCommit(epoch, encoded.row_puts, encoded.row_deletes, index,
                       order_puts=[members[k] for k in encoded.row_puts],
                       order_deletes=[members[k] for k in encoded.row_deletes], **extra)
