"""Root tables: rows written through :class:`Table` become epochs of the table's changelog.

Writes are validated at once (a bad row is refused with its index, field and problem, the good rows of
the same call are kept) and batched; every ``barrier_interval_ms`` the pending changes of each key are
folded into one change and committed as one epoch: a Kafka transaction, then Redis rows + MCE.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, cast

import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, CommittedEpoch, ConsumedInput
from mvlog.connectors.kafka.dead_letter import DeadLetterRecord
from mvlog.connectors.kafka.topics import ensure_changelog
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.backpressure import Backpressure
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.table_writers import TableWriters
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.epoch import EpochClock
from mvlog.record_limits import change_event_bytes, row_fits, surely_fitting_text, too_large_message
from mvlog.row_schema import INT64_MAX, INT64_MIN, ColumnType, FieldError, Key, Row, RowSchema
from mvlog.schemas.codec import (
    decode_key,
    decode_row,
    encode_key,
    encode_row,
    native_module,
)
from mvlog.services.pipeline.committer import EpochCommitter
from mvlog.services.tables.epoch import READ_CHUNK, TableEpochEncoder
from mvlog.services.tables.epoch_loop import EpochLoop

log = logging.getLogger(__name__)

_DELETED = None
# Column kinds as the compiled normalize_row numbers them.
_NATIVE_KINDS = {ColumnType.INT: 0, ColumnType.FLOAT: 1, ColumnType.STRING: 2, ColumnType.BOOLEAN: 3,
                 ColumnType.BYTES: 4}


def _plain_row_normalizer(schema: RowSchema, max_text_bytes: int) -> Callable[[Any], Row | None]:
    """``schema.normalize(row)`` for rows that ``schema.validate`` accepts at a glance, else None.

    A plain dict whose values are of exactly the column types (an int for a float column too) is valid
    and normalized here in one pass; anything else (None for the slow path) is left to the schema,
    which names each problem. So is a row whose strings and bytes exceed ``max_text_bytes``
    (:meth:`_RowLimits.too_large` names it). The result is always what validate + normalize give.
    """
    names = frozenset(schema.names)
    columns = [(c.name, c.type, c.nullable) for c in schema.columns]
    int_, float_, str_ = ColumnType.INT, ColumnType.FLOAT, ColumnType.STRING
    bool_, bytes_ = ColumnType.BOOLEAN, ColumnType.BYTES

    def normalize(row: Any) -> Row | None:
        if type(row) is not dict or not row.keys() <= names:
            return None
        out: Row = {}
        text = 0
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
                text += len(value)
            elif kind is bool_:
                if vtype is not bool:
                    return None
            elif kind is bytes_:
                if vtype is not bytes and vtype is not bytearray:
                    return None
                text += len(value)
            else:
                return None
            out[name] = value
        return out if text <= max_text_bytes else None

    return normalize


def _row_bytes_without_text(schema: RowSchema) -> int:
    """A bound of a row's encoded size without its strings and bytes: every column present, numbers at
    their widest, each length at its widest varint (10 bytes rather than the 1 of an empty value)."""
    widest: dict[ColumnType, Any] = {ColumnType.INT: INT64_MIN, ColumnType.FLOAT: 0.0, ColumnType.STRING: "",
                                     ColumnType.BOOLEAN: True, ColumnType.BYTES: b""}
    sized = sum(1 for c in schema.columns if c.type in (ColumnType.STRING, ColumnType.BYTES))
    return len(encode_row({c.name: widest[c.type] for c in schema.columns})) + 9 * sized


def _key_getter(primary_key: Sequence[str]) -> Callable[[Row], Key]:
    """``RowSchema.key_of`` without a generator per row: the key tuple of a normalized row."""
    if len(primary_key) == 1:
        (column,) = primary_key
        return lambda row: (row[column],)
    return cast(Callable[[Row], Key], operator.itemgetter(*primary_key))


def _valid_key(schema: RowSchema, key_of: Callable[[Row], Key], row: Any) -> Key | None:
    """The normalized primary key of a (partial) row, None when it lacks a valid one."""
    if not isinstance(row, Mapping) or any(name not in row for name in schema.primary_key):
        return None
    key = tuple(row[name] for name in schema.primary_key)
    if schema.validate_key(key):
        return None
    return key_of(schema.normalize(schema.key_row(key)))


class _RowLimits:
    """Whether a row of table ``entry`` fits one record of its changelog (``writer``'s limit)."""

    def __init__(self, entry: CatalogEntry, writer: ChangelogWriter, key_of: Callable[[Row], Key]) -> None:
        self.entry, self.writer, self.key_of = entry, writer, key_of
        # Only string and bytes columns can make a row too large for one Kafka record: checked per row.
        self.sized_columns = [c.name for c in entry.schema.columns if c.type in (ColumnType.STRING, ColumnType.BYTES)]
        # Rows with no more text than this fit the changelog for sure; larger ones are measured (too_large).
        self.text_limit = surely_fitting_text(writer.limit, writer.envelope_bytes,
                                              _row_bytes_without_text(entry.schema))

    def too_large(self, row: Row) -> tuple[str, str] | None:
        """(largest column, problem) when a change of the row could not be one record of the changelog
        (the broker, the producer or the readers would refuse it; an update carries the row twice): it is
        refused now, before any epoch, rather than aborting the epoch it would be in."""
        sizes = {name: len(value) for name in self.sized_columns if (value := row.get(name)) is not None}
        if sum(sizes.values()) <= self.text_limit:
            return None
        key = self.key_of(row)
        row_bytes, key_bytes = len(encode_row(row)), len(encode_key(self.entry.key_columns, key))
        limit, envelope = self.writer.limit, self.writer.envelope_bytes
        if row_fits(row_bytes, key_bytes, envelope, limit):
            return None
        event_bytes = change_event_bytes(key_bytes, row_bytes, row_bytes, envelope)
        return (max(sizes, key=lambda name: sizes[name]),
                too_large_message(key, row_bytes, event_bytes, limit, self.writer.topic))


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
        native = native_module()
        self._native_normalize = native.normalize_row if native is not None else None
        self._native_columns = tuple((c.name, _NATIVE_KINDS[c.type], c.nullable) for c in self.schema.columns)
        self._key_positions = tuple(self.schema.names.index(k) for k in self.schema.primary_key)
        self._key_of = _key_getter(self.schema.primary_key)
        self._redis = client or redis_client.connect(settings)
        self.store = ViewStore(self._redis, settings.topic_prefix)
        # The committer's writer (init_transactions) fences any earlier writer before we read the log's tail.
        self._committer = EpochCommitter.for_table(settings, self._redis, entry)
        self._limits = _RowLimits(entry, self._writer, self._key_of)
        self._text_limit = self._limits.text_limit
        self._fast_normalize = _plain_row_normalizer(self.schema, self._text_limit)
        self._encoder = TableEpochEncoder(entry, self.store, self._committer.writer)
        # A table created a moment ago has an empty changelog: nothing to roll forward.
        # A view built on the table's last epoch proves it committed, should Redis have lost it (wiped).
        # The next barrier names the last committed epoch (the committer's MCE).
        if recover:
            views = self._committer.catalog.views_reading(entry.name)
            self._clock = EpochClock(self._committer.roll_forward(views).max_seen)
        else:
            self._clock = EpochClock(0)
        # Say this writer runs; a join that planned past the table's last epoch while no writer ran sealed it
        # through its bound, and this writer's epochs start above that (mvlog.join_bound). Above the MCE of
        # the views reading it too: a join past the table's last epoch had sealed it, and a seal lost with a
        # wiped Redis is still behind the MCE the join committed (rebuilt from Kafka).
        self._writers = TableWriters(self._redis, settings.topic_prefix)
        self._writer_token, sealed = self._writers.open(entry.name)
        readers = [v.name for v in self._committer.catalog.views_reading(entry.name)] if recover else []
        self._clock.observe(max([sealed, *(m or 0 for m in self.store.mce_many(readers).values())]))
        self._epochs_written = 0
        self._pending: dict[Key, Row | None] = {}
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._closed = threading.Event()
        self._backpressure = Backpressure(settings, self._redis)
        self.store.set_lifecycle(entry.name, Lifecycle.LIVE)
        self._loop: EpochLoop | None = None
        if auto_commit:
            self._loop = EpochLoop(entry.name, settings.barrier_interval_ms / 1000, self.commit_epoch,
                                   self.wait_for_downstreams, self._closed)
            self._loop.start()

    @property
    def _writer(self) -> ChangelogWriter:
        """The table's changelog writer (the committer's: a snapshot load never swaps a table's)."""
        return self._committer.writer

    # --- creating and opening ---------------------------------------------------------------------

    @classmethod
    def create(cls, settings: Settings, name: str, columns: Mapping[str, str], primary_key: Sequence[str],
               *, partitions: int | None = None, client: redis.Redis | None = None,
               exist_ok: bool = False, options: Mapping[str, str] | None = None, **kwargs: Any) -> Table:
        client = client or redis_client.connect(settings)
        catalog = CatalogStore(settings, client)
        existing = catalog.find(name)
        if existing is not None:
            if not exist_ok:
                raise ValueError(f"{existing.kind} {name!r} already exists")
            return cls(settings, existing, client, **kwargs)
        schema = RowSchema.of(columns, primary_key)
        entry = CatalogEntry(name, "table", schema, partitions or settings.partitions,
                             created_epoch=EpochClock().next(), options=dict(options or {}))
        ensure_changelog(settings, name, entry.partitions)
        catalog.put(entry)
        catalog.close()
        return cls(settings, entry, client, recover=False, **kwargs)

    @classmethod
    def open(cls, settings: Settings, name: str, client: redis.Redis | None = None, **kwargs: Any) -> Table:
        client = client or redis_client.connect(settings)
        return cls(settings, CatalogStore(settings, client).get(name), client, **kwargs)

    # --- writing ----------------------------------------------------------------------------------

    def upsert(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Queue rows for the next epoch; raises :class:`RowValidationError` naming any refused row."""
        self._raise_background_error()
        accepted: dict[Key, Row] = {}
        errors: list[FieldError] = []
        fast, key_of = self._fast_normalize, self._key_of
        native, columns, key_positions = self._native_normalize, self._native_columns, self._key_positions
        text_limit = self._text_limit
        for index, row in enumerate(rows):
            if native is not None:  # the compiled normalize: the row, its key and its text size in one call
                plain = native(row, columns, key_positions)
                if plain is not None and plain[2] <= text_limit:
                    accepted[plain[1]] = plain[0]
                    continue
            # Where the compiled check refused the row, the Python one would too: straight to the schema.
            normalized = fast(row) if native is None else None
            if normalized is None:  # not a plain row: the schema says what is wrong, or normalizes it
                problems = self.schema.validate(row, index)
                if problems:
                    errors.extend(problems)
                    continue
                normalized = self.schema.normalize(row)
                if (problem := self._limits.too_large(normalized)) is not None:
                    errors.append(FieldError(index, problem[0], problem[1]))
                    continue
            accepted[key_of(normalized)] = normalized
        with self._lock:
            self._pending.update(accepted)
        if errors:
            raise RowValidationError(self.entry.name, errors, len(accepted))
        return len(accepted)

    def merge(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Like :meth:`upsert`, but a column that a row omits keeps its current value instead of becoming
        NULL (a key with no row yet gets NULL there, as with upsert).

        The current row is the one this writer queued last for the key, else the committed one in Redis:
        the writer's own state, which no other writer changes (this one fenced them). It is read and the
        merged rows are queued under the commit lock, so no epoch commits in between.
        """
        rows = list(rows)
        keys = [_valid_key(self.schema, self._key_of, row) for row in rows]
        with self._commit_lock:
            self._committer.ensure_serving_state()  # a wiped Redis would read as rows that do not exist
            current = self._current_rows({key for key in keys if key is not None})
            merged: list[Any] = []
            for row, key in zip(rows, keys, strict=True):
                if key is not None:  # (without a valid key, upsert names the problem)
                    row = {**(current[key] or {}), **row}
                    if not self.schema.validate(row):
                        current[key] = row  # a later row of the key merges over this one
                merged.append(row)
            return self.upsert(merged)

    def _current_rows(self, keys: set[Key]) -> dict[Key, Row | None]:
        """Each key's row as this writer leaves it so far: queued (None for a queued delete), else committed."""
        with self._lock:
            rows = {key: self._pending[key] for key in keys if key in self._pending}
        unqueued = [key for key in keys if key not in rows]
        for start in range(0, len(unqueued), READ_CHUNK):  # bounded Redis replies
            chunk = unqueued[start:start + READ_CHUNK]
            found = self.store.row_list(self.entry.name, [encode_key(self.entry.key_columns, key) for key in chunk])
            rows.update((key, None if raw is None else decode_row(raw)) for key, raw in zip(chunk, found, strict=True))
        return rows

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

    def queue_normalized(self, changes: Mapping[Key, Row | None]) -> None:
        """Queue ``key -> row`` changes (None: a delete) that are already in the normalized form
        :meth:`upsert` gives, unchecked: each row has every column, in schema order, of its exact type,
        within the table's types and :attr:`text_limit`, and its key is its key columns' values. The fast
        path of a source ingester (:mod:`mvlog.source_fast`) decodes messages straight into such rows."""
        self._raise_background_error()
        with self._lock:
            self._pending.update(changes)

    def delete_unwritten(self) -> int:
        """Queue a delete of every committed row whose key no queued write touches: the queued writes
        then replace the table's rows (a Spark ``mode("overwrite")``). Reads the committed keys from
        Redis a batch at a time (HSCAN), so its memory is the queued writes plus one batch. Returns how
        many deletes it queued. Call it under the same caller that commits next (no epoch in between)."""
        self._raise_background_error()
        self._committer.ensure_serving_state()
        columns = self.entry.key_columns
        with self._lock:
            written = {encode_key(columns, key) for key in self._pending}
        gone: dict[Key, Row | None] = {}
        for kb, _ in self.store.scan_rows(self.entry.name):
            if kb not in written:
                gone[decode_key(columns, kb)] = _DELETED
        with self._lock:
            for key in gone:
                self._pending.setdefault(key, _DELETED)
        return len(gone)

    @property
    def text_limit(self) -> int:
        """Characters of strings and bytes up to which a row surely fits one record of the changelog."""
        return self._text_limit

    def discard(self) -> None:
        """Drop the writes queued since the last epoch: a source ingester that could not take a batch of
        messages whole stops without committing any of it (its committed offsets say it never read them)."""
        with self._lock:
            self._pending = {}

    def flush(self) -> int:
        """Commit everything queued so far as one epoch now; returns that epoch."""
        self._raise_background_error()
        self.wait_for_downstreams()
        committed = self.commit_epoch()
        return committed.epoch

    def commit_epoch(self, consumed: ConsumedInput | None = None,
                     side_records: Sequence[DeadLetterRecord] = ()) -> CommittedEpoch:
        """Fold the pending writes into one epoch and commit it to Kafka, then to Redis. ``consumed``:
        the input offsets these writes came from, committed in the epoch's transaction (source tables).
        ``side_records``: records for other topics (a source table's dead letters) produced in the same
        transaction, so they are committed exactly when the offsets that skipped them are."""
        with self._commit_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
            # Before-images come from Redis: they must be those of the last committed epoch, so a wiped
            # Redis is noticed (and rebuilt from Kafka) before the changes are computed, and after.
            changes = self._committer.compute(partial(self._encoder.changes, pending))
            epoch = self._clock.next()
            self._epochs_written += 1
            checkpoint = self._epochs_written % self.settings.checkpoint_frequency == 0
            follows = self._committer.mce
            # The Redis side of the epoch is queued (not applied) while the epoch is encoded and produced,
            # so redis-server parses it on the other core; it applies after the Kafka transaction commits.
            staged = self.store.stream_commit(self.entry.name, epoch, follows)

            def produce(writer: ChangelogWriter) -> CommittedEpoch:
                chunks = self._encoder.chunks(epoch, changes, staged)
                if side_records:
                    chunks = self._encoder.with_side_records(chunks, side_records)
                return writer.commit_records(epoch, follows, chunks, checkpoint=checkpoint, consumed=consumed)

            committed = self._committer.commit(epoch, produce, staged)
            assert committed is not None  # a streamed commit never withdraws its epoch
            return committed

    @property
    def record_limit_bytes(self) -> int:
        """The largest record (key + value) this table's transactional producer sends."""
        return self._writer.limit.bytes

    # --- background epochs (services/tables/epoch_loop.py) -------------------------------------------------

    def wait_for_downstreams(self, poll_s: float = 0.02) -> None:
        """Backpressure: while a downstream that set ``max_epoch_lag`` lags that many epochs behind this
        table, do not open another epoch (writes keep queueing). Returns as soon as it catches up, or when
        the table is closed. Without such a downstream this is one cached catalog look-up."""
        while self._backpressure.blocking(self.entry.name) and not self._closed.wait(poll_s):
            pass

    @property
    def loop_error(self) -> BaseException | None:
        """What stopped the background epoch loop (None: it runs, ran until closed, or there is none)."""
        return self._loop.error if self._loop is not None else None

    def _raise_background_error(self) -> None:
        error = self.loop_error
        if error is not None:
            raise RuntimeError(f"table {self.entry.name}: the epoch loop stopped: {error}") from error

    def close(self) -> None:
        """Stop the epoch loop after committing what is pending."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._loop is not None:
            self._loop.stop()
        if self.loop_error is None:
            with self._lock:
                has_pending = bool(self._pending)
            if has_pending:
                self.commit_epoch()
        self._committer.close()
        try:  # commits nothing more: joins over this table may plan past its last epoch (mvlog.join_bound)
            self._writers.close(self.entry.name, self._writer_token)
        except redis.RedisError as error:  # it stays open: joins wait for the next writer, nothing is lost
            log.warning("%s: could not record that its writer stopped: %s", self.entry.name, error)

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
