"""A two-view join's rows and operator state re-derived in Spark's tasks, for a rebuild after a Redis wipe.

A join's live epochs take two shuffles (:mod:`mvlog.services.pipeline.join_tasks`): by join key for the
operator and its state, then by the view's key for the changelog partitions. A rebuild writes no
changelog, so it needs the first only: the join's state is per join key, and each of its rows comes from
the pairs (or the unmatched row) of one join key, so the task of join-key partition ``j`` holds every
input row and state key it needs, and stages rows no other task stages.

1. Spark SQL folds each side's changelog into its rows at the view's MCE (each key's last image, as
   ``replay derive`` folds a prefix), shaped as one epoch of inserts, and each row goes to the partition
   of its join key (:class:`~mvlog.services.pipeline.join_tasks.RouteJoinRows`, the live path's routing);
2. task ``j`` hydrates a fresh operator from its rows (the operator's hydration path: one epoch of the
   whole input, as a backfill's first step) and stages the rows it computes, their key-order members and
   its operator state for the rebuild (:meth:`~mvlog.connectors.redis.epoch_commit.EpochCommits.stage_rebuild`:
   several writers stage disjoint parts; a retried task stages the same values again);
3. the driver swaps the staged rebuild in for the view's in one script, refused when the MCE moved.

The driver collects one small row per partition: it never holds the upstreams' rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's convention)
from pyspark.sql.pandas.types import from_arrow_schema

from mvlog.catalog import CatalogEntry
from mvlog.changes import apply_changes
from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.job_progress import JobProgress
from mvlog.connectors.spark.source_options import changelog_read
from mvlog.replay import ReplayRangeError
from mvlog.row_schema import Key, Row
from mvlog.services.pipeline.join_tasks import RouteJoinRows, shuffled_schema, sides
from mvlog.services.pipeline.partition_tasks import (
    ROUTE_TOKEN,
    VIEW_PARTITION,
    check_owned,
    own_partition,
    require_every_partition,
)
from mvlog.services.pipeline.reading import EpochBatches, batches_from_arrow
from mvlog.services.rederive import DerivationPlan, last_images, serving_rows
from mvlog.services.rederive_tasks import STAGED_DDL, STAGED_SCHEMA, RebuiltState, replay_session
from mvlog.services.view_ddl import plan_for
from mvlog.views import InMemoryState, ViewOperator, ViewPlan
from mvlog.views.join_routing import JoinRouting, two_view_equi_join


@dataclass(frozen=True)
class JoinRebuildJob:
    """``mapInArrow``'s function after the join-key shuffle: one join-key partition's part of the rebuild
    (pickled to the executors)."""

    settings_json: str
    view: CatalogEntry
    upstreams: tuple[CatalogEntry, CatalogEntry]  # by side
    plan: ViewPlan
    routing: JoinRouting
    epoch: int  # the view's MCE: the one epoch the folded rows carry

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found = own_partition(batches, VIEW_PARTITION)
        if found is not None:
            partition, rows = found
            yield pa.RecordBatch.from_pylist([self.stage(partition, rows)], schema=STAGED_SCHEMA)

    def stage(self, partition: int, rows: pa.Table | None) -> dict[str, Any]:
        """Partition ``partition``'s rows and operator state at the epoch, staged for the view's rebuild."""
        epochs: EpochBatches = {}
        if rows is not None:
            for upstream, mine in zip(self.upstreams, sides(rows, self.upstreams), strict=True):
                batches_from_arrow(mine, upstream, epochs)
        state = InMemoryState()
        view_rows: dict[Key, Row] = {}
        if (inputs := epochs.get(self.epoch)) is not None:
            output = ViewOperator(self.plan).apply_epoch(inputs, state)
            state.apply(output.state_writes)
            apply_changes(view_rows, output.changes.to_changes())
        check_owned(self.view.name, partition, dict.fromkeys(state.data), self.routing.partitions_of_state_keys)
        encoded, order = serving_rows(self.view.key_columns, view_rows)
        settings = Settings.from_executor_json(self.settings_json)
        ViewStore(redis_client.task_client(settings), settings.topic_prefix).stage_rebuild(
            self.view.name, encoded, state.data, order)
        return {"partition": partition, "rows": len(encoded), "state": len(state.data), "changes": 0}


class JoinRebuild:
    """Rebuilds the rows and operator state of a two-view join at its MCE in Spark's tasks (see the module)."""

    def __init__(self, settings: Settings, client: redis.Redis, plan: DerivationPlan, view: CatalogEntry,
                 upstreams: tuple[CatalogEntry, CatalogEntry], view_plan: ViewPlan,
                 spark: SparkSession | None = None) -> None:
        self.settings, self.client, self.plan, self._spark = settings, client, plan, spark
        self.view, self.upstreams, self.view_plan = view, upstreams, view_plan
        self.routing = JoinRouting(view_plan, view.partitions)

    @property
    def spark(self) -> SparkSession:
        """The session the job runs in (a consumer's, or made on first use: a dry run starts no Spark)."""
        if self._spark is None:
            self._spark = replay_session(self.settings, self.view.name)
        return self._spark

    @classmethod
    def for_plan(cls, settings: Settings, client: redis.Redis, plan: DerivationPlan,
                 spark: SparkSession | None = None) -> JoinRebuild | None:
        """The rebuild in tasks, or None when the view is not a join the tasks run
        (:func:`~mvlog.views.join_routing.two_view_equi_join`)."""
        catalog = CatalogStore(settings, client)
        view = catalog.get(plan.view)
        view_plan = plan_for(catalog, view.name, view.sql or "")
        if len(view.sources) != 2 or not two_view_equi_join(view_plan):
            return None
        first, second = JoinRouting(view_plan, view.partitions).upstreams()
        return cls(settings, client, plan, view, (catalog.get(first), catalog.get(second)), view_plan, spark)

    def rebuild(self, on_progress: Callable[[int, int], None] | None = None) -> RebuiltState:
        """Recompute the view's rows and operator state at the plan's last epoch, which must be its MCE, and
        swap them in (refused, nothing changed, when the MCE moved meanwhile). ``on_progress(tasks done,
        tasks)``: called while the job runs."""
        store = ViewStore(self.client, self.settings.topic_prefix)
        store.clear_rebuild(self.view.name)
        job = JoinRebuildJob(self.settings.to_executor_json(), self.view, self.upstreams, self.view_plan,
                             self.routing, self.plan.last)
        with JobProgress(self.spark, f"mvlog-rebuild-{self.view.name}", on_progress):
            shuffled = self._input().repartition(self.view.partitions, ROUTE_TOKEN)
            results = shuffled.mapInArrow(job.run, STAGED_DDL).toArrow().to_pylist()
        require_every_partition(f"{self.view.name}: the rebuild", (row["partition"] for row in results),
                                self.view.partitions)
        if not store.swap_rebuild(self.view.name, self.plan.last):
            raise ReplayRangeError(f"{self.view.name}: its MCE is no longer {self.plan.last}; a consumer "
                                   "of the view is running")
        return RebuiltState(sum(row["rows"] for row in results), 0)

    def _input(self) -> DataFrame:
        """Each side's rows at the MCE, one epoch of inserts, routed to the partitions of their join keys."""
        schema = shuffled_schema(self.upstreams)
        frames = []
        for side, upstream in enumerate(self.upstreams):
            folded = last_images(changelog_read(self.spark, self.settings, upstream.name, 0,
                                                self.plan.upto(upstream.name)))
            rows = (folded.withColumn("_epoch", F.lit(self.plan.last).cast("bigint"))
                    .withColumn("_change_type", F.lit("insert")).withColumn("_weight", F.lit(1).cast("int")))
            frames.append(rows.mapInArrow(RouteJoinRows(self.routing, side, schema).run, from_arrow_schema(schema)))
        return frames[0].union(frames[1])
