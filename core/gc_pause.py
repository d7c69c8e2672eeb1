"""Pausing the cyclic garbage collector around allocation-heavy loops that create no cycles.

Reading a changelog allocates a GC-tracked object per Kafka message. The batch being decoded outlives
a few young collections, so its messages are promoted to the oldest generation, and every second batch
or so triggers a full collection of the whole heap: a third of a replay's time went there. Decoding one
consume batch with the collector paused, and dropping the batch before it resumes, leaves nothing to
promote. Nothing made inside the pause leaks: reference counting frees it as usual, and the collector
catches up on any cycle once it resumes.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # pauses in progress, in any thread: the collector resumes when the last one ends
_resume = False  # whether the collector was enabled when the first pause began


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector is off inside the block (unless someone turned it off before: then it stays off)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
