"""Runs Spark consumers of views in their own process, so a test can SIGKILL them at random points.

Usage: python -m tests.integration.processes.view_runner SETTINGS_JSON VIEW [VIEW ...]
Prints ``ready <views in tasks>`` once the streaming queries run (the views whose operators run in Spark's
tasks, comma-separated, or ``-``), then ``mce <view> <epoch>`` as epochs commit, and
``chunk <vnode> <start>`` for each vnode of each backfill chunk read (start: the position in hex, ``-``).
Exits with an error as soon as a consumer's micro-batch fails to apply.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mvlog.backfill import Chunk
from mvlog.config import Settings
from mvlog.services.pipeline.view_consumer import ViewConsumer

ROOT = Path(__file__).resolve().parents[3]


def spawn(settings: Settings, views: list[str]) -> subprocess.Popen[str]:
    """This runner in a child process for ``views``; its stdout is a pipe of the lines above."""
    # ROOT first for the runner; the caller's PYTHONPATH stays (e.g. a worktree's package over the installed one).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen([sys.executable, "-m", "tests.integration.processes.view_runner",
                             settings.model_dump_json(), *views],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)


def _print_chunk(chunk: Chunk) -> None:
    for part in chunk.vnodes:
        start = "-" if part.start.last is None else part.start.last.hex()
        print(f"chunk {part.vnode} {start}", flush=True)


def main() -> None:
    settings = Settings.model_validate_json(sys.argv[1])
    consumers: list[ViewConsumer] = []
    for view in sys.argv[2:]:
        spark = consumers[0].spark if consumers else None
        consumers.append(ViewConsumer(settings, view, spark=spark, max_epochs_per_trigger=20,
                                      trigger_interval="100 milliseconds"))
    for consumer in consumers:
        if consumer.backfill is not None:
            consumer.backfill.on_chunk_read = _print_chunk
        consumer.start()
    in_tasks = ",".join(c.entry.name for c in consumers if c.tasks is not None) or "-"
    print(f"ready {in_tasks}", flush=True)  # the views whose operators run in Spark's tasks
    reported = {c.entry.name: c.mce for c in consumers}
    while True:
        for consumer in consumers:
            if (error := consumer.failure()) is not None:  # the query itself fails only at its next micro-batch
                raise SystemExit(f"{consumer.entry.name}: a micro-batch failed: {error!r}")
            if consumer.mce != reported[consumer.entry.name]:
                reported[consumer.entry.name] = consumer.mce
                print(f"mce {consumer.entry.name} {consumer.mce}", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
