"""``view_runner`` that SIGKILLs itself at a chosen moment of a replacement's life (fault injection).

Usage: python -m tests.integration.processes.replacement_runner SETTINGS_JSON KILL_AT VIEW [VIEW ...]

KILL_AT is one of:

- ``none``: run until killed from outside;
- ``hydrate``: after reading the upstream history, before the replacement's first commit (hydrated
  on the driver), or after Spark's tasks staged its first state, before the swap (hydrated in tasks);
- ``cutover_kafka``: after the cut-over epoch (diff + apply_replacement barriers) committed to Kafka,
  before the Redis cut-over;
- ``cutover_redis``: after the Redis cut-over, before the view's catalog entry is rewritten;
- ``followed``: after Spark's tasks committed the replacement's second epoch above its view's MCE (the
  view's operators in tasks; a micro-batch of several epochs), before the view's tasks ran them.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence

from mvlog.changes import IndexEntry
from mvlog.connectors.redis.partition_staging import StagedCounts
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.view_meta import ViewMeta
from mvlog.services.replacement.follower import ReplacementFollower
from mvlog.views import ChangeBatch

from .view_runner import main


def _die() -> None:
    sys.stdout.flush()
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
