"""Real Kafka retention deleting the first segments of a changelog (Apache Kafka 4.1, the session broker).

Earlier tests simulated retention by trimming the epoch index; here the broker deletes log segments. A
changelog topic is created with ``segment.ms`` (Kafka 4 refuses a ``segment.bytes`` below 1 MiB, so
segments roll by time): phase A's epochs are written, then nothing for :data:`GAP_S` seconds, then phase
B's first epoch, which starts new segments on every partition. :func:`delete_by_retention` then sets
``retention.ms`` just under the age of phase A's records (the broker checks every second,
``log.retention.check.interval.ms=1000`` in ``tests/conftest.py``), waits until every partition's low
watermark is past A's last barrier, and sets retention back to unlimited long before B's records are
that old.
So exactly A's epochs are gone, each partition's log starts at B's first record, and the test knows which
epochs retention took.

What is checked:

* replay (``mvlog replay``): epochs retention deleted are refused, naming the oldest retained epoch;
* a view created with ``--backfill snapshot`` from a snapshot taken after A is exact at every epoch (the
  oracle's DuckDB evaluation over t1's rows, which the test keeps itself: t1's changelog no longer holds
  them all, so ``check_oracle``, which folds each upstream's changelog from its start, cannot be used);
  a snapshot from scratch is refused, the next one builds on it; ``--backfill changelog`` must not
  build a view from the retained part of the log;
* a replacement hydrates from the upstream's snapshot, and stops with the reason once retention also
  took the epochs after the snapshot;
* a Redis wipe after retention: the rebuild must not present a table that lost the rows of the deleted
  epochs.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from mvlog.catalog import CatalogEntry
from mvlog.changes import Epoch
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader, reader_consumer
from mvlog.connectors.kafka.retention import starts_the_log
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.replacement_store import ReplacementRecord, ReplacementStore
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
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
from mvlog.services.snapshot_compaction import build_snapshot, check_changelog_after
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view, plan_for
from mvlog.snapshot_plan import SnapshotError

from ..conftest import StackEndpoints
from ..oracle import assert_same_rows, definitions, duckdb_view_rows, rows_by_epoch
from .test_cli_views import mvlog, ok, refused
from .test_replacement import NEW, OLD, T1, WIDER

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SEGMENT_MS = 1000  # changelog segments roll by time (Kafka 4 refuses segment.bytes below 1 MiB)
GAP_S = 6.0  # no record between phase A and phase B for this long (more than SEGMENT_MS: B starts new segments)
MARGIN_MS = 500  # retention.ms is set this far under the age of A's newest record
HOLD_S = 2.0  # the longest a short retention.ms stays set (B's records are GAP_S younger than A's)
CUT_TIMEOUT_S = 30.0


# --------------------------------------------------------------------------------------- retention helpers


def retained_topic(settings: Settings, name: str) -> str:
    """Create ``name``'s changelog topic (before the table or view) with segments rolled every SEGMENT_MS."""
    topic = settings.changelog_topic(name)
    ensure_topic(settings, topic, settings.partitions, {"segment.ms": str(SEGMENT_MS)})
    return topic


def set_retention_ms(settings: Settings, topic: str, retention_ms: int) -> None:
    admin = AdminClient(settings.kafka_client_config())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", str(retention_ms), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(10)


def wait_past(wall: float) -> None:
    """Wait until the wall clock (what record timestamps and the broker's retention use) passes ``wall``."""
    while time.time() < wall:
        time.sleep(min(0.1, max(0.0, wall - time.time())))


def first_record(index: EpochIndex, view: str, partition: int, epoch: int) -> int:
    """The offset of ``epoch``'s first record in ``partition``: its changes sit right before its barrier,
    in the same transaction."""
    entry = index.at(view, partition, epoch)
    assert entry is not None, (view, partition, epoch)
    return entry.offset - entry.records


