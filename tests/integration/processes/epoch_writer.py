"""A changelog writer run as a separate process so a test can SIGKILL it mid-epoch.

Usage: python -m tests.integration.processes.epoch_writer SETTINGS_JSON VIEW ROWS_PER_EPOCH MAX_SEEN PREV
Prints ``begin <epoch>`` before producing an epoch and ``done <epoch>`` after its commit.
"""

from __future__ import annotations

import sys

from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, encode_batch
from mvlog.epoch import EpochClock
from mvlog.row_schema import RowSchema
from mvlog.views import ChangeBatch

SCHEMA = RowSchema.of({"id": "int", "epoch": "int"}, ["id"])


def main() -> None:
    settings = Settings.model_validate_json(sys.argv[1])
    view, rows_per_epoch = sys.argv[2], int(sys.argv[3])
    max_seen, prev = int(sys.argv[4]), int(sys.argv[5])  # the clock starts above max_seen
    writer = ChangelogWriter(settings, view, ["id"], settings.partitions)
    clock = EpochClock(max_seen)
    while True:
        epoch = clock.next()
        changes = [Change(Op.CREATE, (i,), None, {"id": i, "epoch": epoch}) for i in range(rows_per_epoch)]
        print(f"begin {epoch}", flush=True)
        writer.commit_batches(epoch, prev, [encode_batch(["id"], ChangeBatch.from_changes(SCHEMA, changes))])
        print(f"done {epoch}", flush=True)
        prev = epoch


if __name__ == "__main__":
    main()
