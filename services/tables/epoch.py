"""One epoch of a root table: its pending writes as changes against the committed rows, encoded.

:meth:`TableEpochEncoder.changes` folds the writes queued since the last epoch (one row or delete per
key) against the table's rows in Redis (the before-images: those of the last committed epoch, which
the :class:`~mvlog.services.pipeline.committer.EpochCommitter` makes sure of), keeping only the keys whose
row changes. :meth:`TableEpochEncoder.chunks` encodes them as change events for the epoch's Kafka
transaction while the same pass queues the epoch's Redis side
(:class:`~mvlog.connectors.redis.streamed_commit.StreamedCommit`), so each key's vnode and key-order member is
computed once. Both use the compiled codec when it is built (:func:`~mvlog.schemas.codec.native_module`),
else the same steps in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from mvlog.catalog import CatalogEntry
from mvlog.changes import Op
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter
from mvlog.connectors.kafka.dead_letter import DeadLetterRecord
from mvlog.connectors.redis.streamed_commit import StreamedCommit
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.key_order import order_member
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import change_tail, decode_row, encode_change_rows, encode_key, encode_row, native_module
from mvlog.vnode import VNODE_COUNT, vnode_of

READ_CHUNK = 10_000  # keys per HMGET of the current rows
SEND_EVERY = 4096  # changes encoded between two sends of the epoch's queued Redis commands
_CREATE, _UPDATE, _DELETE = Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value
#: A change of one key: key bytes, op, row bytes before and after (None: no row), the key.
TableChange = tuple[bytes, str, bytes | None, bytes | None, Key]
#: The epoch's change events, chunk by chunk, for :meth:`ChangelogWriter.commit_records`.
Chunks = Callable[[int, str], Iterator[list[tuple[bytes, int, bytes]]]]


class TableEpochEncoder:
    """Computes and encodes the epochs of table ``entry`` (rows in ``store``, changelog by ``writer``)."""

    def __init__(self, entry: CatalogEntry, store: ViewStore, writer: ChangelogWriter) -> None:
        self.entry, self.store, self.writer = entry, store, writer

    def changes(self, pending: Mapping[Key, Row | None]) -> list[TableChange]:
        """(key bytes, op, before, after, key) of every pending key whose row changes (each key once).

        ``before`` is the row's bytes in Redis and ``after`` the new row encoded, so an unchanged row is
        found by comparing bytes: both are ``encode_row`` of a normalized row (columns in schema order),
        and equal bytes decode to equal rows. Only different bytes of an existing row are decoded and
        compared as rows (as ``change_between`` does): 0.0 and -0.0, say, are equal rows.
        """
        columns, view = self.entry.key_columns, self.entry.name
        changes: list[TableChange] = []
        append = changes.append
        if self.store.row_count(view) == 0:  # a first load: no before-images to read
            if (native := native_module()) is not None and type(pending) is dict:
                native.encode_created(pending, tuple(columns), _CREATE, changes, encode_key, encode_row)
                return changes
            for key, after in pending.items():
                if after is not None:  # (a delete of a key without a row changes nothing)
                    append((encode_key(columns, key), _CREATE, None, encode_row(after), key))
            return changes
        items = list(pending.items())
        if (native := native_module()) is not None:
            for start in range(0, len(items), READ_CHUNK):
                self._changes_compiled(native, items[start:start + READ_CHUNK], changes)
            return changes
        for start in range(0, len(items), READ_CHUNK):  # bounded Redis replies
            chunk = items[start:start + READ_CHUNK]
            key_bytes = [encode_key(columns, key) for key, _ in chunk]
            current = self.store.row_list(view, key_bytes)
            for (key, after), kb, raw in zip(chunk, key_bytes, current, strict=True):
                if after is None:
                    if raw is not None:
                        append((kb, _DELETE, raw, None, key))
                    continue
                after_bytes = encode_row(after)
                if raw is None:
                    append((kb, _CREATE, None, after_bytes, key))
                elif raw != after_bytes and decode_row(raw) != after:
                    append((kb, _UPDATE, raw, after_bytes, key))
        return changes

    def _changes_compiled(self, native: Any, chunk: list[tuple[Key, Row | None]], changes: list[TableChange]) -> None:
        """:meth:`changes` of one chunk of pending keys, their keys and rows encoded by one compiled call
        (as for a first load), then compared with the rows in Redis (one HMGET)."""
        columns, view = self.entry.key_columns, self.entry.name
        rows = {key: after for key, after in chunk if after is not None}
        written: list[TableChange] = []  # (key bytes, create, None, row bytes, key) of each key with a row
        native.encode_created(rows, tuple(columns), _CREATE, written, encode_key, encode_row)
        deleted = [key for key, after in chunk if after is None] if len(rows) < len(chunk) else []
        deleted_bytes = [encode_key(columns, key) for key in deleted]
        current = self.store.row_list(view, [change[0] for change in written] + deleted_bytes)
        append = changes.append
        for change, raw in zip(written, current, strict=False):
            if raw is None:
                append(change)
            elif raw != change[3] and decode_row(raw) != rows[change[4]]:
                append((change[0], _UPDATE, raw, change[3], change[4]))
        for key, kb, raw in zip(deleted, deleted_bytes, current[len(written):], strict=True):
            if raw is not None:
                append((kb, _DELETE, raw, None, key))

    def chunks(self, epoch: int, changes: list[TableChange], staged: StreamedCommit
                ) -> Chunks:
        """The epoch's change events, in chunks, for :meth:`ChangelogWriter.commit_records`; each change
        also goes to ``staged`` (row and key-order member), so every key's vnode and member is computed
        once, and each chunk's Redis commands are sent while the next is encoded. The generator runs inside
        the epoch's transaction: an error it raises aborts the epoch."""
        view, key_of = self.entry.name, self.entry.schema.key_of
        row_kv, row_deletes = staged.row_kv, staged.row_deletes
        order_puts, order_deletes = staged.order_puts, staged.order_deletes

        def delete(vnode: int, kb: bytes, before: bytes) -> None:
            row_deletes.append(kb)
            order_deletes.append(order_member(vnode, key_of(decode_row(before)), kb))

        def compiled(ts_ms: int, txn: str) -> Iterator[list[tuple[bytes, int, bytes]]]:
            def tail(vnode: int, op: str) -> bytes:
                return change_tail(view, epoch, vnode, op, ts_ms, txn)

            tails: list[bytes | None] = [None] * (3 * VNODE_COUNT)  # by op (c, u, d) and vnode
            for start in range(0, len(changes), SEND_EVERY):
                chunk: list[tuple[bytes, int, bytes]] = []
                native.encode_table_changes(changes, start, start + SEND_EVERY, tails, tail, row_kv, order_puts,
                                            delete, order_member, chunk)
                yield chunk
                staged.send()

        def python(ts_ms: int, txn: str) -> Iterator[list[tuple[bytes, int, bytes]]]:
            put_row, put_member = row_kv.append, order_puts.append
            for start in range(0, len(changes), SEND_EVERY):
                chunk = []
                for kb, op, before, after, key in changes[start:start + SEND_EVERY]:
                    vnode = vnode_of(kb)
                    if after is None:
                        assert before is not None
                        delete(vnode, kb, before)
                    else:
                        put_row(kb)
                        put_row(after)
                        put_member(order_member(vnode, key, kb))
                    chunk.append((kb, vnode, encode_change_rows(view, epoch, vnode, op, before, after, ts_ms, txn)))
                yield chunk
                staged.send()

        native = native_module()
        return python if native is None else compiled

    def with_side_records(self, chunks: Chunks,
                           side_records: Sequence[DeadLetterRecord]
                           ) -> Chunks:
        """``chunks`` preceded by producing ``side_records`` with the changelog's transactional producer:
        the generator runs inside the epoch's transaction (begun by the writer), so they commit or abort
        with it. The writer produces only to its own changelog, hence its producer is used directly."""
        producer = self.writer._producer

        def with_side(ts_ms: int, txn: str) -> Iterator[list[tuple[bytes, int, bytes]]]:
            for record in side_records:
                while True:
                    try:
                        producer.produce(record.topic, record.value, record.key, headers=record.headers)
                        break
                    except BufferError:
                        producer.poll(0.05)
            yield from chunks(ts_ms, txn)

        return with_side