def delete_by_retention(settings: Settings, index: EpochIndex, view: str, written_before: float,
                        last_deleted: int, first_kept: int) -> dict[int, int]:
    """Let Kafka's retention delete every segment of ``view``'s changelog written before the wall-clock time
    ``written_before`` (epochs up to ``last_deleted``), and none of ``first_kept``'s, which was written
    GAP_S later; returns the low watermarks.

    ``retention.ms`` goes just under the age of the newest deleted record, so the next retention check
    (every second) deletes those segments; it goes back to unlimited once every partition's low watermark
    is past ``last_deleted``'s barrier, or after HOLD_S at the latest (then again with the age recomputed),
    long before ``first_kept``'s records reach that age (GAP_S - MARGIN_MS after the setting is made).
    """
    topic = settings.changelog_topic(view)
    barriers = {p: index.at(view, p, last_deleted) for p in range(settings.partitions)}
    consumer = reader_consumer(settings)
    deadline = time.monotonic() + CUT_TIMEOUT_S
    lows: dict[int, int] = {}
    settings_made: list[float] = []  # when retention.ms was set (seconds after written_before), for a failure

    def low_watermarks() -> dict[int, int]:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0]
                for p in range(settings.partitions)}

    def deleted() -> bool:
        return bool(lows) and all(e is not None and lows[p] > e.offset for p, e in barriers.items())

    try:
        while not deleted():
            assert time.monotonic() < deadline, f"retention did not delete {topic} up to epoch {last_deleted}: " \
                                                f"low watermarks {lows}, barriers {barriers}"
            settings_made.append(round(time.time() - written_before, 2))
            set_retention_ms(settings, topic, int(settings_made[-1] * 1000) - MARGIN_MS)
            try:
                hold = time.monotonic() + HOLD_S
                while not deleted() and time.monotonic() < hold:
                    time.sleep(0.05)
                    with contextlib.suppress(KafkaException):  # a transient metadata error: ask again
                        lows = low_watermarks()
            finally:
                set_retention_ms(settings, topic, -1)
        lows = low_watermarks()
    finally:
        consumer.close()
    for p in range(settings.partitions):  # exactly up to the gap: every record of first_kept is still there
        assert lows[p] <= first_record(index, view, p, first_kept), (
            f"{topic} partition {p}: retention went past the gap (low watermark {lows[p]}; retention.ms set "
            f"{settings_made} s after the deleted records, those kept came {GAP_S} s after them)")
    return lows


# ------------------------------------------------------------------------------------ t1 and its record


@dataclass
class TableModel:
    """t1 written by the test, with what it holds after each epoch (the oracle's upstream rows: t1's
    changelog no longer holds its first epochs)."""

    table: Table
    rng: random.Random
    rows: dict[Key, Row] = field(default_factory=dict)
    history: dict[int, dict[Key, Row]] = field(default_factory=dict)
    written: dict[Key, int] = field(default_factory=dict)  # key -> the epoch that last wrote it

    def epoch(self, upserts: int = 8, deletes: int = 2, keys: range = range(40)) -> int:
        pending: list[tuple[Key, Row | None]] = []
        for _ in range(upserts):
            row = {"id": self.rng.choice(keys), "v1": self.rng.choice([None, *range(-5, 9)]),
                   "deleted": self.rng.random() < 0.25, "k": self.rng.choice("abc")}
            self.table.upsert([row])
            pending.append(((row["id"],), row))
        for _ in range(deletes):
            gone = self.rng.choice(keys)
            self.table.delete([gone])
            pending.append(((gone,), None))
        epoch = self.table.flush()
        for key, written in pending:
            if written is None:
                self.rows.pop(key, None)
            else:
                self.rows[key] = written
            self.written[key] = epoch
        self.history[epoch] = dict(self.rows)
        return epoch

    def at(self, epoch: int) -> list[Row]:
        return list(self.history[max(e for e in self.history if e <= epoch)].values())


