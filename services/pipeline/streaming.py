"""How a view consumer's reads run: its backlog with batch jobs, then a Structured Streaming query, each
micro-batch applied on the worker thread, and the stages' upkeep while no micro-batch comes.

A streaming query takes about a second to start (its checkpoint, the source's planning process): a
consumer that starts behind, after a restart or a stop, would wait that long before its first epoch, and
read its backlog through the stream's per-batch checkpointing. So the backlog is read micro-batch by
micro-batch (the trigger's limits) with batch jobs, each applied by the worker thread while the next is
read, and the stream starts after it. The micro-batches are the stream's, applied the same way, so the
view commits the same epochs either way. Nothing here decides what is applied or committed: that is the
consumer's loop (:mod:`mvlog.services.pipeline.view_consumer`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery

from mvlog.infra.child_processes import pid_alive
from mvlog.services.pipeline.micro_batch_worker import MicroBatchWorker

log = logging.getLogger(__name__)

#: A streaming query's checkpoint folder: ``<temp>/mvlog-checkpoint-<pid>-<consumer>-<random>``.
CHECKPOINT_PREFIX = "mvlog-checkpoint-"


def checkpoint_folder(name: str) -> str:
    """A new checkpoint folder for consumer ``name``'s streaming query. mvlog keeps its own positions (the
    view's MCE), so a folder serves one run of the query and :meth:`MicroBatchRunner.stop` deletes it; the
    folders of processes that died without stopping (SIGKILL) are deleted here, by the next start."""
    remove_dead_checkpoints()
    return tempfile.mkdtemp(prefix=f"{CHECKPOINT_PREFIX}{os.getpid()}-{name}-")


def remove_dead_checkpoints(folder: Path | None = None) -> int:
    """Delete the checkpoint folders in ``folder`` (the temporary one) of processes no longer running;
    returns how many."""
    removed = 0
    for path in (folder or Path(tempfile.gettempdir())).glob(f"{CHECKPOINT_PREFIX}*"):
        pid = path.name[len(CHECKPOINT_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


class MicroBatchRunner:
    """Runs the reads of consumer ``name``: ``apply(table)`` applies a collected micro-batch, ``upkeep()``
    is called every ``upkeep_interval`` seconds while the query runs (its errors are logged: the next
    micro-batch runs it again and reports a persistent failure)."""

    def __init__(self, name: str, apply: Callable[[pa.Table], None], upkeep: Callable[[], None],
                 upkeep_interval: float = 1.0) -> None:
        self.name, self._apply, self._upkeep, self._interval = name, apply, upkeep, upkeep_interval
        self.worker = MicroBatchWorker(name)
        self.query: StreamingQuery | None = None
        self._stopping = threading.Event()
        self._upkeeper: threading.Thread | None = None
        self._checkpoint_dir: str | None = None

    def submit(self, table: pa.Table) -> None:
        """Apply ``table`` once the previous micro-batch is applied (raises the previous one's error)."""
        self.worker.submit(lambda: self._apply(table))

    def run_backlog(self, batches: Iterable[tuple[int, Callable[[], pa.Table]]],
                    on_progress: Callable[[int], None] | None = None) -> None:
        """Read and submit each ``(last epoch, read)`` of the backlog, in order."""
        self.worker = MicroBatchWorker(self.name)  # stop() closed the previous one, if any
        for end, read in batches:
            self.submit(read())
            if on_progress is not None:
                on_progress(end)

    def start(self, stream: DataFrame, process_batch: Callable[[DataFrame, int], None], trigger_interval: str,
              query_name: str) -> StreamingQuery:
        """Start the streaming query (``process_batch``: its ``foreachBatch``) and the idle upkeep."""
        self._checkpoint_dir = checkpoint_folder(self.name)
        self.query = (stream.writeStream.foreachBatch(partial(self._until_stopped, process_batch))
                      .option("checkpointLocation", self._checkpoint_dir)
                      .trigger(processingTime=trigger_interval).queryName(query_name).start())
        self._upkeeper = threading.Thread(target=self._idle_upkeep, name=f"upkeep-{self.name}", daemon=True)
        self._upkeeper.start()
        return self.query

    def _until_stopped(self, process_batch: Callable[[DataFrame, int], None], batch: DataFrame,
                       batch_id: int) -> None:
        """``process_batch``, whose error is dropped once :meth:`stop` interrupted it: what it read is read
        again after a restart. Handed to Spark, that error (a Py4J error with the Java trace inside) is
        matched by a regex of Spark's own to tell an interruption, which overflowed the stream thread's
        stack on a long trace (seen in CI)."""
        try:
            process_batch(batch, batch_id)
        except Exception as error:
            if not self._stopping.is_set():
                raise
            log.info("%s: the micro-batch stop() interrupted failed: %s", self.name, type(error).__name__)

    def _idle_upkeep(self) -> None:
        while not self._stopping.wait(self._interval):
            try:
                self._upkeep()
            except Exception as error:
                log.warning("%s: upkeep failed: %s", self.name, error)

    def failure(self) -> BaseException | None:
        """Why the reads stopped, None while they run: the query's error (a micro-batch in Spark's tasks
        that raised), a failed apply's (which fails the query only when the next micro-batch comes), or
        the query having stopped by itself. Supervisors check this one call."""
        if self.query is not None:
            if (error := self.query.exception()) is not None:
                return error
            if not self.query.isActive and not self._stopping.is_set():
                return RuntimeError(f"{self.name}: the streaming query stopped")
        return self.worker.failure()

    def check(self) -> None:
        """Raise :meth:`failure`, if any: a failed apply's error as it was raised, the query's in a
        RuntimeError."""
        self.worker.check()
        if (error := self.failure()) is not None:
            raise RuntimeError(f"{self.name}: {error}") from error

    def wait_until(self, reached: Callable[[], bool], what: str, timeout: float) -> None:
        """Block until ``reached()``, raising the query's or a failed apply's error (:meth:`check`) at once
        rather than at the timeout."""
        deadline = time.monotonic() + timeout
        while not reached():
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {what} not within {timeout}s")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the upkeep and the query, and let the last micro-batch commit (or fail)."""
        self._stopping.set()
        if self._upkeeper is not None:
            self._upkeeper.join(timeout=30)
            self._upkeeper = None
        if self.query is not None:
            self.query.stop()
            self.query = None
        try:
            self.worker.drain()
        except Exception as error:
            log.warning("%s: the last micro-batch failed: %s", self.name, error)
        self.worker.close()
        if self._checkpoint_dir is not None:
            shutil.rmtree(self._checkpoint_dir, ignore_errors=True)
