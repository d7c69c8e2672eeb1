"""A staged replacement followed in Spark's tasks, beside its view's own epochs there (issue 19, item 5).

A view whose operator runs in Spark's tasks would otherwise go the driver's way for as long as a
replacement is staged: the follower (:mod:`~mvlog.services.replacement.follower`) applies the replacement's
operator to each epoch the driver collected, so the view's rows, and the replacement's, would pass through
the driver again. Instead, once the replacement is hydrated and while no apply is pending, each of the
view's micro-batches in tasks first runs the replacement's definition over the same epochs, with the
replacement's own routing (:class:`~mvlog.services.pipeline.task_epochs.TaskEpochs`, its
:class:`~mvlog.services.pipeline.partition_tasks.PartitionTarget` naming the replacement): each view
partition's task reads the replacement's operator state, computes its part of each epoch, and stages its
rows and state under the replacement's keys, writing nothing to Kafka; the driver then commits each
epoch into the replacement with one script (:class:`ReplacementCommits`). The replacement commits
before the view, as the follower does, so after a crash it is never behind the view; the epochs it is
ahead are skipped (their tasks see its MCE) while the view redoes them.

The cut-over runs in tasks too (:mod:`~mvlog.services.replacement.cut_over`): with an apply pending, the
replacement follows here to exactly the view's next epoch, and that epoch is the cut-over's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis.partition_staging import BackfillCommit
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.replacement import applied_entry
from mvlog.services.pipeline.partition_tasks import require_every_partition
from mvlog.services.pipeline.task_epochs import TaskEpochs, staged_counts
from mvlog.services.replacement.follower import ReplacementFollower


class ReplacementCommits:
    """Commits the epochs of ``follower``'s replacement that Spark's tasks computed and staged
    (:class:`~mvlog.services.pipeline.task_epochs.TaskCommits`); moves the follower's MCE with them."""

    def __init__(self, store: ReplacementStore, follower: ReplacementFollower, partitions: int) -> None:
        self.store, self.follower, self.partitions = store, follower, partitions
        self.replacement_id: str | None = follower.id
        self.epochs_committed = 0

    @property
    def mce(self) -> int:
        return self.follower.mce or 0

    def ensure_serving_state(self) -> bool:
        return False  # a wiped Redis lost the replacement's record too: the view's consumer rebuilds the view

    def start_offsets(self) -> dict[int, int]:
        return {}  # a replacement's epochs are in Redis only: no changelog to look in

    def commit(self, epoch: int, rows: Sequence[Mapping[str, int]], backfill: BackfillCommit | None) -> None:
        view = self.follower.view
        require_every_partition(f"{view}: replacement {self.follower.id}, epoch {epoch}",
                                (row["partition"] for row in rows), self.partitions)
        if self.store.commit_partitions(view, self.follower.id, epoch, staged_counts(rows)):
            self.epochs_committed += 1
        self.follower.mce = max(self.mce, epoch)  # committed now, or by an earlier consumer


def follower_tasks(settings: Settings, client: redis.Redis, entry: CatalogEntry,
                   upstreams: Mapping[str, CatalogEntry], follower: ReplacementFollower,
                   store: ReplacementStore) -> tuple[TaskEpochs, ReplacementCommits] | None:
    """The task path of view ``entry``'s staged replacement, and what commits its epochs; None when its
    definition does not run in tasks, or reads its upstreams in another order than the view (the view's
    stream hands its micro-batch as the first upstream's)."""
    plan = follower.plan
    if list(plan.sources) != list(entry.sources):
        return None
    replacement = applied_entry(entry, follower.sql, plan.schema, plan.sources, entry.version)
    commits = ReplacementCommits(store, follower, entry.partitions)
    tasks = TaskEpochs.for_definition(settings, replacement, upstreams, plan, commits, client)
    return (tasks, commits) if tasks is not None else None