def served_rows(client: redis.Redis, settings: Settings, name: str) -> dict[Key, Row]:
    schema = CatalogStore(settings, client).get(name).schema
    return {schema.key_of(row): row for row in (decode_row(v) for _, v in
                                                ViewStore(client, settings.topic_prefix).scan_rows(name))}


def check_view_against_t1(settings: Settings, client: redis.Redis, view: str, t1: TableModel) -> list[int]:
    """I1 for ``view`` (over t1) at each committed epoch: its changelog folded to the epoch equals its
    definition there evaluated by DuckDB over t1's rows at that epoch; Redis serves the fold at the MCE.
    Returns the view's epochs."""
    catalog = CatalogStore(settings, client)
    store = ViewStore(client, settings.topic_prefix)
    entry = catalog.get(view)
    mce = store.mce(view)
    with ChangelogReader(settings, view, entry.key_columns, entry.partitions, store.index, upto_epoch=mce) as reader:
        epochs = list(reader.epochs(idle_timeout=10.0))
    assert epochs and epochs[-1].epoch == mce, f"{view}: the changelog ends at its MCE"
    history = rows_by_epoch(epochs)
    assert_same_rows(view, served_rows(client, settings, view), history[mce], entry.schema, "redis vs changelog")
    plans = [(start, plan_for(catalog, view, sql)) for start, sql in definitions(epochs, entry.sql or "")]
    t1_schema = catalog.get("t1").schema
    for epoch, rows in history.items():
        plan = next(p for start, p in reversed(plans) if start <= epoch)
        expected = duckdb_view_rows(plan, {"t1": (t1_schema, t1.at(epoch))})
        assert_same_rows(view, rows, expected, plan.schema, f"epoch {epoch}")
    return [e.epoch for e in epochs]


def changelog_epochs(settings: Settings, client: redis.Redis, name: str, entry: CatalogEntry, upto: int
                     ) -> list[Epoch]:
    """The epochs of ``name``'s changelog up to ``upto`` (a view's, or a derivation's topic of it: ``entry``'s
    key and partitions), as any reader of it finds them."""
    index = ViewStore(client, settings.topic_prefix).index
    with ChangelogReader(settings, name, entry.key_columns, entry.partitions, index, upto_epoch=upto) as reader:
        return list(reader.epochs(idle_timeout=5.0))


def catch_up(consumers: list[ViewConsumer], epoch: int) -> None:
    for consumer in consumers:
        assert consumer.catch_up() == epoch, consumer.entry.name


# -------------------------------------------------------------------------------------------------- replay


@dataclass(frozen=True)
class TrimmedPipeline:
    """t1 -> mv1 -> mv2, where retention deleted mv1's epochs ``deleted``; ``kept`` are retained."""

    settings: Settings
    client: redis.Redis
    deleted: list[int]
    kept: list[int]
    lows: dict[int, int]


def module_settings(stack: StackEndpoints, folder: Path, **overrides: Any) -> Settings:
    """Settings as the ``settings`` fixture makes them (a prefix of their own), for a module's fixture."""
    values: dict[str, Any] = {"topic_prefix": f"t{uuid.uuid4().hex[:8]}", "barrier_interval_ms": 200,
                              "partitions": 3, "stack_dir": folder / "mvlog", **overrides}
    return stack.settings(**values)


def drop_keys(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start:start + 500])
    client.close()


