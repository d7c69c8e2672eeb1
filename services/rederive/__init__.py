"""Re-deriving a view from its upstreams: ``mvlog replay derive`` and the operator state after a Redis wipe.

* :mod:`~mvlog.services.rederive.derive`: a view's epochs (or its state at an epoch) recomputed from its
  upstreams' changelogs or snapshots, the plan and the driver engines;
* :mod:`~mvlog.services.rederive.tasks`: the same in Spark's tasks, a task per view partition (a view
  whose operator needs no operator-key shuffle);
* :mod:`~mvlog.services.rederive.join_tasks`: the same for the views of two shuffles (joins, top-N,
  unions, joins of subqueries), a task per join-key partition;
* :mod:`~mvlog.services.rederive.state_rebuild`: the rebuild after a wipe, from the upstreams' serving rows
  or, where the tasks can, left to the view's consumer to re-derive.
"""
