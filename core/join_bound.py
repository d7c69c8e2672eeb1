"""How far a view over several upstreams (a join, a union) may plan: the epoch all its upstreams have settled.

A view's epochs are the union of its upstreams' epochs (each upstream keeps its own clock). Epoch ``e`` of
the view is ``Q`` over every upstream's rows at its last epoch at or below ``e``, so the view may commit
``e`` only once no upstream can still commit an epoch at or below it. An upstream whose writer runs will
only commit epochs above its latest one, so the least of the running upstreams' latest epochs is safe.

An upstream table whose writer **stopped cleanly** (``Table.close``: a ``run-source`` that caught up or was
told to stop, a Table API writer closed) commits nothing until a new writer opens, and a new writer's first
epoch is above the table's *seal*. A reader that seals the stopped table through ``E`` (atomically, only
while no writer is open: :mod:`mvlog.connectors.redis.table_writers`) may therefore plan past that table's
last epoch up to ``E``. Without this, a join whose table's ingester stopped would wait forever for an
epoch that table never cuts, and everything its other table committed after that epoch would stay out of
the view. A killed writer is not *stopped*: its table is sealed by nobody, and the join waits for the
restarted writer, whose epochs keep coming.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class UpstreamProgress:
    """One upstream as a planner sees it: ``latest`` its last committed epoch (0: none); ``stopped`` its
    writer closed cleanly and no other writer is open (only ever true of a table)."""

    name: str
    latest: int
    stopped: bool = False


@dataclass(frozen=True)
class PlanBound:
    """``epoch``: the last epoch a view over the upstreams may plan through now; ``seal``: the stopped
    upstreams that must be sealed through ``epoch`` before planning past their own last epoch."""

    epoch: int
    seal: tuple[str, ...] = ()


def plan_bound(upstreams: Sequence[UpstreamProgress]) -> PlanBound:
    """The bound over ``upstreams``: the least latest epoch of those whose writers run; when every one
    stopped, the greatest latest epoch (each stopped one has nothing more to give). Stopped upstreams
    behind the bound are to be sealed through it; those at or past it need no seal (their next epoch is
    above their latest anyway)."""
    if not upstreams:
        raise ValueError("a view has at least one upstream")
    running = [u.latest for u in upstreams if not u.stopped]
    epoch = min(running) if running else max(u.latest for u in upstreams)
    return PlanBound(epoch, tuple(u.name for u in upstreams if u.stopped and u.latest < epoch))


def union_epochs(per_upstream: Sequence[Sequence[tuple[int, int]]], after: int, upto: int) -> list[tuple[int, int]]:
    """The view's epochs in ``(after, upto]``: the union of its upstreams' ``(epoch, records)`` pairs,
    ascending, the records of an epoch two upstreams share summed (what a micro-batch's record limit counts)."""
    records: dict[int, int] = {}
    for epochs in per_upstream:
        for epoch, count in epochs:
            if after < epoch <= upto:
                records[epoch] = records.get(epoch, 0) + count
    return sorted(records.items())