@pytest.fixture(scope="module")
def trimmed(stack: StackEndpoints, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrimmedPipeline]:
    """One pipeline for the replay tests (they only plan: dry runs and refusals change nothing)."""
    settings = module_settings(stack, tmp_path_factory.mktemp("retention"))
    client = redis.Redis.from_url(settings.redis_url)
    retained_topic(settings, "mv1")
    t1 = TableModel(Table.create(settings, "t1", T1, ["id"], client=client, auto_commit=False), random.Random(5))
    create_view(settings, "mv1", OLD, client=client)
    create_view(settings, "mv2", "SELECT sum(v1) AS s, count(*) AS n FROM mv1", client=client)
    consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name in ("mv1", "mv2")]
    try:
        deleted = [t1.epoch() for _ in range(4)]
        catch_up(consumers, deleted[-1])  # mv1 and mv2 write one epoch per t1 epoch
        written_before = time.time()
        wait_past(written_before + GAP_S)
        kept = [t1.epoch() for _ in range(3)]
        catch_up(consumers, kept[-1])
        store = ViewStore(client, settings.topic_prefix)
        lows = delete_by_retention(settings, store.index, "mv1", written_before, deleted[-1], kept[0])
        yield TrimmedPipeline(settings, client, deleted, kept, lows)
    finally:
        t1.table.close()
        for consumer in consumers:
            consumer.committer.writer.close()
        drop_keys(client, settings.topic_prefix)


def test_replay_refuses_epochs_retention_deleted(trimmed: TrimmedPipeline) -> None:
    """Once real retention deleted mv1's first epochs: a re-delivery from an epoch whose records are gone
    and re-deriving mv2 (its state needs mv1 from its first epoch) are refused, each in one line; mv2,
    whose changelog is whole, is re-delivered from its first epoch."""
    settings, client = trimmed.settings, trimmed.client
    store = ViewStore(client, settings.topic_prefix)
    assert not starts_the_log(settings, store.index, "mv1")
    group = f"{settings.topic_prefix}.g"
    error = refused(mvlog(settings, "replay", "redeliver", "mv1", "-g", group, "--to-epoch", str(trimmed.deleted[2])))
    assert "retention deleted" in error or "older than the oldest retained epoch" in error, error
    error = refused(mvlog(settings, "replay", "derive", "mv2", "--from-epoch", "1", "--into-topic"))
    assert "oldest retained epoch" in error, error
    error = refused(mvlog(settings, "replay", "derive", "mv2", "--from-epoch", str(trimmed.kept[1]), "--into-topic"))
    assert "mv1: re-deriving needs its changelog from its first epoch" in error and "retention deleted the start" \
        in error, error
    # mv2's own changelog is whole: re-delivering it from its first epoch is fine.
    plan = json.loads(ok(mvlog(settings, "replay", "redeliver", "mv2", "-g", group, "--to-epoch",
                               str(trimmed.deleted[0]), "--output", "json")).stdout)
    assert plan["dry_run"] and plan["epoch"] == trimmed.deleted[0]
    assert all(p["epochs"] == len(trimmed.deleted) + len(trimmed.kept) for p in plan["partitions"])


def test_replay_names_the_oldest_retained_epoch(trimmed: TrimmedPipeline) -> None:
    settings = trimmed.settings
    group = f"{settings.topic_prefix}.g"
    oldest = trimmed.kept[0]
    for deleted in (trimmed.deleted[0], trimmed.deleted[2]):
        error = refused(mvlog(settings, "replay", "redeliver", "mv1", "-g", group, "--to-epoch", str(deleted)))
        assert f"oldest retained epoch {oldest}" in error, error
    error = refused(mvlog(settings, "replay", "derive", "mv2", "--from-epoch", str(trimmed.kept[1]), "--into-topic"))
    assert f"its oldest retained epoch is {oldest}" in error, error
    earliest = json.loads(ok(mvlog(settings, "replay", "redeliver", "mv1", "-g", group, "--to-earliest",
                                   "--output", "json")).stdout)
    assert earliest["epoch"] == oldest and earliest["retained"]["oldest"] == oldest, earliest


