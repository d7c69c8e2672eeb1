"""A view's upstream changelogs read through Spark (``format("mvlog")``), as epochs of Arrow rows.

Executors read Kafka; the driver gets each epoch's changes as one columnar
:class:`~mvlog.views.ChangeBatch` per upstream (the data source's signed rows), so a row never becomes a
Python object on the way to the operator. The row form (:class:`~mvlog.changes.Change`) is made only
where a consumer of it needs it: a chunked backfill and a replacement's hydration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change
from mvlog.config import Settings
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.spark.change_rows import arrow_schema, end_marker, epoch_slices
from mvlog.connectors.spark.source_options import SMALL_READ_OPTION, changelog_read, connection_options
from mvlog.connectors.spark.spark_source import ReadRanges, plan_ranges, spark_schema_ddl
from mvlog.views import ChangeBatch

EpochBatches = dict[int, dict[str, ChangeBatch]]  # epoch -> upstream view -> its changes


def batches_from_arrow(table: pa.Table, upstream: CatalogEntry, into: EpochBatches, name: str | None = None) -> None:
    """Each epoch's changes in the data source's signed rows, as one batch per epoch (barrier-only epochs
    too: their barriers still have to be committed), under ``name`` (the upstream's unless given: a
    self-join's second side's, :meth:`~mvlog.views.join_routing.JoinRouting.inputs`). The rows of a change
    share its partition and offset; they are paired in Arrow, so a row never becomes a Python object here."""
    for epoch, rows in epoch_slices(table):
        change_ids = pc.add(pc.multiply(rows.column("_partition").cast(pa.int64()), 1 << 40), rows.column("_offset"))
        into.setdefault(epoch, {})[name or upstream.name] = ChangeBatch.from_signed(
            upstream.schema, rows, rows.column("_weight"), change_ids)


class UpstreamEpochLostError(RuntimeError):
    """An upstream epoch a consumer was about to compute is no longer committed upstream."""


class UpstreamReader:
    """Reads the upstreams ``upstreams`` (name -> catalog entry) of one view; ``index``: their epoch index."""

    def __init__(self, settings: Settings, spark: SparkSession, upstreams: Mapping[str, CatalogEntry],
                 index: EpochIndex, max_epochs_per_trigger: int, *, task_per_partition: bool = False) -> None:
        self.settings, self.spark, self.upstreams, self.index = settings, spark, dict(upstreams), index
        self.max_epochs_per_trigger = max_epochs_per_trigger
        #: A view whose operator runs in tasks: its batch reads (a catch-up's ranges) are a Spark task per
        #: upstream partition, planned here (:meth:`frame`). Its stream reads a small micro-batch as one
        #: task like any other (``Settings.small_read_records``): a filter's task then runs the
        #: partitions it holds one after the other, a GROUP BY or a join shuffles them anyway.
        self.task_per_partition = task_per_partition

    def require_committed(self, view: str, sources: Sequence[str], epoch: int) -> None:
        """Refuse an upstream epoch that its upstream's epoch index no longer has.

        A micro-batch planned before Redis was wiped may hold the upstream's last epoch, which the rebuild
        abandons when nothing proves it committed (its writer died before saying so): computing it would
        leave view ``view`` holding an epoch its upstream dropped. Raising restarts the consumer, which
        plans again from the rebuilt index."""
        if not any(self.index.between(source, 0, epoch - 1, epoch) for source in sources):
            raise UpstreamEpochLostError(f"{view}: epoch {epoch} is no longer in the epoch index of "
                                         f"{', '.join(sources)} (abandoned after Redis was wiped); "
                                         "restart to plan again from the index")

    def stream(self, sources: Sequence[str], after: int) -> DataFrame:
        """The streaming read of ``sources`` from the epoch after ``after``: the first one's rows; for a join,
        in micro-batches over the union of all of their epochs, each ending with the data source's end
        marker (``alignWith``), up to which the consumer reads the others."""
        reader = self.spark.readStream.format("mvlog").options(**connection_options(self.settings))
        reader = reader.option("view", sources[0]).option(SMALL_READ_OPTION, str(self.settings.small_read_records))
        reader = reader.option("startingEpoch", str(after))
        reader = reader.option("maxEpochsPerTrigger", str(self.max_epochs_per_trigger))
        reader = reader.option("maxRecordsPerTrigger", str(self.settings.max_records_per_trigger))
        if len(sources) > 1:
            reader = reader.option("alignWith", ",".join(sources[1:]))
        return reader.load()

    def frame(self, view: str, after: int, upto: int) -> DataFrame:
        """One upstream's epochs in ``(after, upto]`` (a batch read, not run yet). With a task per partition,
        planned here and read by the tasks of ``spark.range`` (:class:`ReadRanges`): no Python worker of
        the driver's JVM plans it, and the driver's work per micro-batch stays a few Redis reads."""
        if self.task_per_partition:
            ranges = plan_ranges(self.settings, self.upstreams[view], after, upto)
            ids = self.spark.range(0, len(ranges), 1, numPartitions=max(1, len(ranges)))
            return ids.mapInArrow(ReadRanges(tuple(ranges)).run, spark_schema_ddl(self.upstreams[view].schema))
        return changelog_read(self.spark, self.settings, view, after, upto,
                              **{SMALL_READ_OPTION: str(self.settings.small_read_records)})

    def read_range(self, view: str, after: int, upto: int) -> pa.Table:
        """One upstream's epochs in ``(after, upto]``, collected to the driver (a batch job)."""
        return self.frame(view, after, upto).toArrow()

    def read_settled(self, view: str, after: int, upto: int) -> pa.Table:
        """:meth:`read_range` of a join's upstream up to ``upto`` or its latest epoch, whichever is lower.

        A join plans up to a bound that every upstream has settled (``plan_through``): a running upstream's
        latest epoch is at or above it, and a stopped table behind it was sealed through it, so it commits
        nothing in (its latest, ``upto``]: its epochs up to its latest are all it has there."""
        upto = self.settled_upto(view, upto)
        if upto <= after:
            return pa.Table.from_batches([], schema=arrow_schema(self.upstreams[view].schema))
        return self.read_range(view, after, upto)

    def settled_upto(self, view: str, upto: int | None) -> int:
        """``upto`` (None: no bound) or ``view``'s latest epoch, whichever is lower (:meth:`read_settled`)."""
        latest = self.index.latest(view, 0)
        last = latest.epoch if latest is not None else 0
        return last if upto is None else min(upto, last)

    def read_aligned(self, sources: Sequence[str], after: int, upto: int) -> pa.Table:
        """A join's first upstream in ``(after, upto]`` and the end marker at ``upto``: a backlog
        micro-batch as the stream delivers it (``alignWith``), up to which the others are then read."""
        marker = end_marker(self.upstreams[sources[0]].schema, upto)
        return pa.concat_tables([self.read_settled(sources[0], after, upto), marker], promote_options="permissive")

    def with_undelivered(self, view: str, after: int, table: pa.Table) -> pa.Table:
        """``table``, a micro-batch the stream delivered, preceded by ``view``'s epochs after ``after`` it
        never delivered (planned while Redis was wiped), read now."""
        first = pc.min(table.column("_epoch")).as_py() if len(table) else None
        if first is None or not self.index.between(view, 0, after, first - 1):
            return table
        return pa.concat_tables([self.read_range(view, after, first - 1), table], promote_options="default")

    def backlog_read(self, sources: Sequence[str], after: int, upto: int) -> pa.Table:
        """A backlog micro-batch in ``(after, upto]`` as the stream delivers it: one upstream's epochs, or
        a join's first upstream with its end marker (:meth:`read_aligned`: a join's micro-batch may end on
        an epoch of another upstream)."""
        if len(sources) == 1:
            return self.read_range(sources[0], after, upto)
        return self.read_aligned(sources, after, upto)

    def epochs(self, sources: Sequence[str], after: int, upto: int, into: EpochBatches | None = None, *,
               settled: bool = False) -> EpochBatches:
        """The epochs in ``(after, upto]`` of each of ``sources``, added to ``into``; ``settled``: ``upto`` is
        a join's bound, each source read up to its latest epoch below it (:meth:`read_settled`)."""
        into = {} if into is None else into
        read = self.read_settled if settled else self.read_range
        for source in sources:
            batches_from_arrow(read(source, after, upto), self.upstreams[source], into)
        return into

    def changes(self, source: str, after: int, upto: int) -> list[Change]:
        """One upstream's changes of its epochs in (after, upto], in epoch order, in the row form (a
        replacement's hydration nets them in one operator step)."""
        epochs = self.epochs([source], after, upto)
        return [change for epoch in sorted(epochs) for change in epochs[epoch][source].to_changes()]

    def history(self, sources: Sequence[str], after: int, upto: int) -> dict[str, list[Change]]:
        """Each of ``sources``' changes of its epochs in (after, upto], read from its changelog."""
        return {source: self.changes(source, after, upto) for source in sources}
