"""I3 for the Faust log cache against the real broker, Redis and Spark: stopped, slow and crash-looping
downstreams of a cached table do not slow its writer, and replay what they lagged afterwards."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle
from .barrier_check import assert_barriers_once
from .cache_workload import COLUMNS, cache_worker, until, writing
from .laps import Laps
from .processes.view_runner import spawn as spawn_view_runner

pytestmark = [pytest.mark.integration]


class _SlowConsumer(ViewConsumer):
    """A downstream that takes 0.5 s per epoch once started (an artificial delay), so it falls ever
    further behind; the backlog that :meth:`start` applies goes at full speed.

    The delay is in ``apply_epoch``, which every epoch the consumer's driver computes goes through.
    """

    delay = 0.0

    def start(self, on_catch_up: Callable[[int, int], None] | None = None) -> Any:
        query = super().start(on_catch_up)
        self.delay = 0.5
        return query

    def apply_epoch(self, epoch: int, changes: Any) -> None:
        time.sleep(self.delay)
        super().apply_epoch(epoch, changes)


class _CrashLoop:
    """A downstream that crash-loops: its consumer process is SIGKILLed each time it commits an epoch and
    started again at once, as a supervisor would, until :meth:`stop`."""

    def __init__(self, settings: Settings, view: str) -> None:
        self.settings = settings
        self.view = view
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()
        self._child: subprocess.Popen[str] | None = None
        self.errors: list[str] = []

    def __enter__(self) -> _CrashLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:  # a child still starting would print nothing for half a minute: end it now
            if self._child is not None:
                self._child.send_signal(signal.SIGKILL)
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            child = spawn_view_runner(self.settings, [self.view])
            with self._lock:
                self._child = child
                if self._stop.is_set():
                    child.send_signal(signal.SIGKILL)
            try:
                assert child.stdout is not None
                for line in child.stdout:  # "mce VIEW EPOCH" once an epoch is committed: the crash point
                    if line.startswith("mce ") or self._stop.is_set():
                        break
                else:
                    if not self._stop.is_set():  # (killed by __exit__ otherwise)
                        self.errors.append(f"the consumer exited by itself ({child.poll()})")
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait()
            if not self._stop.is_set():
                self.kills += 1


def test_isolation_stopped_slow_and_crash_looping_downstreams_do_not_slow_the_upstream(
        settings: Settings, redis_client: redis.Redis, spark: Any, report: Callable[[str], None]) -> None:
    """I3: t1 has a stopped downstream (mv1), a slow one (mv2) and a crash-looping one (mv3); t0 has none.
    Both write at once for the same seconds with the worker caching t1: their epoch rates match. Then the
    three downstreams run normally, replay what they lagged, and the oracle holds at every epoch."""
    t0 = Table.create(settings, "t0", COLUMNS, ["id"], client=redis_client)
    t1 = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client)
    create_view(settings, "mv2", "SELECT sum(v1) AS s FROM t1", client=redis_client)
    create_view(settings, "mv3", "SELECT count(v1) AS c FROM t1", client=redis_client)
    store = ViewStore(redis_client, settings.topic_prefix)
    laps = Laps()
    # The crash loop's process starts while the slow consumer does (the tables commit an empty epoch
    # every interval from their creation on: it crashes at its first commit, writes or not).
    with cache_worker(settings, "t1", partitions=settings.partitions), _CrashLoop(settings, "mv3") as crashing:
        slow = _SlowConsumer(settings, "mv2", spark=spark, client=redis_client, max_epochs_per_trigger=5)
        try:
            slow.start()  # its backlog is applied before start() returns
            laps.lap("slow consumer started")
            with writing(t0, seed=1), writing(t1, seed=2):
                # Up to 300 s: its Spark driver's start took over 120 s twice on a loaded CI machine.
                until(lambda: crashing.kills >= 1, 300, "the crash-looping consumer's first crash")
                until(lambda: (store.mce("mv2") or 0) > 0, 60, "the slow consumer's first epoch")
                laps.lap("first crash")
                start = {t: store.mce(t) for t in ("t0", "t1")}
                time.sleep(4)  # the measurement window: epochs each table commits in these 4 s
                epochs = {t: store.index.count_after(t, start[t]) for t in ("t0", "t1")}
            lag = store.index.count_after("t1", store.mce("mv2"))
        finally:
            slow.stop()
    t0.close()
    t1.close()
    laps.lap("measured")
    ratio = epochs["t1"] / epochs["t0"]
    report(f"I3: t1 (stopped, slow and crash-looping downstreams) {epochs['t1']} epochs in 4 s, t0 (none) "
           f"{epochs['t0']}: ratio {ratio:.2f}; mv2 lags {lag} epochs; mv3 crashed {crashing.kills} times")
    assert not crashing.errors, crashing.errors
    assert lag > 3, "the slow downstream really fell behind"
    assert ratio >= 0.8
    last = store.mce("t1") or 0
    for view in ("mv1", "mv2", "mv3"):  # restarted: each replays its lagged epochs and catches up
        consumer = ViewConsumer(settings, view, spark=spark, client=redis_client, max_epochs_per_trigger=1000)
        assert consumer.catch_up() == last
        consumer.stop()
    laps.lap("caught up")
    checked = check_oracle(settings, redis_client, ["t1", "mv1", "mv2", "mv3"])
    assert checked > 0
    laps.lap("oracle")
    for view in ("mv1", "mv2", "mv3"):
        assert_barriers_once(settings, redis_client, view, last)
    laps.lap("barriers")
    report(f"I3's phases: {laps}; {checked} (view, epoch) pairs checked")