def test_the_first_retained_epoch_counts_as_retained(trimmed: TrimmedPipeline) -> None:
    settings, client = trimmed.settings, trimmed.client
    store = ViewStore(client, settings.topic_prefix)
    oldest = trimmed.kept[0]
    group = f"{settings.topic_prefix}.g"
    plan = json.loads(ok(mvlog(settings, "replay", "redeliver", "mv1", "-g", group, "--to-epoch", str(oldest),
                               "--output", "json")).stdout)
    assert plan["epoch"] == oldest
    for start in plan["partitions"]:  # from the log's start, at the latest the epoch's first change
        p = start["partition"]
        assert trimmed.lows[p] <= start["offset"] <= first_record(store.index, "mv1", p, oldest), start
        assert start["epochs"] == len(trimmed.kept), start
    # Every record after the last deleted epoch's barrier (but its commit marker) is in Kafka: a snapshot at
    # that epoch is covered by the changelog.
    check_changelog_after(settings, store, CatalogStore(settings, client).get("mv1"), trimmed.deleted[-1])


# ---------------------------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class TrimmedTable:
    """t1 with a snapshot at ``at_e``, the first epoch after the gap; retention deleted ``deleted``."""

    settings: Settings
    client: redis.Redis
    t1: TableModel
    deleted: list[int]
    at_e: int


@pytest.fixture(scope="module")
def trimmed_t1(stack: StackEndpoints, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrimmedTable]:
    """One t1 for the snapshot tests (each creates views of its own, and writes t1's epochs through its
    model only)."""
    folder = tmp_path_factory.mktemp("retention")
    settings = module_settings(stack, folder, snapshot_dir=folder / "snapshots")
    client = redis.Redis.from_url(settings.redis_url)
    store = ViewStore(client, settings.topic_prefix)
    retained_topic(settings, "t1")
    t1 = TableModel(Table.create(settings, "t1", T1, ["id"], client=client, auto_commit=False), random.Random(7))
    try:
        deleted = [t1.epoch(upserts=12, keys=range(30)) for _ in range(4)]
        written_before = time.time()
        wait_past(written_before + GAP_S)
        at_e = t1.epoch(upserts=4, keys=range(30, 40))
        snapshot = build_snapshot(settings, "t1", spark, client=client).record
        assert snapshot.epoch == at_e and snapshot.rows == len(t1.rows)
        delete_by_retention(settings, store.index, "t1", written_before, deleted[-1], at_e)
        assert not starts_the_log(settings, store.index, "t1")
        for _ in range(3):  # updates and deletes of keys whose rows only the snapshot holds now
            t1.epoch(upserts=6, deletes=3, keys=range(30))
        assert any(t1.written[key] in deleted for key in t1.rows), "t1 holds rows last written in deleted epochs"
        yield TrimmedTable(settings, client, t1, deleted, at_e)
    finally:
        t1.table.close()
        drop_keys(client, settings.topic_prefix)


def backfilled(trimmed: TrimmedTable, views: dict[str, str], spark: Any) -> None:
    """Create ``views`` over t1 while its changelog starts after retention (a snapshot backfill, a join's
    chunked: one snapshot cannot seed it) and run their consumers until every one is live at t1's MCE."""
    settings, client = trimmed.settings, trimmed.client
    store = ViewStore(client, settings.topic_prefix)
    for name, sql in views.items():
        create_view(settings, name, sql, client=client, backfill="chunked" if "JOIN" in sql else "snapshot")
    consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name in views]
    try:
        for _ in range(5):  # a join's chunks, each a micro-batch at t1's MCE
            catch_up(consumers, store.mce("t1") or 0)
            if all(store.lifecycle(name) == Lifecycle.LIVE for name in views):
                break
    finally:
        for consumer in consumers:
            consumer.committer.writer.close()
    assert all(store.lifecycle(name) == Lifecycle.LIVE for name in views)


