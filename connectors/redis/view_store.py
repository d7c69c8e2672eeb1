"""A view's serving state in Redis: rows, operator state, max committed epoch (MCE) and lifecycle.

Rows, operator state, the epoch index and the MCE change together in one Lua script per epoch, which
also refuses an epoch at or below the MCE: applying an epoch twice is impossible, whoever retries it.
All keys of a view share the hash tag ``{view}`` so the script also runs on Redis Cluster.

The same script keeps a *key-order index* (a sorted set of order members, :mod:`mvlog.key_order`): a
backfill scans a vnode's rows in key order after a position with :meth:`ViewStore.read_ordered`, which
returns them with the MCE they reflect. A view's backfill positions are committed by the script too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import redis

from mvlog.changes import Change
from mvlog.connectors.kafka.changelog_writer import EncodedBatch
from mvlog.connectors.redis.epoch_index import EpochIndex, IndexEntry, epoch_hex, index_member
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.packed_script import run_script
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.key_order import order_member, order_members
from mvlog.row_schema import Key
from mvlog.schemas.codec import encode_key, encode_row
from mvlog.vnode import vnode_of

if TYPE_CHECKING:
    from mvlog.connectors.redis.streamed_commit import StreamedCommit


class Lifecycle(StrEnum):
    CREATING = "creating"
    BACKFILLING = "backfilling"
    REPLAYING = "replaying"
    LIVE = "live"
    PAUSED = "paused"
    FAILED = "failed"


JOURNAL_LIMIT = 100_000  # committed backfill chunks kept per view (the I5 audit trail, newest last)

_COMMIT_SCRIPT = lua_script("view_commit", lib=["each_chunk"], constants={"JOURNAL_LIMIT": JOURNAL_LIMIT})

# Rows of some vnodes in key order after given positions, with the MCE they reflect: one script, so the
# rows and the epoch are read atomically (an epoch commit is one script too). ARGV: the row budget, then
# (vnode, lower bound, upper bound) triples; vnodes are read in turn until the budget is spent.
_READ_ORDERED_SCRIPT = lua_script("view_read_ordered")


_REPLACE_SCRIPT = lua_script("view_replace", lib=["swap_staged"])


# A snapshot backfill's first epoch: rows, operator state and key-order index staged under ``*.load`` keys
# (batch by batch, so no process holds them all) are swapped in with the MCE and the epoch index, in one
# script. Refused (0) when the view has an MCE already; -1 when the staged rows are not all there (Redis
# was wiped or flushed meanwhile): the caller then rolls Redis forward from Kafka instead.
_COMMIT_LOAD_SCRIPT = lua_script("view_commit_load", lib=["swap_staged"])

_LOAD_KEYS = ("rows.load", "opstate.load", "keyorder.load")


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


@dataclass(frozen=True)
class OrderedRead:
    """Rows of some vnodes in key order, as of the upstream's MCE ``epoch``."""

    epoch: int | None
    row_count: int  # all rows of the view at ``epoch``
    parts: list[tuple[int, bool, list[tuple[bytes, bytes]]]]  # (vnode, reached its end, [(member, row)])


