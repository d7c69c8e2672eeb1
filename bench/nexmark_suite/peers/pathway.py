"""Pathway as a Nexmark peer: ``jobs/pathway_job.py`` in the venv of ``requirements/pathway.txt``."""

from __future__ import annotations

from .base import PeerJob
from .engine import SubprocessPeer
from .queries import PeerQuery
from .venvs import pinned_version


class PathwayPeer(SubprocessPeer):
    name = "Pathway"
    engine = "pathway"
    guarantee = "at-least-once"
    queries = ("q0", "q1", "q2", "q3", "q17", "q20", "q21", "q22")

    def encoding(self, query: PeerQuery) -> str:
        return "diff"

    def renames(self, query: PeerQuery) -> dict[str, str]:
        return {"auction_id": "id"} if query.name == "q3" else {}  # `id` is Pathway's row-key column

    def env(self, job: PeerJob) -> dict[str, str]:
        env = super().env(job)
        env["PATHWAY_THREADS"] = str(job.parallelism)
        return env

    def note(self, job: PeerJob) -> str:
        self.settings = (f"pathway {pinned_version('pathway', 'pathway')}, {job.parallelism} worker threads "
                         "(PATHWAY_THREADS), autocommit 100 ms, no persistence (the free edition's guarantee is "
                         "at-least-once; exactly-once is Pathway's enterprise edition), Kafka writer not transactional")
        return super().note(job)


RUNNER = PathwayPeer()
