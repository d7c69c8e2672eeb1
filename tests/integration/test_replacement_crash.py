"""SIGKILL during a replacement's hydration and at each step of its cut-over: applied exactly once.

The consumers of t1 -> mv1 -> mv2, mv3 run in a child process that SIGKILLs itself at a chosen point
(``processes/replacement_runner.py``) while the upstream keeps writing: during hydration, after the
cut-over epoch reached Kafka but not Redis, and after Redis but before the catalog. Each restart carries
on from what was durable; at the end the changelog holds exactly one committed apply_replacement epoch
(the killed attempts are dropped by the chain rule), the oracle holds at every epoch of every view, and
the catalog has the new definition. The ``tasks`` variant runs the operators in Spark's tasks and kills
the replacement's hydration there, after its tasks staged the first state and before the swap; a
restart hydrates it anew and follows the view's epochs in tasks, and is killed once it committed an
epoch ahead of its view; the next restart cuts over in tasks, and is killed by the cut-over's task of
partition 0 once that partition committed its part (the apply can then be neither withdrawn nor
discarded); the last one completes the cut-over at that epoch.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.replacement_store import CutOverBegunError, ReplacementRecord, ReplacementStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.replacement import Status
from mvlog.services.control_plane import ensure_control_plane
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.replacement.operations import request_apply, stage_replacement, wait_for_apply
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle
from .barrier_check import assert_barriers_once
from .independent_consumer import read_topic
from .processes.task_view_runner import run as run_task_views
from .test_cli_views import mvlog, ok, refused
from .test_replacement import changelog

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]  # 4 Spark processes

ROOT = Path(__file__).resolve().parents[2]
VIEWS = ["mv1", "mv2", "mv3"]
NEW = "SELECT * FROM t1 WHERE deleted = false AND v1 > 0"


def _runner(settings: Settings, kill_at: str, views: list[str] = VIEWS) -> subprocess.Popen[str]:
    # ROOT first for the runner; the caller's PYTHONPATH stays (e.g. a worktree's package over the installed one).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen([sys.executable, "-m", "tests.integration.processes.replacement_runner",
                             settings.model_dump_json(), kill_at, *views],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)


def _until(condition: Callable[[], object], what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _killed(child: subprocess.Popen[str], timeout: float = 300.0) -> None:
    """Wait for the child to SIGKILL itself at its kill point."""
    try:
        code = child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        raise AssertionError("the consumer process did not reach its kill point") from None
    assert code == -9, f"the consumer process exited with {code}, not by its SIGKILL"


@pytest.mark.timeout(1500)  # four Spark process starts; the oracle checks every epoch of three views
@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_sigkill_during_hydration_and_cut_over_applies_exactly_once(
        path: str, make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    # "tasks": the views' operators run in Spark's tasks, and so does the replacement's hydration (a
    # filter over the whole changelog), killed after its tasks staged the first state, before the swap,
    # and its cut-over, killed after partition 0's task committed its part to Kafka.
    tasks = path == "tasks"
    settings = make_settings(barrier_interval_ms=1000,  # fewer epochs for the oracle to check
                             operators_in_tasks=tasks, tasks_min_records=0)
    table = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean"}, ["id"], client=redis_client)
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client)
    create_view(settings, "mv2", "SELECT sum(v1) AS s FROM mv1", client=redis_client)
    create_view(settings, "mv3", "SELECT count(v1) AS c FROM mv1", client=redis_client)
    views, replacements = ViewStore(redis_client, settings.topic_prefix), ReplacementStore(redis_client,
                                                                                         settings.topic_prefix)
    catalog = CatalogStore(settings, redis_client)
    stop = threading.Event()
    rng = random.Random(3)

    def workload() -> None:  # the upstream keeps writing through every kill
        while not stop.is_set():
            table.upsert([{"id": rng.randrange(100), "v1": rng.randrange(-20, 20), "deleted": rng.random() < 0.3}
                          for _ in range(20)])
            table.delete([rng.randrange(100)])
            stop.wait(0.05)

    def record() -> ReplacementRecord:
        found = replacements.record("mv1")
        assert found is not None
        return found

    writer = threading.Thread(target=workload)
    writer.start()
    child: subprocess.Popen[str] | None = None
    try:
        # 1. Killed while hydrating: nothing of the replacement is committed, the view is untouched.
        child = _runner(settings, "hydrate")
        _until(lambda: (views.mce("mv1") or 0) > 0, "mv1's first epochs")
        staged = stage_replacement(settings, "mv1", NEW, client=redis_client)
        _killed(child)
        assert not record().hydrated and record().status is Status.STAGED
        # In tasks, the staged first state is all there is: the replacement's own keys are still empty.
        assert redis_client.exists(replacements.key("mv1", "rows.hydrate")) == tasks
        assert not redis_client.exists(replacements.key("mv1", "rows"))

        ahead = 0
        if tasks:
            # 2. In tasks the replacement follows its view's epochs there, committed first: killed after it
            # committed an epoch the view has not, the replacement is ahead of its view.
            child = _runner(settings, "followed")
            _killed(child)
            ahead = record().mce or 0
            assert ahead > (views.mce("mv1") or 0), (ahead, views.mce("mv1"))  # two epochs ahead (the runner)
            assert (record().fields or {})["hydrated_from"].endswith("in Spark's tasks")
            assert not redis_client.exists(replacements.key("mv1", "rows.hydrate"))
            request_apply(settings, "mv1", client=redis_client)  # pending while the replacement is ahead

            # 3. The cut-over in tasks, killed once partition 0 committed its part: fixed at its epoch.
            child = _runner(settings, "cutover_partition")
            _killed(child)
            cut = record().cut_epoch
            assert cut is not None and cut >= ahead and record().status is Status.STAGED, record()
            assert [b.epoch for b in partition_barriers(settings, "mv1", 0, 0)][-1] == cut
            with pytest.raises(CutOverBegunError, match=f"began at epoch {cut}"):
                replacements.withdraw_apply("mv1", staged.id)
            assert f"began at epoch {cut}" in refused(mvlog(settings, "replacement", "discard", "mv1"))
            assert f"cutting over at epoch {cut}" in ok(mvlog(settings, "replacement", "list")).stdout
            assert record().apply_requested and catalog.get("mv1").sql != NEW
        else:
            # 2. Killed after the cut-over epoch reached Kafka, before Redis: not applied (yet).
            child = _runner(settings, "cutover_kafka")
            _until(lambda: record().hydrated, "hydration after the restart")
            request_apply(settings, "mv1", client=redis_client)
            _killed(child)
            assert record().status is Status.STAGED and record().apply_requested
            entry = catalog.get("mv1")
            attempts = [b for entries in read_topic(settings.bootstrap_servers, settings.changelog_topic("mv1"),
                                                    entry.partitions, idle=1.5)[0].barriers.values()
                        for _, b in entries if b["mutation"] is not None]
            assert len(attempts) == 1  # the killed attempt is in Kafka, uncommitted for readers

            # 3. Killed after the Redis cut-over, before the catalog entry: applied; the catalog lags.
            child = _runner(settings, "cutover_redis")
            _killed(child)
            assert record().status is Status.APPLIED
            assert catalog.get("mv1").sql != NEW

        # 4. A clean restart rolls the catalog forward (the driver's path; its kill after the Redis commit is
        # the same in tasks) or completes the cut-over at its fixed epoch, each partition's part once (in
        # tasks), and the chain carries on under the new definition.
        child = _runner(settings, "none")
        applied = wait_for_apply(settings, "mv1", staged.id, timeout=60, client=redis_client)
        assert catalog.get("mv1").sql == NEW
        if tasks:  # where the killed attempt fixed it
            assert applied.epoch == cut, (applied.epoch, cut)
    except BaseException:
        if child is not None and child.poll() is None:  # a failed step leaves no consumer running
            child.kill()
            child.wait()
        raise
    finally:
        stop.set()
        writer.join()
    last = table.flush()
    table.close()
    assert child is not None
    try:
        _until(lambda: all((views.mce(v) or 0) >= last for v in VIEWS), "every view at the last epoch", 180)
    finally:
        child.kill()
        child.wait()

    assert check_oracle(settings, redis_client, ["t1", *VIEWS]) > 0
    committed = [(e.epoch, e.mutation.payload["replacement_id"]) for e in changelog(settings, redis_client, "mv1")
                 if e.mutation is not None]
    assert committed == [(applied.epoch, staged.id)]
    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic("mv1"), catalog.get("mv1").partitions,
                      idle=1.5)
    for partition, log in logs.items():
        mutated = [(epoch, offset) for epoch, entries in log.barriers.items() for offset, b in entries
                   if b["mutation"] is not None]
        # The driver's path: step 2's killed attempt and step 3's kept one. In tasks: each partition's
        # part once, whichever attempt committed it.
        assert len(mutated) == (1 if tasks else 2), (partition, mutated)
        index = views.index.at("mv1", partition, applied.epoch)
        assert index is not None and (applied.epoch, index.offset) in mutated
    assert (catalog.get("mv1").version, applied.version) == (3, 3)


@pytest.mark.timeout(900)
def test_a_micro_batch_killed_in_tasks_is_finished_there_though_an_apply_waits(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any) -> None:
    """A GROUP BY view's micro-batch in Spark's tasks, its driver SIGKILLed by partition 0's task after it
    committed two epochs (the others one), while the apply of the view's staged replacement was pending. A
    busy stage sends epochs the driver's way, which writes every partition: before a micro-batch completed
    in tasks, that would write those partitions' committed epochs again; a cut-over then, the tasks' way,
    would find one of them committed under the old definition. So the next consumer finishes them in tasks
    first, then cuts over in tasks at the next epoch; each epoch's barrier is in each partition once, and
    the oracle holds at every epoch."""
    settings = make_settings(operators_in_tasks=True, tasks_min_records=0, partitions=3)
    table = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean"}, ["id"],
                         client=redis_client, auto_commit=False)
    rng = random.Random(8)

    def epoch() -> int:
        table.upsert([{"id": rng.randrange(60), "v1": rng.randrange(-5, 9), "deleted": False} for _ in range(20)])
        table.delete([rng.randrange(60)])
        return table.flush()

    store = ViewStore(redis_client, settings.topic_prefix)
    epoch()
    create_view(settings, "mvg", "SELECT id % 7 AS b, count(*) AS n, sum(v1) AS s FROM t1 GROUP BY id % 7",
                client=redis_client)
    try:
        assert run_task_views(settings, ["mvg"]).returncode == 0
        staged = stage_replacement(settings, "mvg", "SELECT id % 7 AS b, count(*) AS n, sum(v1) AS s FROM t1 "
                                   "WHERE v1 > 0 GROUP BY id % 7", client=redis_client)
        last = [epoch() for _ in range(3)][-1]
        request_apply(settings, "mvg", client=redis_client)
        killed = run_task_views(settings, ["mvg"], ["mvg:0:driver2", "mvg:1:hold", "mvg:2:hold"])
        # Its first micro-batch went the tasks' way though the apply waited (the driver's way would not kill).
        assert killed.returncode == -9, (killed.returncode, killed.stdout, killed.stderr[-3000:])
        mce = store.mce("mvg") or 0
        assert partition_barriers(settings, "mvg", 0, 0)[-1].epoch > mce, "partition 0 is not ahead of Redis"
        consumer = ViewConsumer(settings, "mvg", spark=spark, client=redis_client)
        try:
            assert consumer.catch_up() == last  # the pending epochs, finished in tasks
            assert consumer.tasks is not None and consumer.tasks.resumed
            assert consumer.replacement.cut_overs_in_tasks == 0
            cut = epoch()
            consumer.catch_up()  # now the cut-over, in tasks too
            assert wait_for_apply(settings, "mvg", staged.id, timeout=30, client=redis_client).epoch == cut
            assert consumer.replacement.cut_overs_in_tasks == 1
        finally:
            consumer.stop()
    finally:
        table.close()
    assert_barriers_once(settings, redis_client, "mvg", store.mce("mvg") or 0)
    assert check_oracle(settings, redis_client, ["t1", "mvg"]) >= 5


@pytest.mark.timeout(900)
def test_a_cut_over_half_committed_in_tasks_when_redis_is_wiped_completes_from_the_log(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any) -> None:
    """Redis wiped (FLUSHALL) after partition 0's task committed its part of a cut-over in tasks and before
    the cut-over's Redis commit: the record that fixed the cut-over is gone, and the one staged again from
    the catalog knows of no apply. Partition 0 holds the epoch as the replacement's cut-over, so the old
    definition can never be written there; the next consumer takes the cut-over back from the partitions'
    barriers, hydrates the replacement anew, follows it to that epoch and completes the cut-over there,
    each partition's part once; the oracle holds at every epoch."""
    settings = make_settings(operators_in_tasks=True, tasks_min_records=0)
    table = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean"}, ["id"],
                         client=redis_client, auto_commit=False)
    views, replacements = ViewStore(redis_client, settings.topic_prefix), ReplacementStore(redis_client,
                                                                                         settings.topic_prefix)
    rng = random.Random(5)
    stop = threading.Event()

    def epoch() -> int:
        table.upsert([{"id": rng.randrange(80), "v1": rng.randrange(-20, 20), "deleted": rng.random() < 0.3}
                      for _ in range(20)])
        table.delete([rng.randrange(80)])
        return table.flush()

    def workload() -> None:  # new upstream epochs for the cut-over to take
        while not stop.wait(0.3):
            epoch()

    def record() -> ReplacementRecord:
        found = replacements.record("mv1")
        assert found is not None
        return found

    epoch()
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client)
    writer = threading.Thread(target=workload)
    writer.start()
    child = _runner(settings, "cutover_partition", ["mv1"])
    try:
        _until(lambda: (views.mce("mv1") or 0) > 0, "mv1's first epochs")
        staged = stage_replacement(settings, "mv1", NEW, client=redis_client)
        _until(lambda: record().hydrated, "the replacement's hydration")
        request_apply(settings, "mv1", client=redis_client)
        _killed(child)  # by partition 0's task of the cut-over, once it committed its part
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        stop.set()
        writer.join()
    cut = record().cut_epoch
    assert cut is not None and partition_barriers(settings, "mv1", 0, 0)[-1].epoch == cut

    redis_client.flushall()
    assert ensure_control_plane(settings, redis_client)  # what `mvlog run-view` does first
    consumer = ViewConsumer(settings, "mv1", spark=spark, client=redis_client)
    try:
        assert record().id == staged.id  # staged again from the catalog
        consumer.catch_up()
        assert wait_for_apply(settings, "mv1", staged.id, timeout=30, client=redis_client).epoch == cut
        assert consumer.replacement.cut_overs_in_tasks == 1
        last = [epoch() for _ in range(2)][-1]
        assert consumer.catch_up() == last  # under the new definition
    finally:
        consumer.stop()
        table.close()
    assert CatalogStore(settings, redis_client).get("mv1").sql == NEW
    committed = [(e.epoch, e.mutation.payload["replacement_id"]) for e in changelog(settings, redis_client, "mv1")
                 if e.mutation is not None]
    assert committed == [(cut, staged.id)]
    assert_barriers_once(settings, redis_client, "mv1", last)
    assert check_oracle(settings, redis_client, ["t1", "mv1"]) >= 3
