"""Spark's read path: the ``mvlog`` Python data source and the row shape it gives Spark.

* ``spark_source``: :class:`~mvlog.connectors.spark.spark_source.MvlogDataSource` (batch and streaming
  reads, PySpark's ``DataSource`` contract): the driver plans whole epochs per partition from the epoch
  index, the executors read them.
* ``change_rows``: changes as signed Arrow rows (Delta's change data feed shape), what every reader of a
  changelog through Spark sees.
* ``job_progress``: a long Spark job's tasks done, from Spark's status tracker (for a progress bar).
* ``log_cache_client``: the executor side of the log cache: a task's planned epochs come from a Faust
  worker over HTTP when it holds them, else from Kafka.
* ``worker_daemon``: the daemon Spark forks its Python workers from (``spark.python.daemon.module``):
  PySpark's, with Spark's archives taken off the workers' path where the packages are installed, modules
  preloaded before it forks, and no full collection of them after each task.

One unit because this code runs in Spark's executors (imported there by module name when a session
registers the data source) and shares one contract, the signed-row schema; it reads Kafka and Redis
through :mod:`mvlog.connectors.kafka` and :mod:`mvlog.connectors.redis`. The writing side of the data
source commits through the table writer, so it is a service (:mod:`mvlog.services.tables.spark_sink`).
"""
