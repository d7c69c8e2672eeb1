"""``view_runner`` that SIGKILLs itself at a chosen moment of a replacement's life (fault injection).

Usage: python -m tests.integration.processes.replacement_runner SETTINGS_JSON KILL_AT VIEW [VIEW ...]

KILL_AT is one of:

- ``none``: run until killed from outside;
- ``hydrate``: after reading the upstream history, before the replacement's first commit (hydrated
  on the driver), or after Spark's tasks staged its first state, before the swap (hydrated in tasks);
- ``cutover_kafka``: after the cut-over epoch (diff + apply_replacement barriers) committed to Kafka,
  before the Redis cut-over;
- ``cutover_redis``: after the Redis cut-over, before the view's catalog entry is rewritten;
- ``cutover_partition``: the cut-over in Spark's tasks, its driver SIGKILLed by view partition 0's task
  right after that task committed its part to Kafka (the other partitions have committed theirs or not);
- ``followed``: after Spark's tasks committed the replacement's second epoch above its view's MCE (the
  view's operators in tasks; a micro-batch of several epochs), before the view's tasks ran them.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark import TaskContext

from mvlog.changes import IndexEntry
from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.partition_staging import StagedCounts
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.view_meta import ViewMeta
from mvlog.services.pipeline.task_epochs import TaskEpochs
from mvlog.services.replacement.follower import ReplacementFollower
from mvlog.services.replacement.stage import ReplacementStage
from mvlog.views import ChangeBatch

from .view_runner import main


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class KillAtCutOver:
    """Runs in the cut-over's tasks (:attr:`PartitionTarget.on_written`): the first attempt of view partition
    0's, once it committed its part, SIGKILLs the driver and then its own Python worker."""

    driver_pid: int
    settings_json: str
    view: str

    def __call__(self, partition: int, epoch: int) -> None:
        context = TaskContext.get()
        if partition != 0 or (context is not None and context.attemptNumber() > 0):
            return
        settings = Settings.from_executor_json(self.settings_json)
        record = ReplacementStore(redis_client.task_client(settings), settings.topic_prefix).record(self.view)
        if record is not None and record.cut_epoch == epoch:  # not a view's epoch before the cut-over's
            os.kill(self.driver_pid, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


def install(kill_at: str) -> None:
    if kill_at == "hydrate":
        commit = ReplacementFollower._commit

        def die_on_hydration(self: ReplacementFollower, epoch: int, inputs: Mapping[str, ChangeBatch],
                             fields: Mapping[str, str | int] | None = None) -> None:
            if self.mce is None:
                _die()
            commit(self, epoch, inputs, fields)

        ReplacementFollower._commit = die_on_hydration  # type: ignore[method-assign]

        def die_before_the_swap(self: ReplacementStore, view: str, replacement_id: str, epoch: int,
                                fields: Mapping[str, str | int] | None = None) -> bool:
            _die()
            return False

        ReplacementStore.swap_hydration = die_before_the_swap  # type: ignore[method-assign]
    elif kill_at in ("cutover_kafka", "cutover_redis"):
        apply = ReplacementStore.apply

        def die_around_cutover(self: ReplacementStore, view: str, replacement_id: str, epoch: int,
                               index: Mapping[int, IndexEntry], version: int, order_added: Sequence[bytes] = (),
                               order_removed: Sequence[bytes] = ()) -> bool:
            if kill_at == "cutover_kafka":
                _die()
            applied = apply(self, view, replacement_id, epoch, index, version, order_added, order_removed)
            if applied:
                _die()
            return applied

        ReplacementStore.apply = die_around_cutover  # type: ignore[method-assign]
    elif kill_at == "cutover_partition":
        cut_over = ReplacementStage.cut_over_in_tasks

        def with_a_kill(self: ReplacementStage, view_tasks: TaskEpochs, upto: int | None) -> bool:
            view_tasks.on_written = KillAtCutOver(os.getpid(), view_tasks.settings.to_executor_json(),
                                                  view_tasks.entry.name)
            return cut_over(self, view_tasks, upto)

        ReplacementStage.cut_over_in_tasks = with_a_kill  # type: ignore[method-assign]
    elif kill_at == "followed":
        commit_partitions = ReplacementStore.commit_partitions
        ahead: list[int] = []  # the replacement's epochs above its view's MCE

        def die_ahead_of_the_view(self: ReplacementStore, view: str, replacement_id: str, epoch: int,
                                  staged: Mapping[int, StagedCounts]) -> bool:
            committed = commit_partitions(self, view, replacement_id, epoch, staged)
            mce = ViewMeta(self.redis, self.prefix).mce(view) or 0
            if committed and epoch > mce:
                ahead[:] = [*(e for e in ahead if e > mce), epoch]
                if len(ahead) >= 2:  # two epochs ahead: the view's next epoch is not the replacement's
                    _die()
            return committed

        ReplacementStore.commit_partitions = die_ahead_of_the_view  # type: ignore[method-assign]
    elif kill_at != "none":
        raise SystemExit(f"unknown kill point {kill_at!r}")


if __name__ == "__main__":
    install(sys.argv.pop(2))
    main()
