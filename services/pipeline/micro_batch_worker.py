"""Applying a view's micro-batches on one worker thread, so Spark reads the next one meanwhile.

Spark calls ``foreachBatch`` for one micro-batch at a time and plans the next only once it returns. A
consumer whose ``foreachBatch`` collected its micro-batch *and* applied it left the executors idle while
the driver applied, and the driver idle while the executors read. With this worker, ``foreachBatch``
collects its micro-batch (the Spark job), waits for the previous micro-batch to be applied, hands this
one over and returns: reading micro-batch N+1 overlaps applying micro-batch N.

Nothing about exactly-once changes: micro-batches are applied one at a time and in order, each epoch
still commits to Kafka then Redis, and progress lives in the view's MCE (a restarted consumer starts
from it, whatever Spark had read ahead). An apply that fails is raised by the next :meth:`submit`
(which fails the streaming query), by :meth:`check` and by :meth:`drain`, and :meth:`failure` tells it
to supervisors meanwhile (no micro-batch may come for a while). At most two micro-batches are
held at once: the one being applied and the one just collected.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class MicroBatchWorker:
    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"apply-{name}")
        self._pending: Future[None] | None = None

    def submit(self, apply: Callable[[], None]) -> None:
        """Run ``apply`` once the previous one is done (raises the previous one's error instead; raises
        RuntimeError after :meth:`close`: a micro-batch collected while the query stopped is dropped)."""
        self.drain()
        self._pending = self._executor.submit(apply)

    def drain(self) -> None:
        """Wait for the micro-batch being applied; raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def failure(self) -> BaseException | None:
        """The error of a micro-batch whose apply failed (without waiting for one still running)."""
        pending = self._pending
        return pending.exception() if pending is not None and pending.done() else None

    def check(self) -> None:
        """Raise :meth:`failure`, if any."""
        if self.failure() is not None:
            self.drain()

    def close(self) -> None:
        """Let the micro-batch being applied finish (its error is the caller's to drain first), then stop."""
        self._executor.shutdown(wait=True)
