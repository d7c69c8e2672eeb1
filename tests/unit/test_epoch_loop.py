"""A table's background epochs (EpochLoop): a commit per interval after the backpressure wait, none once
closed, and the first error kept for the table's next call, the loop stopped."""

from __future__ import annotations

import threading

from mvlog.services.tables.epoch_loop import EpochLoop


def test_commits_each_interval_after_the_downstreams_and_stops_when_closed() -> None:
    closed, calls, third = threading.Event(), [], threading.Event()

    def commit() -> None:
        calls.append("commit")
        if calls.count("commit") == 3:
            third.set()

    loop = EpochLoop("t1", 0.01, commit, lambda: calls.append("wait"), closed)
    loop.start()
    assert third.wait(5)
    closed.set()
    loop.stop()
    done = len(calls)
    assert calls[:6] == ["wait", "commit"] * 3  # the backpressure wait before every commit
    assert loop.error is None
    loop.stop()  # already ended: returns at once, and commits nothing more
    assert len(calls) == done


def test_the_first_error_stops_the_loop_and_is_kept() -> None:
    closed, commits = threading.Event(), []

    def commit() -> None:
        commits.append(1)
        raise OSError("broker gone")

    loop = EpochLoop("t1", 0.01, commit, lambda: None, closed)
    loop.start()
    loop._thread.join(5)  # it ends by itself: nobody closed it
    assert not loop._thread.is_alive()
    assert isinstance(loop.error, OSError) and commits == [1]


def test_closing_before_the_first_interval_commits_nothing() -> None:
    closed, commits = threading.Event(), []
    loop = EpochLoop("t1", 60.0, lambda: commits.append(1), lambda: None, closed)
    loop.start()
    closed.set()
    loop.stop()  # woken at once, not after the 60 s interval
    assert commits == [] and loop.error is None
