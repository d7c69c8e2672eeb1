"""A source ingester SIGKILLed between its first epoch's Kafka commit and that epoch's Redis commit.

Usage: python -m tests.integration.processes.source_killed_before_redis SETTINGS_JSON TABLE
Runs ``SourceIngester(TABLE)`` until its first epoch's Kafka transaction (changes, barriers and the
consumed offsets) has committed and its Redis commands are queued (MULTI, not yet EXEC); then prints
``committed <epoch>`` and kills itself: Kafka holds the epoch and its offsets, Redis does not.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

from mvlog.config import Settings
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.streamed_commit import StreamedCommit
from mvlog.services.sources.ingester import SourceIngester


def _killed_at_finish(commit: StreamedCommit, index: Mapping[int, IndexEntry]) -> bool:
    commit.send()
    print(f"committed {commit.epoch}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def main() -> None:
    settings = Settings.model_validate_json(sys.argv[1])
    StreamedCommit.finish = _killed_at_finish  # type: ignore[method-assign, assignment]
    with SourceIngester(settings, sys.argv[2]) as ingester:
        ingester.run(until_caught_up=True)


if __name__ == "__main__":
    main()
