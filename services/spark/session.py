"""The Spark session of mvlog's consumers: local mode by default, any master through settings."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from mvlog.config import Settings
from mvlog.infra.local_stack import LOOPBACK
from mvlog.services.spark import daemon as spark_daemon
from mvlog.services.spark.data_source import MvlogDataSource

#: The driver's JVM when the executors are JVMs of their own: it plans and schedules a view's micro-batches
#: (and on the driver path passes their Arrow batches on), and every micro-batch's new plan makes its C2
#: compiler threads compile code that runs too briefly to repay them. Measured on local-cluster
#: (bench/views.py --tasks, docs/scaling.md): the driver's CPU per 1M changes with the operators in tasks
#: 8.3-10.5 s with C2, 3.3-4.0 s with C1 only, and its JVM's CPU on the driver path a third less. Applies
#: only where this session starts the JVM; ``spark.driver.extraJavaOptions`` in ``spark_conf`` replaces it.
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def executors_in_driver(master: str) -> bool:
    """Local mode (``local``, ``local[N]``, ``local[*, F]``): the executors are threads of the driver's JVM,
    which then does the data's work too and keeps its full JIT."""
    return master == "local" or master.startswith("local[")


def spark_session(settings: Settings, app_name: str = "mvlog") -> SparkSession:
    """A session with the ``mvlog`` data source registered.

    Executors read Kafka and Redis themselves, so they must see the same settings: the registered data
    source carries them (:meth:`MvlogDataSource.for_settings`), and a session reused by ``getOrCreate``
    is registered again with the new ones. The ``MVLOG_*`` environment is set too, for the user's own
    code run in the executors.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    for name, value in (("MVLOG_BOOTSTRAP_SERVERS", settings.bootstrap_servers),
                        ("MVLOG_REDIS_URL", settings.redis_url), ("MVLOG_TOPIC_PREFIX", settings.topic_prefix)):
        os.environ[name] = value
    builder = (SparkSession.builder.master(settings.spark_master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.python.worker.reuse", "true")
               # PySpark's daemon with Spark's archives off the workers' path (a task's
               # importlib.invalidate_caches() re-read them all), the tasks' modules imported before it
               # forks a worker, and no full collection of them after every task (see the module).
               .config("spark.python.daemon.module", spark_daemon.__name__))
    if settings.spark_master.startswith("local"):
        # Everything on this machine: the JVM binds and resolves only the loopback address. On a
        # cluster the driver must be reachable by executors: spark-submit's own settings decide.
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        builder = (builder.config("spark.driver.bindAddress", LOOPBACK)
                   .config("spark.driver.host", LOOPBACK))
    if not executors_in_driver(settings.spark_master):
        builder = builder.config("spark.driver.extraJavaOptions", DRIVER_JAVA_OPTIONS)
    for key, value in settings.spark_conf.items():  # the user's settings win over mvlog's
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MvlogDataSource.for_settings(settings))
    return spark
