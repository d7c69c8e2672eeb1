"""A replacement hydrated from its upstream's snapshot, on the real stack (Apache Kafka, redis-server, Spark local).

The chain t1 -> mv1 -> mv2 runs while mv1's filter is replaced, with a reference view ``ref`` keeping
mv1's old definition. t1 has a snapshot at epoch E, so hydration computes the replacement at E from the
snapshot's rows and follows t1's changelog after E; the record says where it started. After the apply
the oracle holds at every epoch. Then t1's changelog loses its first epochs (the epoch index forgets
them, as after Kafka retention): a replacement still hydrates from the snapshot, and once the changelog
no longer covers the snapshot either, staging is stopped with the reason while mv1 carries on.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.kafka.retention import starts_the_log
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.replacement_store import ReplacementRecord, ReplacementStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.replacement import Status
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import decode_row
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.replacement.operations import (
    discard_replacement,
    replacement_rows,
    request_apply,
    stage_replacement,
    wait_for_apply,
)
from mvlog.services.snapshot_compaction import build_snapshot
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import assert_same_rows, check_oracle, duckdb_view_rows
from .test_cli_views import mvlog, ok
from .test_replacement import NEW, OLD, T1, WIDER, _canonical, changelog

pytestmark = [pytest.mark.integration, pytest.mark.spark]

VIEWS = [("mv1", OLD), ("mv2", "SELECT sum(v1) AS s, count(*) AS n FROM mv1"), ("ref", OLD)]


def _replacement_matches_oracle(settings: Settings, client: redis.Redis, view: str, at: int) -> ReplacementRecord:
    """The replacement's rows at ``at`` are its definition over t1's rows there (t1 is at ``at`` too)."""
    record, plan, rows = replacement_rows(settings, view, client=client)
    assert record.mce == at
    t1_mce, t1_raw = ViewStore(client, settings.topic_prefix).read_at_consistent_epoch("t1")
    assert t1_mce == at
    upstream = {"t1": (CatalogStore(settings, client).get("t1").schema, [decode_row(v) for _, v in t1_raw])}
    actual: dict[Key, Row] = {plan.schema.key_of(r): r for r in rows}
    assert_same_rows(view, actual, duckdb_view_rows(plan, upstream), plan.schema, f"replacement at {at}")
    return record


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_replacement_hydrates_from_the_upstream_snapshot(path: str, make_settings: Callable[..., Settings],
                                                         redis_client: redis.Redis, spark: Any) -> None:
    """``tasks``: mv1's filters run in Spark's tasks, and so does the hydration: a task per view partition
    reads the snapshot's files and stages its part of the replacement."""
    settings = make_settings(**({"operators_in_tasks": True, "tasks_min_records": 0} if path == "tasks" else {}))
    rng = random.Random(11)
    store = ViewStore(redis_client, settings.topic_prefix)
    replacements = ReplacementStore(redis_client, settings.topic_prefix)
    t1 = Table.create(settings, "t1", T1, ["id"], client=redis_client, auto_commit=False)
    for name, sql in VIEWS:
        create_view(settings, name, sql, client=redis_client)
    consumers = [ViewConsumer(settings, name, spark=spark, client=redis_client) for name, _ in VIEWS]
    mv1 = consumers[0]

    def write_epoch() -> int:
        t1.upsert([{"id": rng.randrange(40), "v1": rng.choice([None, *range(-3, 4)]), "deleted": rng.random() < 0.3,
                    "k": rng.choice("ab")} for _ in range(15)])
        t1.delete([rng.randrange(40)])
        epoch = t1.flush()
        for consumer in consumers:
            consumer.catch_up()
        return epoch

    def record() -> ReplacementRecord:
        found = replacements.record("mv1")
        assert found is not None
        return found

    try:
        for _ in range(3):
            write_epoch()
        snapshot = build_snapshot(settings, "t1", spark, client=redis_client).record
        assert snapshot.rows > 0 and snapshot.epoch == store.mce("t1")
        for _ in range(2):  # epochs after the snapshot: hydration follows them from the changelog
            write_epoch()

        # 1. The changelog is complete, yet hydration starts from the snapshot at E, then follows E+1...
        staged = stage_replacement(settings, "mv1", NEW, client=redis_client)
        at = write_epoch()  # mv1's consumer hydrates the replacement with this epoch's micro-batch
        hydrated = _replacement_matches_oracle(settings, redis_client, "mv1", at)
        assert hydrated.hydration_epoch == snapshot.epoch < at
        source = f"t1: snapshot at epoch {snapshot.epoch}" + (", in Spark's tasks" if path == "tasks" else "")
        assert hydrated.fields is not None and hydrated.fields["hydrated_from"] == source
        listed = json.loads(ok(mvlog(settings, "replacement", "list", "--output", "json")).stdout)
        assert [(r["view"], r["hydration_epoch"], r["hydrated_from"]) for r in listed] == [
            ("mv1", snapshot.epoch, source)]
        request_apply(settings, "mv1", client=redis_client)
        cut_over = write_epoch()
        applied = wait_for_apply(settings, "mv1", staged.id, timeout=30, client=redis_client)
        assert applied.epoch == cut_over
        for _ in range(2):
            write_epoch()
        # I1 for t1, mv1 under both definitions, mv2 on top of it, and ref, at every epoch.
        assert check_oracle(settings, redis_client, ["t1", "mv1", "mv2", "ref"]) == 3 * 9  # views x epochs
        # Read-only until the apply: mv1's changelog is exactly the old definition's (ref) before it.
        mv1_log, ref_log = changelog(settings, redis_client, "mv1"), changelog(settings, redis_client, "ref")
        before = [(e.epoch, _canonical(e.changes)) for e in mv1_log if e.epoch < cut_over]
        assert before == [(e.epoch, _canonical(e.changes)) for e in ref_log if e.epoch < cut_over]
        assert len(before) == 6

        # 2. Retention took t1's epochs before E: the changelog alone cannot hydrate, the snapshot can.
        partitions = CatalogStore(settings, redis_client).get("t1").partitions
        for p in range(partitions):
            store.index.trim_before("t1", p, snapshot.epoch)
        assert not starts_the_log(settings, store.index, "t1")
        stage_replacement(settings, "mv1", WIDER, client=redis_client)
        at = write_epoch()
        wider = _replacement_matches_oracle(settings, redis_client, "mv1", at)
        assert wider.hydration_epoch == snapshot.epoch and (wider.fields or {}).get("hydrated_from") == source
        discard_replacement(settings, "mv1", client=redis_client)

        # 3. Retention also took E: neither a whole changelog nor a covered snapshot, so it stops with the
        # reason; mv1 keeps running unchanged.
        for p in range(partitions):
            store.index.trim_before("t1", p, snapshot.epoch + 1)
        stage_replacement(settings, "mv1", WIDER, client=redis_client)
        at = write_epoch()
        stopped = record()
        assert stopped.status is Status.STAGED and not stopped.hydrated
        error = (stopped.fields or {}).get("error", "")
        assert "cannot hydrate: the changelog of t1 no longer starts at its first epoch" in error, error
        assert f"its snapshot at epoch {snapshot.epoch} is not covered by the changelog" in error, error
        assert mv1.mce == at and CatalogStore(settings, redis_client).get("mv1").sql == NEW
    finally:
        t1.close()
        for consumer in consumers:
            consumer.committer.writer.close()


