"""Flink SQL as a Nexmark peer: ``jobs/flink_job.py`` (PyFlink, local mini-cluster) in the venv of
``requirements/flink.txt``, with Flink's Kafka SQL connector from Maven Central (``poms/flink``)."""

from __future__ import annotations

from pathlib import Path

from .base import PeerJob
from .engine import SubprocessPeer
from .jars import flink_jars
from .venvs import pinned_version


class FlinkPeer(SubprocessPeer):
    name = "Flink SQL"
    engine = "flink"
    guarantee = "exactly-once"
    queries = ("q0", "q1", "q2", "q3", "q17", "q20", "q21", "q22")

    def running(self, run_dir: Path) -> bool | None:
        # A checkpoint is triggered only once every task runs: the first completed one shows the job deployed.
        return any((run_dir / "checkpoints").glob("*/chk-*/_metadata"))

    def extra_args(self, job: PeerJob, run_dir: Path) -> list[str]:
        return ["--jars", ",".join(str(jar) for jar in flink_jars())]

    def note(self, job: PeerJob) -> str:
        jars = ", ".join(jar.name for jar in flink_jars())
        self.settings = (f"apache-flink {pinned_version('flink', 'apache-flink')} ({jars}), local mini-cluster, "
                         "checkpoints EXACTLY_ONCE every 1 s, Kafka sink delivery-guarantee exactly-once "
                         "(transactions committed at checkpoints), sources read_committed; the catch-up time "
                         "includes the job's deployment (details: catch_up_first_commit_s, READY to the first "
                         "checkpoint)")
        return super().note(job)


RUNNER = FlinkPeer()
