"""Chunked backfill on a live upstream (issue 5): exact at every epoch, resumable after SIGKILL (I1, I5).

The checks read only Kafka and Redis: the upstream's rows at every epoch are its changelog summed up to
that barrier; which keys the view covers at epoch e comes from the backfill journal (committed with
each epoch). At every committed epoch of the view, its changelog summed up to e must equal
Q(upstream rows at e restricted to covered keys): a lost change or a doubled one breaks the equality.
Once the backfill is done, every key is covered and this is I1 itself.
"""

from __future__ import annotations

import bisect
import itertools
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from mvlog.backfill import DONE, START, Position
from mvlog.catalog import CatalogEntry
from mvlog.changes import Epoch
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.key_order import order_member
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import encode_key
from mvlog.services.backfill.chunked import ChunkedBackfill
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import alter_view, create_view, plan_for
from mvlog.vnode import vnode_of

from ..oracle import assert_same_rows, check_oracle, duckdb_view_rows, rows_at, rows_by_epoch
from .barrier_check import assert_barriers_once
from .busy_table import busy
from .laps import Laps
from .processes.task_view_runner import run as run_task_views
from .processes.view_runner import MCE_TIMEOUT_S, READY_TIMEOUT_S, Relay

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KEYS = 1500
KILLS = 2
COLUMNS = {"id": "int", "v1": "int", "deleted": "boolean"}


def _epochs(settings: Settings, store: ViewStore, entry: CatalogEntry, upto: int) -> list[Epoch]:
    with ChangelogReader(settings, entry.name, entry.key_columns, entry.partitions, store.index,
                         upto_epoch=upto) as reader:
        return list(reader.epochs(idle_timeout=10.0))


def _journal(store: ViewStore, view: str) -> list[tuple[int, str, int, Position, Position]]:
    def position(text: str) -> Position:
        return DONE if text == "done" else START if text == "-" else Position(False, bytes.fromhex(text))

    entries = []
    for line in store.backfill_journal(view):
        epoch, source, vnode, start, end = line.split()
        entries.append((int(epoch), source, int(vnode), position(start), position(end)))
    return entries


def check_journal(store: ViewStore, view: str) -> dict[tuple[str, int], list[tuple[int, Position]]]:
    """I5 from the committed chunks: per vnode, each chunk starts where the previous one ended and moves
    forward (nothing committed twice, nothing skipped); returns each vnode's positions by epoch."""
    history: dict[tuple[str, int], list[tuple[int, Position]]] = {}
    for epoch, source, vnode, start, end in _journal(store, view):
        steps = history.setdefault((source, vnode), [])
        previous = steps[-1][1] if steps else START
        assert start == previous, f"{source} vnode {vnode}: a chunk at epoch {epoch} restarts at {start}"
        assert end.is_after(start) or (end.done and start.done), f"{source} vnode {vnode} moved back"
        steps.append((epoch, end))
    return history


def check_backfilled_view(settings: Settings, client: redis.Redis, view: str) -> int:
    """The view at every committed epoch = Q(upstream at that epoch restricted to covered keys)."""
    catalog = CatalogStore(settings, client)
    store = ViewStore(client, settings.topic_prefix)
    entry = catalog.get(view)
    (source,) = entry.sources
    upstream = catalog.get(source)
    plan = plan_for(catalog, view, entry.sql or "")
    mce = store.mce(view)
    assert mce is not None
    view_epochs = _epochs(settings, store, entry, mce)
    assert view_epochs and view_epochs[-1].epoch == mce
    upstream_history = rows_by_epoch(_epochs(settings, store, upstream, mce))
    assert set(e.epoch for e in view_epochs) == {e for e in upstream_history if view_epochs[0].epoch <= e <= mce}, \
        "one view epoch per upstream epoch from the backfill's start"
    positions = check_journal(store, view)
    columns = upstream.key_columns
    step_epochs = {vnode: [e for e, _ in steps] for (_, vnode), steps in positions.items()}
    members: dict[Key, tuple[int, bytes]] = {}  # a key's vnode and key-order member: the same at every epoch

    def covered(key: Key, epoch: int) -> bool:
        if key not in members:
            key_bytes = encode_key(columns, key)
            vnode = vnode_of(key_bytes)
            members[key] = (vnode, order_member(vnode, key, key_bytes))
        vnode, member = members[key]
        last = bisect.bisect_right(step_epochs.get(vnode, []), epoch)  # steps at or before the epoch
        return last > 0 and positions[(source, vnode)][last - 1][1].covers(member)

    history = rows_by_epoch(view_epochs)
    for epoch, rows in history.items():
        visible: list[Row] = [r for k, r in rows_at(upstream_history, epoch).items() if covered(k, epoch)]
        expected = duckdb_view_rows(plan, {source: (upstream.schema, visible)})
        assert_same_rows(view, rows, expected, plan.schema, f"epoch {epoch}")
    # Once live, every key is covered: I1 on the whole upstream at the MCE.
    assert all(steps[-1][1].done for steps in positions.values()) and len(positions) == 256
    full = duckdb_view_rows(plan, {source: (upstream.schema, list(rows_at(upstream_history, mce).values()))})
    assert_same_rows(view, history[mce], full, plan.schema, "at the MCE")
    return len(history)


