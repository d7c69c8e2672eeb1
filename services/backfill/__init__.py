"""Backfill: how a view created on a live upstream gets the upstream's history without replaying it all.

* ``chunked``: :class:`~mvlog.services.backfill.chunked.ChunkedBackfill`, the upstream's rows read from
  its serving state in key-ordered chunks, merged with its live epochs (positions commit with each epoch).
* ``task_chunks``: the chunked backfill of a view whose operator runs in Spark's tasks: one chunk per
  micro-batch, saved in Redis for its tasks, the upstream's changes routed by position in the tasks.
* ``snapshot``: :class:`~mvlog.services.backfill.snapshot.SnapshotBackfill`, the view computed by Spark SQL
  over the upstream's snapshot at epoch E and committed as the view's first epoch.
* ``snapshot_tasks``: that first epoch loaded by a Spark task per view partition, for a view whose
  operator runs in tasks.
* ``stages``: both as stages of a view's epoch pipeline (:mod:`mvlog.services.pipeline.stage`).
"""