def test_view_backfilled_from_a_snapshot_after_retention_deleted_the_start(trimmed_t1: TrimmedTable,
                                                                            spark: Any) -> None:
    """Retention deleted every t1 epoch before its snapshot at E: views created with ``--backfill
    snapshot`` load t1's rows at E (rows last written in deleted epochs included) and follow the epochs
    after E from the changelog; I1 holds at every epoch. A snapshot from scratch is refused, the next
    one is built on the snapshot at E."""
    settings, client, t1, at_e = trimmed_t1.settings, trimmed_t1.client, trimmed_t1.t1, trimmed_t1.at_e
    store = ViewStore(client, settings.topic_prefix)
    views = {"mvf": "SELECT id, v1 * 2 AS w, k FROM t1 WHERE deleted = false",
             "mvg": "SELECT k, count(*) AS n, count(v1) AS c, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi "
                    "FROM t1 GROUP BY k"}
    backfilled(trimmed_t1, views, spark)
    for name in views:
        assert check_view_against_t1(settings, client, name, t1) == [e for e in sorted(t1.history) if e >= at_e]
        assert store.backfill_progress(name)["snapshot_epoch"] == str(at_e)
    assert served_rows(client, settings, "t1") == t1.rows
    with pytest.raises(SnapshotError, match="a snapshot cannot be built from scratch"):
        build_snapshot(settings, "t1", spark, client=client, from_scratch=True)
    later = build_snapshot(settings, "t1", spark, client=client).record
    assert (later.epoch, later.base_epoch) == (store.mce("t1"), at_e)
    assert later.rows == len(t1.rows)


def test_derive_and_rebuild_after_retention_start_from_the_snapshot(trimmed_t1: TrimmedTable, spark: Any) -> None:
    """Retention deleted t1's first epochs; t1 has a snapshot at E. ``replay derive --engine spark`` reads t1
    from that snapshot and its changelog after it: a GROUP BY's and a self-join's rows, key order and
    operator state, rebuilt in Spark's tasks (cleared first), equal what their consumers built; the GROUP
    BY's epochs after E re-derived into a topic equal its changelog, change for change; the local engine,
    which reads changelogs only, refuses and names ``--engine spark``."""
    settings, client, at_e = trimmed_t1.settings, trimmed_t1.client, trimmed_t1.at_e
    store = ViewStore(client, settings.topic_prefix)
    views = {"mvdg": "SELECT k, count(*) AS n, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi FROM t1 GROUP BY k",
             "mvdj": "SELECT a.id, b.id AS id2, a.v1, b.k FROM t1 a JOIN t1 b ON a.v1 = b.id"}
    backfilled(trimmed_t1, views, spark)
    # Epochs of the views after their load (whichever snapshot of t1 it took: another test may have made a
    # later one than E's), through t1's model so that the module's other tests still know its rows.
    for _ in range(2):
        trimmed_t1.t1.epoch(upserts=6, deletes=2, keys=range(40))
    consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name in views]
    try:
        catch_up(consumers, store.mce("t1") or 0)
    finally:
        for consumer in consumers:
            consumer.committer.writer.close()
    for name in views:
        keys = [f"{settings.topic_prefix}:{{{name}}}:{what}" for what in ("rows", "opstate", "keyorder")]
        rows, state, order = client.hgetall(keys[0]), client.hgetall(keys[1]), client.zrange(keys[2], 0, -1)
        assert rows and state, name
        client.delete(*keys)
        # The rebuild recomputes the MCE from t1's rows before it: its newest snapshot at or before there.
        before = store.index.before("t1", 0, store.mce(name) or 0)
        start = SnapshotStore(client, settings.topic_prefix).latest("t1", at_or_before=before.epoch if before else 0)
        assert start is not None and start.epoch >= at_e, start
        error = refused(mvlog(settings, "replay", "derive", name, "--rebuild", "--execute"))
        assert f"--engine spark starts from its snapshot at epoch {start.epoch}" in error, error
        out = json.loads(ok(mvlog(settings, "replay", "derive", name, "--rebuild", "--execute", "--engine", "spark",
                                  "--output", "json")).stdout)
        assert out["in_tasks"] and out["executed"] and out["rows"] == len(rows), out
        assert [u["snapshot_epoch"] for u in out["upstreams"]] == [start.epoch], out
        assert client.hgetall(keys[0]) == rows, name
        assert client.hgetall(keys[1]) == state, name
        assert client.zrange(keys[2], 0, -1) == order, name
        if name != "mvdg":
            continue
        # The epochs after the snapshot's load, into a topic: the view's own, change for change.
        loaded = int(store.backfill_progress(name)["snapshot_epoch"])
        epochs = [e.epoch for e in store.index.between(name, 0, loaded, store.mce(name) or 0)]
        assert len(epochs) >= 2, epochs
        out = json.loads(ok(mvlog(settings, "replay", "derive", name, "--from-epoch", str(epochs[0]), "--into-topic",
                                  "--execute", "--engine", "spark", "--output", "json")).stdout)
        assert out["in_tasks"] and out["epochs_written"] == len(epochs), out
        entry = CatalogStore(settings, client).get(name)
        logs = [changelog_epochs(settings, client, view, entry, epochs[-1]) for view in (name, out["name"])]
        original, derived = ({e.epoch: sorted(map(repr, e.changes)) for e in log if e.epoch in epochs} for log in logs)
        assert derived == original and any(original.values()), name


