"""Re-deriving a view's changes for a range of epochs from its upstream changelog(s) (``mvlog replay derive``).

The view's incremental operator needs its state as of the epoch before the range. That state (per
group sums and counts, the min/max multisets, a join's indexes of both sides) is not in the view's own
changelog: summing that gives the view's *rows*, from which ``min`` after a delete or a join's other
side cannot be recovered. It is, however, a function of the upstream rows at that epoch. So the
upstream changelogs are summed up to the epoch before the range (rows(u, a)), fed to the operator as
one epoch of ``READ`` changes (the operator's hydration path, as a backfill does), and the range's
upstream epochs are then applied one by one, exactly as the view's consumer applied them. Each
re-derived epoch therefore equals the view's original epoch, change for change.

Two engines read the upstreams: ``local`` (the changelog reader, in this process; memory holds the
upstream rows and one epoch) and ``spark`` (the ``mvlog`` data source: executors read the partitions,
Spark SQL folds the prefix into rows per key, and the range is fetched in chunks of epochs).

Kafka's retention deletes a changelog's first epochs. An upstream whose changelog no longer starts at
its first epoch is read from its newest snapshot at or before the range (``mvlog snapshot``; the
changelog must hold every epoch after it): the snapshot's rows, then the changelog after it. Only the
``spark`` engine reads snapshots (their Parquet files).

Where the result goes is the caller's choice (:class:`TopicSink`, :class:`RedisRebuildSink`).
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from mvlog.catalog import CatalogEntry, CatalogError
from mvlog.changes import Change, Epoch, Op, apply_changes
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, encode_batch
from mvlog.connectors.kafka.retention import retained_epochs, starts_the_log
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.source_options import changelog_read
from mvlog.key_order import order_member
from mvlog.replay import ReplayRangeError, ReplayTargetError, RetainedRange
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import encode_key, encode_row
from mvlog.services.view_ddl import plan_for
from mvlog.snapshot_plan import SnapshotRecord
from mvlog.views import ChangeBatch, InMemoryState, ViewOperator
from mvlog.vnode import vnode_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ENGINES = ("local", "spark")
SPARK_CHUNK_EPOCHS = 200  # epochs fetched per Spark read of the range: bounds the driver's memory


@dataclass(frozen=True)
class DerivedEpoch:
    epoch: int
    prev_epoch: int
    changes: ChangeBatch  # the view's changes of the epoch


@dataclass(frozen=True)
class UpstreamRead:
    """What the derivation reads from one upstream: every epoch up to ``upto`` (prefix + range)."""

    name: str
    partitions: int
    upto: int  # its last committed epoch at or below the range's end
    prefix_epochs: int  # epochs before the range (summed into rows)
    range_epochs: int
    records: int  # change events to read (from the epoch index)
    end_offsets: dict[int, int]  # partition -> offset of the barrier of ``upto``
    #: Where its rows before the range start: None, its changelog's first epoch; else this snapshot, whose
    #: rows are read and its changelog after it (retention deleted the start; :func:`_prefix_start`).
    snapshot: SnapshotRecord | None = None


@dataclass
class DerivationPlan:
    view: str
    sources: tuple[str, ...]
    first: int  # first re-derived epoch
    last: int  # last re-derived epoch
    prev_epoch: int  # the epoch before ``first`` (0 if none)
    epochs: list[int]
    retained: RetainedRange
    upstreams: list[UpstreamRead] = field(default_factory=list)

    @classmethod
    def at_snapshot(cls, view: str, source: str, epoch: int) -> DerivationPlan:
        """A plan of no epoch: the state at ``epoch``, hydrated from ``source``'s snapshot there (its
        changelog is not read)."""
        return cls(view, (source,), epoch, epoch, epoch, [], RetainedRange(source, epoch, epoch))

    def upto(self, upstream: str) -> int:
        """The last epoch read from ``upstream``."""
        return self._read(upstream).upto

    def snapshot_of(self, upstream: str) -> SnapshotRecord | None:
        """The snapshot ``upstream``'s rows before the range start from (None: its changelog's first epoch)."""
        return self._read(upstream).snapshot

    def _read(self, upstream: str) -> UpstreamRead:
        return next(u for u in self.upstreams if u.name == upstream)

    def to_json(self) -> dict[str, Any]:
        return {"view": self.view, "sources": list(self.sources), "first_epoch": self.first,
                "last_epoch": self.last, "prev_epoch": self.prev_epoch, "epochs": len(self.epochs),
                "retained": {"oldest": self.retained.oldest, "latest": self.retained.latest},
                "upstreams": [{"view": u.name, "upto": u.upto, "prefix_epochs": u.prefix_epochs,
                               "range_epochs": u.range_epochs, "records": u.records,
                               "snapshot_epoch": u.snapshot.epoch if u.snapshot is not None else None,
                               "partitions": [{"partition": p, "start_offset": 0, "end_offset": o}
                                              for p, o in sorted(u.end_offsets.items())]}
                              for u in self.upstreams]}


def plan_derivation(settings: Settings, client: redis.Redis, view: str, from_epoch: int | None = None,
                    to_epoch: int | None = None) -> DerivationPlan:
    """Check the range against what the view and its upstreams retain; list the epochs to re-derive."""
    catalog = CatalogStore(settings, client)
    entry = catalog.get(view)
    if entry.kind != "view":
        raise CatalogError(f"{view!r} is a table: only views are re-derived (a table has no upstream)")
    index = EpochIndex(client, settings.topic_prefix)
    retained = retained_epochs(settings, index, view, entry.partitions)
    first_asked = retained.oldest if from_epoch is None else from_epoch
    last_asked = retained.latest if to_epoch is None else to_epoch
    retained.check_epoch(first_asked, "--from-epoch")
    retained.check_epoch(last_asked, "--to-epoch")
    if last_asked < first_asked:
        raise ReplayRangeError(f"{view}: --to-epoch {last_asked} is below --from-epoch {first_asked}")
    upstream_epochs: set[int] = set()
    reads: list[UpstreamRead] = []
    prev = 0
    for name in entry.sources:
        upstream = catalog.get(name)
        upto_entry = index.before(name, 0, last_asked + 1)
        upto = upto_entry.epoch if upto_entry is not None else 0
        inside = [e.epoch for e in index.between(name, 0, first_asked - 1, upto)]
        before = index.before(name, 0, first_asked)
        snapshot = _prefix_start(settings, client, upstream, before.epoch if before is not None else 0)
        prev = max(prev, before.epoch if before is not None else 0)
        upstream_epochs.update(inside)
        since = snapshot.epoch if snapshot is not None else 0
        records = sum(e.records for p in range(upstream.partitions) for e in index.between(name, p, since, upto))
        ends = {p: e.offset for p in range(upstream.partitions) if (e := index.at(name, p, upto)) is not None}
        prefix = len(index.between(name, 0, since, before.epoch)) if before is not None else 0
        reads.append(UpstreamRead(name, upstream.partitions, upto, prefix, len(inside), records, ends, snapshot))
    epochs = sorted(upstream_epochs)
    if not epochs:
        raise ReplayRangeError(f"{view}: no committed epoch between {first_asked} and {last_asked}")
    return DerivationPlan(view, entry.sources, epochs[0], epochs[-1], prev, epochs, retained, reads)


def _prefix_start(settings: Settings, client: redis.Redis, upstream: CatalogEntry, before: int
                  ) -> SnapshotRecord | None:
    """Where the upstream's rows as of epoch ``before`` (the range's start) are read from: its changelog's
    first epoch (None) while retention kept it; else its newest snapshot at or before ``before`` whose
    later epochs the changelog still holds. Refused, naming both, with neither."""
    from mvlog.services.snapshot_compaction import check_changelog_after  # Spark's side: not the CLI's import
    from mvlog.snapshot_plan import SnapshotError

    store = ViewStore(client, settings.topic_prefix)
    if starts_the_log(settings, store.index, upstream.name):
        return None
    try:
        oldest = retained_epochs(settings, store.index, upstream.name, upstream.partitions).oldest
        since = f"its oldest retained epoch is {oldest}"
    except ReplayRangeError as error:
        since = str(error).split(": ", 1)[-1]
    snapshot = SnapshotStore(client, settings.topic_prefix).latest(upstream.name, at_or_before=before)
    why_not = f"it has no snapshot at or before epoch {before} (mvlog snapshot {upstream.name})"
    if snapshot is not None:
        try:
            check_changelog_after(settings, store, upstream, snapshot.epoch)
            return snapshot
        except SnapshotError as error:
            why_not = f"its snapshot at epoch {snapshot.epoch} is not covered by the changelog ({error})"
    raise ReplayRangeError(f"{upstream.name}: re-deriving needs its changelog from its first epoch or a snapshot, "
                           f"but {since} (retention deleted the start) and {why_not}")


# ------------------------------------------------------------------------------------------ deriving


class Derivation:
    """Runs a :class:`DerivationPlan`: yields the re-derived epochs; afterwards ``rows`` and ``state``
    hold the view's rows and operator state as of the plan's last epoch."""

    def __init__(self, settings: Settings, client: redis.Redis, plan: DerivationPlan, engine: str = "local",
                 spark: SparkSession | None = None) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
        if engine == "local" and (read := next((u for u in plan.upstreams if u.snapshot is not None), None)):
            assert read.snapshot is not None
            raise ReplayRangeError(f"{read.name}: its changelog no longer starts at its first epoch, and the local "
                                   f"engine reads changelogs only: --engine spark starts from its snapshot at epoch "
                                   f"{read.snapshot.epoch}")
        self.settings = settings
        self.plan = plan
        self.engine = engine
        self._spark = spark
        catalog = CatalogStore(settings, client)
        self.entry = catalog.get(plan.view)
        self.upstreams = {name: catalog.get(name) for name in plan.sources}
        self.operator = ViewOperator(plan_for(catalog, plan.view, self.entry.sql or ""))
        self.index = EpochIndex(client, settings.topic_prefix)
        self.state = InMemoryState()
        self.rows: dict[Key, Row] = {}

    def epochs(self) -> Iterator[DerivedEpoch]:
        prefix, upstream_range = (self._spark_read() if self.engine == "spark" else self._local_read())
        self._hydrate(prefix())
        prev = self.plan.prev_epoch
        wanted = set(self.plan.epochs)
        for epoch, changes in upstream_range():
            if epoch not in wanted:
                continue
            output = self.operator.apply_epoch(changes, self.state)
            self.state.apply(output.state_writes)
            apply_changes(self.rows, output.changes.to_changes())
            yield DerivedEpoch(epoch, prev, output.changes)
            prev = epoch

    def _hydrate(self, rows: dict[str, list[Row]]) -> None:
        """The operator's state and the view's rows as of the epoch before the range."""
        changes = {name: self._batch(name, [Change(Op.READ, self.upstreams[name].schema.key_of(row), None, row)
                                            for row in found])
                   for name, found in rows.items()}
        output = self.operator.apply_epoch(changes, self.state)
        self.state.apply(output.state_writes)
        apply_changes(self.rows, output.changes.to_changes())

    def _batch(self, upstream: str, changes: list[Change]) -> ChangeBatch:
        """Upstream changes read in the row form (the changelog reader's) as the operator's input."""
        return ChangeBatch.from_changes(self.upstreams[upstream].schema, changes)

    # --- the local engine: changelog readers in this process ----------------------------------------

    def _local_read(self) -> tuple[Callable[[], dict[str, list[Row]]],
                                   Callable[[], Iterator[tuple[int, dict[str, ChangeBatch]]]]]:
        readers = [ChangelogReader(self.settings, u.name, self.upstreams[u.name].key_columns, u.partitions,
                                   self.index, upto_epoch=u.upto) for u in self.plan.upstreams if u.upto > 0]
        merged = heapq.merge(*(reader.epochs(idle_timeout=30.0) for reader in readers), key=lambda e: e.epoch)
        grouped = itertools.groupby(merged, key=lambda e: e.epoch)
        pending: list[tuple[int, list[Epoch]]] = []

        def prefix() -> dict[str, list[Row]]:
            rows: dict[str, dict[Key, Row]] = {name: {} for name in self.plan.sources}
            for epoch, same in grouped:
                group = list(same)
                if epoch > self.plan.prev_epoch:
                    pending.append((epoch, group))  # the range's first epoch: kept for the second phase
                    break
                for upstream_epoch in group:
                    apply_changes(rows[upstream_epoch.view], upstream_epoch.changes)
            return {name: list(found.values()) for name, found in rows.items()}

        def upstream_range() -> Iterator[tuple[int, dict[str, ChangeBatch]]]:
            try:
                for epoch, group in itertools.chain(pending, ((e, list(g)) for e, g in grouped)):
                    changes: dict[str, list[Change]] = {}
                    for upstream_epoch in group:
                        changes.setdefault(upstream_epoch.view, []).extend(upstream_epoch.changes)
                    yield epoch, {name: self._batch(name, found) for name, found in changes.items()}
            finally:
                for reader in readers:
                    reader.close()

        return prefix, upstream_range

    # --- the spark engine: the mvlog data source, executors reading the partitions ------------------

    def _spark_read(self) -> tuple[Callable[[], dict[str, list[Row]]],
                                   Callable[[], Iterator[tuple[int, dict[str, ChangeBatch]]]]]:
        from mvlog.services.pipeline.reading import EpochBatches, batches_from_arrow
        from mvlog.services.rederive.tasks import rows_before
        from mvlog.services.spark.session import spark_session

        spark = self._spark or spark_session(self.settings, app_name=f"mvlog-replay-{self.plan.view}")

        def prefix() -> dict[str, list[Row]]:
            rows: dict[str, list[Row]] = {}
            for name in self.plan.sources:
                frame = rows_before(spark, self.settings, self.index, self.plan, self.upstreams[name])
                rows[name] = [] if frame is None else \
                    frame.select(*self.upstreams[name].schema.names).toArrow().to_pylist()
            return rows

        def upstream_range() -> Iterator[tuple[int, dict[str, ChangeBatch]]]:
            epochs = self.plan.epochs
            after = self.plan.prev_epoch
            for start in range(0, len(epochs), SPARK_CHUNK_EPOCHS):
                upto = epochs[min(start + SPARK_CHUNK_EPOCHS, len(epochs)) - 1]
                chunk: EpochBatches = {}
                for name in self.plan.sources:
                    if self.index.between(name, 0, after, upto):
                        batches_from_arrow(changelog_read(spark, self.settings, name, after, upto).toArrow(),
                                           self.upstreams[name], chunk)
                for epoch in sorted(chunk):
                    yield epoch, chunk[epoch]
                after = upto

        return prefix, upstream_range


def last_images(frame: DataFrame) -> DataFrame:
    """The rows of a changelog read (the data source's signed rows) as of its last epoch: Spark SQL folds
    the log into each key's last signed row, kept when it asserts a row (its meta columns kept too)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812 (Spark's convention)

    latest = Window.partitionBy("_key").orderBy(F.desc("_epoch"), F.desc("_offset"), F.desc("_weight"))
    return (frame.where(F.col("_change_type") != "barrier").withColumn("_rank", F.row_number().over(latest))
            .where("_rank = 1 AND _weight > 0").drop("_rank"))


# --------------------------------------------------------------------------------------------- sinks


def new_replay_topic(settings: Settings, client: redis.Redis, entry: CatalogEntry, name: str | None) -> tuple[str, str]:
    """The name and topic of a new changelog for ``entry``'s re-derived epochs (``name``, or one made up),
    created with the view's partitions; refused when it is a table or view, or holds epochs already."""
    name = name or f"{entry.name}.replay-{uuid.uuid4().hex[:8]}"
    topic = settings.changelog_topic(name)
    check_topic_name(settings, client, name)
    ensure_topic(settings, topic, entry.partitions)
    return name, topic



class TopicSink:
    """Writes re-derived epochs to a new changelog ``<prefix>.<name>.changelog`` for inspection.

    Same wire format as the view's changelog (one transaction per epoch, barriers on every partition),
    and its epochs are indexed under ``name``, so ``ChangelogReader(settings, name, ...)`` and any Avro
    client read it like a view's changelog.
    """

    def __init__(self, settings: Settings, client: redis.Redis, entry: CatalogEntry, name: str | None = None) -> None:
        self.name, self.topic = new_replay_topic(settings, client, entry, name)
        self._writer = ChangelogWriter(settings, self.name, entry.key_columns, entry.partitions)
        self._key_columns = entry.key_columns
        self._index = EpochIndex(client, settings.topic_prefix)
        self.epochs = 0

    def write(self, derived: DerivedEpoch) -> None:
        encoded = encode_batch(self._key_columns, derived.changes)
        committed = self._writer.commit_batches(derived.epoch, derived.prev_epoch, [encoded])
        self._index.add(self.name, committed.index)
        self.epochs += 1

    def close(self) -> None:
        self._writer.close()


def check_topic_name(settings: Settings, client: redis.Redis, name: str) -> None:
    """Refuse a target that is a table or view (its changelog would be written to) or holds epochs already."""
    if CatalogStore(settings, client).find(name) is not None:
        raise ReplayTargetError(f"{name} is an existing table or view: choose another --topic-name")
    if EpochIndex(client, settings.topic_prefix).latest(name, 0) is not None:
        raise ReplayTargetError(f"{settings.changelog_topic(name)} already holds re-derived epochs: "
                                "choose another --topic-name")


class RedisRebuildSink:
    """Replaces the view's serving rows and operator state in Redis with the re-derived ones, at the
    view's MCE (refused if the MCE moved meanwhile: a running consumer owns the view)."""

    def __init__(self, store: ViewStore, entry: CatalogEntry) -> None:
        self.store = store
        self.entry = entry

    def finish(self, derivation: Derivation) -> int:
        return self.swap(derivation.rows, derivation.state.data, derivation.plan.last)

    def swap(self, view_rows: Mapping[Key, Row], state: Mapping[bytes, bytes], epoch: int) -> int:
        """Put ``view_rows`` and ``state``, both as of ``epoch``, in place of the view's (one script; refused
        when the MCE is no longer ``epoch``); returns the number of rows."""
        rows, order = serving_rows(self.entry.key_columns, view_rows)
        if not self.store.replace_state(self.entry.name, epoch, rows, state, order):
            raise ReplayRangeError(f"{self.entry.name}: its MCE is no longer {epoch}; a consumer "
                                   "of the view is running: stop it before rebuilding")
        return len(rows)


def serving_rows(key_columns: Sequence[str], view_rows: Mapping[Key, Row]) -> tuple[dict[bytes, bytes], list[bytes]]:
    """A view's rows as Redis serves them: encoded key -> encoded row, and the key-order members."""
    columns = tuple(key_columns)
    keys = {key: encode_key(columns, key) for key in view_rows}
    return ({keys[key]: encode_row(row) for key, row in view_rows.items()},
            [order_member(vnode_of(encoded), key, encoded) for key, encoded in keys.items()])
