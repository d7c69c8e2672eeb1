"""What the tests of operators in Spark's tasks on a multi-process Spark share
(``test_operators_in_tasks.py``, ``test_operators_in_tasks_kills.py``): the ``local-cluster`` master, the
views, the workload of two tables, the runner's output and the checks of the wire."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable
from typing import Any

import redis

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services.tables.writer import Table

from .barrier_check import assert_barriers_once
from .independent_consumer import PartitionLog, check_whole_epochs, read_topic

CLUSTER = "local-cluster[2,1,1024]"
VIEWS = [
    ("mvf", "SELECT * FROM t1 WHERE deleted = false"),
    ("mvp", "SELECT id, v1 + 1 AS v2, CASE WHEN v1 > 0 THEN 'pos' ELSE 'neg' END AS sign FROM t1"),
    ("mvf2", "SELECT id, v1 FROM mvf WHERE v1 > 0"),  # on a view maintained in tasks
    # A GROUP BY: shuffled by its groups' partitions, state per group read and staged by the tasks; about
    # three upstream keys a group, so updates and deletes empty groups (the changelog's deletes) and
    # move the extremes.
    ("mvg", "SELECT id % 40 AS b, count(*) AS n, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi, avg(v1) AS a "
            "FROM t1 WHERE deleted = false GROUP BY id % 40"),
    # A global aggregate: every row shuffled to its one row's partition, whose task alone computes it; the
    # other partitions' epochs are barriers only. Over a filter subquery: the rows its WHERE drops go nowhere.
    ("mvga", "SELECT count(*) AS n, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi "
             "FROM (SELECT id, v1 FROM t1 WHERE deleted = false) s"),
    # A hopping window over ``id`` as the time (ms): each row in three windows, often of three partitions;
    # the row goes to each, whose operator folds its own windows.
    ("mvw", "SELECT window.start, window.end, count(*) AS n, sum(v1) AS s, max(v1) AS hi FROM t1 "
            "WHERE deleted = false GROUP BY window(id, '10 milliseconds', '4 milliseconds')"),
    # A top-N: a join's two shuffles, by ranking group (v1) for its state, then by the view key (id) for its
    # changelog; rows move between groups as v1 changes, and a group's top 2 shifts as rows come and go.
    ("mvt", "SELECT id, v1, rn FROM (SELECT id, v1, ROW_NUMBER() OVER (PARTITION BY v1 ORDER BY id DESC) AS rn "
            "FROM t1 WHERE deleted = false) t WHERE rn <= 2"),
    # A GROUP BY over a windowed GROUP BY (Nexmark q5's shape: counts per key and hopping window, then the
    # most per window): t1's rows shuffled to each partition holding one of their inner groups (``id % 4``
    # and a window; each task's subquery keeps its own windows' state), the subquery's changes by ``ws``
    # (the outer groups'), then by the view key; an inner group's count moving changes its window's top.
    ("mvgg", "SELECT ws, max(n) AS top, count(*) AS c, sum(b) AS s FROM (SELECT id % 4 AS b, window.start AS ws, "
             "count(*) AS n FROM t1 WHERE deleted = false GROUP BY id % 4, window(id, '10 milliseconds', "
             "'4 milliseconds')) g GROUP BY ws"),
]
# The upstream's key under another name, and over two partitions where t1 has three (either alone is
# enough): other key bytes, so the input is shuffled by the partition of the key it will have
# (mvlog.views.key_routing), no state.
RENAMED = ("mvr", "SELECT v1, id AS order_id FROM t1 WHERE v1 <> 0")


# A two-view inner join: both inputs shuffled by their join key's partition (the buckets' state read and
# staged by those tasks), the output shuffled again by the view key's partition, where it is written.
# About two t2 rows per join key, so deletes and updates of t2 empty buckets and move rows between them.
JOIN = ("mvj", "SELECT t1.id, t2.id AS id2, t1.v1, t2.w FROM t1 JOIN t2 ON t1.v1 = t2.k WHERE t1.deleted = false")
T2 = {"id": "int", "k": "int", "w": "int"}
LONE = 100  # the join key of one row of each side, inserted and then deleted: both its buckets empty
# A full outer join, the same way. Its LONE rows: t1's null-extended, then retracted when t2's arrives
# (its key's first match), then t2's null-extended when t1's leaves (its key's last match), then gone;
# random t2 updates and deletes empty and fill t2's buckets under t1's rows too.
FULL = ("mvjf", "SELECT t1.id, t2.id AS id2, t1.v1, t2.k, t2.w FROM t1 FULL JOIN t2 ON t1.v1 = t2.k")
# An anti join, the same way (t2's rows routed by the column its subquery passes through): t1's LONE row
# in it, then out when t2's arrives, a row of t1 in or out as its key's last match leaves or arrives.
ANTI = ("mvja", "SELECT t1.id, t1.v1 FROM t1 WHERE NOT EXISTS (SELECT 1 FROM t2 WHERE t2.k = t1.v1 AND t2.w < 80)")
# An aggregate over the join: a third step, the joined rows shuffled to their groups' partitions (groups
# that are not join keys), each group's state read and staged there beside the join's buckets. Windowed
# over t1's ``id`` as the time (ms): a joined row falls in two windows, often of two partitions, and goes
# to each, whose task folds its own windows.
GROUPED = ("mvjg", "SELECT window.start, t2.w % 7 AS b, count(*) AS n, sum(t1.v1) AS s, min(t2.k) AS lo "
                   "FROM t1 JOIN t2 ON t1.v1 = t2.k WHERE t1.deleted = false "
                   "GROUP BY window(t1.id, '20 milliseconds', '10 milliseconds'), t2.w % 7")
# A GROUP BY over the anti join: the subquery run in the join-key tasks, the rows without a match then
# shuffled to their groups (v1 % 3: several join keys a group).
ANTI_GROUPED = ("mvjag", "SELECT t1.v1 % 3 AS b, count(*) AS n, max(t1.id) AS hi FROM t1 WHERE NOT EXISTS "
                         "(SELECT 1 FROM t2 WHERE t2.k = t1.v1 AND t2.w < 80) GROUP BY t1.v1 % 3")
# A global aggregate over the join: every joined row to its one row's partition, whose task alone folds it.
GLOBAL = ("mvjt", "SELECT count(*) AS n, sum(t2.w) AS s, min(t1.id) AS lo FROM t1 JOIN t2 ON t1.v1 = t2.k")
# A top-N over the join ranked per join key (Nexmark q9's shape): each join-key task joins and ranks its
# own keys (a group's state ``t[...]`` beside its buckets); the second shuffle consolidates the ranks that
# moved by view key. New t2 rows with a higher ``w`` push pairs out of a group's top 3, deletes let them in.
RANKED = ("mvjr", "SELECT id, id2, v1, w, rn FROM (SELECT t1.id, t2.id AS id2, t1.v1, t2.w, ROW_NUMBER() OVER "
                  "(PARTITION BY t1.v1 ORDER BY t2.w DESC, t1.id) AS rn FROM t1 JOIN t2 ON t1.v1 = t2.k "
                  "WHERE t1.deleted = false) AS r WHERE rn <= 3")
# A chain of joins on one key, t1 read twice (its second side's rows routed apart): every step in the task
# of the key (``v1`` = ``k``), its buckets of both steps there (``j0``/``j1``, ``j1.0``/``j1.1``).
CHAIN = ("mvjc", "SELECT t1.id, t2.id AS id2, b.id AS id3, t2.w FROM t1 JOIN t2 ON t1.v1 = t2.k "
                 "LEFT JOIN t1 b ON t2.k = b.v1 AND b.id % 10 = 0 WHERE t1.deleted = false")
# A GROUP BY over a join's GROUP BY by t1's join key (Nexmark q4's shape: the highest bid of each auction,
# then the average per category): the join and its inner groups (v1, w % 3) in v1's join-key task, the
# subquery's changes shuffled by b, then the view's by its key.
OVER_GROUPS = ("mvjq", "SELECT b, avg(hi) AS a, count(*) AS n, max(hi) AS top FROM (SELECT t1.v1, t2.w % 3 AS b, "
                       "max(t1.id) AS hi FROM t1 JOIN t2 ON t1.v1 = t2.k WHERE t1.deleted = false "
                       "GROUP BY t1.v1, t2.w % 3) q GROUP BY b")
# A join of two GROUP BY subqueries on keys among their groups (Nexmark q8's shape): t1's live rows per v1
# and hopping window, t2's per k and the same windows, joined on the key and the window. Each side's rows
# go to the partition of their groups' join key (a t1 row in two windows, often of two partitions: each
# task's subquery keeps its own), where the groups (``($(p))g``, ``($(q))g``) and the buckets are.
GROUPS_JOINED = ("mvgj", "SELECT p.v1, p.ws, p.n, q.m FROM (SELECT v1, window.start AS ws, count(*) AS n FROM t1 "
                         "WHERE deleted = false GROUP BY v1, window(id, '20 milliseconds', '10 milliseconds')) p "
                         "JOIN (SELECT k, window.start AS ws, max(w) AS m FROM t2 "
                         "GROUP BY k, window(id, '20 milliseconds', '10 milliseconds')) q "
                         "ON p.v1 = q.k AND p.ws = q.ws")
JOINS = [JOIN, FULL, ANTI, GROUPED, ANTI_GROUPED, GLOBAL, RANKED, CHAIN, OVER_GROUPS, GROUPS_JOINED]
# Self-joins: t1's one read routed twice, as the left side by ``v1`` and as the right side by ``id``
# (another partition for most rows); a row whose ``v1`` is an ``id`` of t1 pairs with that row. And an
# anti join whose subquery reads t1 too: the rows no live row points to.
SELF = ("mvjs", "SELECT a.id, b.id AS id2, a.v1, b.deleted FROM t1 a JOIN t1 b ON a.v1 = b.id")
SELF_ANTI = ("mvjx", "SELECT a.id, a.v1 FROM t1 a WHERE NOT EXISTS (SELECT 1 FROM t1 b WHERE b.v1 = a.id "
                     "AND b.deleted = false)")
# And q4's shape over an outer self-join: per row of t1 the rows pointing to it, 0 for none (grouped by the
# preserved right side's join key, in that key's task, each side reading an input of its own), then how
# many rows have that many.
SELF_GROUPS = ("mvjqs", "SELECT n, count(*) AS c, max(hi) AS top FROM (SELECT b.id, count(a.id) AS n, "
                        "max(a.id) AS hi FROM t1 a RIGHT JOIN t1 b ON a.v1 = b.id GROUP BY b.id) q GROUP BY n")
# Nexmark q5's shape ("hot items"): t1's live rows counted per v1 and hopping window, joined on the window with
# each window's highest count (a GROUP BY over the same counts), kept where the count is the highest. t1 is
# read once and routed per side by the window of each row's groups; both levels of the second side's
# groups (``($(t))g``, ``($(t))($(m))g``) are in the window's task with the first side's.
HOT = ("mvq5", "SELECT c.v1, c.n, c.ws FROM (SELECT v1, count(*) AS n, window.start AS ws FROM t1 "
               "WHERE deleted = false GROUP BY v1, window(id, '20 milliseconds', '10 milliseconds')) c "
               "JOIN (SELECT max(m.n) AS top, m.ws FROM (SELECT count(*) AS n, window.start AS ws FROM t1 "
               "WHERE deleted = false GROUP BY v1, window(id, '20 milliseconds', '10 milliseconds')) m "
               "GROUP BY m.ws) t ON c.ws = t.ws AND c.n >= t.top")
SELF_JOINS = [SELF, SELF_ANTI, SELF_GROUPS, HOT]
# A UNION ALL of a filter of t1, a GROUP BY of t2 and a hopping window over t1: the join's two steps, a side
# per branch (t1's rows routed by their own key for the filter, to each partition of their windows for the
# window, whose task keeps its own windows; t2's by group, whose state that task reads and stages), then the
# output by the view key (branch and its key: a t1 row in two branches is two view rows, most often in two
# partitions).
UNION = ("mvu", "SELECT id, v1 FROM t1 WHERE deleted = false UNION ALL SELECT k, count(*) AS n FROM t2 GROUP BY k "
                "UNION ALL SELECT window.start, count(*) AS n FROM t1 WHERE v1 < 0 "
                "GROUP BY window(id, '10 milliseconds', '4 milliseconds')")
# A UNION ALL with a join branch: t1's and t2's rows routed for it by the join key (its buckets there,
# ``($(branch0))j0[...]``), t1's and t2's again for the anti join branch by its join key (``($(branch1))j0``,
# t2's rows as its subquery passes their ``k`` through), t1's for the global aggregate's branch to its
# one row's partition, whose task alone keeps that row, t1's and t2's for a join of GROUP BY subqueries
# (q8's shape) by the join key of their groups (``($(branch3))($(p))g[...]`` beside the branch's buckets), and
# t1's for a GROUP BY over a filter/project subquery by the group of the subquery's row.
UNION_JOIN = ("mvuj", "SELECT t1.id, t2.w FROM t1 JOIN t2 ON t1.v1 = t2.k WHERE t1.deleted = false "
                      "UNION ALL SELECT id, v1 FROM t1 WHERE v1 < 0 "
                      "AND NOT EXISTS (SELECT 1 FROM t2 WHERE t2.k = t1.v1) "
                      "UNION ALL SELECT count(*) AS n, sum(v1) AS s FROM t1 WHERE deleted = false "
                      "UNION ALL SELECT p.v1, q.n FROM (SELECT v1, count(*) AS n FROM t1 WHERE deleted = false "
                      "GROUP BY v1) p JOIN (SELECT k, count(*) AS n FROM t2 GROUP BY k) q ON p.v1 = q.k "
                      "UNION ALL SELECT b, sum(id) AS s FROM (SELECT v1 % 3 AS b, id FROM t1 WHERE deleted = false) "
                      "f GROUP BY b")
UNIONS = [UNION, UNION_JOIN]


def task_settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(spark_master=CLUSTER, operators_in_tasks=True, tasks_min_records=0, partitions=3)


def tables(settings: Settings, client: redis.Redis) -> tuple[Table, Table]:
    """t1 (``id``, ``v1``, ``deleted``) and t2 (:data:`T2`), each committing only when flushed."""
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean"}, ["id"], client=client,
                      auto_commit=False)
    return t1, Table.create(settings, "t2", T2, ["id"], client=client, auto_commit=False)


def write_epochs(table: Table, rng: random.Random, epochs: int, rows: int, t2: Table | None = None) -> int:
    """``epochs`` epochs of upserts (new keys and updates), deletes and one empty epoch; the last one.
    With ``t2``: after each, an epoch of ``t2`` (the first one inserts a row of each table with join key
    :data:`LONE`, the third deletes both, each table in its own epoch)."""
    last = 0
    for n in range(epochs):
        if n != 1:  # the second one is empty: its barriers still go to every partition downstream
            table.upsert([{"id": rng.randrange(rows * 2), "v1": rng.randrange(-5, 5),
                           "deleted": rng.random() < 0.3} for _ in range(rows)])
            table.delete([rng.randrange(rows * 2) for _ in range(rows // 10)])
        if t2 is not None and n == 0:
            table.upsert([{"id": 1000, "v1": LONE, "deleted": False}])
        if t2 is not None and n == 2:
            table.delete([1000])
        last = table.flush()
        if t2 is not None:
            t2.upsert([{"id": rng.randrange(20), "k": rng.randrange(-5, 5), "w": rng.randrange(100)}
                       for _ in range(4)])
            t2.delete([rng.randrange(20)])
            if n == 0:
                t2.upsert([{"id": 1000, "k": LONE, "w": 1}])
            if n == 2:
                t2.delete([1000])
            t2.flush()
    return last


def why(process: subprocess.CompletedProcess[str]) -> str:
    """The runner's Python traceback (its stderr also holds the JVM's log)."""
    start = process.stderr.rfind("Traceback (most recent call last)")
    return process.stderr[start:start + 6000] if start >= 0 else process.stderr[-6000:]


def done_lines(output: str) -> dict[str, tuple[int, int]]:
    """view -> (MCE, partition epochs written) from the runner's ``done`` lines."""
    return {words[1]: (int(words[2]), int(words[3])) for line in output.splitlines()
            if (words := line.split())[:1] == ["done"]}


def check_wire(settings: Settings, client: redis.Redis, view: str, mce: int) -> dict[int, PartitionLog]:
    """The barriers and the independent consumer's whole epochs; returns the changelog as it read it."""
    assert_barriers_once(settings, client, view, mce)
    partitions = CatalogStore(settings, client).get(view).partitions
    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic(view), partitions, idle=1.5)
    indexed = {e.epoch for e in ViewStore(client, settings.topic_prefix).index.between(view, 0, 0, mce)}
    # The chain rule confirms every epoch but the last; the epoch index confirms the last.
    assert check_whole_epochs(logs) | {mce} == indexed
    return logs


def changes_of(logs: dict[int, PartitionLog]) -> list[dict[str, Any]]:
    return [change for log in logs.values() for entries in log.changes.values() for _, change in entries]


def extended(changes: list[dict[str, Any]], image: str, missing: str) -> int:
    """Null-extended rows (``missing``: the other side's key column, NULL) in ``image`` of ``changes``."""
    return sum(change[image] is not None and change[image][missing] is None for change in changes)