def test_a_changelog_backfill_after_retention_is_refused_or_exact(trimmed_t1: TrimmedTable, spark: Any) -> None:
    """``--backfill changelog`` needs the upstream's whole changelog: with its start deleted, a user
    expects the view refused (naming retention) or exact, never a view missing rows."""
    settings, client = trimmed_t1.settings, trimmed_t1.client
    try:
        create_view(settings, "mvc", "SELECT * FROM t1 WHERE deleted = false", client=client, backfill="changelog")
        consumer = ViewConsumer(settings, "mvc", spark=spark, client=client)
        try:
            consumer.catch_up()
        finally:
            consumer.committer.writer.close()
    except Exception as error:  # a refusal is fine if it says why
        assert "retention" in str(error) or "first epoch" in str(error), f"unclear refusal: {error!r}"
        return
    check_view_against_t1(settings, client, "mvc", trimmed_t1.t1)


# ------------------------------------------------------------------------------------------- replacements


def test_replacement_hydrates_from_the_snapshot_and_stops_once_retention_passed_it(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any, tmp_path: Path) -> None:
    """t1 -> mv1. Retention deleted t1's epochs before its snapshot at E: mv1's replacement
    hydrates from the snapshot (at E, then t1's epochs after E) and is applied; I1 holds for mv1 under both
    definitions. Then retention deletes E and the epochs after it too: a replacement staged now is stopped
    with the reason, and mv1 carries on."""
    settings = make_settings(snapshot_dir=tmp_path / "snapshots")
    client = redis_client
    store = ViewStore(client, settings.topic_prefix)
    replacements = ReplacementStore(client, settings.topic_prefix)
    retained_topic(settings, "t1")
    t1 = TableModel(Table.create(settings, "t1", T1, ["id"], client=client, auto_commit=False), random.Random(11))
    create_view(settings, "mv1", OLD, client=client)
    consumers = [ViewConsumer(settings, "mv1", spark=spark, client=client)]

    def write_epoch(count: int = 1) -> int:
        for _ in range(count):
            epoch = t1.epoch()
        catch_up(consumers, epoch)
        return epoch

    def record() -> ReplacementRecord:
        found = replacements.record("mv1")
        assert found is not None
        return found

    try:
        write_epoch(2)
        deleted = sorted(t1.history)
        written_before = time.time()
        wait_past(written_before + GAP_S)
        at_e = write_epoch()
        snapshot = build_snapshot(settings, "t1", spark, client=client).record
        assert snapshot.epoch == at_e
        write_epoch()
        delete_by_retention(settings, store.index, "t1", written_before, deleted[-1], at_e)
        assert not starts_the_log(settings, store.index, "t1")

        # 1. The changelog lost its start: hydration starts from the snapshot at E.
        staged = stage_replacement(settings, "mv1", NEW, client=client)
        at = write_epoch()
        hydrated, plan, rows = replacement_rows(settings, "mv1", client=client)
        assert hydrated.mce == at and hydrated.hydration_epoch == at_e
        assert (hydrated.fields or {}).get("hydrated_from") == f"t1: snapshot at epoch {at_e}"
        assert_same_rows("mv1 replacement", {plan.schema.key_of(r): r for r in rows},
                         duckdb_view_rows(plan, {"t1": (CatalogStore(settings, client).get("t1").schema, t1.at(at))}),
                         plan.schema, f"at {at}")
        request_apply(settings, "mv1", client=client)
        cut_over = write_epoch()
        assert wait_for_apply(settings, "mv1", staged.id, timeout=30, client=client).epoch == cut_over
        written_before = time.time()
        wait_past(written_before + GAP_S)

        # 2. Retention took E and the epochs after it: neither a whole changelog nor a covered snapshot.
        kept = write_epoch()
        delete_by_retention(settings, store.index, "t1", written_before, cut_over, kept)
        stage_replacement(settings, "mv1", WIDER, client=client)
        at = write_epoch()
        stopped = record()
        assert stopped.status is Status.STAGED and not stopped.hydrated
        error = (stopped.fields or {}).get("error", "")
        assert "cannot hydrate: the changelog of t1 no longer starts at its first epoch" in error, error
        assert f"its snapshot at epoch {at_e} is not covered by the changelog" in error, error
        assert store.mce("mv1") == at
        discard_replacement(settings, "mv1", client=client)
    finally:
        t1.table.close()
        for consumer in consumers:
            consumer.committer.writer.close()
    epochs = check_view_against_t1(settings, client, "mv1", t1)  # OLD before the cut-over, NEW from it on
    assert epochs == sorted(t1.history) and cut_over in epochs
    assert CatalogStore(settings, client).get("mv1").sql == NEW


