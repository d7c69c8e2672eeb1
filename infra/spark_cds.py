"""A class-data-sharing (CDS) archive of a Spark driver's classes, made once, mapped by every later start.

A Spark driver loads, parses and verifies some fifteen thousand classes from Spark's jars each time it
starts. The JVM can write the classes one run loaded into an archive (``-XX:ArchiveClassesAtExit``) and
map that archive at a later start instead (``-XX:SharedArchiveFile``). Measured on two busy cores, the
launch of a local-mode session to its first results went from 18 s to 12 s; the test suite starts a
driver dozens of times (every SIGKILL test a new one per kill), so the tests use it.

The archive belongs to one JVM build and one class path: its file name carries both (the Java version,
pyspark's version), so an upgrade makes a new one, and a JVM that still finds it stale runs without it
(``-Xshare:auto``, the default). The archive is made by a short Spark workload in a child process
(streaming through a Python data source into ``foreachBatch``, Arrow both ways, a shuffle), written to a
temporary name and renamed when whole. A local cluster's executors start with the driver's class path
and can map it too; a real cluster's may differ, and a JVM whose class path does not match ignores it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Imported here, not in _fingerprint: the tests' configure hook makes the archive in a thread while the
# test modules import pyspark.sql, and two threads importing pyspark at once can see it half initialised.
import pyspark

from mvlog.infra.maven_jars import cache_folder

__all__ = ["driver_archive", "java_options"]

#: Quiet JVM logging of CDS: writing an archive lists every class it skips, on stdout.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def java_options(archive: Path | None) -> str:
    """The driver's extra Java options that map ``archive`` (none without one)."""
    return f"-XX:SharedArchiveFile={archive} {_QUIET}" if archive is not None else ""


def driver_archive(java_options_base: str = "", *, create: bool = True, timeout_s: float = 300.0) -> Path | None:
    """The archive for this machine's Java and pyspark, made now if missing and ``create``; ``None`` when
    there is none (no Java, the workload failed): a driver then simply starts without one.

    ``java_options_base``: the driver options the archive's users run with (the JIT's settings must
    match for the archive to be used)."""
    java = _java()
    if java is None:
        return None
    archive = cache_folder("MVLOG_SPARK_CDS_HOME", "spark-cds") / f"driver-{_fingerprint(java)}.jsa"
    if archive.exists() or not create:
        return archive if archive.exists() else None
    archive.parent.mkdir(parents=True, exist_ok=True)
    fd, partial_name = tempfile.mkstemp(prefix=archive.name, suffix=".partial", dir=archive.parent)
    os.close(fd)
    partial = Path(partial_name)
    partial.unlink()  # the JVM writes it at exit
    options = f"{java_options_base} -XX:ArchiveClassesAtExit={partial} {_QUIET}".strip()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    try:
        done = subprocess.run([sys.executable, "-m", "mvlog.infra.spark_cds", options], env=env,
                              capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        return None
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        return None
    partial.replace(archive)  # whole or absent
    return archive


def _java() -> str | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    if home := os.environ.get("JAVA_HOME"):
        candidate = Path(home) / "bin" / "java"
        if candidate.exists():
            return str(candidate)
    return shutil.which("java")


@functools.cache
def _fingerprint(java: str) -> str:
    """Which JVM build and which Spark: an archive is valid for exactly one of each."""
    version = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    text = f"{os.path.realpath(java)}\n{version}\n{pyspark.__version__}\n{pyspark.__file__}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _workload(extra_java_options: str) -> None:
    """What a driver of mvlog's does, briefly, so that its classes are in the archive."""
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class _Counter(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:  # noqa: N802 (PySpark names it)
            return {"n": 0}

        def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:  # noqa: N802
            return {"n": 2}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return [InputPartition(i) for i in range(start["n"], end["n"])]

        def read(self, partition: InputPartition) -> Iterator[tuple[int, str]]:
            yield (partition.value, str(partition.value))

    class _Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "cds_workload"

        def schema(self) -> str:
            return "id int, v string"

        def streamReader(self, schema: object) -> DataSourceStreamReader:  # noqa: N802
            return _Counter()

    spark = (SparkSession.builder.master("local[2]").appName("mvlog-cds")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.extraJavaOptions", extra_java_options).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(_Source)
    frame = spark.createDataFrame(pa.table({"k": [1, 2, 2], "v": ["a", "b", "c"]}).to_pandas())
    frame.groupBy("k").count().collect()
    frame.mapInArrow(lambda batches: batches, frame.schema).toArrow()
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (spark.readStream.format("cds_workload").load().writeStream
                 .foreachBatch(lambda batch, _: batch.toArrow())
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(120)
    spark.stop()


if __name__ == "__main__":
    _workload(sys.argv[1])
