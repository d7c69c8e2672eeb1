"""An epoch's Redis commit sent while the epoch is still being written to Kafka, applied after it commits.

The table writer used to build the whole epoch's argument list after the Kafka transaction committed and
run it through the commit script (:meth:`EpochCommits.commit`): Python built ~600k arguments for 200k rows,
Lua copied each of them into its ``ARGV`` and back, and the writer waited for all of it. Here the epoch
is one Redis transaction on a connection of its own::

    WATCH meta; HGET meta mce_hex          (before the Kafka transaction: must be ``follows``)
    MULTI; HSET/HDEL/ZADD/ZREM ...         (chunks sent while the writer encodes; redis-server parses them
                                            on the other core, nothing applies yet)
    HSET meta mce ...; ZADD index ...; EXEC (after the Kafka transaction committed)

Why this keeps the commit script's guarantees:

* nothing applies before EXEC, and EXEC applies everything at once: a writer killed before it leaves Redis
  at the old epoch (the server drops a connection's queued commands with it); Kafka committed first;
* the MCE was ``follows`` when watched, and any write to the view's meta since (another epoch's commit,
  a lifecycle change, a wipe: FLUSHALL touches every watched key) makes EXEC apply nothing. The commit
  then falls back to the script (:meth:`EpochCommits.commit_rows`), which checks the MCE itself: the epoch
  is applied, refused at or below the MCE, or :class:`ServingStateLostError` is raised, as before.

A view without rows (a table's first load) takes a cheaper way, as a snapshot backfill's first epoch does:
its rows and members are written at once (not queued) under staged keys of this epoch alone, so
redis-server stores them while Python still encodes, and after the Kafka commit one script checks the MCE,
that the view is still empty and that everything staged is there, and renames the staged keys into place
(O(1)). Staged keys expire (:data:`STAGE_TTL_S`), so those of a writer killed meanwhile go away by themselves.

The transaction's connection is its own, outside the client's retry policy; when it breaks (Redis
restarted), nothing queued on it applies (or EXEC did, and the MCE says so) and :meth:`StreamedCommit.finish`
commits the epoch with the script, which the client retries until Redis is back
(:mod:`mvlog.connectors.redis.redis_client`).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import redis
from hiredis import pack_command  # redis[hiredis] is a dependency: packs a whole chunk in C

from mvlog.connectors.redis.epoch_commit import EpochCommits, ServingStateLostError
from mvlog.connectors.redis.epoch_index import IndexEntry, epoch_hex, index_member
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.redis_client import node_pool
from mvlog.schemas.codec import native_module

log = logging.getLogger(__name__)

#: A broken connection (Redis went away): the epoch is committed by the script instead.
_LOST = (redis.ConnectionError, redis.TimeoutError)

CHUNK = 4096  # fields (or members) per queued command: big enough to be cheap, small enough to overlap
STAGE_TTL_S = 3600  # staged keys of an epoch whose writer died before renaming them expire after this

# The staged epoch of a view without rows. KEYS: meta, rows, keyorder, staged rows, staged keyorder, then the
# epoch index of each partition. ARGV: epoch hex, epoch, now (ms), the MCE it follows ('none': no MCE),
# staged rows, staged members, then an index member per partition. 1: applied; 0: at or below the MCE
# (refused); -1: the MCE is not the one it follows; -2: the view got rows meanwhile, or the staged keys are
# not all there (expired, wiped): the caller commits the epoch the usual way. Staged keys never outlive it.
_SWAP_SCRIPT = lua_script("streamed_swap")


class StreamedCommit:
    """One epoch's rows and key-order members, queued in Redis as they are encoded.

    The writer appends to :attr:`row_kv` (key, row, key, row, ...), :attr:`row_deletes`,
    :attr:`order_puts` and :attr:`order_deletes` (a key in one of them at most), calls :meth:`send` now
    and then, and :meth:`finish` once the Kafka transaction committed (or :meth:`abort` when it did not).
    """

    def __init__(self, store: EpochCommits, view: str, epoch: int, follows: int) -> None:
        self.store, self.view, self.epoch, self.follows = store, view, epoch, follows
        self.row_kv: list[bytes] = []
        self.row_deletes: list[bytes] = []
        self.order_puts: list[bytes] = []
        self.order_deletes: list[bytes] = []
        self._sent = [0, 0, 0, 0]  # items of each list already queued
        self._queued = 0  # replies owed by the server for queued commands
        self._meta = store.key(view, "meta")
        self._rows = store.key(view, "rows")
        self._order = store.key(view, "keyorder")
        self._pool = node_pool(store.redis, self._meta)  # on a cluster, the master of the view's slot
        self._conn: Any = None
        self._staged = False  # the view had no rows: written under staged keys, renamed at the end
        self._open()

    # --- the transaction's life -------------------------------------------------------------------

    def _open(self) -> None:
        """WATCH the view's meta and open MULTI when the MCE is ``follows`` (or stage, when the view has no
        rows); otherwise stay closed, and :meth:`finish` leaves the decision to the commit script."""
        conn: Any = self._pool.get_connection()
        try:
            conn.send_packed_command([self._pack(("WATCH", self._meta)), self._pack(("HGET", self._meta, "mce_hex")),
                                      self._pack(("EXISTS", self._rows, self._order))])
            conn.read_response()
            current, existing = conn.read_response(), conn.read_response()
            expected = epoch_hex(self.follows).encode() if self.follows > 0 else None
            if current != expected or not existing:
                conn.send_command("UNWATCH")
                conn.read_response()
            if current != expected:
                self._pool.release(conn)
                return
            if existing:
                conn.send_command("MULTI")
                self._queued = 1
            else:
                token = uuid.uuid4().hex[:12]
                self._staged = True
                self._rows = self.store.key(self.view, f"rows.stage.{token}")
                self._order = self.store.key(self.view, f"keyorder.stage.{token}")
        except _LOST as error:
            self._lost(conn, error)
            return
        except BaseException:
            self._drop(conn)
            raise
        self._conn = conn

    def send(self) -> None:
        """Queue the rows and members appended since the last call, in chunks of :data:`CHUNK`."""
        if self._conn is None:
            return
        packed: list[bytes] = []
        self._pack_new(packed, final=False)
        if packed:
            self._write(packed)

    def finish(self, index: Mapping[int, IndexEntry]) -> bool:
        """Apply the epoch (the Kafka transaction committed): True when applied, False when Redis refused
        it (at or below the MCE); raises :class:`ServingStateLostError` when the MCE is not ``follows``."""
        if self._conn is not None and self._staged:
            result = self._swap(index)
            if result >= 0:
                return result == 1
            if result == -1:
                raise ServingStateLostError(f"{self.view}: epoch {self.epoch} follows epoch {self.follows}, but "
                                            f"Redis holds MCE {self.store.mce(self.view)}: the serving state was "
                                            "wiped or rolled back")
        elif self._conn is not None:
            packed: list[bytes] = []
            self._pack_new(packed, final=True)
            now = int(time.time() * 1000)
            packed.append(self._pack(("HSET", self._meta, "mce_hex", epoch_hex(self.epoch), "mce", self.epoch,
                                      "mce_ts_ms", now)))
            packed += [self._pack(("ZADD", self.store.index.key(self.view, p), 0,
                                   index_member(self.epoch, index[p].offset, index[p].records)))
                       for p in sorted(index)]
            self._queued += 1 + len(index)
            packed.append(self._pack(("EXEC",)))
            self._write(packed)
            if self._conn is not None and self._replies():
                return True
        # Not watched (the MCE was not ``follows``), something touched the meta meanwhile, the staged keys
        # could not be swapped in, or the connection broke: the script decides.
        if self._staged:
            self._forget_staged()
        return self.store.commit_rows(self.view, self.epoch, self.row_kv, self.row_deletes, self.order_puts,
                                      self.order_deletes, index, follows=self.follows)

    def abort(self) -> None:
        """Forget the queued commands (the Kafka transaction did not commit)."""
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if not self._staged:
            self._drop(conn)  # closing the connection discards MULTI and WATCH on the server
            return
        # Staged keys are deleted on the connection that wrote them, after the commands queued on it: the
        # server may still run those after the connection closed, and a DEL sent on another connection
        # could run first and leave them behind (until they expire).
        try:
            conn.send_packed_command([self._pack(("DEL", self._rows, self._order))], check_health=False)
            for _ in range(self._queued + 1):
                conn.read_response()
        except redis.RedisError:  # a reply lost or refused: the staged keys expire anyway
            self._drop(conn)
            return
        except BaseException:
            self._drop(conn)
            raise
        self._pool.release(conn)

    def _forget_staged(self) -> None:
        if self._staged:
            with contextlib.suppress(redis.RedisError):  # they expire anyway
                self.store.redis.delete(self._rows, self._order)

    def _swap(self, index: Mapping[int, IndexEntry]) -> int:
        """Write what is left under the staged keys, then swap them in (:data:`_SWAP_SCRIPT`'s result)."""
        packed: list[bytes] = []
        self._pack_new(packed, final=True)
        if packed:
            self._write(packed)
        conn, self._conn = self._conn, None
        if conn is None:  # the connection broke
            return -2
        try:
            for _ in range(self._queued):
                conn.read_response()  # HSET / ZADD / EXPIRE counts (an error raises: the epoch is not applied)
        except _LOST as error:
            self._lost(conn, error)
            return -2  # the usual way (finish forgets the staged keys)
        except BaseException:
            self._drop(conn)
            self._forget_staged()
            raise
        self._pool.release(conn)
        partitions = sorted(index)
        keys = [self._meta, self.store.key(self.view, "rows"), self.store.key(self.view, "keyorder"),
                self._rows, self._order] + [self.store.index.key(self.view, p) for p in partitions]
        args: list[bytes | str | int] = [epoch_hex(self.epoch), self.epoch, int(time.time() * 1000),
                                         epoch_hex(self.follows) if self.follows > 0 else "none",
                                         len(self.row_kv) // 2, len(self.order_puts)]
        args += [index_member(self.epoch, index[p].offset, index[p].records) for p in partitions]
        script = self.store.redis.register_script(_SWAP_SCRIPT)
        return int(script(keys=keys, args=args))

    # --- helpers ----------------------------------------------------------------------------------

    def _pack_new(self, out: list[bytes], final: bool) -> None:
        lists = (self.row_kv, self.row_deletes, self.order_puts, self.order_deletes)
        for which, (items, command, key, width) in enumerate(zip(
                lists, ("HSET", "HDEL", "ZADD", "ZREM"), (self._rows, self._rows, self._order, self._order),
                (2, 1, 1, 1), strict=True)):
            start, stop = self._sent[which], len(items)
            step = CHUNK * width
            while stop - start >= step or (final and stop > start):
                end = min(start + step, stop)
                out.append(_pack_items((command, key), items, start, end, b"0" if command == "ZADD" else b""))
                self._queued += 1
                if self._staged:  # written at once: expires unless swapped in
                    out.append(self._pack(("EXPIRE", key, STAGE_TTL_S)))
                    self._queued += 1
                start = end
            self._sent[which] = start

    def _write(self, packed: list[bytes]) -> None:
        try:
            self._conn.send_packed_command(packed, check_health=False)
        except _LOST as error:
            conn, self._conn = self._conn, None
            self._lost(conn, error)
        except BaseException:
            self.abort()
            raise

    def _replies(self) -> bool:
        """Read the queued commands' acknowledgements and EXEC's reply; True when EXEC applied them."""
        conn, self._conn = self._conn, None
        try:
            for _ in range(self._queued):
                conn.read_response()  # +QUEUED (an error here makes EXEC refuse the whole transaction)
            results = conn.read_response()
        except _LOST as error:  # EXEC applied or not: the script finds out from the MCE
            self._lost(conn, error)
            return False
        except BaseException:
            self._drop(conn)
            raise
        self._pool.release(conn)
        if results is None:
            return False  # a watched key changed: nothing was applied
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise redis.ResponseError(f"{self.view}: epoch {self.epoch}: a command of the commit failed: {failed[0]}")
        return True

    def _lost(self, conn: Any, error: Exception) -> None:
        log.info("%s: epoch %d: the streamed commit's connection broke (%s): committing with the script",
                 self.view, self.epoch, error)
        self._drop(conn)

    def _drop(self, conn: Any) -> None:
        conn.disconnect()
        self._pool.release(conn)

    @staticmethod
    def _pack(args: tuple[Any, ...]) -> bytes:
        return bytes(pack_command(args))


def _pack_items_python(head: tuple[str | bytes, ...], items: list[bytes], start: int, stop: int,
                       each_before: bytes) -> bytes:
    """``head`` then ``items[start:stop]`` (each after ``each_before``, unless empty) as one packed command."""
    if each_before:
        args: list[Any] = [each_before] * (2 * (stop - start))
        args[1::2] = items[start:stop]
    else:
        args = items[start:stop]
    return bytes(pack_command((*head, *args)))


# An epoch's chunks packed by the compiled codec when it is built: the same bytes as hiredis' pack_command,
# without a tuple of some 8k arguments per command (1 us per row of a table's epoch, on its commit thread).
_native = native_module()
_pack_items = _native.pack_items if _native is not None and hasattr(_native, "pack_items") else _pack_items_python