def test_view_created_on_a_busy_upstream_is_exact_at_every_epoch(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any) -> None:
    # Chunks of 150-300 rows and 1 s epochs: a backfill over several epochs, with few epochs to check. (400 ms
    # epochs let a loaded CI run's upstream outpace the backfill: 271 s and 110 epochs a view, 48 alone.)
    settings = make_settings(barrier_interval_ms=1000, backfill_batch_rows=150, backfill_max_batch_rows=300)
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    rng = random.Random(5)
    table.upsert([{"id": i, "v1": rng.randrange(-50, 50), "deleted": rng.random() < 0.2} for i in range(KEYS)])
    table.flush()
    store = ViewStore(redis_client, settings.topic_prefix)
    with busy(table, seed=7, keys=KEYS, per_tick=30):
        time.sleep(0.5)  # the upstream has moved on before the views exist
        create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client,
                    backfill="chunked")
        create_view(settings, "mv2", "SELECT deleted, count(*) AS c, sum(v1) AS s FROM t1 GROUP BY deleted",
                    client=redis_client, backfill="chunked")
        consumers = [ViewConsumer(settings, v, spark=spark, client=redis_client, max_epochs_per_trigger=10,
                                  trigger_interval="100 milliseconds") for v in ("mv1", "mv2")]
        for consumer in consumers:
            consumer.start()
        try:
            deadline = time.monotonic() + 150
            seen_backfilling = False
            # The lifecycle turns live in the last backfill epoch's commit; the progress hash (a display,
            # not state) is published just after it, so both are waited for.
            while (any(store.lifecycle(v) != Lifecycle.LIVE for v in ("mv1", "mv2"))
                   or store.backfill_progress("mv1").get("state") != "live"):
                seen_backfilling |= store.lifecycle("mv1") == Lifecycle.BACKFILLING
                assert time.monotonic() < deadline, store.backfill_progress("mv1")
                time.sleep(0.1)
            assert seen_backfilling
            progress = store.backfill_progress("mv1")
            assert progress["state"] == "live" and int(progress["rows_done"]) > 0
            assert progress["vnodes_done"] == progress["vnodes_total"] == "256"
            live_at = store.mce("mv1") or 0
            for consumer in consumers:  # keep running live for a few epochs under the same writes
                consumer.wait_for_epoch(live_at + 1)
        except BaseException:
            for consumer in consumers:
                consumer.stop()
            raise
    last = table.flush()
    table.close()
    try:
        for consumer in consumers:
            consumer.wait_for_epoch(last)
    finally:
        for consumer in consumers:
            consumer.stop()
    epochs = [check_backfilled_view(settings, redis_client, v) for v in ("mv1", "mv2")]
    assert min(epochs) >= 5, epochs  # the backfill spanned epochs while the upstream wrote


