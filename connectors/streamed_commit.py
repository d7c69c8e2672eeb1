"""An epoch's Redis commit sent while the epoch is still being written to Kafka, applied after it commits.

The table writer used to build the whole epoch's argument list after the Kafka transaction committed and
run it through the commit script (:meth:`ViewStore.commit`): Python built ~600k arguments for 200k rows,
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
  then falls back to the script (:meth:`ViewStore.commit_rows`), which checks the MCE itself: the epoch
  is applied, refused at or below the MCE, or :class:`ServingStateLostError` is raised, as before.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import redis
from hiredis import pack_command  # redis[hiredis] is a dependency: packs a whole chunk in C

from mvlog.connectors.epoch_index import IndexEntry, epoch_hex, index_member
from mvlog.connectors.view_store import ViewStore

CHUNK = 4096  # fields (or members) per queued command: big enough to be cheap, small enough to overlap


class StreamedCommit:
    """One epoch's rows and key-order members, queued in Redis as they are encoded.

    The writer appends to :attr:`row_kv` (key, row, key, row, ...), :attr:`row_deletes`,
    :attr:`order_puts` and :attr:`order_deletes`, calls :meth:`send` now and then, and :meth:`finish`
    once the Kafka transaction committed (or :meth:`abort` when it did not).
    """

    def __init__(self, store: ViewStore, view: str, epoch: int, follows: int) -> None:
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
        self._pool = store.redis.connection_pool
        self._conn: Any = None
        self._open()

    # --- the transaction's life -------------------------------------------------------------------

    def _open(self) -> None:
        """WATCH the view's meta and open MULTI when the MCE is ``follows``; otherwise stay closed, and
        :meth:`finish` leaves the decision to the commit script."""
        conn: Any = self._pool.get_connection()
        try:
            conn.send_packed_command([self._pack(("WATCH", self._meta)), self._pack(("HGET", self._meta, "mce_hex"))])
            conn.read_response()
            current = conn.read_response()
            expected = epoch_hex(self.follows).encode() if self.follows > 0 else None
            if current != expected:
                conn.send_command("UNWATCH")
                conn.read_response()
                self._pool.release(conn)
                return
            conn.send_command("MULTI")
            self._queued = 1
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
        if self._conn is not None:
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
            applied = self._replies()
            if applied:
                return True
        # Not watched (the MCE was not ``follows``) or something touched the meta meanwhile: the script decides.
        return self.store.commit_rows(self.view, self.epoch, self.row_kv, self.row_deletes, self.order_puts,
                                      self.order_deletes, index, follows=self.follows)

    def abort(self) -> None:
        """Forget the queued commands (the Kafka transaction did not commit)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self._drop(conn)  # closing the connection discards MULTI and WATCH on the server

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
                if command == "ZADD":
                    args: list[Any] = [b"0"] * (2 * (end - start))
                    args[1::2] = items[start:end]
                else:
                    args = items[start:end]
                out.append(self._pack((command, key, *args)))
                self._queued += 1
                start = end
            self._sent[which] = start

    def _write(self, packed: list[bytes]) -> None:
        try:
            self._conn.send_packed_command(packed, check_health=False)
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

    def _drop(self, conn: Any) -> None:
        conn.disconnect()
        self._pool.release(conn)

    @staticmethod
    def _pack(args: tuple[Any, ...]) -> bytes:
        return bytes(pack_command(args))
