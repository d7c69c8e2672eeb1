"""A table writer that is SIGKILLed between an epoch's Kafka commit and its Redis commit.

Usage: python -m tests.integration.processes.table_killed_before_redis SETTINGS_JSON TABLE FIRST COUNT
Upserts rows ``id`` in [FIRST, FIRST + COUNT) into the existing table TABLE and flushes them as one epoch.
Once that epoch's Kafka transaction has committed, its Redis commands are all queued (MULTI, not yet
EXEC) and the process prints ``committed <epoch>`` and kills itself.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

from mvlog.config import Settings
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.streamed_commit import StreamedCommit
from mvlog.services.tables.writer import Table


def _killed_at_finish(commit: StreamedCommit, index: Mapping[int, IndexEntry]) -> bool:
    commit.send()  # everything but the MCE, the index and EXEC is queued in Redis
    print(f"committed {commit.epoch}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def main() -> None:
    settings = Settings.model_validate_json(sys.argv[1])
    name, first, count = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    StreamedCommit.finish = _killed_at_finish  # type: ignore[method-assign, assignment]
    table = Table.open(settings, name, auto_commit=False)
    table.upsert([{"id": i, "v": f"row {i}"} for i in range(first, first + count)])
    table.flush()


if __name__ == "__main__":
    main()
