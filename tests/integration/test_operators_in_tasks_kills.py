"""Operators in Spark's tasks (issue 19, items 4 and 6) on a multi-process Spark
(``local-cluster[2,1,1024]``), killed where a transaction per partition matters.

* I2 with a transaction per partition: the driver SIGKILLed by a GROUP BY's task right after its
  partition committed an epoch (other partitions had or had not): the next consumer's tasks find what
  committed, recompute it from the committed state, write only the rest, and the view loses and doubles
  nothing; then the same with the join's task of view partition 0 (after its second shuffle), the
  aggregate over the join's, and the union's (a side per branch, one a GROUP BY), those three in local
  mode (only the driver dies: no executor of its own is needed). In the GROUP BY's
  run, a filter view's task kills only its own Python worker after its first
  epoch, and another of its tasks SIGKILLs its executor's JVM after its first epoch: Spark retries
  both (the second on the other executor, or on the one the cluster's worker starts in place of the
  dead one), and each retry finds its first epoch committed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.partition_epochs import PartitionBarrier
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle
from .processes.task_view_runner import run as run_views
from .task_views import GROUPED, JOIN, UNION, VIEWS, check_wire, done_lines, tables, task_settings, why, write_epochs

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]


def _committed(settings: Settings, view: str, start: dict[int, int]) -> dict[int, list[PartitionBarrier]]:
    """Each partition's barriers after the offsets ``start`` (those after an MCE's barrier)."""
    return {p: partition_barriers(settings, view, p, start[p]) for p in range(3)}


def _after_mce(store: ViewStore, view: str, mce: int) -> dict[int, int]:
    start = store.index.offsets_after(view, 3, mce)
    assert len(start) == 3, start
    return start


def test_driver_killed_after_some_partitions_committed_loses_and_doubles_nothing(
        make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    settings = task_settings(make_settings)
    table, t2 = tables(settings, redis_client)
    views = {name: sql for name, sql in [*VIEWS, JOIN, GROUPED, UNION] if name in ("mvf", "mvg", "mvj", "mvjg", "mvu")}
    for name, sql in views.items():
        create_view(settings, name, sql, client=redis_client)
    store = ViewStore(redis_client, settings.topic_prefix)
    rng = random.Random(4)
    try:
        mce = write_epochs(table, rng, 2, 50, t2)
        # The runs without a kill of an executor or a Python worker (all but the second) need no cluster:
        # local mode starts faster, and its driver dies the same way.
        local = settings.model_copy(update={"spark_master": "local[2]"})
        assert run_views(local, list(views)).returncode == 0
        assert all(store.mce(view) == mce for view in ("mvg", "mvj", "mvjg", "mvu"))
        start = {view: _after_mce(store, view, mce) for view in ("mvg", "mvj", "mvjg", "mvu")}
        last = write_epochs(table, rng, 4, 80, t2)
        # mvf's task of partition 0 kills its Python worker after its first epoch, its task of partition 1
        # the executor JVM it runs in: both are retried. mvg's task of partition 0 kills the driver after its
        # second epoch, while the other partitions' tasks hold after their first until the driver is gone
        # (however fast the tasks run, partition 0 is then ahead of them).
        killed = run_views(settings, ["mvf", "mvg"], kills=["mvf:0:worker", "mvf:1:executor", "mvg:0:driver2",
                                                            "mvg:1:hold", "mvg:2:hold"])
        assert killed.returncode == -9, (killed.returncode, killed.stdout, why(killed))
        # Spark's scheduler saw the executor die of the SIGKILL (128 + 9), not only a task fail.
        assert re.search(r"Lost executor \d+ .*exited with code 137", killed.stderr), why(killed)
        # Each retried task found its partition's first epoch committed by the attempt that died.
        assert done_lines(killed.stdout)["mvf"] == (last, 4 * 3 - 2)
        # Kafka ahead of Redis: partition 0 committed an epoch above the MCE, another partition did not.
        assert store.mce("mvg") == mce
        before = {"mvg": _committed(settings, "mvg", start["mvg"])}
        # mvg resumes; then the join's task of view partition 0 (after the second shuffle) kills the driver,
        # the same way.
        resumed = run_views(local, ["mvg", "mvj"], kills=["mvj:0:driver2", "mvj:1:hold", "mvj:2:hold"])
        assert resumed.returncode == -9, (resumed.returncode, resumed.stdout, why(resumed))
        written = {"mvg": done_lines(resumed.stdout)["mvg"]}
        assert written["mvg"][0] == last and store.mce("mvj") == mce
        before["mvj"] = _committed(settings, "mvj", start["mvj"])
        # mvj resumes; then the aggregate over the join's task of view partition 0 (after the third step)
        # kills the driver, the same way: its groups' state staged beside the join's buckets is redone.
        joined = run_views(local, ["mvj", "mvjg"], kills=["mvjg:0:driver2", "mvjg:1:hold", "mvjg:2:hold"])
        assert joined.returncode == -9, (joined.returncode, joined.stdout, why(joined))
        written["mvj"] = done_lines(joined.stdout)["mvj"]
        assert written["mvj"][0] == last and store.mce("mvjg") == mce
        before["mvjg"] = _committed(settings, "mvjg", start["mvjg"])
        # mvjg resumes; then the union's task of view partition 0 (its branches' rows, t2's GROUP BY state
        # among them, after the second shuffle) kills the driver, the same way.
        united = run_views(local, ["mvjg", "mvu"], kills=["mvu:0:driver2", "mvu:1:hold", "mvu:2:hold"])
        assert united.returncode == -9, (united.returncode, united.stdout, why(united))
        written["mvjg"] = done_lines(united.stdout)["mvjg"]
        assert written["mvjg"][0] == last and store.mce("mvu") == mce
        before["mvu"] = _committed(settings, "mvu", start["mvu"])
        final = run_views(local, ["mvu"])
        assert final.returncode == 0, why(final)
        written["mvu"] = done_lines(final.stdout)["mvu"]
        assert written["mvu"][0] == last
    finally:
        table.close()
        t2.close()
    # What committed before the kill stayed, at the same offsets; the rest was written once. The join's
    # epochs: t2's last of the first round (after t1's last), then 4 of t1 and 3 of t2.
    for view, epochs in (("mvg", 4), ("mvj", 1 + 4 + 3), ("mvjg", 1 + 4 + 3), ("mvu", 1 + 4 + 3)):
        assert before[view][0], f"{view}: partition 0 committed nothing before the kill"
        assert min(len(b) for b in before[view].values()) < len(before[view][0]), before[view]
        after = _committed(settings, view, start[view])
        for p in range(3):
            assert after[p][:len(before[view][p])] == before[view][p]
        assert written[view][1] == sum(len(after[p]) - len(before[view][p]) for p in range(3))
        assert all(len(after[p]) == epochs for p in range(3)), (view, after)
    check_oracle(settings, redis_client, ["t1", "t2", *views])
    for view in views:
        check_wire(settings, redis_client, view, last)
