"""Spark's Python daemon for mvlog's sessions: PySpark's own (``pyspark.daemon``), started after the archives
Spark puts on its workers' ``PYTHONPATH`` are taken off ``sys.path`` where the same packages are installed.

Spark starts the daemon that forks its Python workers with ``PYTHONPATH`` set to
``$SPARK_HOME/python/lib/pyspark.zip``, py4j's source zip and the spark-core jar, ahead of the
environment's own packages. With pyspark installed from PyPI (``$SPARK_HOME`` is the installed package)
the zips are copies of installed packages and the jar holds no Python, yet, being first, they cost:

- **at every task**: PySpark's worker calls ``importlib.invalidate_caches()`` (``setup_spark_files``), and
  on Python 3.11 each zipimporter answers by reading its archive's whole central directory again: once
  per package imported from pyspark.zip (a dozen), and once for the jar's thousands of entries.
  Measured in a worker that imported ``pyspark.sql``: 143 ms a call, 0.007 ms without the archives;
  py-spy over a cold ``bench/views.py --tasks --repeat 1`` (``local[2]``) found 13.6 % of all the
  Python workers' CPU there, and 28 % fewer samples in all after this change;
- **at every new worker**: modules imported from an archive are compiled from source (an archive keeps
  no bytecode cache).

The daemon also runs a **full collection** (``gc.collect()``) in a reused worker after every task. It walks
the whole heap, and most of that heap is the modules the tasks imported (pyarrow, pandas, pyspark, mvlog's
operators): 25 ms a collection for 126k objects, after every task of every micro-batch. Over one test of
three views maintained in tasks (``test_replace_mv1_filter_under_running_mv2_mv3[tasks]``) the Python
workers used 49 s of CPU, 11 s once :class:`TaskEndCollector` freezes the heap a task's imports made.

Taking the archives off before pyspark is first imported makes the workers import the installed packages. An
archive stays when nothing else on the path provides its package (executors that have only Spark's own
pyspark), so no module is ever lost; the jar always goes.

:func:`serve` can also import modules before the daemon forks any worker (``preload``): every worker
then starts with them, and they are frozen (``gc.freeze``) so that no collection in a worker walks them or
writes to their pages. mvlog's sessions run :mod:`mvlog.services.spark.daemon`, which preloads what
mvlog's tasks import; ``spark.python.daemon.module`` in ``spark_conf`` replaces it.

Run as ``python -m mvlog.connectors.spark.worker_daemon``, as Spark runs its daemon (nothing preloaded).
"""

from __future__ import annotations

import gc
import importlib
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import PurePath


def _provides(entry: str) -> str | None:
    """The package a Spark archive on the path provides: ``pyspark.zip``, ``py4j-<version>-src.zip``
    (None: not such an archive)."""
    name = PurePath(entry).name
    if name == "pyspark.zip":
        return "pyspark"
    if name.startswith("py4j-") and name.endswith(".zip"):
        return "py4j"
    return None


def redundant_archives(path: list[str]) -> list[str]:
    """The entries of ``path`` this daemon takes off: jars, and Spark's archives of a package that the rest
    of the path provides too."""
    redundant = [entry for entry in path if entry.endswith(".jar")]
    for entry in path:
        package = _provides(entry)
        rest = [p for p in path if p != entry and p not in redundant]
        if package is not None and importlib.machinery.PathFinder.find_spec(package, rest) is not None:
            redundant.append(entry)
    return redundant


def take_off_archives() -> list[str]:
    """Remove :func:`redundant_archives` from ``sys.path`` and their finders from the import system's cache
    (what ``invalidate_caches`` walks); the entries removed."""
    removed = redundant_archives(sys.path)
    for entry in removed:
        sys.path.remove(entry)
        for cached in [key for key in sys.path_importer_cache if key == entry or key.startswith(entry + "/")]:
            del sys.path_importer_cache[cached]
    return removed


class TaskEndCollector:
    """What PySpark's daemon calls ``gc.collect()`` on after every task of a reused worker: the same full
    collection, but the heap of modules a task imported is frozen after it (``gc.freeze``), so the
    collections after the next tasks walk only what those tasks left, not the whole import heap."""

    def __init__(self) -> None:
        self._modules = 0  # len(sys.modules) when the heap was last frozen

    def collect(self) -> int:
        found = gc.collect()
        if len(sys.modules) != self._modules:
            self._modules = len(sys.modules)
            gc.freeze()
        return found


def serve(preload: Sequence[str] = ()) -> None:
    """Run PySpark's daemon with the archives off the path, the ``preload`` modules imported and frozen
    before it forks a worker, and a :class:`TaskEndCollector` after each task."""
    take_off_archives()
    from pyspark import daemon  # after: pyspark from the installed package

    for module in preload:
        importlib.import_module(module)
    gc.freeze()
    vars(daemon)["gc"] = TaskEndCollector()  # the name its manager calls collect() on
    daemon.manager()


if __name__ == "__main__":
    serve()
