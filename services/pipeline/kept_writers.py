"""A Spark Python worker's changelog writers of view partitions, kept from one task to the next.

A task of a view in tasks writes its partition's epochs with a transactional producer of the partition's
id (:func:`~mvlog.services.pipeline.partition_tasks.partition_transactional_id`). Making one costs its
connections, a look-up of the topic's record limit and ``init_transactions``: 60-80 ms, sometimes 0.5 s,
a third of a task's write time at 10,000-change epochs (docs/scaling.md). Spark runs the next task in an
idle Python worker it already has (``spark.python.worker.reuse``, on by default), so a worker that wrote
partition ``p`` of a view in one micro-batch often writes it in a later one, and can do so with the
writer it made then.

What keeps exactly-once as the README's "A transaction per partition" has it:

* A writer is kept only after a task used it without error, so it holds no open transaction.
* A kept writer is used again only while its claim is still its own
  (:class:`~mvlog.connectors.redis.writer_claims.WriterClaims`): no writer of that partition called
  ``init_transactions`` since. Otherwise it is known to be fenced, and is closed unused.
* A kept writer that fails in any way is closed, and the task starts its partition over with a new one,
  whose ``init_transactions`` fences every other attempt before it reads what the partition committed:
  what a retried task does. So a writer fenced after its claim was checked wastes work, never writes an
  epoch twice: the broker refuses its transaction.
* Writers are kept only in Spark's Python workers (a task context): a driver or a test that runs a
  partition's work in its own process makes a writer each time and closes it, as before.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pyspark import TaskContext

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter
from mvlog.connectors.redis.writer_claims import WriterClaims

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: What a kept writer must match to be used again: the settings it was made with, the view's name, key
#: columns and partition count, and the partition.
WriterKey = tuple[str, str, tuple[str, ...], int, int]


@dataclass(frozen=True)
class _Writer:
    writer: ChangelogWriter
    token: str  # its claim (WriterClaims)


class KeptWriters:
    """The writers one process keeps, most recently used last; at most ``capacity`` (the setting
    ``task_writers_kept``, read at each use), the least recently used closed beyond it."""

    def __init__(self, *, outside_tasks: bool = False) -> None:
        """``outside_tasks``: keep writers in any process, not only in Spark's Python workers (the tests of
        this module, which use it without Spark)."""
        self.outside_tasks = outside_tasks
        self._kept: OrderedDict[WriterKey, _Writer] = OrderedDict()
        self._lock = threading.Lock()  # a worker runs one task at a time; a driver's threads may share it

    def run(self, settings: Settings, view: CatalogEntry, partition: int, transactional_id: str,
            claims: WriterClaims, work: Callable[[ChangelogWriter, bool], T]) -> T:
        """``work(writer, kept)`` with a kept writer of the partition (``kept`` True) if one is still its
        claim's, else (or after a kept one failed: see the module's docstring) with a new one."""
        key: WriterKey = (settings.model_dump_json(), view.name, tuple(view.key_columns), view.partitions, partition)
        kept = self._take(key, claims, view.name, partition)
        if kept is not None:
            try:
                result = work(kept.writer, True)
            except Exception as error:
                kept.writer.close()
                logger.info("%s partition %d: the kept writer failed (%s); starting over with a new one",
                            view.name, partition, error)
            else:
                self._keep(key, kept, settings.task_writers_kept)
                return result
        writer = ChangelogWriter(settings, view.name, view.key_columns, view.partitions,
                                 transactional_id=transactional_id, partition=partition)
        made = _Writer(writer, uuid.uuid4().hex)
        try:
            claims.claim(view.name, partition, made.token)
            result = work(writer, False)
        except BaseException:
            writer.close()
            raise
        self._keep(key, made, settings.task_writers_kept)
        return result

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
        for each in kept:
            each.writer.close()

    def _take(self, key: WriterKey, claims: WriterClaims, view: str, partition: int) -> _Writer | None:
        with self._lock:
            kept = self._kept.pop(key, None)
        if kept is None:
            return None
        try:
            if claims.holds(view, partition, kept.token):
                return kept
        except BaseException:  # Redis unreachable: the task fails, and the writer is not left unclosed
            kept.writer.close()
            raise
        kept.writer.close()  # another worker's writer of this partition fenced it
        return None

    def _keep(self, key: WriterKey, writer: _Writer, capacity: int) -> None:
        if capacity == 0 or not (self.outside_tasks or TaskContext.get() is not None):
            writer.writer.close()
            return
        with self._lock:
            self._kept[key] = writer
            self._kept.move_to_end(key)
            evicted = [self._kept.popitem(last=False)[1] for _ in range(len(self._kept) - capacity)]
        for each in evicted:
            each.writer.close()


#: This process's writers (a Spark Python worker's, between its tasks).
KEPT_WRITERS = KeptWriters()
