"""Replacement views on the real stack: stage, hydrate read-only, diff, apply under a running chain.

The canonical chain t1 -> mv1 -> mv2, mv3 runs while mv1's filter is replaced. A reference view ``ref``
keeps mv1's old definition over the same t1 epochs, so mv1's changelog before the cut-over can be
compared change for change with what it would have been without a staged replacement. The oracle
(DuckDB at every committed epoch) follows mv1's definitions through the apply_replacement mutation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import redis

from mvlog.catalog import CatalogError
from mvlog.changes import Change, Epoch
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.replacement_store import ReplacementRecord, ReplacementStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.replacement import IncompatibleReplacementError, ReplacementError, Status, staged_in
from mvlog.schemas.codec import decode_row
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.replacement.operations import (
    apply_replacement,
    diff_replacement,
    discard_replacement,
    replacement_rows,
    request_apply,
    stage_replacement,
    wait_for_apply,
)
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view, plan_for

from ..oracle import check_oracle, duckdb_view_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

T1 = {"id": "int", "v1": "int", "deleted": "boolean", "k": "string"}
OLD = "SELECT * FROM t1 WHERE deleted = false"
NEW = "SELECT * FROM t1 WHERE deleted = false AND v1 > 0"
MV2_NEW = "SELECT sum(v1) AS s FROM mv1 WHERE v1 > 1"
WIDER = "SELECT id, v1, deleted, k, v1 * 2 AS doubled FROM t1 WHERE deleted = false AND v1 > 0"  # + nullable column
MV3_NEW = "SELECT k, count(v1) AS c, sum(v1) AS s FROM mv1 GROUP BY k"  # + nullable column
VIEWS = [("mv1", OLD), ("mv2", "SELECT sum(v1) AS s FROM mv1"),
         ("mv3", "SELECT k, count(v1) AS c FROM mv1 GROUP BY k"), ("ref", OLD)]


def changelog(settings: Settings, client: redis.Redis, view: str) -> list[Epoch]:
    entry = CatalogStore(settings, client).get(view)
    store = ViewStore(client, settings.topic_prefix)
    with ChangelogReader(settings, view, entry.key_columns, entry.partitions, store.index,
                         upto_epoch=store.mce(view)) as reader:
        return list(reader.epochs(idle_timeout=10.0))


def hydrated_in_tasks(record: ReplacementRecord | None) -> bool:
    """Whether the replacement's first state was computed by Spark's tasks (its record says where from)."""
    assert record is not None and record.hydrated
    return (record.fields or {}).get("hydrated_from", "").endswith("in Spark's tasks")


def _canonical(changes: list[Change]) -> list[tuple[Any, ...]]:
    return sorted((c.op.value, c.key, sorted((c.before or {}).items()), sorted((c.after or {}).items()))
                  for c in changes)


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_replace_mv1_filter_under_running_mv2_mv3(path: str, make_settings: Callable[..., Settings],
                                                   redis_client: redis.Redis, spark: Any) -> None:
    # "tasks": mv1 (a filter) computes its epochs in Spark's tasks, before and after the cut-over, which
    # the consumer applies on the driver: the task path must then compute the new definition.
    settings = make_settings(operators_in_tasks=True, tasks_min_records=0) if path == "tasks" else make_settings()
    rng = random.Random(7)
    t1 = Table.create(settings, "t1", T1, ["id"], client=redis_client, auto_commit=False)
    for name, sql in VIEWS:
        create_view(settings, name, sql, client=redis_client)
    consumers = [ViewConsumer(settings, name, spark=spark, client=redis_client) for name, _ in VIEWS]
    mv1 = consumers[0]

    def write_epoch() -> int:
        t1.upsert([{"id": rng.randrange(30), "v1": rng.choice([None, *range(-3, 4)]), "deleted": rng.random() < 0.3,
                    "k": rng.choice("ab")} for _ in range(12)])
        t1.delete([rng.randrange(30)])
        return t1.flush()

    def run_views() -> None:
        for consumer in consumers:
            consumer.catch_up()

    try:
        for _ in range(3):
            write_epoch()
        run_views()
        staged = stage_replacement(settings, "mv1", NEW, client=redis_client)
        with pytest.raises(ReplacementError, match="already has a staged replacement"):
            stage_replacement(settings, "mv1", "SELECT * FROM t1", client=redis_client)
        assert staged_in(CatalogStore(settings, redis_client).get("mv1")) == (staged.id, NEW)  # in the catalog topic
        # mv2 (an aggregate on mv1) gets a replacement too: it follows mv1 through mv1's own cut-over.
        stage_replacement(settings, "mv2", MV2_NEW, client=redis_client)
        # mv3's (a GROUP BY: in "tasks" its operator state is derived per partition too).
        stage_replacement(settings, "mv3", MV3_NEW, client=redis_client)
        for _ in range(2):
            write_epoch()
            run_views()
        replacements = ReplacementStore(redis_client, settings.topic_prefix)
        hydrated_before = replacements.record("mv1")
        assert hydrated_before is not None and hydrated_before.mce == mv1.mce
        # "tasks": mv1's replacement (a filter) is hydrated by Spark's tasks, and so is mv2's (a global
        # aggregate: by the task of its one row's partition).
        assert hydrated_in_tasks(hydrated_before) == (path == "tasks")
        assert hydrated_in_tasks(replacements.record("mv2")) == (path == "tasks")
        assert hydrated_in_tasks(replacements.record("mv3")) == (path == "tasks")

        # Redis loses the replacement and the catalog: both come back from Kafka. The catalog topic has the
        # staged definition; mv1's next consumer records it again and hydrates it anew.
        redis_client.delete(*redis_client.scan_iter(f"{settings.topic_prefix}:{{mv1}}:replacement*"),
                            CatalogStore(settings, redis_client).key)
        assert CatalogStore(settings, redis_client).rebuild_from_topic() == 1 + len(VIEWS)
        mv1.committer.writer.close()
        mv1 = consumers[0] = ViewConsumer(settings, "mv1", spark=spark, client=redis_client)
        write_epoch()
        run_views()

        # Hydrated read-only at mv1's epoch: its rows are NEW over t1 at that epoch.
        record, plan, rows = replacement_rows(settings, "mv1", client=redis_client)
        assert record.mce == mv1.mce and hydrated_in_tasks(record) == (path == "tasks")
        t1_rows = [row for _, row in sorted(ViewStore(redis_client, settings.topic_prefix).read_at_consistent_epoch(
            "t1")[1])]
        upstream = {"t1": (CatalogStore(settings, redis_client).get("t1").schema, [decode_row(r) for r in t1_rows])}
        expected_new = duckdb_view_rows(plan, upstream)
        assert {plan.schema.key_of(r): r for r in rows} == expected_new
        # The diff at that same epoch: NEW only narrows the filter, so it only deletes.
        old_rows = duckdb_view_rows(plan_for(CatalogStore(settings, redis_client), "mv1", OLD), upstream)
        summary = diff_replacement(settings, "mv1", client=redis_client, samples=2)
        assert summary.epoch == mv1.mce
        assert (summary.inserts, summary.updates, summary.deletes) == (0, 0, len(set(old_rows) - set(expected_new)))
        assert summary.deletes > 0 and len(summary.samples["delete"]) == 2

        # An apply that cannot happen (no new epoch reaches mv1) is withdrawn after its timeout, with the
        # reason; nothing is applied at the next epoch.
        with pytest.raises(ReplacementError, match="did not reach a new epoch"):
            apply_replacement(settings, "mv1", timeout=0.5, client=redis_client)
        write_epoch()
        run_views()
        assert ReplacementStore(redis_client, settings.topic_prefix).record("mv1").status is Status.STAGED  # type: ignore[union-attr]

        # Apply: the cut-over happens at mv1's next epoch while mv2 and mv3 keep running.
        replacement_id = request_apply(settings, "mv1", client=redis_client)
        cut_over = write_epoch()
        run_views()
        applied = wait_for_apply(settings, "mv1", replacement_id, timeout=10, client=redis_client)
        assert applied.epoch == cut_over
        for _ in range(3):
            write_epoch()
            run_views()
        # A second replacement adds a nullable column: every row is updated with it; mv2, mv3 carry on.
        stage_replacement(settings, "mv1", WIDER, client=redis_client)
        write_epoch()
        run_views()
        assert hydrated_in_tasks(replacements.record("mv1")) == (path == "tasks")
        widened_id = request_apply(settings, "mv1", client=redis_client)
        widened_at = write_epoch()
        run_views()
        widened = wait_for_apply(settings, "mv1", widened_id, timeout=10, client=redis_client)
        assert widened.epoch == widened_at
        mv2_id = request_apply(settings, "mv2", client=redis_client)
        mv2_at = write_epoch()
        run_views()
        assert wait_for_apply(settings, "mv2", mv2_id, timeout=10, client=redis_client).epoch == mv2_at
        mv3_id = request_apply(settings, "mv3", client=redis_client)
        mv3_at = write_epoch()
        run_views()
        assert wait_for_apply(settings, "mv3", mv3_id, timeout=10, client=redis_client).epoch == mv3_at
        write_epoch()
        run_views()
    finally:
        t1.close()
        for consumer in consumers:
            consumer.committer.writer.close()

    # I1 for mv1 under each definition in turn and for mv2, mv3 (and ref) at every epoch; each changelog
    # summed to its MCE equals its Redis rows.
    assert check_oracle(settings, redis_client, ["t1", "mv1", "mv2", "mv3", "ref"]) >= 4 * 14
    assert [e.mutation.payload["sql"] for e in changelog(settings, redis_client, "mv2") if e.mutation] == [MV2_NEW]
    assert [e.mutation.payload["sql"] for e in changelog(settings, redis_client, "mv3") if e.mutation] == [MV3_NEW]
    mv1_log, ref_log = changelog(settings, redis_client, "mv1"), changelog(settings, redis_client, "ref")
    mutations = [(e.epoch, e.mutation) for e in mv1_log if e.mutation is not None]
    assert [(epoch, m.kind, m.payload["sql"], m.payload["replacement_id"]) for epoch, m in mutations] == [
        (cut_over, "apply_replacement", NEW, replacement_id), (widened_at, "apply_replacement", WIDER, widened_id)]
    widening = next(e for e in mv1_log if e.epoch == widened_at).changes
    # Rows already in mv1 are updated to carry the new column (the epoch's own upstream changes ride along).
    assert sum(c.op.value == "u" and c.before is not None and c.before["v1"] == (c.after or {}).get("v1")
               for c in widening) > 0
    assert all(c.after is None or c.after["doubled"] == c.after["v1"] * 2 for c in widening)
    # Before the cut-over, mv1's changelog is exactly what the old definition computes (ref).
    before = [(e.epoch, _canonical(e.changes)) for e in mv1_log if e.epoch < cut_over]
    assert before == [(e.epoch, _canonical(e.changes)) for e in ref_log if e.epoch < cut_over]
    assert len(before) == 7  # 3 before staging, 4 while staged
    entry = CatalogStore(settings, redis_client).get("mv1")
    assert (entry.sql, entry.version, staged_in(entry)) == (WIDER, widened.version, None)
    assert (applied.version, widened.version) == (3, 5)  # created 1, staged 2, applied 3, staged 4, applied 5
    assert entry.schema.column("doubled").nullable

    # Refusals: incompatible schema (naming the column), unknown view, discarded or missing replacement.
    with pytest.raises(IncompatibleReplacementError, match="column 'k' would be dropped"):
        stage_replacement(settings, "mv1", "SELECT id, v1, deleted, v1 * 2 AS doubled FROM t1", client=redis_client)
    with pytest.raises(CatalogError, match="unknown table or view 'nope'"):
        stage_replacement(settings, "nope", NEW, client=redis_client)
    with pytest.raises(ReplacementError, match="was applied at epoch"):
        apply_replacement(settings, "mv1", timeout=0.1, client=redis_client)
    stage_replacement(settings, "mv1", WIDER.replace("v1 > 0", "v1 > 1"), client=redis_client)
    discard_replacement(settings, "mv1", client=redis_client)
    assert staged_in(CatalogStore(settings, redis_client).get("mv1")) is None
    with pytest.raises(ReplacementError, match="was discarded"):
        apply_replacement(settings, "mv1", timeout=0.1, client=redis_client)
    with pytest.raises(ReplacementError, match="ref has no replacement"):
        apply_replacement(settings, "ref", timeout=0.1, client=redis_client)
    with pytest.raises(ReplacementError, match="'t1' is a table"):
        apply_replacement(settings, "t1", timeout=0.1, client=redis_client)