@pytest.mark.slow
@pytest.mark.timeout(900)  # four Spark driver start-ups on a shared 2-core machine
def test_backfill_killed_at_random_points_resumes_from_its_positions(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, report: Callable[[str], None],
        tmp_path: Path) -> None:
    laps = Laps()
    settings = make_settings(barrier_interval_ms=400, backfill_batch_rows=40, backfill_max_batch_rows=80)
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    rng = random.Random()
    table.upsert([{"id": i, "v1": rng.randrange(-50, 50), "deleted": rng.random() < 0.2} for i in range(0, KEYS, 2)])
    table.flush()
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client, backfill="chunked")
    store = ViewStore(redis_client, settings.topic_prefix)
    reads: list[tuple[int, str]] = []  # (run, chunk line) of every chunk read by every run
    sampled: list[dict[bytes, bytes]] = []
    kills = 0
    # Each run's Spark session starts while the one before it runs (Relay).
    with Relay(settings, ["mv1"], runs=KILLS + 1, log_dir=tmp_path) as relay:
        with busy(table, seed=rng.randrange(1 << 30), keys=KEYS, per_tick=30):
            while kills < KILLS:
                lines = relay.next()
                child = lines.child
                out: list[str] = []
                try:
                    lines.until("ready", READY_TIMEOUT_S, out)
                    laps.lap("start to ready")
                    for _ in range(rng.randrange(1, 4)):
                        lines.until("mce", MCE_TIMEOUT_S, out)
                    time.sleep(rng.uniform(0, 0.3))
                    laps.lap("ready to kill")
                finally:
                    child.send_signal(signal.SIGKILL)
                    child.wait()
                out += lines.rest()  # what it printed before the kill
                reads += [(kills, line) for line in out if line.startswith("chunk ")]
                sampled.append(store.backfill_state("mv1"))
                kills += 1
                assert store.lifecycle("mv1") != Lifecycle.LIVE, "the backfill finished before the kills"
        # The table stays open: its writer commits an (empty) epoch every interval, and the backfill moves
        # one chunk per upstream epoch.
        last = table.flush()
        laps.lap("kills")
        child = relay.next().child
        try:
            deadline = time.monotonic() + 240
            while (store.mce("mv1") or 0) < last or store.lifecycle("mv1") != Lifecycle.LIVE:
                assert time.monotonic() < deadline and child.poll() is None, (
                    store.backfill_progress("mv1"), store.mce("mv1"), store.mce("t1"))
                time.sleep(0.2)
            last = table.flush()
            while (store.mce("mv1") or 0) < last:
                assert time.monotonic() < deadline and child.poll() is None, store.backfill_progress("mv1")
                time.sleep(0.2)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            table.close()
    laps.lap("last run to live and caught up")

    # I5: sampled positions never move backwards across the kills.
    for before, after in itertools.pairwise(sampled):
        for name, value in before.items():
            if name.startswith(b"pos:"):
                assert name in after and (Position.decode(after[name]) == Position.decode(value)
                                          or Position.decode(after[name]).is_after(Position.decode(value)))
    # Each run resumes from the positions committed before it started, and of the chunks a killed run
    # read, only its last one per vnode (the one in flight) is read again by a later run.
    runs: dict[int, dict[int, list[str]]] = {}
    for run, line in reads:
        _, vnode_text, start = line.split()
        runs.setdefault(run, {}).setdefault(int(vnode_text), []).append(start)
    redone = 0
    for run, by_vnode in runs.items():
        committed = sampled[run - 1] if run else {}
        for vnode, starts in by_vnode.items():
            stored = committed.get(f"pos:t1:{vnode}".encode())
            assert starts[0] == (stored.hex() if stored else "-"), f"run {run} vnode {vnode} did not resume"
            assert len(set(starts)) == len(starts), f"run {run} read a chunk of vnode {vnode} twice"
            later = {s for r, v in runs.items() if r > run for s in v.get(vnode, [])}
            again = [s for s in starts if s in later]
            assert again in ([], [starts[-1]]), f"run {run} vnode {vnode}: chunks redone {again}"
            redone += len(again)
    assert redone <= len(sampled) * 256
    assert check_backfilled_view(settings, redis_client, "mv1") > 0
    laps.lap("checks")
    report(f"{KILLS} kills, {redone} chunks redone; {laps}")


