"""Lag, status, /metrics and consistent multi-view reads on a real chain (Apache Kafka, Redis, Spark) at rest.

The chain ``t1 -> mv1 -> mv2`` is put in a known position: t1 committed 10 epochs (epoch i inserts i new
rows; epoch 9 also updates a row of epoch 2, epoch 10 deletes a row of epoch 1), mv1 and mv2 caught up
with Spark to t1's 4th epoch only. What every command reports is then checked against what the test
wrote (not against the epoch index the code reads): mv1 is 6 epochs, 5+6+7+8+10+11 = 47 records and
(ms(e10) - ms(e4)) seconds behind t1; mv2 is level with mv1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from mvlog.config import Settings
from mvlog.connectors.redis.lag_store import LagStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.epoch import epoch_millis
from mvlog.services.cli import main
from mvlog.services.dashboard.server import DashboardServer
from mvlog.services.lag_sampler import LagSampler
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import alter_view, create_view, drop_view

pytestmark = pytest.mark.integration

_SCRIPT = Path(sys.executable).with_name("mvlog")
MVLOG = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "mvlog.services.cli"]
RECORDS_BEHIND = 5 + 6 + 7 + 8 + (9 + 1) + (10 + 1)


@dataclass
class Chain:
    settings: Settings
    client: redis.Redis
    t1: Table
    epochs: list[int]  # t1's epochs, oldest first
    rows_at: list[dict[int, int]]  # id -> v1 of t1 after each epoch
    mv1: ViewConsumer
    mv2: ViewConsumer


def _env(settings: Settings) -> dict[str, str]:
    return {"MVLOG_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "MVLOG_REDIS_URL": settings.redis_url,
            "MVLOG_REDIS_CLUSTER": str(settings.redis_cluster).lower(),
            "MVLOG_TOPIC_PREFIX": settings.topic_prefix, "MVLOG_STACK_DIR": str(settings.stack_dir)}


def mvlog_json(settings: Settings, *args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--output", "json"], env=_env(settings), catch_exceptions=False)
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout)


@pytest.fixture
def chain(settings: Settings, redis_client: redis.Redis, spark: Any) -> Iterator[Chain]:
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int"}, ["id"], client=redis_client, auto_commit=False)
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE v1 >= 0", client=redis_client)
    create_view(settings, "mv2", "SELECT sum(v1) AS total FROM mv1", client=redis_client)
    epochs: list[int] = []
    rows_at: list[dict[int, int]] = []
    current: dict[int, int] = {}
    for i in range(1, 11):
        batch = {100 * i + j: i for j in range(i)}
        if i == 9:
            batch[200] = 99
        t1.upsert([{"id": k, "v1": v} for k, v in batch.items()])
        current.update(batch)
        if i == 10:
            t1.delete([100])
            del current[100]
        epochs.append(t1.flush())
        rows_at.append(dict(current))
    mv1 = ViewConsumer(settings, "mv1", spark=spark, client=redis_client)
    mv2 = ViewConsumer(settings, "mv2", spark=spark, client=redis_client)
    assert mv1.catch_up(upto=epochs[3]) == epochs[3]
    assert mv2.catch_up() == epochs[3]
    try:
        yield Chain(settings, redis_client, t1, epochs, rows_at, mv1, mv2)
    finally:
        mv1.stop()
        mv2.stop()
        t1.close()


def test_status_lag_and_metrics_report_epochs_seconds_and_records(chain: Chain) -> None:
    settings, e = chain.settings, chain.epochs
    seconds_behind = (epoch_millis(e[9]) - epoch_millis(e[3])) / 1000

    lag = {(r["view"], r["upstream"]): r for r in mvlog_json(settings, "lag")}
    assert set(lag) == {("mv1", "t1"), ("mv2", "mv1")}
    mv1 = lag["mv1", "t1"]
    assert (mv1["view_mce"], mv1["upstream_mce"], mv1["epochs"], mv1["records"]) == (e[3], e[9], 6, RECORDS_BEHIND)
    assert mv1["seconds"] == pytest.approx(seconds_behind)
    assert mv1["status"] == "unknown"  # no sampler runs: lag measured on the spot, no window to judge
    mv2 = lag["mv2", "mv1"]
    assert (mv2["epochs"], mv2["records"], mv2["seconds"]) == (0, 0, 0)

    # What other services publish (backfill, log cache, backpressure) shows up where it exists.
    store = ViewStore(chain.client, settings.topic_prefix)
    chain.client.hset(store.key("mv2", "backfill"), mapping={"rows_done": 30, "rows_total": 120, "rate": 10})
    chain.client.hset(f"{settings.topic_prefix}:cache:t1", mapping={"bytes": 1024, "max_bytes": 4096,
                                                                    "epochs": 6, "held_for": "mv1"})
    alter_view(settings, "mv1", client=chain.client, max_epoch_lag=5)

    status = {v["name"]: v for v in mvlog_json(settings, "status")["views"]}
    assert set(status) == {"t1", "mv1", "mv2"}
    assert status["t1"]["kind"] == "table" and status["t1"]["lag"] is None and status["t1"]["mce"] == e[9]
    assert status["mv1"]["mce"] == e[3] and status["mv1"]["lag"]["epochs"] == 6
    assert status["mv1"]["lag"]["records"] == RECORDS_BEHIND
    assert status["mv1"]["backpressure"] == {"max_epoch_lag": 5, "holding": True}
    assert status["mv1"]["cache"]["t1"]["fraction"] == 0.25
    assert status["mv2"]["backfill"]["fraction"] == 0.25 and status["mv2"]["backfill"]["eta_seconds"] == 9
    assert status["mv2"]["backpressure"] is None and status["mv2"]["cache"] is None
    assert status["mv2"]["rows"] == 1

    with DashboardServer(settings, port=0, sample=False) as server:
        with urllib.request.urlopen(f"{server.url}metrics", timeout=10) as response:
            text = response.read().decode()
        with urllib.request.urlopen(f"{server.url}api/status", timeout=10) as response:
            api = {v["name"]: v for v in json.load(response)["views"]}
    # The page's API: the same numbers, epochs as strings (JavaScript numbers stop at 2**53).
    assert (api["mv1"]["mce"], api["mv1"]["lag"]["epochs"], api["mv1"]["lag"]["records"]) == (str(e[3]), 6,
                                                                                            RECORDS_BEHIND)
    assert api["mv1"]["lag"]["upstreams"][0]["upstream_mce"] == str(e[9])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def metric(name: str, **labels: str) -> float:
        return samples[name, tuple(sorted(labels.items()))]

    assert metric("mvlog_view_epoch_lag", view="mv1", upstream="t1") == 6
    assert metric("mvlog_view_lag_records", view="mv1", upstream="t1") == RECORDS_BEHIND
    assert metric("mvlog_view_lag_seconds", view="mv1", upstream="t1") == pytest.approx(seconds_behind)
    assert metric("mvlog_view_epoch_lag", view="mv2", upstream="mv1") == 0
    assert metric("mvlog_view_max_committed_epoch", view="mv1") == float(e[3])
    assert metric("mvlog_view_max_committed_epoch_timestamp_seconds", view="t1") == epoch_millis(e[9]) / 1000
    state = store.lifecycle("mv1")
    assert state is not None and metric("mvlog_view_state", view="mv1", state=state.value) == 1
    assert sum(v for (n, labels), v in samples.items() if n == "mvlog_view_state" and ("view", "mv1") in labels) == 1
    assert metric("mvlog_view_max_epoch_lag", view="mv1") == 5
    assert metric("mvlog_view_backpressure_holding", view="mv1") == 1
    assert metric("mvlog_view_backfill_eta_seconds", view="mv2") == 9
    assert metric("mvlog_cache_bytes", upstream="t1") == 1024
    assert metric("mvlog_view_rows", view="t1") == len(chain.rows_at[9])


def test_status_watch_judges_its_own_window_and_stops_on_ctrl_c(chain: Chain) -> None:
    """No sampler runs: ``status --watch`` samples by itself; mv1 is behind and nothing moves: stopped."""
    table = CliRunner().invoke(main, ["status"], env=_env(chain.settings), catch_exceptions=False)
    assert table.exit_code == 0 and "lag epochs" in table.stdout
    mv1_line = next(line for line in table.stdout.splitlines() if "mv1" in line and "unknown" in line)
    assert f" {RECORDS_BEHIND} " in mv1_line and " 6 " in mv1_line
    process = subprocess.Popen([*MVLOG, "status", "--watch", "0.2", "--output", "json"],
                               env={**os.environ, **_env(chain.settings)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        documents = [json.loads(process.stdout.readline()) for _ in range(3)]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    statuses = [{v["name"]: (v["status"] or {}).get("status") for v in d["views"]} for d in documents]
    assert statuses[0]["mv1"] == "unknown" and statuses[2]["mv1"] == "stopped", statuses
    assert statuses[2]["mv2"] == "ok" and statuses[2]["t1"] is None


def test_status_rules_judge_real_samples(chain: Chain) -> None:
    settings = chain.settings.model_copy(update={"lag_window": 3})
    sampler = LagSampler(settings, chain.client)
    rival = LagSampler(settings, chain.client)
    store = LagStore(chain.client, settings.topic_prefix)

    def statuses() -> dict[str, str]:
        return {view: verdict.status.value for view, (_, verdict) in store.current().items()}

    assert sampler.tick()
    assert not rival.tick()  # one sampler at a time (the lease)
    assert statuses() == {"mv1": "unknown", "mv2": "unknown"}
    assert sampler.tick()
    assert statuses() == {"mv1": "stopped", "mv2": "ok"}  # nothing moves, mv1 is 6 epochs behind
    chain.t1.upsert([{"id": 5000, "v1": 1}])
    chain.t1.flush()
    assert sampler.tick()
    assert statuses() == {"mv1": "stalled", "mv2": "ok"}  # t1 moved on, mv1 did not
    current = store.current()["mv1"]
    assert current[0].epochs == 7 and "while the upstream moved on" in current[1].reason
    chain.mv1.catch_up()
    assert sampler.tick()
    assert statuses()["mv1"] == "ok"
    history = store.history("mv1", 100)
    assert [s.epochs for s in history] == [6, 6, 7, 0]
    chain.mv2.stop()
    drop_view(settings, "mv2", client=chain.client)
    assert sampler.tick()
    assert set(statuses()) == {"mv1"} and store.history("mv2", 10) == []  # a dropped view is forgotten
    sampler.stop()
    assert rival.tick()  # the lease is free once the first sampler stopped
    rival.stop()


def test_read_views_reads_every_view_at_the_minimum_mce(chain: Chain) -> None:
    settings, e = chain.settings, chain.epochs
    chain.mv1.catch_up(upto=e[8])  # mv1 at t1's 9th epoch (after the update of id 200), mv2 still at the 4th

    document = mvlog_json(settings, "read", "--views", "t1,mv1,mv2")
    assert document["epoch"] == e[3]
    expected = chain.rows_at[3]
    for view in ("t1", "mv1"):  # both taken back from their own changelogs to t1's 4th epoch
        assert {r["id"]: r["v1"] for r in document["views"][view]["rows"]} == expected, view
    assert document["views"]["mv2"]["rows"] == [{"total": sum(expected.values())}]

    # The same views alone are at their own MCEs.
    assert mvlog_json(settings, "read", "mv1")["epoch"] == e[8]
    assert {r["id"]: r["v1"] for r in mvlog_json(settings, "read", "mv1")["rows"]} == chain.rows_at[8]
    alone = mvlog_json(settings, "read", "--views", "mv1")
    assert alone["epoch"] == e[8]

    bad = CliRunner().invoke(main, ["read", "--views", "mv1,nope"], env=_env(settings))
    assert bad.exit_code == 1 and "unknown table or view 'nope'" in bad.stderr
    both = CliRunner().invoke(main, ["read", "mv1", "--views", "mv1,mv2"], env=_env(settings))
    assert both.exit_code == 2 and "--views reads whole views" in both.stderr
