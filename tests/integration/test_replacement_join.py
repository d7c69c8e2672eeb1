"""Replacing a join view on a running chain, on the real stack (Apache Kafka, redis-server, Spark local);
a self-join, a top-N and two unions (a join's two steps in tasks) beside it.

t1 -> mv1, and mvj = mv1 JOIN t2 with mvs (an aggregate) on top. mvj's replacement adds a filter on
t2's side; both of its upstreams have snapshots at different epochs, so hydration starts at the newer
one with the other side's snapshot rolled forward by its changelog. After the apply the oracle holds
for every view at every epoch, and mvj's changelog before the cut-over is its old definition's.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.schemas.codec import decode_row
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.replacement.operations import replacement_rows, request_apply, stage_replacement, wait_for_apply
from mvlog.services.snapshot_compaction import build_snapshot
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import assert_same_rows, check_oracle, duckdb_view_rows, rows_at, rows_by_epoch
from .test_replacement import _canonical, changelog

pytestmark = [pytest.mark.integration, pytest.mark.spark]

JOIN = "SELECT a.id, a.v1, b.w FROM mv1 a JOIN t2 b ON a.v1 = b.id"
NEW = JOIN + " WHERE b.w > 0"
# A self-join, replaced beside it: one upstream (mv1) read once for both sides.
SELF = "SELECT a.id, b.id AS id2, a.v1 FROM mv1 a JOIN mv1 b ON a.v1 = b.id"
SELF_NEW = SELF + " WHERE b.v1 > 0"
# A top-N over mv1, replaced by another ranking: in tasks both run by ranking group (a join's two steps).
TOP_N = ("SELECT id, v1, rn FROM (SELECT id, v1, ROW_NUMBER() OVER (PARTITION BY v1 ORDER BY id DESC) AS rn "
         "FROM mv1) t WHERE rn <= 2")
TOP_N_NEW = ("SELECT id, v1, rn FROM (SELECT id, v1, ROW_NUMBER() OVER (PARTITION BY v1 ORDER BY id) AS rn "
             "FROM mv1) t WHERE rn <= 3")
# A UNION ALL of a filter of mv1, a GROUP BY of t2 and their join, replaced by others: in tasks a side per branch, mv1's
# rows to their own key's task, t2's to their group's (its state there), the output to the view key's.
UNION = ("SELECT id, v1 FROM mv1 WHERE v1 > 0 UNION ALL SELECT w, count(*) AS n FROM t2 GROUP BY w "
         "UNION ALL SELECT a.id, b.w FROM mv1 a JOIN t2 b ON a.v1 = b.id")  # and a join branch, by join key
UNION_NEW = ("SELECT id, v1 FROM mv1 WHERE v1 > 1 UNION ALL SELECT w, sum(id) AS n FROM t2 GROUP BY w "
             "UNION ALL SELECT a.id, b.w FROM mv1 a JOIN t2 b ON a.v1 = b.id AND b.w > 0")
# And one over mv1 alone (read once, both branches run on its rows).
SELF_UNION = "SELECT id, v1 FROM mv1 WHERE v1 > 0 UNION ALL SELECT id, v1 FROM mv1 WHERE v1 < 2"
SELF_UNION_NEW = "SELECT id, v1 FROM mv1 WHERE v1 > 1 UNION ALL SELECT id, -v1 FROM mv1 WHERE v1 < 3"
# A chain of joins on one key (mv1, t2, mv1 again), replaced by another: every step in the key's task.
CHAIN = "SELECT a.id, b.id AS id2, c.id AS id3 FROM mv1 a JOIN t2 b ON a.v1 = b.id LEFT JOIN mv1 c ON b.id = c.v1"
CHAIN_NEW = CHAIN + " AND c.id < 15"
# A GROUP BY over a GROUP BY, replaced by another: its inner groups' state by their tasks, then the outer.
NESTED = "SELECT n, count(*) AS c FROM (SELECT v1, count(*) AS n FROM mv1 GROUP BY v1) g GROUP BY n"
NESTED_NEW = NESTED.replace("FROM mv1 GROUP BY", "FROM mv1 WHERE id % 3 <> 0 GROUP BY")
VIEWS = [("mv1", "SELECT * FROM t1 WHERE deleted = false"), ("mvj", JOIN),
         ("mvs", "SELECT sum(w) AS s, count(*) AS n FROM mvj"), ("ref", JOIN), ("mvself", SELF), ("mvtop", TOP_N),
         ("mvu", UNION), ("mvu1", SELF_UNION), ("mvjc", CHAIN), ("mvgg", NESTED)]
REPLACED = {"mvj": NEW, "mvself": SELF_NEW, "mvtop": TOP_N_NEW, "mvu": UNION_NEW, "mvu1": SELF_UNION_NEW,
            "mvjc": CHAIN_NEW, "mvgg": NESTED_NEW}
#: Views replaced on the tasks' path only: the shapes the tasks run since session 35, and the self-join, the
#: top-N and the union of one view, whose replacement on the driver's path is mvj's and mvu's code (the
#: driver's operator of each is tested apart; the suite's time is kept down). A top-N over a join ranked per
#: join key takes the join's routing, as mvj and mvself do: left out for time.
TASKS_ONLY = ("mvjc", "mvgg", "mvself", "mvtop", "mvu1")


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_replace_a_join_view_under_a_running_chain(path: str, make_settings: Callable[..., Settings],
                                                   redis_client: redis.Redis, spark: Any) -> None:
    """``tasks``: the views run in Spark's tasks, and the join's replacement is hydrated there (a task per
    join-key partition, each side folded from its snapshot and its changelog after it)."""
    settings = make_settings(**({"operators_in_tasks": True, "tasks_min_records": 0} if path == "tasks" else {}))
    rng = random.Random(5)
    store = ViewStore(redis_client, settings.topic_prefix)
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean"}, ["id"], client=redis_client,
                      auto_commit=False)
    t2 = Table.create(settings, "t2", {"id": "int", "w": "int"}, ["id"], client=redis_client, auto_commit=False)
    views = [(name, sql) for name, sql in VIEWS if path == "tasks" or name not in TASKS_ONLY]
    replaced = {name: sql for name, sql in REPLACED.items() if path == "tasks" or name not in TASKS_ONLY}
    for name, sql in views:
        create_view(settings, name, sql, client=redis_client)
    consumers = [ViewConsumer(settings, name, spark=spark, client=redis_client) for name, _ in views]

    def write_epoch() -> int:
        """An epoch of each table; returns the epoch mvj reached (a join waits for both sides)."""
        t1.upsert([{"id": rng.randrange(30), "v1": rng.randrange(-3, 6), "deleted": rng.random() < 0.2}
                   for _ in range(10)])
        t1.delete([rng.randrange(30)])
        t2.upsert([{"id": rng.randrange(-3, 6), "w": rng.randrange(-2, 4)} for _ in range(3)])
        t1.flush()
        t2.flush()
        for consumer in consumers:
            consumer.catch_up()
        return store.mce("mvj") or 0

    try:
        for _ in range(2):
            write_epoch()
        t2_snapshot = build_snapshot(settings, "t2", spark, client=redis_client).record
        write_epoch()
        mv1_snapshot = build_snapshot(settings, "mv1", spark, client=redis_client).record
        assert t2_snapshot.epoch < mv1_snapshot.epoch
        write_epoch()

        staged = {name: stage_replacement(settings, name, sql, client=redis_client) for name, sql in replaced.items()}
        by_name = {consumer.entry.name: consumer for consumer in consumers}
        written = {name: tasks.epochs_written if (tasks := by_name[name].tasks) is not None else 0 for name in replaced}
        at = write_epoch()
        # In tasks the views' epochs stay there while the replacements are staged, and each replacement
        # follows there too: from its hydration epoch up to the view's MCE, then the view's next epoch.
        for name in replaced:
            consumer = by_name[name]
            if path == "tasks":
                assert consumer.tasks is not None and consumer.tasks.epochs_written > written[name], name
                assert consumer.replacement.epochs_in_tasks >= 2, (name, consumer.replacement.epochs_in_tasks)
            else:
                assert consumer.replacement.epochs_in_tasks == 0, name
        catalog = CatalogStore(settings, redis_client)
        upstreams = {name: (catalog.get(name).schema,
                            list(rows_at(rows_by_epoch(changelog(settings, redis_client, name)), at).values()))
                     for name in ("mv1", "t2")}
        in_tasks = ", in Spark's tasks" if path == "tasks" else ""
        for name in replaced:
            record, plan, rows = replacement_rows(settings, name, client=redis_client)
            assert record.mce == at and rows, name
            # Its rows at ``at`` are its definition over its upstreams' rows there (their changelogs summed).
            assert_same_rows(name, {plan.schema.key_of(r): r for r in rows}, duckdb_view_rows(plan, upstreams),
                             plan.schema, f"replacement at {at}")
        for name in ("mvj", "mvu", "mvjc"):  # two upstreams: the newer snapshot, the other rolled forward to it
            if name not in replaced:
                continue
            hydrated = ReplacementStore(redis_client, settings.topic_prefix).record(name)
            assert hydrated is not None and hydrated.hydration_epoch == mv1_snapshot.epoch, name
            assert (hydrated.fields or {})["hydrated_from"] == (f"mv1: snapshot at epoch {mv1_snapshot.epoch}; "
                                                                f"t2: snapshot at epoch {t2_snapshot.epoch}"
                                                                + in_tasks), name
        for name in ("mvself", "mvtop", "mvu1", "mvgg"):  # one upstream: its snapshot, then its changelog
            if name not in replaced:
                continue
            hydrated = ReplacementStore(redis_client, settings.topic_prefix).record(name)
            assert hydrated is not None and hydrated.hydration_epoch == mv1_snapshot.epoch, name
            assert (hydrated.fields or {})["hydrated_from"] == (f"mv1: snapshot at epoch {mv1_snapshot.epoch}"
                                                                + in_tasks), name
        for name in replaced:
            request_apply(settings, name, client=redis_client)
        reached = write_epoch()  # t1's and t2's epochs: the cut-over is mvj's first epoch after the request
        cut_over = wait_for_apply(settings, "mvj", staged["mvj"].id, timeout=30, client=redis_client).epoch
        assert at < cut_over <= reached
        for name in [n for n in ("mvself", "mvtop", "mvu", "mvu1", "mvjc", "mvgg") if n in replaced]:
            assert at < wait_for_apply(settings, name, staged[name].id, timeout=30,
                                       client=redis_client).epoch <= reached
        for name in replaced:  # in tasks, the cut-over's diff too: each view partition's task its part
            assert by_name[name].replacement.cut_overs_in_tasks == (path == "tasks"), name
        write_epoch()
    finally:
        t1.close()
        t2.close()
        for consumer in consumers:
            consumer.committer.writer.close()

    # I1 at every epoch: mvj under both definitions, mvs built on it, and the untouched ref.
    assert check_oracle(settings, redis_client, ["t1", "t2", *(name for name, _ in views)]) >= 4 * 8
    mvj_log, ref_log = changelog(settings, redis_client, "mvj"), changelog(settings, redis_client, "ref")
    assert [e.epoch for e in mvj_log if e.mutation is not None] == [cut_over]
    before = [(e.epoch, _canonical(e.changes)) for e in mvj_log if e.epoch < cut_over]
    assert before == [(e.epoch, _canonical(e.changes)) for e in ref_log if e.epoch < cut_over]
    # The new filter took effect: no row of mvj has w <= 0 after the cut-over.
    _, raw = store.read_at_consistent_epoch("mvj")
    assert all(decode_row(v)["w"] > 0 for _, v in raw)
    if "mvself" in replaced:  # ... and the self-join's: every pair's right side has v1 > 0 (at one epoch)
        (self_mce, self_rows), (mv1_mce, mv1_rows) = store.read_many_at_consistent_epoch(["mvself", "mv1"]).values()
        assert self_mce == mv1_mce
        positive = {row["id"] for row in map(decode_row, (v for _, v in mv1_rows)) if row["v1"] > 0}
        assert self_rows and all(decode_row(v)["id2"] in positive for _, v in self_rows)
