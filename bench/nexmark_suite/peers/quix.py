"""Quix Streams as a Nexmark peer: ``jobs/quix_job.py`` in the venv of ``requirements/quix.txt``."""

from __future__ import annotations

from .base import PeerJob
from .engine import SubprocessPeer
from .venvs import pinned_version


class QuixPeer(SubprocessPeer):
    name = "Quix Streams"
    engine = "quix"
    guarantee = "exactly-once"
    queries = ("q0", "q1", "q2", "q3", "q17", "q20", "q21", "q22")

    def note(self, job: PeerJob) -> str:
        self.settings = (f"quixstreams {pinned_version('quix', 'quixstreams')}, processing_guarantee=exactly-once "
                         f"(Kafka transactions), commit_interval 1 s, {job.parallelism} processes in one consumer "
                         f"group (input topics: {job.topics.partitions} partition(s))")
        return super().note(job)


RUNNER = QuixPeer()