# ----------------------------------------------------------------------------------- rebuild after a wipe


def test_a_wipe_after_retention_does_not_rebuild_a_table_without_its_deleted_rows(
        make_settings: Callable[..., Settings], own_redis: str, spark: Any, tmp_path: Path) -> None:
    """t1 lost its first epochs to retention; it has a snapshot at E, the first epoch retained. Redis is
    wiped, then t1's writer starts: a user expects either t1 rebuilt whole (from the snapshot and the epochs
    after it) or a refusal naming the problem, never a table silently missing the rows of deleted epochs."""
    settings = make_settings(redis_url=own_redis, snapshot_dir=tmp_path / "snapshots")
    client = redis.Redis.from_url(own_redis)
    store = ViewStore(client, settings.topic_prefix)
    retained_topic(settings, "t1")
    t1 = TableModel(Table.create(settings, "t1", T1, ["id"], client=client, auto_commit=False), random.Random(17))
    try:
        deleted = [t1.epoch(keys=range(30)) for _ in range(3)]
        written_before = time.time()
        wait_past(written_before + GAP_S)
        at_e = t1.epoch(keys=range(30, 40))
        assert build_snapshot(settings, "t1", spark, client=client).record.epoch == at_e
        delete_by_retention(settings, store.index, "t1", written_before, deleted[-1], at_e)
        for _ in range(2):
            t1.epoch(keys=range(30, 40))
    finally:
        t1.table.close()
    assert served_rows(client, settings, "t1") == t1.rows
    client.flushall()
    try:
        reopened = Table.open(settings, "t1", client, auto_commit=False)
    except Exception as error:  # a refusal is fine if it says why
        message = str(error)
        assert "retention" in message or "first epoch" in message, f"unclear refusal: {error!r}"
        return
    try:
        mce = store.mce("t1")
        assert mce is not None and mce >= at_e
        rebuilt = served_rows(client, settings, "t1")
        lost = {key for key in t1.history[mce] if key not in rebuilt}
        assert not lost, f"t1 rebuilt at epoch {mce} without {len(lost)} of its {len(t1.history[mce])} rows " \
                         f"(last written in epochs retention deleted: {sorted(lost)})"
        assert rebuilt == t1.history[mce]
    finally:
        reopened.close()
        client.close()
