"""The demo as a user runs it: the README's ``make demo``, 25 s of workload.

It runs in this repository, whose ``make setup`` (the first step of both README commands) has made the
``.venv`` the suite runs in: CI runs the suite from a clean clone, so that setup is the one a fresh
machine gets, and a second one here would only cost the suite a minute of CPU. While the demo runs, its
lag dashboard answers at the address it prints (page, /api/status, /metrics).

The demo reuses the test stack (its ``MVLOG_*`` variables point at it and it answers), runs its chain of
views under this test's prefix, and must exit 0 with progress tables whose MCEs advance and a final JSON
summary whose contents this test checks again itself, from the views' serving state in Redis.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services.commands.read import read_rows
from mvlog.source_spec import SourceSpec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
VIEWS = ("mv1", "mv2", "mv3", "mvj")
RESTARTED = re.compile(r"^view (\w+) failed \(.*\); restarting it", re.M)


def progress_tables(stdout: str) -> list[dict[str, list[str]]]:
    """The progress tables printed, in order: view name -> its cells (view, kind, state, MCE, ...)."""
    tables: list[dict[str, list[str]]] = []
    for line in stdout.splitlines():
        if line.startswith("┏"):
            tables.append({})
        elif line.startswith("│") and tables:
            cells = [cell.strip() for cell in line.strip("│").split("│")]
            tables[-1][cells[0]] = cells
    return tables


def mce_of(cells: list[str]) -> int:
    return 0 if cells[3] == "-" else int(cells[3])


def visible_rows(settings: Settings, client: redis.Redis, name: str) -> list[dict[str, Any]]:
    entry = CatalogStore(settings, client).get(name)
    rows = read_rows(ViewStore(client, settings.topic_prefix), entry, None)[1]
    return [{c: row.get(c) for c in entry.schema.visible_names} for row in rows]


def wait_for_dashboard(err_path: Path, process: subprocess.Popen[str], timeout: float = 600.0) -> str:
    """The dashboard's address, from the line the demo prints once it serves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := re.search(r"Lag dashboard: (http://127\.0\.0\.1:\d+/)", err_path.read_text()):
            return found.group(1)
        assert process.poll() is None, f"the demo exited early:\n{err_path.read_text()}"
        time.sleep(0.2)
    raise AssertionError(f"no dashboard address printed within {timeout}s:\n{err_path.read_text()}")


def check_dashboard_answers(url: str) -> None:
    """While the demo runs, the dashboard serves its page, every view with a lag sample, and /metrics."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert "mvlog" in response.read().decode()
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(f"{url}api/status", timeout=10) as response:
            views = {v["name"]: v for v in json.load(response)["views"]}
        if all(views.get(v, {}).get("lag") and views[v]["mce"] is not None for v in VIEWS):
            break
        assert time.monotonic() < deadline, f"views without lag samples or MCE: {views}"
        time.sleep(1.0)
    assert sorted(views["mvj"]["sources"]) == ["mv1", "t2"]  # the view graph: the join reads both
    with urllib.request.urlopen(f"{url}metrics", timeout=10) as response:
        families = {f.name for f in text_string_to_metric_families(response.read().decode())}
    assert {"mvlog_view_epoch_lag", "mvlog_view_lag_seconds", "mvlog_view_max_committed_epoch"} <= families


def fold_debezium_topic(settings: Settings, topic: str) -> dict[Any, dict[str, Any]]:
    """The rows of a Debezium change-event topic (JSON, no schemas): each key's last ``after``, gone after
    its ``d``; read from the start to the end offsets of every partition."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": "test-demo-fold",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        rows: dict[Any, dict[str, Any]] = {}
        positions = dict.fromkeys(partitions, 0)
        deadline = time.monotonic() + 60
        while any(positions[p] < ends[p] for p in partitions):
            assert time.monotonic() < deadline, f"{topic}: not read to its end: {positions} of {ends}"
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            partition, offset, value = message.partition(), message.offset(), message.value()
            assert partition is not None and offset is not None
            positions[partition] = offset + 1
            if value is None:
                continue  # the tombstone after a delete
            event = json.loads(value)
            if event["op"] == "d":
                rows.pop(event["before"]["id"], None)
            else:
                rows[event["after"]["id"]] = event["after"]
        return rows
    finally:
        consumer.close()


#: The demo's workload: long enough for several progress tables while the views move, short for the suite.
DURATION_S = 15


