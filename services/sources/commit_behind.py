"""One commit in flight: an epoch committed on a thread of its own while the caller reads the next one.

The source ingester's pipelining (:mod:`.ingester`): reading and decoding the next epoch overlaps the
Kafka transaction and the Redis write of the last one. At most one commit runs, and the next one starts
only after it ended, so epochs still commit one after the other, in order; what a commit raised is raised
on the caller's thread by :meth:`CommitBehind.settle`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class CommitBehind(Generic[T]):
    """Runs ``commit(item)`` on a thread named ``thread_name``, one at a time."""

    def __init__(self, commit: Callable[[T], object], thread_name: str) -> None:
        self._commit = commit
        self._thread_name = thread_name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._waited_s = 0.0

    @property
    def ended(self) -> bool:
        """A commit was started and has ended (:meth:`settle` then returns at once, or raises its error)."""
        return self._thread is not None and not self._thread.is_alive()

    def start(self, item: T) -> None:
        """Commit ``item`` on its own thread, after the commit in flight (waited for first)."""
        self.settle()

        def run() -> None:
            try:
                self._commit(item)
            except BaseException as error:  # raised on the caller's thread by settle()
                self._error = error

        self._thread = threading.Thread(target=run, name=self._thread_name, daemon=True)
        self._thread.start()

    def settle(self) -> None:
        """Wait for the commit in flight, if any; raise what it raised."""
        thread = self._thread
        if thread is None:
            return
        started = time.monotonic()
        thread.join()
        self._waited_s += time.monotonic() - started
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def take_waited_s(self) -> float:
        """Seconds :meth:`settle` waited since the last call (what the commits cost the reading)."""
        waited, self._waited_s = self._waited_s, 0.0
        return waited

    def close(self) -> None:
        """Let the commit in flight end without raising its error (the caller is closing: it is moot)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self._error = None
