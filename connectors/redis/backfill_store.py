"""A view's chunked backfill as Redis holds it: the committed positions and journal, and the progress shown.

``backfill`` (positions ``pos:<source>:<vnode>`` and counters) and ``journal`` (the committed chunks,
newest last, at most :data:`~mvlog.connectors.redis.epoch_commit.JOURNAL_LIMIT`) change only with an
epoch's commit (:class:`~mvlog.connectors.redis.epoch_commit.EpochCommit` ``backfill`` and ``journal``),
so a resumed backfill starts from exactly what the view's rows reflect. ``backfill_progress`` is the
dashboard's figures (rate, ETA), written by the backfill as it goes, not a commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from mvlog.connectors.redis.view_keyspace import ViewKeyspace


class BackfillStore(ViewKeyspace):
    """The backfill positions, journal and progress of views."""

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
