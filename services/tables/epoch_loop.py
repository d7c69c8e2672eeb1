"""A root table's background epochs: every barrier interval, what was written meanwhile commits as one
epoch, on a thread of the table's own, until the table closes.

Writers call ``upsert`` and ``delete`` at their own pace and never wait for a commit; where an epoch ends
is a matter of time (``barrier_interval_ms``), as the design's barriers are. The first error stops the
loop and is kept: the table raises it at its writer's next call rather than queueing writes that would
never commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class EpochLoop:
    """Calls ``commit()`` every ``interval_s`` once ``wait_for_downstreams()`` returns (backpressure),
    until ``closed`` is set; :meth:`stop` after setting it wakes the loop and waits for its end."""

    def __init__(self, name: str, interval_s: float, commit: Callable[[], object],
                 wait_for_downstreams: Callable[[], None], closed: threading.Event) -> None:
        self.name, self.interval_s = name, interval_s
        self._commit, self._wait_for_downstreams, self._closed = commit, wait_for_downstreams, closed
        self.error: BaseException | None = None  # what stopped the loop, for the table's next call
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mvlog-table-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        next_tick = time.monotonic() + self.interval_s
        while not self._closed.is_set():
            self._wake.wait(max(0.0, next_tick - time.monotonic()))
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self._wait_for_downstreams()
                if self._closed.is_set():
                    return
                next_tick = time.monotonic() + self.interval_s
                self._commit()
            except BaseException as exc:  # surfaced to the table's next call
                log.exception("%s: epoch commit failed", self.name)
                self.error = exc
                return
