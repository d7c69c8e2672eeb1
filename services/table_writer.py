"""Root tables: rows written through :class:`Table` become epochs of the table's changelog.

Writes are validated at once (a bad row is refused with its index, field and problem, the good rows of
the same call are kept) and batched; every ``barrier_interval_ms`` the pending changes of each key are
folded into one change and committed as one epoch: a Kafka transaction, then Redis rows + MCE.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis

from mvlog.catalog import CatalogEntry
from mvlog.changes import Op
from mvlog.config import Settings
from mvlog.connectors.backpressure import Backpressure
from mvlog.connectors.catalog_store import CatalogStore
from mvlog.connectors.changelog_writer import ChangelogWriter, CommittedEpoch, EncodedChange
from mvlog.connectors.recovery import roll_forward
from mvlog.connectors.topics import ensure_topic
from mvlog.connectors.view_store import EpochCommit, Lifecycle, ServingStateLostError, ViewStore
from mvlog.epoch import EpochClock
from mvlog.key_order import order_member
from mvlog.row_schema import INT64_MAX, INT64_MIN, ColumnType, FieldError, Key, Row, RowSchema
from mvlog.schemas.codec import decode_row, encode_key, encode_row, native_module
from mvlog.vnode import vnode_of

log = logging.getLogger(__name__)

_DELETED = None
_READ_CHUNK = 10_000  # keys per HMGET of the current rows
# Column kinds as the compiled normalize_row numbers them.
_NATIVE_KINDS = {ColumnType.INT: 0, ColumnType.FLOAT: 1, ColumnType.STRING: 2, ColumnType.BOOLEAN: 3,
                 ColumnType.BYTES: 4}


def _plain_row_normalizer(schema: RowSchema) -> Callable[[Any], Row | None]:
    """``schema.normalize(row)`` for rows that ``schema.validate`` accepts at a glance, else None.

    A plain dict whose values are of exactly the column types (an int for a float column too) is valid
    and normalized here in one pass; anything else (None for the slow path) is left to the schema,
    which names each problem. The result is always what validate + normalize give.
    """
    names = frozenset(schema.names)
    columns = [(c.name, c.type, c.nullable) for c in schema.columns]
    int_, float_, str_ = ColumnType.INT, ColumnType.FLOAT, ColumnType.STRING
    bool_, bytes_ = ColumnType.BOOLEAN, ColumnType.BYTES

    def normalize(row: Any) -> Row | None:
        if type(row) is not dict or not row.keys() <= names:
            return None
        out: Row = {}
        for name, kind, nullable in columns:
            value = row.get(name)
            vtype = type(value)
            if value is None:
                if not nullable:
                    return None
            elif kind is int_:
                if vtype is not int or not INT64_MIN <= value <= INT64_MAX:
                    return None
            elif kind is float_:
                if vtype is int:
                    value = float(value)
                elif vtype is not float or value != value:  # NaN is refused
                    return None
            elif kind is str_:
                if vtype is not str:
                    return None
            elif kind is bool_:
                if vtype is not bool:
                    return None
            elif kind is bytes_:
                if vtype is not bytes and vtype is not bytearray:
                    return None
            else:
                return None
            out[name] = value
        return out

    return normalize


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
        self._fast_normalize = _plain_row_normalizer(self.schema)
        native = native_module()
        self._native_normalize = native.normalize_row if native is not None else None
        self._native_columns = tuple((c.name, _NATIVE_KINDS[c.type], c.nullable) for c in self.schema.columns)
        self._key_positions = tuple(self.schema.names.index(k) for k in self.schema.primary_key)
        # Only string and bytes columns can make a row too large for one Kafka record: checked per row.
        self._sized_columns = [c.name for c in self.schema.columns if c.type in (ColumnType.STRING, ColumnType.BYTES)]
        self._redis = client or redis.Redis.from_url(settings.redis_url)
        self.store = ViewStore(self._redis, settings.topic_prefix)
        # The writer's init_transactions fences any earlier writer before we read the log's tail.
        self._writer = ChangelogWriter(settings, entry.name, entry.key_columns, entry.partitions)
        # A table created a moment ago has an empty changelog: nothing to roll forward.
        # A view built on the table's last epoch proves it committed, should Redis have lost it (wiped).
        if recover:
            views = CatalogStore(settings, self._redis).views_reading(entry.name)
            self._clock = EpochClock(roll_forward(settings, self.store, entry, downstreams=views).max_seen)
        else:
            self._clock = EpochClock(0)
        # The next barrier names the last *committed* epoch, abandoning any epoch a killed writer left.
        self._prev_epoch = self.store.mce(entry.name) or 0
        # Proof that the last epoch committed, should Redis be wiped before this writer commits one.
        self._last_committed = self.store.index.entries_at(entry.name, entry.partitions, self._prev_epoch or None)
        self._epochs_written = 0
        self._pending: dict[Key, Row | None] = {}
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._error: BaseException | None = None
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._backpressure = Backpressure(settings, self._redis)
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
        fast, key_of = self._fast_normalize, self.schema.key_of
        native, columns, key_positions = self._native_normalize, self._native_columns, self._key_positions
        text_limit = self.settings.max_record_bytes // 2
        for index, row in enumerate(rows):
            if native is not None:  # the compiled normalize: the row, its key and its text size in one call
                plain = native(row, columns, key_positions)
                if plain is not None and plain[2] <= text_limit:
                    accepted[plain[1]] = plain[0]
                    continue
            normalized = fast(row)
            if normalized is None:  # not a plain row: the schema says what is wrong, or normalizes it
                problems = self.schema.validate(row, index)
                if problems:
                    errors.extend(problems)
                    continue
                normalized = self.schema.normalize(row)
            if self._sized_columns and (problem := self._too_large(normalized)) is not None:
                errors.append(FieldError(index, problem[0], problem[1]))
                continue
            accepted[key_of(normalized)] = normalized
        with self._lock:
            self._pending.update(accepted)
        if errors:
            raise RowValidationError(self.entry.name, errors, len(accepted))
        return len(accepted)

    def _too_large(self, row: Row) -> tuple[str, str] | None:
        """(column, problem) when the row's strings and bytes alone exceed ``max_record_bytes``: its change
        event (before and after images) could not be one Kafka record, and readers would dead-letter it."""
        limit = self.settings.max_record_bytes // 2  # an update carries the row twice
        sizes = {name: len(value) for name in self._sized_columns if (value := row.get(name)) is not None}
        if sum(sizes.values()) <= limit:
            return None
        largest = max(sizes, key=lambda name: sizes[name])
        return largest, (f"row too large: {sum(sizes.values())} bytes of text/bytes, above half of max_record_bytes "
                         f"({self.settings.max_record_bytes}), the largest column being {largest!r}")

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
        self.wait_for_downstreams()
        committed = self.commit_epoch()
        return committed.epoch

    def commit_epoch(self) -> CommittedEpoch:
        """Fold the pending writes into one epoch and commit it to Kafka, then to Redis."""
        with self._commit_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
            # Before-images come from Redis: they must be those of the last committed epoch, so a wiped
            # Redis is noticed (and rebuilt from Kafka) before the changes are computed, and after.
            self._ensure_serving_state()
            changes = self._changes(pending)
            while self._ensure_serving_state():
                changes = self._changes(pending)
            epoch = self._clock.next()
            self._epochs_written += 1
            checkpoint = self._epochs_written % self.settings.checkpoint_frequency == 0
            # Each row is encoded once, for its change event and for Redis; the generator runs inside the
            # epoch's transaction, so an encoding error aborts the epoch.
            row_puts: dict[bytes, bytes] = {}
            row_deletes: list[bytes] = []
            order_puts: list[bytes] = []
            order_deletes: list[bytes] = []
            key_of = self.schema.key_of

            def encoded() -> Iterator[EncodedChange]:
                for key, op, before, after in changes:
                    after_bytes = None if after is None else encode_row(after)
                    image = after if after is not None else before
                    assert image is not None
                    member = order_member(vnode_of(key), key_of(image), key)
                    if after_bytes is None:
                        row_deletes.append(key)
                        order_deletes.append(member)
                    else:
                        row_puts[key] = after_bytes
                        order_puts.append(member)
                    yield EncodedChange(op, key, None if before is None else encode_row(before), after_bytes)

            follows = self._prev_epoch
            committed = self._writer.commit_encoded(epoch, follows, encoded(), checkpoint=checkpoint)
            self._prev_epoch = epoch
            self._last_committed = committed.index
            try:
                self.store.commit(self.entry.name, EpochCommit(epoch, row_puts, row_deletes, committed.index,
                                                               order_puts=order_puts, order_deletes=order_deletes,
                                                               follows=follows))
            except ServingStateLostError:
                self._recover()  # rolls Redis forward over this epoch too
            return committed

    def _ensure_serving_state(self) -> bool:
        """True when Redis had lost this table's state (wiped) and it was rebuilt from Kafka."""
        if self.store.mce(self.entry.name) == (self._prev_epoch or None):
            return False
        self._recover()
        return True

    def _recover(self) -> None:
        from mvlog.services.control_plane import recover_after_wipe

        log.warning("%s: Redis no longer holds its MCE %d: rebuilding from Kafka", self.entry.name, self._prev_epoch)
        mce = recover_after_wipe(self.settings, self._redis, self.entry, self._last_committed)
        if (mce or 0) != self._prev_epoch:
            raise RuntimeError(f"table {self.entry.name}: Redis is at epoch {mce}, this writer at {self._prev_epoch}; "
                               "another writer of the table is running")
        self.store.set_lifecycle(self.entry.name, Lifecycle.LIVE)

    def _changes(self, pending: Mapping[Key, Row | None]) -> list[tuple[bytes, str, Row | None, Row | None]]:
        """(key bytes, op, before, after) of every pending key whose row changes (each key once)."""
        columns, view = self.entry.key_columns, self.entry.name
        changes: list[tuple[bytes, str, Row | None, Row | None]] = []
        items = list(pending.items())
        for start in range(0, len(items), _READ_CHUNK):  # bounded Redis replies
            chunk = items[start:start + _READ_CHUNK]
            key_bytes = [encode_key(columns, key) for key, _ in chunk]
            current = self.store.get_rows(view, key_bytes)
            for (_, after), kb in zip(chunk, key_bytes, strict=True):
                raw = current.get(kb)
                before = decode_row(raw) if raw is not None else None
                if before == after:  # as change_between: nothing changed
                    continue
                op = Op.CREATE if before is None else Op.DELETE if after is None else Op.UPDATE
                changes.append((kb, op.value, before, after))
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
            try:
                self.wait_for_downstreams()
                if self._closed.is_set():
                    return
                next_tick = time.monotonic() + interval
                self.commit_epoch()
            except BaseException as exc:  # surfaced to the caller's next call
                log.exception("%s: epoch commit failed", self.entry.name)
                self._error = exc
                return

    def wait_for_downstreams(self, poll_s: float = 0.02) -> None:
        """Backpressure: while a downstream that set ``max_epoch_lag`` lags that many epochs behind this
        table, do not open another epoch (writes keep queueing). Returns as soon as it catches up, or when
        the table is closed. Without such a downstream this is one cached catalog look-up."""
        while self._backpressure.blocking(self.entry.name) and not self._closed.wait(poll_s):
            pass

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
