"""bench/_cpu.py's pure parts: a ``/proc/<pid>/stat`` line's parent and CPU ticks, and which processes
belong to the driver, the executors, the broker and Redis (the driver's share of issue 19 depends on it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

from _cpu import ProcStat, parse_stat, roles, thread_group  # noqa: E402


def test_parse_stat_counts_after_the_last_parenthesis_of_the_command() -> None:
    # comm "(a) b)" holds a space and a parenthesis; utime 11, stime 22, cutime 33, cstime 44
    line = "42 ((a) b)) S 7 42 42 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 3 0 100 1000 50"
    assert parse_stat(42, line) == ProcStat(42, 7, 11 + 22, 33 + 44)


def test_parse_stat_of_this_process() -> None:
    stat = parse_stat(os.getpid(), Path(f"/proc/{os.getpid()}/stat").read_text())
    assert stat.ppid == os.getppid()
    assert stat.ticks > 0


def test_roles_split_the_driver_jvm_tree_at_the_executors() -> None:
    # python driver 10 -> JVM 11 -> {planning worker 12, executor 20 -> daemon 21 -> worker 22,
    # executor 30}; broker 40 -> 41; redis 50; someone else's 60
    tree = {10: 1, 11: 10, 12: 11, 20: 11, 21: 20, 22: 21, 30: 11, 40: 10, 41: 40, 50: 10, 60: 1}
    stats = {pid: ProcStat(pid, ppid, 1) for pid, ppid in tree.items()}
    found = roles(stats, [20, 30], driver=10, driver_jvm=11, broker=40, redis=50)
    assert found == {"driver_py": {10}, "driver_jvm": {11}, "driver_workers": {12},
                     "executors": {20, 21, 22, 30}, "broker": {40, 41}, "redis": {50}}


def test_thread_group_drops_the_number() -> None:
    assert thread_group("Executor task l") == "Executor task l"
    assert thread_group("dispatcher-Bloc") == "dispatcher-Bloc"
    assert thread_group("shuffle-client-3") == "shuffle-client"
    assert thread_group("GC Thread#1") == "GC Thread"
    assert thread_group("12") == "12"
