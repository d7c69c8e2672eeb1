"""A view's chunked backfill as Redis holds it: the committed positions and journal, and the progress shown.

``backfill`` (positions ``pos:<source>:<vnode>`` and counters) and ``journal`` (the committed chunks,
newest last, at most :data:`~mvlog.connectors.redis.epoch_commit.JOURNAL_LIMIT`) change only with an
epoch's commit (:class:`~mvlog.connectors.redis.epoch_commit.EpochCommit` ``backfill`` and ``journal``),
so a resumed backfill starts from exactly what the view's rows reflect. ``backfill_progress`` is the
dashboard's figures (rate, ETA), written by the backfill as it goes, not a commit.

When the view's operator runs in Spark's tasks, the chunk of a micro-batch is saved before its tasks run
(``backfill_chunk``: what it commits, as JSON; ``backfill_chunk_rows``: its rows' order members and
values, alternating) and dropped by the commit of its epoch: the tasks read its rows from there, and a
consumer that died after some partitions committed that epoch finishes it with the same chunk
(:mod:`mvlog.services.backfill.task_chunks`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from mvlog.connectors.redis.view_keyspace import ViewKeyspace

#: The saved chunk of a backfill run in tasks (see the module's docstring).
CHUNK_KEYS = ("backfill_chunk", "backfill_chunk_rows")
_BATCH = 2048


class BackfillStore(ViewKeyspace):
    """The backfill positions, journal and progress of views."""

    def save_chunk(self, view: str, record: str, rows: Sequence[tuple[bytes, bytes]]) -> None:
        """Save a chunk (``record``: what it commits; ``rows``: (order member, value)) in place of any other."""
        record_key, rows_key = self.chunk_keys(view)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(rows_key)
        for start in range(0, len(rows), _BATCH):
            pipe.rpush(rows_key, *[part for row in rows[start:start + _BATCH] for part in row])
        pipe.set(record_key, record)
        pipe.execute()

    def chunk_record(self, view: str) -> str | None:
        """The saved chunk's record (its commit not done yet), if any."""
        value = cast(bytes | None, self.redis.get(self.chunk_keys(view)[0]))
        return value.decode() if value is not None else None

    def chunk_rows(self, view: str, start: int, stop: int) -> list[tuple[bytes, bytes]]:
        """Rows ``start`` to ``stop`` (excluded) of the saved chunk: (order member, value)."""
        flat = cast(list[bytes], self.redis.lrange(self.chunk_keys(view)[1], 2 * start, 2 * stop - 1))
        return list(zip(flat[::2], flat[1::2], strict=True))

    def chunk_keys(self, view: str) -> list[str]:
        return [self._key(view, what) for what in CHUNK_KEYS]

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