def test_rate_limit_caps_the_backfill_and_changes_while_it_runs(
        make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    """``alter-view --backfill-rate-limit`` applies to a running backfill within a second (no Spark:
    the backfill is driven with the upstream's epochs as they commit)."""
    settings = make_settings(backfill_batch_rows=10_000, backfill_max_batch_rows=10_000)
    store = ViewStore(redis_client, settings.topic_prefix)
    with Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client) as table:
        table.upsert([{"id": i, "v1": i, "deleted": False} for i in range(20_000)])
        table.flush()
        create_view(settings, "mv1", "SELECT * FROM t1", client=redis_client, backfill="chunked")
        alter_view(settings, "mv1", client=redis_client, backfill_rate_limit=1000)
        catalog = CatalogStore(settings, redis_client)
        backfill = ChunkedBackfill(settings, store, catalog, catalog.get("mv1"), {"t1": catalog.get("t1")})

        def rows_in(seconds: float) -> int:
            done, seen = backfill.rows_done, 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                epoch = store.mce("t1") or 0
                if epoch > seen:
                    seen = epoch
                    backfill.committed(backfill.prepare(epoch, {}), 0.0)
                time.sleep(0.02)
            return backfill.rows_done - done

        slow = rows_in(3.0)
        assert 0 < slow <= 1000 * 3 + 1000, slow  # the rate, plus at most one second of burst
        alter_view(settings, "mv1", client=redis_client, backfill_rate_limit=4000)
        rows_in(1.2)  # the new limit is read within a second
        fast = rows_in(3.0)
        assert fast > 2 * slow and fast <= 4000 * 3 + 4000, (slow, fast)
        assert store.backfill_progress("mv1")["rate_limit"] == "4000"


