"""gc_paused: off inside, back to the state before when the last pause ends, from any thread; heap_frozen:
the heap frozen inside, unfrozen when the last block ends, a heap frozen by someone else left so."""

from __future__ import annotations

import gc
import threading

import pytest

from mvlog.gc_pause import gc_paused, heap_frozen


@pytest.fixture(autouse=True)
def collector_on() -> None:
    gc.enable()


def test_the_collector_is_off_inside_and_on_after() -> None:
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_and_overlapping_pauses_resume_once_the_last_ends() -> None:
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=other)
    with gc_paused():
        thread.start()
        assert inside.wait(5)
        with gc_paused():
            assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's pause is still on
    leave.set()
    thread.join(5)
    assert gc.isenabled()


def test_a_collector_turned_off_before_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_error_inside_still_resumes_the_collector() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


@pytest.fixture
def heap_not_frozen() -> None:
    if gc.get_freeze_count():  # an ingester of another test still runs in this process (its heap_frozen)
        pytest.skip("the heap is frozen by something else in this process")


@pytest.mark.usefixtures("heap_not_frozen")
def test_the_heap_is_frozen_inside_and_unfrozen_when_the_last_block_ends() -> None:
    before: object = object.__new__(type("Before", (), {}))  # a GC-tracked object alive when the block begins
    with heap_frozen():
        assert gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())  # frozen: no generation holds it
        with heap_frozen():
            pass
        assert gc.get_freeze_count() > 0  # the outer block still runs
    assert gc.get_freeze_count() == 0
    assert any(o is before for o in gc.get_objects())


@pytest.mark.usefixtures("heap_not_frozen")
def test_a_heap_frozen_before_stays_frozen() -> None:
    # Not gc.get_freeze_count() before and after: another thread of the process may free frozen objects
    # meanwhile. An object frozen before the block must still be in the permanent generation after it.
    before: object = object.__new__(type("FrozenBefore", (), {}))
    gc.freeze()
    try:
        with heap_frozen():
            pass
        assert gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())  # not unfrozen into a generation
    finally:
        gc.unfreeze()
    assert any(o is before for o in gc.get_objects())  # the check above can see it once it is unfrozen
