"""Spark Structured Streaming as a Nexmark peer: ``jobs/spark_job.py`` in the venv of
``requirements/spark.txt``, with Spark's own Kafka connector from Maven Central (``poms/spark``)."""

from __future__ import annotations

from pathlib import Path

from .base import PeerJob
from .engine import SubprocessPeer
from .jars import spark_jars
from .venvs import pinned_version


class SparkPeer(SubprocessPeer):
    name = "Spark Structured Streaming"
    engine = "spark"
    guarantee = "at-least-once"
    queries = ("q0", "q1", "q2", "q3", "q17", "q20", "q21", "q22")

    def extra_args(self, job: PeerJob, run_dir: Path) -> list[str]:
        return ["--jars", ",".join(str(jar) for jar in spark_jars())]

    def running(self, run_dir: Path) -> bool | None:
        # The first micro-batch (batch 0, run even on empty topics) committed: the query is planned and running.
        return (run_dir / "checkpoint" / "commits" / "0").exists()

    def env(self, job: PeerJob) -> dict[str, str]:
        env = super().env(job)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"  # else Spark binds to the host's first non-loopback address
        return env

    def note(self, job: PeerJob) -> str:
        version = pinned_version("spark", "pyspark")
        self.settings = (f"pyspark {version} with spark-sql-kafka-0-10_2.13 {version}, local[{job.parallelism}], "
                         f"{job.parallelism} shuffle partitions, default trigger, checkpointed state; Kafka sink "
                         "at-least-once (Spark offers no exactly-once Kafka sink)")
        return super().note(job)


RUNNER = SparkPeer()