class ViewStore:
    """Redis serving state of all views under one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self.index = EpochIndex(client, prefix)
        self._commit = client.register_script(_COMMIT_SCRIPT)
        self._read_ordered = client.register_script(_READ_ORDERED_SCRIPT)
        self._replace = client.register_script(_REPLACE_SCRIPT)
        self._commit_load = client.register_script(_COMMIT_LOAD_SCRIPT)

    def _key(self, view: str, what: str) -> str:
        return view_key(self.prefix, view, what)

    def key(self, view: str, what: str) -> str:
        """The Redis key of ``what`` (meta, rows, backfill, ...) of ``view``, under the view's hash tag."""
        return self._key(view, what)

    # --- committed epochs -------------------------------------------------------------------------

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

    def mce_many(self, views: Sequence[str]) -> dict[str, int | None]:
        pipe = self.redis.pipeline(transaction=False)
        for view in views:
            pipe.hget(self._key(view, "meta"), "mce")
        return {v: (int(m) if m is not None else None) for v, m in zip(views, pipe.execute(), strict=True)}

    # --- lifecycle --------------------------------------------------------------------------------

    def set_lifecycle(self, view: str, state: Lifecycle, reason: str = "") -> None:
        self.redis.hset(self._key(view, "meta"), mapping={"state": state.value, "reason": reason,
                                                          "state_ts_ms": int(time.time() * 1000)})

    def lifecycle(self, view: str) -> Lifecycle | None:
        value = cast(bytes | None, self.redis.hget(self._key(view, "meta"), "state"))
        return Lifecycle(value.decode()) if value is not None else None

    def meta(self, view: str) -> dict[str, str]:
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self._key(view, "meta")))
        return {k.decode(): v.decode() for k, v in raw.items()}

    # --- rows and operator state ------------------------------------------------------------------

    def get_rows(self, view: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        values = cast(list[bytes | None], self.redis.hmget(self._key(view, "rows"), list(keys)))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def row_list(self, view: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """The rows of ``keys`` in their order, None where there is none (one HMGET)."""
        if not keys:
            return []
        return cast(list[bytes | None], self.redis.hmget(self._key(view, "rows"), list(keys)))

    def scan_rows(self, view: str, batch: int = 1000) -> Iterator[tuple[bytes, bytes]]:
        """All rows, a batch at a time (HSCAN: memory stays bounded for large views)."""
        yield from self.redis.hscan_iter(self._key(view, "rows"), count=batch)

    def row_count(self, view: str) -> int:
        return int(self.redis.hlen(self._key(view, "rows")))

    def get_state(self, view: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        values = cast(list[bytes | None], self.redis.hmget(self._key(view, "opstate"), list(keys)))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def read_at_consistent_epoch(self, view: str) -> tuple[int | None, list[tuple[bytes, bytes]]]:
        """All rows together with the MCE they reflect (one MULTI, so both are of the same epoch)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self._key(view, "meta"), "mce")
        pipe.hgetall(self._key(view, "rows"))
        mce, rows = pipe.execute()
        return (int(mce) if mce is not None else None), list(rows.items())

    def read_many_at_consistent_epoch(self, views: Sequence[str]
                                      ) -> dict[str, tuple[int | None, list[tuple[bytes, bytes]]]]:
        """All rows of several views with each one's MCE, in one MULTI (one instant for all of them)."""
        pipe = self.redis.pipeline(transaction=True)
        for view in views:
            pipe.hget(self._key(view, "meta"), "mce")
            pipe.hgetall(self._key(view, "rows"))
        replies = pipe.execute()
        return {view: ((int(mce) if mce is not None else None), list(rows.items()))
                for view, mce, rows in zip(views, replies[0::2], replies[1::2], strict=True)}

    def get_rows_at_consistent_epoch(self, view: str, keys: Sequence[bytes]
                                     ) -> tuple[int | None, dict[bytes, bytes]]:
        """The rows of ``keys`` (those that exist) with the MCE they reflect (one MULTI)."""
        if not keys:
            return self.mce(view), {}
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self._key(view, "meta"), "mce")
        pipe.hmget(self._key(view, "rows"), list(keys))
        mce, values = pipe.execute()
        rows = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
        return (int(mce) if mce is not None else None), rows

    # --- key order and backfill -------------------------------------------------------------------

    def read_ordered(self, view: str, vnodes: Sequence[tuple[int, bytes | None]], budget: int) -> OrderedRead:
        """Up to ``budget`` rows of ``vnodes`` (each: vnode, order member to read after, or None from its
        start), in key order, vnode after vnode, with the MCE they reflect (one atomic script)."""
        args: list[bytes | int] = [budget]
        for vnode, after in vnodes:
            low = b"(" + after if after is not None else b"[" + bytes((vnode,))
            high = b"(" + bytes((vnode + 1,)) if vnode < 255 else b"+"
            args += [vnode, low, high]
        keys = [self._key(view, "meta"), self._key(view, "rows"), self._key(view, "keyorder")]
        reply = cast(list[Any], self._read_ordered(keys=keys, args=args))
        epoch = int(reply[0]) if reply[0] else None
        parts: list[tuple[int, bool, list[tuple[bytes, bytes]]]] = []
        i = 2
        while i < len(reply):
            vnode, count, exhausted = int(reply[i]), int(reply[i + 1]), bool(int(reply[i + 2]))
            members = reply[i + 3:i + 3 + count]
            values = reply[i + 3 + count:i + 3 + 2 * count]
            if any(v is None for v in values):
                raise RuntimeError(f"{view}: the key-order index names rows that do not exist (vnode {vnode})")
            parts.append((vnode, exhausted, list(zip(members, values, strict=True))))
            i += 3 + 2 * count
        return OrderedRead(epoch, int(reply[1]), parts)

    def backfill_state(self, view: str) -> dict[bytes, bytes]:
        """The view's backfill hash as committed with its MCE (positions ``pos:<source>:<vnode>``, counters)."""
        return cast(dict[bytes, bytes], self.redis.hgetall(self._key(view, "backfill")))

    def backfill_journal(self, view: str) -> list[str]:
        """Committed chunks, oldest first: ``<epoch> <source> <vnode> <from hex> <to hex>``."""
        return [e.decode() for e in cast(list[bytes], self.redis.lrange(self._key(view, "journal"), 0, -1))]

    def set_backfill_progress(self, view: str, progress: Mapping[str, str | int | float]) -> None:
        """The dashboard's view of a running backfill (derived figures: rate, ETA; not a commit)."""
        mapping: dict[str | bytes, str | int | float] = {k: v for k, v in progress.items()}
        self.redis.hset(self._key(view, "backfill_progress"), mapping=mapping)  # type: ignore[arg-type]

    def backfill_progress(self, view: str) -> dict[str, str]:
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self._key(view, "backfill_progress")))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def replace_state(self, view: str, expected_mce: int, rows: Mapping[bytes, bytes],
                      state: Mapping[bytes, bytes], order: Sequence[bytes] = (), chunk: int = 1000) -> bool:
        """Replace the view's rows, operator state and key-order index (``order``: the members of
        ``rows``) with ones rebuilt for epoch ``expected_mce``.

        They are staged under temporary keys and swapped in by one script that checks the MCE is still
        ``expected_mce``; False (and nothing changed) when it moved (a consumer committed meanwhile).
        """
        staged = [self._key(view, w) for w in ("rows.rebuild", "opstate.rebuild", "keyorder.rebuild")]
        self.redis.delete(*staged)
        for key, mapping in zip(staged, (rows, state), strict=False):
            items = list(mapping.items())
            for start in range(0, len(items), chunk):
                self.redis.hset(key, mapping=dict(items[start:start + chunk]))
        members = list(order)
        for start in range(0, len(members), chunk):
            self.redis.zadd(staged[2], dict.fromkeys(members[start:start + chunk], 0))
        keys = [self._key(view, w) for w in ("meta", "rows", "opstate", "keyorder")] + staged
        return bool(self._replace(keys=keys, args=[epoch_hex(expected_mce)]))

    # --- a snapshot backfill's first epoch, staged --------------------------------------------------

    def clear_load(self, view: str) -> None:
        """Forget what an interrupted load staged."""
        self.redis.delete(*(self._key(view, w) for w in _LOAD_KEYS))

    def stage_load(self, view: str, rows: Mapping[bytes, bytes], state: Mapping[bytes, bytes],
                   order: Sequence[bytes]) -> None:
        """Add one batch of the first epoch's rows, operator state and key-order members (invisible to
        readers until :meth:`commit_load`)."""
        rows_key, state_key, order_key = (self._key(view, w) for w in _LOAD_KEYS)
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
        keys += [self._key(view, w) for w in _LOAD_KEYS] + [self.index.key(view, p) for p in partitions]
        args: list[bytes | str | int] = [epoch_hex(epoch), epoch, int(time.time() * 1000), lifecycle, rows]
        args += [index_member(epoch, index[p].offset, index[p].records) for p in partitions]
        result = int(self._commit_load(keys=keys, args=args))
        if result < 0:
            raise ServingStateLostError(f"{view}: the {rows} rows staged for epoch {epoch} are no longer all in "
                                        "Redis: it was wiped while the snapshot backfill ran")
        return result == 1

    def drop(self, view: str, partitions: int) -> None:
        keys = [self._key(view, w) for w in ("meta", "rows", "opstate", "keyorder", "backfill", "journal",
                                             "backfill_progress", *_LOAD_KEYS)]
        keys += [self.index.key(view, p) for p in range(partitions)]
        self.redis.delete(*keys)


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
