"""Which Nexmark queries run in Spark's tasks (issue 19 item 2): every query mvlog's planner takes, but q7,
whose join key is an aggregate's result (the highest price of each window). Pure: the planner and the
choice of task path, as ``mvlog create-view`` makes it."""

from __future__ import annotations

from bench.nexmark_suite.mvlog_tables import DECLARATIONS, plan_queries
from mvlog.views.task_path import Upstream, task_path


def test_every_planned_nexmark_query_but_q7_runs_in_sparks_tasks() -> None:
    planned = [p for p in plan_queries() if p.plan is not None]
    assert len(planned) >= 18
    on_driver = [p.query.id for p in planned if p.plan is not None and task_path(
        p.plan, [Upstream(DECLARATIONS[view].primary_key, 4) for view in p.plan.sources], 4) is None]
    assert on_driver == ["q7"]
