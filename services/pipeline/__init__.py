"""A view's epoch pipeline: read the upstream epochs, run the stages and the operator, commit in order.

* ``committer``: :class:`~mvlog.services.pipeline.committer.EpochCommitter`, the one owner of the commit
  order (Kafka transaction, then Redis, roll forward from the changelog when Redis is behind) for table
  writers, view consumers, snapshot loads and replacement cut-overs alike.
* ``stage``: the interface of what sits between the upstream epochs and the commit (backfills and
  replacements implement it, in their own packages).
* ``reading``: the upstream changelogs read through Spark (``format("mvlog")``), as epochs of Arrow rows.
* ``view_consumer``: the loop that maintains one view; ``streaming`` runs its reads (the backlog, then
  the streaming query), ``micro_batch_worker`` applies its micro-batches on one thread while Spark
  reads the next, and ``view_commit`` writes one computed epoch through the committer.
* ``task_epochs`` and ``partition_tasks``: the opt-in path that computes a view's epochs in Spark's
  tasks, one per changelog partition, the driver committing each epoch in one step; ``join_tasks`` a
  two-view join's two shuffles on it; ``kept_writers`` the partition producers a Python worker keeps
  between those tasks.

The package imports none of its modules: a table writer imports the committer without importing Spark.

``docs/architecture.md`` draws the whole pipeline and the commit order, with what a crash leaves.
"""
