"""The Python daemon of mvlog's Spark sessions (``spark.python.daemon.module``, set by
:mod:`~mvlog.services.spark.session`): the connectors' worker daemon
(:mod:`mvlog.connectors.spark.worker_daemon`), with the modules mvlog's tasks run imported once, before it
forks any Python worker.

A worker imports what its first task's function needs: pyarrow, pandas, PySpark's Arrow serializers and
mvlog's operators and task paths, 0.8-1.1 s of CPU (measured, ``import`` of these modules in a fresh
interpreter), in every worker of every Spark application. Imported in the daemon, they cost that once per
executor, and every forked worker starts with them, their pages shared and, frozen, never written by a
worker's collections. The daemon imports a few modules a given application's tasks may not use (about
0.3 s of CPU); a local session forks two workers or more.

Run as ``python -m mvlog.services.spark.daemon``, as Spark runs its daemon.
"""

from __future__ import annotations

from mvlog.connectors.spark import worker_daemon

#: What the functions of mvlog's Spark tasks import when a worker unpickles them: the data source's read,
#: the live path's partition and join tasks, the backfills', the replacement's cut-over and ``replay
#: derive``'s tasks, and the Arrow serializers PySpark's worker uses for all of them.
TASK_MODULES = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "mvlog.connectors.spark.spark_source",
    "mvlog.services.pipeline.partition_tasks",
    "mvlog.services.pipeline.join_tasks",
    "mvlog.services.backfill.task_chunks",
    "mvlog.services.backfill.snapshot_tasks",
    "mvlog.services.replacement.cut_over",
    "mvlog.services.rederive.tasks",
    "mvlog.services.rederive.join_tasks",
)

if __name__ == "__main__":
    worker_daemon.serve(preload=TASK_MODULES)