@pytest.mark.slow
@pytest.mark.timeout(900)  # four Spark starts of a runner on a shared 2-core machine
def test_backfill_in_tasks_finishes_a_chunk_epoch_some_partitions_committed(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, report: Callable[[str], None]) -> None:
    """A chunked backfill whose routing runs in Spark's tasks (a filter and a GROUP BY in tasks, over three
    partitions; a global aggregate, a hopping window and a top-N backfill in tasks in
    :func:`test_join_backfill_in_tasks_is_exact_at_every_epoch`): its chunk's epoch ends each micro-batch.
    The driver is SIGKILLed by the GROUP BY's task of partition 0 right after it committed the chunk's
    epoch, the other partitions not: the next consumer finds the chunk saved, runs the same micro-batch,
    writes only what was missing, and the view is exact at every epoch, each epoch's barrier once in each
    partition."""
    laps = Laps()
    settings = make_settings(operators_in_tasks=True, tasks_min_records=0, partitions=3,
                             backfill_batch_rows=40, backfill_max_batch_rows=40)
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    rng = random.Random(11)

    def epoch() -> int:  # an upstream epoch of inserts, updates and deletes
        table.upsert([{"id": rng.randrange(200), "v1": rng.randrange(-50, 50), "deleted": rng.random() < 0.2}
                      for _ in range(40)])
        table.delete([rng.randrange(200) for _ in range(5)])
        return table.flush()

    for _ in range(3):
        epoch()
    views = {"mv1": "SELECT * FROM t1 WHERE deleted = false",
             "mvg": "SELECT id % 7 AS b, count(*) AS n, sum(v1) AS s, min(v1) AS lo FROM t1 GROUP BY id % 7"}
    for name, sql in views.items():
        create_view(settings, name, sql, client=redis_client, backfill="chunked")
    store = ViewStore(redis_client, settings.topic_prefix)
    runs: list[dict[str, tuple[int, int]]] = []

    def run(kills: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        done = run_task_views(settings, list(views) if kills is None else ["mvg"], kills)
        runs.append({w[1]: (int(w[2]), int(w[3])) for line in done.stdout.splitlines()
                     if (w := line.split())[:1] == ["done"]})
        return done

    try:
        first = run()  # the first chunk of each, emitted in the upstream's last epoch
        assert first.returncode == 0, first.stderr[-3000:]
        assert set(runs[0]) == set(views) and all(written > 0 for _, written in runs[0].values()), runs[0]  # tasks
        assert store.lifecycle("mvg") == Lifecycle.BACKFILLING and store.chunk_record("mvg") is None
        laps.lap("first run")
        at = store.mce("mvg") or 0
        epoch()
        last = epoch()
        # mvg's micro-batch is the two epochs, its chunk in the second: partition 0's task kills the driver
        # after committing it, the other two hold after their first epoch until the driver is gone.
        killed = run(["mvg:0:driver2", "mvg:1:hold", "mvg:2:hold"])
        assert killed.returncode == -9, (killed.returncode, killed.stdout, killed.stderr[-3000:])
        assert store.mce("mvg") == at and store.chunk_record("mvg") is not None, "the chunk's epoch committed"
        saved = store.chunk_record("mvg")
        partition0 = partition_barriers(settings, "mvg", 0, 0)
        assert [b.epoch for b in partition0][-1] == last, "partition 0 did not commit the chunk's epoch"
        before = {p: partition_barriers(settings, "mvg", p, 0) for p in range(3)}
        assert all(b.epoch != last for p in (1, 2) for b in before[p])
        laps.lap("killed run")
        resumed = run()
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert store.mce("mvg") == last and store.chunk_record("mvg") is None
        # The saved chunk was the one committed; what the killed run committed stayed, the rest was written.
        after = {p: partition_barriers(settings, "mvg", p, 0) for p in range(3)}
        assert all(after[p][:len(before[p])] == before[p] for p in range(3))
        assert f'"epoch": {last}' in (saved or "") and runs[-1]["mvg"] == (last, sum(
            len(after[p]) - len(before[p]) for p in range(3))), runs
        assert any(line.startswith(f"{last} ") for line in store.backfill_journal("mvg"))
        laps.lap("resumed run")
        for _ in range(8):  # on until both are live, an upstream epoch a run
            if all(store.lifecycle(v) == Lifecycle.LIVE for v in views):
                break
            last = epoch()
            assert run().returncode == 0
        assert all(store.lifecycle(v) == Lifecycle.LIVE for v in views), store.backfill_progress("mvg")
        laps.lap("runs to live")
    finally:
        table.close()
    checked = {view: check_backfilled_view(settings, redis_client, view) for view in views}
    for view in views:
        assert_barriers_once(settings, redis_client, view, store.mce(view) or 0)
    laps.lap("checks")
    report(f"{len(runs)} runs, epochs checked {checked}; {laps}")


def test_join_backfill_in_tasks_is_exact_at_every_epoch(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any,
        report: Callable[[str], None]) -> None:
    """A full outer join created with a chunked backfill while both its upstreams write, its operator in
    Spark's tasks: each side's changes are routed by that side's positions in the tasks, a micro-batch
    emits a chunk of one side (t1's until it is done, then t2's), and the view is exact at every
    committed epoch on the keys it covered then (a row of one side covered before its match on the other
    is null-extended, then retracted), every epoch committed in tasks. An aggregate over a LEFT JOIN of the
    same tables backfills beside it (its joined rows folded into their groups in a third step), and a UNION
    ALL of a filter of t1 and a GROUP BY of t2 (and a join branch), a GROUP BY over a chain of joins on one
    key (t1, t2, t1 again), a GROUP BY over a GROUP BY, and a global aggregate, a hopping window and a top-N of
    t1 (the GROUP BY's and the top-N's routings). (A top-N over a join takes the join's routing; it
    runs in tasks in ``test_operators_in_tasks``, ``test_replay`` and ``test_replacement_join``.)"""
    settings = make_settings(operators_in_tasks=True, tasks_min_records=0, partitions=3,
                             backfill_batch_rows=110, backfill_max_batch_rows=110)
    t1 = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    t2 = Table.create(settings, "t2", {"id": "int", "k": "int", "w": "int"}, ["id"], client=redis_client,
                      auto_commit=False)
    rng = random.Random(23)

    def write() -> None:  # an epoch of each upstream: inserts, updates and deletes
        t1.upsert([{"id": rng.randrange(300), "v1": rng.randrange(40), "deleted": rng.random() < 0.2}
                   for _ in range(25)])
        t1.delete([rng.randrange(300) for _ in range(4)])
        t1.flush()
        t2.upsert([{"id": rng.randrange(120), "k": rng.randrange(40), "w": rng.randrange(100)} for _ in range(10)])
        t2.delete([rng.randrange(120) for _ in range(2)])
        t2.flush()

    t1.upsert([{"id": i, "v1": rng.randrange(40), "deleted": False} for i in range(0, 300, 2)])
    t2.upsert([{"id": i, "k": rng.randrange(40), "w": rng.randrange(100)} for i in range(0, 120, 2)])
    write()
    views = {"mvj": "SELECT t1.id, t2.id AS id2, t1.v1, t2.k, t2.w FROM t1 FULL JOIN t2 ON t1.v1 = t2.k "
                    "WHERE t1.deleted = false OR t1.deleted IS NULL",
             "mvjg": "SELECT t2.w % 5 AS b, count(*) AS n, sum(t1.v1) AS s, max(t1.id) AS hi FROM t1 LEFT JOIN t2 "
                     "ON t1.v1 = t2.k WHERE t1.deleted = false GROUP BY t2.w % 5",
             # A union of a filter and a GROUP BY (t1's rows to their own key's task, t2's to their group's).
             "mvu": "SELECT id, v1 FROM t1 WHERE deleted = false UNION ALL SELECT k, count(*) AS n FROM t2 GROUP BY k "
                    "UNION ALL SELECT t1.id, t2.w FROM t1 JOIN t2 ON t1.v1 = t2.k",  # and a join branch
             # A GROUP BY over a chain of joins on one key, t1 read twice (each side's positions its own).
             "mvjc": "SELECT t2.w % 4 AS b, count(*) AS n, max(c.id) AS hi FROM t1 JOIN t2 ON t1.v1 = t2.k LEFT JOIN "
                     "t1 c ON t2.k = c.v1 AND c.id % 7 = 0 GROUP BY t2.w % 4",
             # A GROUP BY over a GROUP BY of t2 (the inner groups by k, then the outer by their counts).
             "mvgg": "SELECT n, count(*) AS c FROM (SELECT k, count(*) AS n FROM t2 GROUP BY k) g GROUP BY n",
             # A global aggregate (its one row's partition's task), a hopping window (a row to each of its
             # windows' partitions) and a top-N (by ranking group, then by view key) of t1.
             "mvga": "SELECT count(*) AS n, sum(v1) AS s FROM t1 WHERE deleted = false",
             "mvw": "SELECT window.start, count(*) AS n, max(v1) AS hi FROM t1 "
                    "GROUP BY window(id, '30 milliseconds', '10 milliseconds')",
             "mvt": "SELECT id, v1 FROM (SELECT id, v1, ROW_NUMBER() OVER (PARTITION BY id % 5 ORDER BY v1 DESC) "
                    "AS rn FROM t1) t WHERE rn <= 3"}
    for name, sql in views.items():
        create_view(settings, name, sql, client=redis_client, backfill="chunked")
    store = ViewStore(redis_client, settings.topic_prefix)
    consumers = [ViewConsumer(settings, name, spark=spark, client=redis_client) for name in views]
    assert all(c.tasks is not None and c.backfills.in_tasks is not None for c in consumers)
    rounds = 0
    try:
        # A chunk of about 110 rows a round: t1's ~155 rows in two, then t2's ~65.
        while any(store.lifecycle(name) != Lifecycle.LIVE for name in views) and rounds < 20:
            rounds += 1
            write()
            for consumer in consumers:
                consumer.catch_up()
        assert all(store.lifecycle(name) == Lifecycle.LIVE for name in views), store.backfill_progress("mvj")
        write()  # and on, live
        for consumer in consumers:
            consumer.catch_up()
    finally:
        for consumer in consumers:
            consumer.stop()
        t1.close()
        t2.close()
    for consumer in consumers:
        name = consumer.entry.name
        sources = {line.split()[1] for line in store.backfill_journal(name)}
        assert sources == set(consumer.entry.sources), (name, sources)  # each upstream backfilled
        # Every epoch of the view was computed, written and committed by its tasks, none by the driver.
        assert consumer.tasks is not None
        assert consumer.tasks.epochs_written == consumer.epochs_applied * 3 > 0, (name, consumer.epochs_applied)
    checked = check_oracle(settings, redis_client, ["t1", "t2", *views])
    assert checked >= 8, checked
    report(f"live after {rounds} rounds, {[c.epochs_applied for c in consumers]} view epochs in tasks, "
           f"{checked} epochs checked")