def test_replacement_staged_while_the_upstream_is_idle_hydrates_from_the_snapshot(
        settings: Settings, redis_client: redis.Redis, spark: Any) -> None:
    """No micro-batch comes while t1 writes nothing: the running consumer's watcher hydrates the
    replacement (reading the snapshot on its own thread), and mv1 stays at its epoch meanwhile."""
    rng = random.Random(13)
    store = ViewStore(redis_client, settings.topic_prefix)
    t1 = Table.create(settings, "t1", T1, ["id"], client=redis_client, auto_commit=False)
    create_view(settings, "mv1", OLD, client=redis_client)
    consumer = ViewConsumer(settings, "mv1", spark=spark, client=redis_client, trigger_interval="100 milliseconds")
    try:
        consumer.start()
        for _ in range(3):
            t1.upsert([{"id": rng.randrange(40), "v1": rng.randrange(-3, 4), "deleted": rng.random() < 0.3,
                        "k": rng.choice("ab")} for _ in range(15)])
            last = t1.flush()
        consumer.wait_for_epoch(last, timeout=120)
        snapshot = build_snapshot(settings, "t1", spark, client=redis_client).record
        assert snapshot.epoch == last
        stage_replacement(settings, "mv1", NEW, client=redis_client)
        replacements = ReplacementStore(redis_client, settings.topic_prefix)
        deadline = time.monotonic() + 60
        while not (record := replacements.record("mv1")) or not record.hydrated:
            assert time.monotonic() < deadline, f"not hydrated while the upstream is idle: {record}"
            time.sleep(0.1)
        assert (record.mce, record.hydration_epoch, store.mce("mv1"), store.mce("t1")) == (last, last, last, last)
        _replacement_matches_oracle(settings, redis_client, "mv1", last)
    finally:
        consumer.stop()
        t1.close()
