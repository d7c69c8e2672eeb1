"""Pausing the cyclic garbage collector around allocation-heavy loops that create no cycles, and keeping
its full collections off the heap a long-running loop found when it started.

Reading a changelog allocates a GC-tracked object per Kafka message. The batch being decoded outlives
a few young collections, so its messages are promoted to the oldest generation, and every second batch
or so triggers a full collection of the whole heap: a third of a replay's time went there. Decoding one
consume batch with the collector paused, and dropping the batch before it resumes, leaves nothing to
promote. Nothing made inside the pause leaks: reference counting frees it as usual, and the collector
catches up on any cycle once it resumes.

A loop that holds many objects for a while (a source ingester holds an epoch's rows and keys until the
epoch commits) promotes enough of them to the oldest generation to trigger a **full collection** every
few thousand records, and a full collection walks the whole heap: the 110k objects of the modules mvlog
imports take 40-50 ms each time, whatever the loop holds (``bench/ingest_stages.py`` measured 0.5-0.6 s
of CPU per 200k records ingested, a quarter of the ingester's CPU). :func:`heap_frozen` moves what is
alive when the loop starts to the collector's permanent generation (``gc.freeze``) while it runs, so full
collections see only what the loop made. Reference counting still frees frozen objects; a cycle among
them that becomes garbage meanwhile is collected once the last frozen block ends (``gc.unfreeze``).
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


_frozen = 0  # heap_frozen blocks in progress, in any thread: the heap is unfrozen when the last one ends
_unfreeze = False  # whether the first block froze the heap (not when someone else had frozen it before)


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Full collections skip the objects alive when the first such block began, until the last one ends
    (see the module doc). A heap someone else froze before is left as it is."""
    global _frozen, _unfreeze
    with _lock:
        if _frozen == 0:
            _unfreeze = gc.get_freeze_count() == 0
            if _unfreeze:
                gc.freeze()
        _frozen += 1
    try:
        yield
    finally:
        with _lock:
            _frozen -= 1
            if _frozen == 0 and _unfreeze:
                gc.unfreeze()