@pytest.mark.timeout(900)
def test_demo_runs_the_chain_and_ends_consistent(settings: Settings, redis_client: redis.Redis,
                                                 tmp_path: Path, report: Callable[[str], None]) -> None:
    # Nothing of this process's environment may help the demo: no Spark Python, no make state, no settings
    # but the ones pointing it at the test stack.
    inherited = ("PYSPARK_", "MVLOG_", "MAKE", "MFLAGS", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    env.update({"MVLOG_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "MVLOG_REDIS_URL": settings.redis_url,
                "MVLOG_STACK_DIR": str(tmp_path / "stack")})
    demo_args = f"--duration {DURATION_S} --prefix {settings.topic_prefix} --dashboard-port 0 --output json"
    out_path, err_path = tmp_path / "demo.out", tmp_path / "demo.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(["make", "demo", f"DEMO_ARGS={demo_args}"], env=env, cwd=ROOT,
                                   stdout=out, stderr=err, text=True)
        try:
            url = wait_for_dashboard(err_path, process)
            try:
                check_dashboard_answers(url)
            except urllib.error.URLError:
                try:  # a demo that fails stops its dashboard first, then Spark: wait, then say why
                    process.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    raise
                raise AssertionError(f"the demo exited {process.returncode} while its dashboard was "
                                     f"checked:\n{err_path.read_text()[-4000:]}") from None
            process.wait(timeout=480)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    result = subprocess.CompletedProcess(process.args, process.returncode, out_path.read_text(),
                                         err_path.read_text())
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    # No traceback of mvlog's own. A view whose Spark query failed (a Python worker that did not connect
    # back in time on a loaded machine) is restarted by the demo: Spark prints the worker's traceback.
    restarts = RESTARTED.findall(result.stderr)
    assert result.stderr.count("Traceback") <= len(restarts), result.stderr[-4000:]
    report(f"demo: {len(restarts)} view restart(s) {restarts}")
    assert "Using the running stack" in result.stderr  # the test stack, not a new one
    assert not (tmp_path / "stack" / "stack.json").exists()
    with pytest.raises(urllib.error.URLError):  # the dashboard stopped with the demo
        urllib.request.urlopen(f"{url}healthz", timeout=5)

    tables = progress_tables(result.stdout)
    assert len(tables) >= 5, result.stdout  # one every 2 s of the workload, and the final one
    first, last = tables[0], tables[-1]
    for view in VIEWS:
        assert view in first and view in last, result.stdout
        assert mce_of(last[view]) > mce_of(first[view]), f"{view} did not advance:\n{result.stdout}"
        assert last[view][2] == "live"
    # Some table in between shows the views moving while the workload writes.
    middle = [mce_of(t["mv1"]) for t in tables[1:-1] if "mv1" in t]
    assert len(set(middle)) > 1, result.stdout

    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["prefix"] == settings.topic_prefix
    assert summary["caught_up"] is True
    assert summary["consistent"] is True, summary["checks"]
    assert summary["changes_written"] > DURATION_S * 100  # a few hundred changes per second
    assert summary["views"]["mv2"]["value"] == {"total": summary["mv2_total"]}

    # The same contents, read again from the serving state by the test itself.
    t1 = {r["id"]: r for r in visible_rows(settings, redis_client, "t1")}
    t2 = {r["id"]: r for r in visible_rows(settings, redis_client, "t2")}
    mv1 = {r["id"]: r for r in visible_rows(settings, redis_client, "mv1")}
    assert mv1 == {k: r for k, r in t1.items() if r["deleted"] is False}
    assert len(mv1) == summary["mv1_rows"] > 0
    (mv2,) = visible_rows(settings, redis_client, "mv2")
    assert mv2["total"] == sum(r["v1"] for r in mv1.values()) == summary["mv2_total"]
    (mv3,) = visible_rows(settings, redis_client, "mv3")
    assert mv3["n"] == len(mv1) == summary["mv3_n"]
    mvj = sorted((r["id"], r["v1"], r["name"]) for r in visible_rows(settings, redis_client, "mvj"))
    assert mvj == sorted((k, r["v1"], t2[k]["name"]) for k, r in mv1.items() if k in t2)
    assert mvj, "the join should have rows"

    # t1 came from a Debezium-shaped topic through `mvlog run-source`: it equals that topic's change events
    # folded by key, read here by a plain consumer (tombstones and deletes remove the row).
    spec = SourceSpec.from_options(CatalogStore(settings, redis_client).get("t1").options)
    assert spec is not None and spec.format.value == "debezium-json"
    assert "t1 = the database's rows (its Debezium topic, ingested)" in summary["checks"]
    assert t1 == fold_debezium_topic(settings, spec.topic)
