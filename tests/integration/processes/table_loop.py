"""A table writer that writes continuously in its own process, so a test can kill the broker or Redis under it.

Usage: python -m tests.integration.processes.table_loop SETTINGS_JSON TABLE SEED KEYS
Opens the existing table TABLE (columns ``id`` int, ``v1`` int, ``k`` string; key ``id``) with its epoch
loop on (an epoch every ``barrier_interval_ms``) and upserts and deletes random rows of ``id`` in
[0, KEYS) every 20 ms. Prints ``ready`` once the writer is open. Commands on stdin:

``hold``
    The next epoch is held open: once its change events are on the broker in its Kafka transaction (and
    its Redis commands queued, not applied), the writer prints ``open <epoch> <changes>`` and waits HOLD_S seconds
    before it produces the epoch's barriers and commits, so that the test kills a process mid-epoch.
``close``
    Stop writing, close the table (its last epoch commits), print ``closed <mce>`` and exit 0.

When the table's epoch loop has stopped on an error, the next write raises it: the process exits with
status 1 and the traceback on stderr.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from mvlog.config import Settings
from mvlog.connectors.redis.streamed_commit import StreamedCommit
from mvlog.services.tables.epoch import TableEpochEncoder
from mvlog.services.tables.writer import Table

HOLD_S = 2.0

_hold = threading.Event()
_close = threading.Event()


def _hold_epochs() -> None:
    """Make Table hold an epoch's transaction open after its changes when ``_hold`` is set."""
    chunks = TableEpochEncoder.chunks

    def holding(self: TableEpochEncoder, epoch: int, changes: list[Any], staged: StreamedCommit
                ) -> Callable[[int, str], Iterator[list[tuple[bytes, int, bytes]]]]:
        inner = chunks(self, epoch, changes, staged)

        def produce(ts_ms: int, txn: str) -> Iterator[list[tuple[bytes, int, bytes]]]:
            yield from inner(ts_ms, txn)
            if _hold.is_set():
                _hold.clear()
                self.writer._producer.flush(10)  # the changes are on the broker, in the open transaction
                print(f"open {epoch} {len(changes)}", flush=True)
                time.sleep(HOLD_S)

        return produce

    TableEpochEncoder.chunks = holding  # type: ignore[method-assign]


def _commands() -> None:
    for line in sys.stdin:
        command = line.strip()
        if command == "hold":
            _hold.set()
        elif command == "close":
            _close.set()
            return


def main() -> None:
    settings = Settings.model_validate_json(sys.argv[1])
    name, seed, keys = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    _hold_epochs()
    threading.Thread(target=_commands, name="commands", daemon=True).start()
    table = Table.open(settings, name)
    print("ready", flush=True)
    while not _close.is_set():
        table.upsert([{"id": rng.randrange(keys), "v1": rng.randrange(-5, 20), "k": rng.choice("abcd")}
                      for _ in range(8)])
        table.delete([rng.randrange(keys) for _ in range(2)])
        time.sleep(0.02)
    table.flush()  # raises the epoch loop's error, if it stopped on one
    table.close()
    print(f"closed {table.store.mce(name)}", flush=True)


if __name__ == "__main__":
    main()
