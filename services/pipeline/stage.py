"""The stages of a view's epoch pipeline: what sits between the upstream epochs and the commit.

For every upstream epoch the consumer (:mod:`mvlog.services.pipeline.view_consumer`) runs the same
short loop: its stages see the epoch (:meth:`Stage.before_epoch`), the view's operator computes the
epoch's changes, the :class:`~mvlog.services.pipeline.committer.EpochCommitter` commits them, and the
stages hear of it (:meth:`Stage.after_commit`). A chunked backfill, a snapshot seeding the first epoch, a
replacement followed, hydrated and cut over: each is one stage, in its own package
(:mod:`mvlog.services.backfill.stages`, :mod:`mvlog.services.replacement.stage`), instead of a branch of
the consumer. The interface is small on purpose; what a stage may do to an epoch is:

* change its input (a chunked backfill keeps the changes at or below its positions and adds a chunk);
* add to its commit, so that the stage's progress commits with the epoch, atomically, in Redis
  (:attr:`EpochWork.commit_fields`) and on the barriers (:attr:`EpochWork.mutation`), where a rebuild
  from Kafka finds it again;
* take the epoch: commit it itself through the committer (a replacement's cut-over), the operator then
  does not run.

Work that does not belong to an epoch (a replacement staged while the upstream is idle, a snapshot to
load before anything is read) is :meth:`Stage.upkeep`. The consumer calls the stages from one thread
at a time (its lock): stages need no locking of their own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from mvlog.changes import Mutation
from mvlog.views import ChangeBatch


@dataclass
class EpochWork:
    """One upstream epoch on its way through the pipeline."""

    epoch: int
    inputs: dict[str, ChangeBatch]  # each upstream's changes (an absent upstream had none)
    #: More of the epoch's Redis commit (keyword arguments of ``EpochCommit``: a backfill's positions).
    commit_fields: dict[str, Any] = field(default_factory=dict)
    mutation: Mutation | None = None  # on the epoch's barriers
    taken: bool = False  # a stage committed the epoch itself: the operator does not run
    started: float = field(default_factory=time.monotonic)


class Stage(Protocol):
    """One concern on the epoch pipeline (see the module's docstring)."""

    def upkeep(self) -> None:
        """Before each micro-batch is applied and before a backlog is read, and every second while no
        micro-batch comes."""
        ...

    def before_epoch(self, work: EpochWork) -> None:
        """See the epoch before the operator: change its input, add to its commit, or take it."""
        ...

    def after_commit(self, work: EpochWork) -> None:
        """The epoch committed (Kafka and Redis)."""
        ...

    @property
    def finished(self) -> bool:
        """Nothing more to do: the pipeline drops the stage."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing to do to the next epochs for now (:meth:`before_epoch` would leave them as they are):
        they may be computed where the stage never sees them, in Spark's tasks."""
        ...
