"""Operators in Spark's tasks (issue 19, item 2; ``Settings.operators_in_tasks``), on the real stack
with a multi-process Spark (``local-cluster[2,1,1024]``: two executors in their own JVMs and Python
workers): filter/project views, a GROUP BY shuffled by its groups' partitions, and two-view inner, full
outer and anti joins shuffled by their join keys' partitions and then by their view key's, whose partitions
are computed, written (a Kafka transaction per partition) and staged by tasks (the GROUP BY's and the
joins' with their operator state), their epochs committed in Redis by the driver.

Also a filter whose key is its upstream's renamed (``id AS order_id``), over 2 partitions where its
upstream has 3: its input shuffled by the partition of its own key (``mvlog.views.key_routing``).

* I1: the views equal DuckDB's evaluation at every committed epoch, Redis equals their changelog, and
  an independent client reading the changelog (confluent-kafka and fastavro only) finds every epoch
  whole, one barrier per partition, though each partition committed in its own transaction.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import cast

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle
from .processes.task_view_runner import run as run_views
from .task_views import (
    CHAIN,
    JOINS,
    LONE,
    RANKED,
    RENAMED,
    SELF,
    SELF_ANTI,
    SELF_JOINS,
    UNIONS,
    VIEWS,
    changes_of,
    check_wire,
    done_lines,
    extended,
    tables,
    task_settings,
    why,
    write_epochs,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_filter_and_project_views_in_tasks_on_a_local_cluster_match_the_oracle(
        make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    settings = task_settings(make_settings)
    table, t2 = tables(settings, redis_client)
    for name, sql in [*VIEWS, *JOINS, *SELF_JOINS, *UNIONS]:
        create_view(settings, name, sql, client=redis_client)
    create_view(settings, *RENAMED, client=redis_client, partitions=2)
    store = ViewStore(redis_client, settings.topic_prefix)
    views = [v for v, _ in VIEWS] + [RENAMED[0]] + [v for v, _ in [*JOINS, *SELF_JOINS, *UNIONS]]
    rng = random.Random(19)
    try:
        last = write_epochs(table, rng, 4, 60, t2)
        first = run_views(settings, views)
        assert first.returncode == 0, why(first)
        done = done_lines(first.stdout)
        # Every upstream epoch, every partition, written by this run's tasks. The join's epochs are both
        # tables': it plans up to the least latest epoch of the two (both writers run), t1's last, so t2's
        # epoch after it waits for the next run (4 + 3 now, 1 + 3 + 2 then).
        assert all(done[view] == (last, 4 * 3) for view, _ in [*VIEWS, *SELF_JOINS]), done  # self-joins: t1's
        assert done["mvr"] == (last, 4 * 2), done
        assert all(done[join] == (last, 7 * 3) for join, _ in [*JOINS, *UNIONS]), done
        for join, _ in JOINS:
            assert store.get_state(join, [b"j0[%d]" % LONE, b"j1[%d]" % LONE]) == {}  # both buckets emptied
            assert len(redis_client.hkeys(f"{settings.topic_prefix}:{{{join}}}:opstate")) > 5
        last = write_epochs(table, rng, 2, 40, t2)  # a second run starts after the MCE's barriers (and state)
        second = run_views(settings, views)
        assert second.returncode == 0, why(second)
        done = done_lines(second.stdout)
        assert done["mvf"] == done["mvg"] == done["mvjs"] == done["mvjx"] == (last, 2 * 3)
        assert done["mvr"] == (last, 2 * 2)
        # t2's last epoch of the first run, then t1's two and the t2 epoch between them.
        assert all(done[join] == (last, 4 * 3) for join, _ in [*JOINS, *UNIONS]), done
    finally:
        table.close()
        t2.close()
    assert check_oracle(settings, redis_client, ["t1", "t2", *views]) >= 5 * 7 + 3 * (7 + 6)
    changes = {view: changes_of(check_wire(settings, redis_client, view, last)) for view in views}
    deletes = {view: sum(change["op"] == "d" for change in changes[view]) for view in views}
    assert deletes["mvg"] > 0, "no group emptied: the GROUP BY's deletes went untested"
    assert deletes["mvj"] > 0, "no joined pair deleted"
    assert deletes["mvja"] > 0, "no row left the anti join"
    ranked = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{{RANKED[0]}}}:opstate"))
    assert sum(key.startswith(b"t[") for key in ranked) >= 5, ranked  # the groups ranked in the join's tasks
    assert deletes["mvjr"] > 0 and store.row_count("mvjr") >= 10, "no pair left a join key's top 3"
    nested = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{mvgg}}:opstate"))
    assert {key[:key.index(b"[")] for key in nested} == {b"($(g))g", b"g"}, nested  # both levels' groups
    assert deletes["mvgg"] > 0 and store.row_count("mvgg") >= 10, "no window emptied"
    assert any(change["op"] == "u" for change in changes["mvgg"]), "no window's top or count updated"
    chained = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{{CHAIN[0]}}}:opstate"))
    assert {key[:key.index(b"[")] for key in chained} == {b"j0", b"j1", b"j1.0", b"j1.1"}, chained
    assert deletes["mvjc"] > 0 and store.row_count("mvjc") >= 20, "the chain's rows never came and went"
    assert extended(changes["mvjc"], "after", "id3") > 0, "no row of the chain's LEFT JOIN null-extended"
    assert deletes["mvu"] > 0 and store.row_count("mvu") > 20, "the union's rows never came and went"
    union_state = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{mvu}}:opstate"))
    assert {key[:key.index(b"[")] for key in union_state} == {b"($(branch1))g", b"($(branch2))g"}, union_state
    union_state = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{mvuj}}:opstate"))
    assert {key[:key.index(b"[")] for key in union_state} == {
        b"($(branch0))j0", b"($(branch0))j1", b"($(branch1))j0", b"($(branch1))j1", b"($(branch2))g",
        b"($(branch3))($(p))g", b"($(branch3))($(q))g", b"($(branch3))j0", b"($(branch3))j1",
        b"($(branch4))g"}, union_state
    assert deletes["mvuj"] > 0 and store.row_count("mvuj") > 20, "the union's joined rows never came and went"
    over_groups = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{mvjq}}:opstate"))
    assert {key[:key.index(b"[")] for key in over_groups} == {b"($(q))j0", b"($(q))j1", b"($(q))g", b"g"}, over_groups
    assert store.row_count("mvjq") == 3 and len(changes["mvjq"]) > 3, "the averages per b never moved"
    over_self = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{mvjqs}}:opstate"))
    assert {key[:key.index(b"[")] for key in over_self} == {b"($(q))j0", b"($(q))j1", b"($(q))g", b"g"}, over_self
    assert deletes["mvjqs"] > 0 or any(change["op"] == "u" for change in changes["mvjqs"]), "its counts never moved"
    grouped_sides = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{mvgj}}:opstate"))
    assert {key[:key.index(b"[")] for key in grouped_sides} == {b"($(p))g", b"($(q))g", b"j0", b"j1"}, grouped_sides
    assert store.row_count("mvgj") >= 5 and any(change["op"] != "c" for change in changes["mvgj"]), "no row moved"
    hot = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{mvq5}}:opstate"))
    assert {key[:key.index(b"[")] for key in hot} == {b"($(c))g", b"($(t))g", b"($(t))($(m))g", b"j0", b"j1"}, hot
    assert store.row_count("mvq5") >= 5 and deletes["mvq5"] > 0, "no item stopped being a window's hottest"
    state = cast(list[bytes], redis_client.hkeys(f"{settings.topic_prefix}:{{mvjg}}:opstate"))
    groups = [key for key in state if key.startswith(b"g[")]
    assert store.row_count("mvjg") == len(groups) >= 5 and len(changes["mvjg"]) > len(groups)  # groups updated
    assert deletes["mvjs"] > 0 and store.row_count(SELF[0]) > 10, "the self-join's pairs never came and went"
    assert deletes["mvjx"] > 0 and store.row_count(SELF_ANTI[0]) > 10, "no row of the self anti join left it"
    # Each side's null-extended rows asserted (a join key's last match left, or it never had one) and
    # retracted (its first match arrived, or the row left).
    for missing in ("id2", "id"):
        for image in ("after", "before"):
            assert extended(changes["mvjf"], image, missing) > 0, (missing, image)
