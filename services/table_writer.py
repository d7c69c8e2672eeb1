"""Root tables: rows written through :class:`Table` become epochs of the table's changelog.

Writes are validated at once (a bad row is refused with its index, field and problem, the good rows of
the same call are kept) and batched; every ``barrier_interval_ms`` the pending changes of each key are
folded into one change and committed as one epoch: a Kafka transaction, then Redis rows + MCE.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, change_between
from mvlog.config import Settings
from mvlog.connectors.catalog_store import CatalogStore
from mvlog.connectors.changelog_writer import ChangelogWriter, CommittedEpoch
from mvlog.connectors.recovery import roll_forward
from mvlog.connectors.topics import ensure_topic
from mvlog.connectors.view_store import Lifecycle, ViewStore, commit_from_changes
from mvlog.epoch import EpochClock
from mvlog.row_schema import FieldError, Key, Row, RowSchema
from mvlog.schemas.codec import decode_row, encode_key

log = logging.getLogger(__name__)

_DELETED = None


class RowValidationError(ValueError):
    """Some rows of a call were refused; the others (``accepted``) were queued for the next epoch."""

    def __init__(self, table: str, errors: Sequence[FieldError], accepted: int) -> None:
        self.table = table
        self.errors = list(errors)
        self.accepted = accepted
        shown = "; ".join(str(e) for e in self.errors[:10])
        more = f" (and {len(self.errors) - 10} more)" if len(self.errors) > 10 else ""
        super().__init__(f"table {table}: {len(self.errors)} problem(s), {accepted} row(s) accepted: {shown}{more}")


class Table:
    """A writer of one root table. Use as a context manager, or call :meth:`close`."""

    def __init__(self, settings: Settings, entry: CatalogEntry, client: redis.Redis | None = None,
                 *, auto_commit: bool = True, recover: bool = True) -> None:
        if entry.kind != "table":
            raise ValueError(f"{entry.name} is a {entry.kind}, not a table")
        self.settings = settings
        self.entry = entry
        self.schema: RowSchema = entry.schema
        self._redis = client or redis.Redis.from_url(settings.redis_url)
        self.store = ViewStore(self._redis, settings.topic_prefix)
        # The writer's init_transactions fences any earlier writer before we read the log's tail.
        self._writer = ChangelogWriter(settings, entry.name, entry.key_columns, entry.partitions)
        # A table created a moment ago has an empty changelog: nothing to roll forward.
        self._clock = EpochClock(roll_forward(settings, self.store, entry).max_seen if recover else 0)
        # The next barrier names the last *committed* epoch, abandoning any epoch a killed writer left.
        self._prev_epoch = self.store.mce(entry.name) or 0
        self._epochs_written = 0
        self._pending: dict[Key, Row | None] = {}
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._error: BaseException | None = None
        self._closed = threading.Event()
        self._wake = threading.Event()
        self.store.set_lifecycle(entry.name, Lifecycle.LIVE)
        self._thread: threading.Thread | None = None
        if auto_commit:
            self._thread = threading.Thread(target=self._run, name=f"mvlog-table-{entry.name}", daemon=True)
            self._thread.start()

    # --- creating and opening ---------------------------------------------------------------------

    @classmethod
    def create(cls, settings: Settings, name: str, columns: Mapping[str, str], primary_key: Sequence[str],
               *, partitions: int | None = None, client: redis.Redis | None = None,
               exist_ok: bool = False, **kwargs: Any) -> Table:
        client = client or redis.Redis.from_url(settings.redis_url)
        catalog = CatalogStore(settings, client)
        existing = catalog.find(name)
        if existing is not None:
            if not exist_ok:
                raise ValueError(f"{existing.kind} {name!r} already exists")
            return cls(settings, existing, client, **kwargs)
        schema = RowSchema.of(columns, primary_key)
        entry = CatalogEntry(name, "table", schema, partitions or settings.partitions,
                             created_epoch=EpochClock().next())
        ensure_topic(settings, settings.changelog_topic(name), entry.partitions)
        catalog.put(entry)
        catalog.close()
        return cls(settings, entry, client, recover=False, **kwargs)

    @classmethod
    def open(cls, settings: Settings, name: str, client: redis.Redis | None = None, **kwargs: Any) -> Table:
        client = client or redis.Redis.from_url(settings.redis_url)
        return cls(settings, CatalogStore(settings, client).get(name), client, **kwargs)

    # --- writing ----------------------------------------------------------------------------------

    def upsert(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Queue rows for the next epoch; raises :class:`RowValidationError` naming any refused row."""
        self._raise_background_error()
        accepted: dict[Key, Row] = {}
        errors: list[FieldError] = []
        for index, row in enumerate(rows):
            problems = self.schema.validate(row, index)
            if problems:
                errors.extend(problems)
                continue
            normalized = self.schema.normalize(row)
            accepted[self.schema.key_of(normalized)] = normalized
        with self._lock:
            self._pending.update(accepted)
        if errors:
            raise RowValidationError(self.entry.name, errors, len(accepted))
        return len(accepted)

    def delete(self, keys: Iterable[Any]) -> int:
        """Queue deletes of primary keys (a scalar for a one-column key, else a tuple)."""
        self._raise_background_error()
        accepted: list[Key] = []
        errors: list[FieldError] = []
        for index, key in enumerate(keys):
            key_tuple = key if isinstance(key, tuple) else (key,)
            problems = self.schema.validate_key(key_tuple, index)
            if problems:
                errors.extend(problems)
            else:
                accepted.append(key_tuple)
        with self._lock:
            for key_tuple in accepted:
                self._pending[key_tuple] = _DELETED
        if errors:
            raise RowValidationError(self.entry.name, errors, len(accepted))
        return len(accepted)

    def flush(self) -> int:
        """Commit everything queued so far as one epoch now; returns that epoch."""
        self._raise_background_error()
        committed = self.commit_epoch()
        return committed.epoch

    def commit_epoch(self) -> CommittedEpoch:
        """Fold the pending writes into one epoch and commit it to Kafka, then to Redis."""
        with self._commit_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
            changes = self._changes(pending)
            epoch = self._clock.next()
            self._epochs_written += 1
            checkpoint = self._epochs_written % self.settings.checkpoint_frequency == 0
            committed = self._writer.commit_epoch(epoch, self._prev_epoch, changes, checkpoint=checkpoint)
            self._prev_epoch = epoch
            self.store.commit(self.entry.name,
                              commit_from_changes(self.entry.key_columns, epoch, changes, committed.index))
            return committed

    def _changes(self, pending: Mapping[Key, Row | None]) -> list[Change]:
        keys = list(pending)
        key_bytes = [encode_key(self.entry.key_columns, k) for k in keys]
        current = self.store.get_rows(self.entry.name, key_bytes)
        changes: list[Change] = []
        for key, kb in zip(keys, key_bytes, strict=True):
            raw = current.get(kb)
            change = change_between(key, decode_row(raw) if raw is not None else None, pending[key])
            if change is not None:
                changes.append(change)
        return changes

    # --- background epochs ------------------------------------------------------------------------

    def _run(self) -> None:
        interval = self.settings.barrier_interval_ms / 1000
        next_tick = time.monotonic() + interval
        while not self._closed.is_set():
            self._wake.wait(max(0.0, next_tick - time.monotonic()))
            self._wake.clear()
            if self._closed.is_set():
                return
            next_tick = time.monotonic() + interval
            try:
                self.commit_epoch()
            except BaseException as exc:  # surfaced to the caller's next call
                log.exception("%s: epoch commit failed", self.entry.name)
                self._error = exc
                return

    def _raise_background_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"table {self.entry.name}: the epoch loop stopped: {self._error}") from self._error

    def close(self) -> None:
        """Stop the epoch loop after committing what is pending."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if self._error is None:
            with self._lock:
                has_pending = bool(self._pending)
            if has_pending:
                self.commit_epoch()
        self._writer.close()

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
