"""I1 on the real stack: views maintained by the Spark consumer equal an independent evaluation.

Workloads come from hypothesis (inserts, updates, deletes, key collisions, NULLs, empty epochs); they go
through Apache Kafka and Redis, are read back by the ``format("mvlog")`` data source and maintained through
chains of depth 1 to 3 covering every supported construct. At every committed epoch of each view, its
changelog summed up to that barrier is compared with DuckDB evaluating the definition over the
upstreams' rows at that epoch; Redis' rows are compared with the changelog at the MCE; and the last
epoch is also checked with Spark SQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from mvlog.config import Settings
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLES = {
    "t1": ({"id": "int", "v1": "int", "deleted": "boolean", "k": "string"}, ["id"]),
    "t2": ({"id": "int", "w": "int"}, ["id"]),
}
# In dependency order: the canonical chain t1 -> mv1 -> mv2, mv3, then every construct, depth up to 3.
VIEWS = [
    ("mv1", "SELECT * FROM t1 WHERE deleted = false"),
    ("mv2", "SELECT sum(v1) AS s FROM mv1"),
    ("mv3", "SELECT count(v1) AS c FROM mv1"),
    ("mvp", "SELECT id, v1 + 1 AS v2, CASE WHEN v1 > 0 THEN 'pos' ELSE 'neg' END AS sign, v1 / 2 AS half FROM t1"),
    ("mv4", "SELECT k, count(*) AS n, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi, avg(v1) AS a "
            "FROM mv1 GROUP BY k"),
    ("mv5", "SELECT k, n * 2 AS n2, hi FROM mv4 WHERE n > 1"),
    ("mvj", "SELECT a.id, a.v1, b.w FROM mv1 a JOIN t2 b ON a.v1 = b.id"),
    # Outer joins: t2's deletes empty a side, so rows of t1 are null-extended again.
    ("mvl", "SELECT a.id, a.k, b.id AS bid, b.w FROM t1 a LEFT JOIN t2 b ON a.v1 = b.id"),
    # Over mv4, whose key k may be NULL (the presence column in the key), with a residual condition.
    ("mvf", "SELECT a.k, a.n, b.id AS bid, b.w FROM mv4 a FULL JOIN t2 b ON a.n = b.w AND b.id > 0"),
    # A WITH query, a semi join and a UNION ALL, nested in one view's operator.
    ("mvs", "WITH pos AS (SELECT id, v1 FROM t1 WHERE v1 > 0) SELECT p.id, p.v1 FROM pos p "
            "WHERE EXISTS (SELECT 1 FROM t2 WHERE t2.id = p.v1) UNION ALL SELECT id, w FROM t2"),
    # Top-N per k (ties in v1 broken by id; deletes and `deleted` move rows up and empty partitions),
    # and a view on it.
    ("mvt", "SELECT * FROM (SELECT id, k, v1, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v1 DESC) AS rn "
            "FROM mv1) WHERE rn <= 2"),
    ("mvt2", "SELECT k, count(*) AS n, max(rn) AS deepest FROM mvt GROUP BY k"),
    # DISTINCT aggregates and HAVING (groups retracted and emitted again), SELECT DISTINCT.
    ("mvh", "SELECT k, count(DISTINCT v1) AS nd, sum(DISTINCT v1) AS sd, count(*) AS n FROM t1 GROUP BY k "
            "HAVING count(*) > 2"),
    ("mvd", "SELECT DISTINCT k, deleted FROM t1"),
    # A hopping window over id as event time (INT epoch milliseconds): rows in two windows each.
    ("mvw", "SELECT window.start AS ws, window.end AS we, k, count(*) AS n, max(v1) AS top FROM t1 "
            "GROUP BY window(id, '4 milliseconds', '2 milliseconds'), k"),
]

t1_ops = st.one_of(
    st.tuples(st.just("upsert"), st.fixed_dictionaries({
        "id": st.integers(0, 12), "v1": st.one_of(st.none(), st.integers(-4, 4)),
        "deleted": st.booleans(), "k": st.sampled_from(["a", "b", "c"])})),
    st.tuples(st.just("delete"), st.integers(0, 12)),
)
t2_ops = st.one_of(
    st.tuples(st.just("upsert"), st.fixed_dictionaries({"id": st.integers(-4, 4), "w": st.integers(0, 3)})),
    st.tuples(st.just("delete"), st.integers(-4, 4)),
)
epoch_writes = st.fixed_dictionaries({
    "t1": st.lists(t1_ops, max_size=8), "t2": st.lists(t2_ops, max_size=3), "catch_up": st.booleans()})
workloads = st.lists(epoch_writes, min_size=1, max_size=4)


def _write(table: Table, ops: list[tuple[str, Any]]) -> None:
    for op, arg in ops:  # later ops on a key win within an epoch, as in the table writer
        if op == "upsert":
            table.upsert([arg])
        else:
            table.delete([arg])


def run_pipeline(settings: Settings, client: redis.Redis, spark: Any, workload: list[dict[str, Any]]) -> None:
    tables = {name: Table.create(settings, name, cols, pk, client=client, auto_commit=False)
              for name, (cols, pk) in TABLES.items()}
    for name, sql in VIEWS:
        create_view(settings, name, sql, client=client)
    consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name, _ in VIEWS]
    try:
        for writes in workload:
            for name, table in tables.items():
                _write(table, writes[name])
                table.flush()  # an epoch per table, empty ones included
            if writes["catch_up"]:
                for consumer in consumers:
                    consumer.catch_up()
        for consumer in consumers:
            consumer.catch_up()
    finally:
        for table in tables.values():
            table.close()
        for consumer in consumers:
            consumer.committer.writer.close()


def test_canonical_chain_and_every_construct_against_the_oracle(settings: Settings, redis_client: redis.Redis,
                                                                 spark: Any) -> None:
    workload = [
        {"t1": [("upsert", {"id": i, "v1": i % 5 - 2, "deleted": i % 3 == 0, "k": "abc"[i % 3]}) for i in range(10)],
         "t2": [("upsert", {"id": i, "w": i}) for i in range(-2, 3)], "catch_up": True},
        {"t1": [("delete", 4), ("upsert", {"id": 1, "v1": 4, "deleted": False, "k": "a"})], "t2": [],
         "catch_up": False},
        {"t1": [], "t2": [], "catch_up": True},  # empty epochs still get barriers downstream
        {"t1": [("upsert", {"id": 2, "v1": None, "deleted": False, "k": "c"}), ("delete", 9)],
         "t2": [("delete", 0), ("upsert", {"id": 4, "w": 1})], "catch_up": True},
    ]
    run_pipeline(settings, redis_client, spark, workload)
    assert check_oracle(settings, redis_client, [*TABLES, *(v for v, _ in VIEWS)], spark) >= len(VIEWS) * 4


@hypothesis_settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(workload=workloads)
def test_generated_workloads_against_the_oracle(make_settings: Callable[..., Settings], redis_client: redis.Redis,
                                                spark: Any, workload: list[dict[str, Any]]) -> None:
    settings = make_settings(topic_prefix=f"h{uuid.uuid4().hex[:8]}")
    try:
        run_pipeline(settings, redis_client, spark, workload)
        check_oracle(settings, redis_client, [*TABLES, *(v for v, _ in VIEWS)])
    finally:
        for key in redis_client.scan_iter(f"{settings.topic_prefix}:*"):
            redis_client.delete(key)
