"""The operator/producer CLI against the real broker and Redis: tables, inserts, view DDL, reads, run-view.

Commands run through click's CliRunner with the test's settings passed as ``MVLOG_*`` variables, as a
user's shell would; ``run-view`` runs as a real process (it is what fault-injection tests SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from confluent_kafka.admin import AdminClient

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.infra.local_stack import free_ports
from mvlog.services.cli import main

pytestmark = pytest.mark.integration

_SCRIPT = Path(sys.executable).with_name("mvlog")
MVLOG = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "mvlog.services.cli"]

T1 = ["create-table", "t1", "--column", "id:int", "--column", "v1:int", "--column", "deleted:boolean",
      "--primary-key", "id"]


def env_of(settings: Settings) -> dict[str, str]:
    return {"MVLOG_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "MVLOG_REDIS_URL": settings.redis_url,
            "MVLOG_REDIS_CLUSTER": str(settings.redis_cluster).lower(),
            "MVLOG_TOPIC_PREFIX": settings.topic_prefix, "MVLOG_PARTITIONS": str(settings.partitions),
            "MVLOG_BARRIER_INTERVAL_MS": str(settings.barrier_interval_ms),
            "MVLOG_STACK_DIR": str(settings.stack_dir), "MVLOG_SPARK_CONF": json.dumps(settings.spark_conf)}


def mvlog(settings: Settings, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, env=env or env_of(settings), catch_exceptions=False)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result


def refused(result: Result, code: int = 1) -> str:
    """The error of a refused command: a clean ``Error: ...`` line, never a traceback."""
    assert result.exit_code == code, f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert "Traceback" not in result.output
    assert "Error: " in result.stderr
    return result.stderr


def read_json(settings: Settings, view: str, *args: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(ok(mvlog(settings, "read", view, "--output", "json", *args)).stdout)
    return document


def lines(*rows: Any) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def topic_exists(settings: Settings, topic: str) -> bool:
    return topic in AdminClient(settings.kafka_client_config()).list_topics(timeout=10).topics


def test_create_table_insert_and_read(settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    created = ok(mvlog(settings, *T1, "--partitions", "2")).stdout
    assert "Created table t1 (id int primary key, v1 int, deleted boolean) with 2 partition(s)" in created
    assert CatalogStore(settings, redis_client).get("t1").partitions == 2
    assert "table 't1' already exists" in refused(mvlog(settings, *T1))
    assert "'id' is not NAME:TYPE" in refused(mvlog(settings, "create-table", "t2", "--column", "id",
                                                    "--primary-key", "id"), code=2)
    assert "unknown column type 'intx'" in refused(mvlog(settings, "create-table", "t2", "-c", "id:intx",
                                                         "-k", "id"), code=2)
    assert "'nope' is not a column" in refused(mvlog(settings, "create-table", "t2", "-c", "id:int",
                                                     "-k", "nope"), code=2)

    # One bad line among good ones: refused with its line number, field and problem; the others written.
    data = lines({"id": 1, "v1": 10, "deleted": False}, {"id": 2, "v1": "x", "deleted": False}, "{not json",
                 "", {"id": 3, "v1": 30, "deleted": True, "colour": "red"}, {"id": 4, "v1": 40, "deleted": True},
                 {"v1": 5})
    result = mvlog(settings, "insert", "t1", input=data)
    assert result.exit_code == 1 and "Traceback" not in result.output
    errors = result.stderr
    assert "line 2: field 'v1': expected int, got str 'x'" in errors
    assert "line 3: invalid JSON" in errors
    assert "line 5: field 'colour': unknown column" in errors
    assert "line 7: field 'id': primary key column is missing or null" in errors
    assert "2 row(s) written" in errors and "4 line(s) refused" in errors
    epoch = int(result.stdout)

    full = read_json(settings, "t1")
    assert full["epoch"] == epoch and full["columns"] == ["id", "v1", "deleted"]
    assert full["rows"] == [{"id": 1, "v1": 10, "deleted": False}, {"id": 4, "v1": 40, "deleted": True}]
    assert read_json(settings, "t1", "--key", "4")["rows"] == [{"id": 4, "v1": 40, "deleted": True}]
    assert read_json(settings, "t1", "--key", "2")["rows"] == []
    assert "expected int, got 'four'" in refused(mvlog(settings, "read", "t1", "--key", "four"), code=2)
    table = ok(mvlog(settings, "read", "t1")).stdout
    assert f"t1 at epoch {epoch}" in table and "│ 4  │ 40 │ true    │" in table and "2 row(s)." in table

    # Deletes by key, from a file: an object, a bare value; a key of the wrong type is refused.
    keys = tmp_path / "keys.jsonl"
    keys.write_text(lines({"id": 1}, 4, "true"))
    result = mvlog(settings, "insert", "t1", "--delete", "--file", str(keys))
    assert result.exit_code == 1 and "line 3: field 'id': expected int, got bool True" in result.stderr
    assert read_json(settings, "t1")["rows"] == [] and read_json(settings, "t1")["epoch"] == int(result.stdout)

    # A key of two columns, and bytes as base64 both ways.
    ok(mvlog(settings, "create-table", "t2", "-c", "a:string", "-c", "b:int", "-c", "blob:bytes", "-k", "a,b"))
    ok(mvlog(settings, "insert", "t2", input=lines({"a": "x", "b": 1, "blob": "AAEC"}, {"a": "x", "b": 2})))
    assert read_json(settings, "t2", "--key", "x", "--key", "1")["rows"] == [{"a": "x", "b": 1, "blob": "AAEC"}]
    assert "give one --key per key column" in refused(mvlog(settings, "read", "t2", "--key", "x"), code=2)
    assert "unknown table or view 'nope' (known: t1, t2)" in refused(mvlog(settings, "insert", "nope", input=""))


def test_create_and_drop_views(settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    ok(mvlog(settings, *T1))
    catalog = CatalogStore(settings, redis_client)

    created = ok(mvlog(settings, "create-view", "mv1", "AS", "SELECT * FROM t1 WHERE deleted = false")).stdout
    assert "Created view mv1 over t1" in created and "mvlog run-view mv1" in created
    assert ("Operator: on the driver (MVLOG_OPERATORS_IN_TASKS is off; with it on: in Spark's tasks, a task per "
            "changelog partition, no shuffle (keyed like its upstream))." in created), created
    assert ViewStore(redis_client, settings.topic_prefix).meta("mv1")["state"] == "creating"
    sql_file = tmp_path / "mv2.sql"
    sql_file.write_text("SELECT v1 FROM mv1\n")
    ok(mvlog(settings, "create-view", "mv2", "--sql-file", str(sql_file)))
    assert read_json(settings, "mv2")["columns"] == ["v1"]  # the hidden key column id is not shown

    # Refused definitions name the problem and where it is; nothing is created.
    for sql, expected in [
        ("SELECT * FROM t1 ORDER BY v1", "unsupported SQL: ORDER BY at line 1, col 18: `ORDER BY v1`"),
        ("SELECT * FROM t9", "unknown view 't9' in `t9` at line 1, col 15; known views: mv1, mv2, t1"),
        ("SELECT * FROM t1 WHERE v1 = 'a'", "type error in `v1 = 'a'` at line 1, col 24: cannot compare int "
                                            "with string"),
    ]:
        error = refused(mvlog(settings, "create-view", "bad", "AS", sql))
        assert f"view bad refused, nothing created: {expected}" in error
    assert catalog.names() == ["mv1", "mv2", "t1"]
    assert not topic_exists(settings, settings.changelog_topic("bad"))
    assert "no SQL" in refused(mvlog(settings, "create-view", "bad"), code=2)

    listing = json.loads(ok(mvlog(settings, "views", "--output", "json")).stdout)
    assert [(v["name"], v["kind"], v["sources"], v["state"]) for v in listing] == [
        ("mv1", "view", ["t1"], "creating"), ("mv2", "view", ["mv1"], "creating"), ("t1", "table", [], "live")]
    assert "mv2  │ view  │ mv1" in ok(mvlog(settings, "views")).stdout

    # Settings change in the catalog entry (rebuilt from Kafka with it); 0 removes a setting.
    assert "max_epoch_lag=5" in ok(mvlog(settings, "alter-view", "mv1", "--max-epoch-lag", "5")).stdout
    ok(mvlog(settings, "alter-view", "mv1", "--backfill-rate-limit", "100"))
    assert catalog.get("mv1").options == {"backfill": "chunked", "max_epoch_lag": "5", "backfill_rate_limit": "100"}
    ok(mvlog(settings, "alter-view", "mv1", "--max-epoch-lag", "0"))
    assert catalog.get("mv1").options == {"backfill": "chunked", "backfill_rate_limit": "100"}
    assert "'t1' is a table, not a view" in refused(mvlog(settings, "alter-view", "t1", "--max-epoch-lag", "1"))
    assert "nothing to change" in refused(mvlog(settings, "alter-view", "mv1"), code=2)

    assert "cannot drop view 'mv1': mv2 depends on it" in refused(mvlog(settings, "drop-view", "mv1"))
    assert "'t1' is a table, not a view" in refused(mvlog(settings, "drop-view", "t1"))
    ok(mvlog(settings, "drop-view", "mv2"))
    ok(mvlog(settings, "drop-view", "mv1"))
    assert catalog.names() == ["t1"]
    assert not topic_exists(settings, settings.changelog_topic("mv1"))
    assert "unknown table or view 'mv1' (known: t1)" in refused(mvlog(settings, "drop-view", "mv1"))


def test_unreachable_servers_are_named(settings: Settings) -> None:
    dead_kafka, dead_redis = free_ports(2)
    env = env_of(settings) | {"MVLOG_REDIS_URL": f"redis://127.0.0.1:{dead_redis}/0"}
    error = refused(mvlog(settings, "read", "t1", env=env))
    assert f"cannot reach Redis at redis://127.0.0.1:{dead_redis}/0" in error and "MVLOG_REDIS_URL" in error
    # A long-running process started while Redis is away waits for it (redis_outage_timeout_s), then says so.
    started = time.monotonic()
    error = refused(mvlog(settings, "run-view", "mv1", env=env | {"MVLOG_REDIS_OUTAGE_TIMEOUT_S": "2"}))
    assert f"cannot reach Redis at redis://127.0.0.1:{dead_redis}/0" in error
    assert time.monotonic() - started >= 2, "run-view gave up before its Redis outage bound"
    env = env_of(settings) | {"MVLOG_BOOTSTRAP_SERVERS": f"127.0.0.1:{dead_kafka}"}
    error = refused(mvlog(settings, *T1, env=env))
    assert f"cannot reach Kafka at 127.0.0.1:{dead_kafka}" in error and "MVLOG_BOOTSTRAP_SERVERS" in error


@pytest.mark.spark
def test_run_view_maintains_a_view_until_sigterm(settings: Settings, redis_client: redis.Redis,
                                                 tmp_path: Path) -> None:
    ok(mvlog(settings, *T1))
    ok(mvlog(settings, "insert", "t1", input=lines(*({"id": i, "v1": i * 10, "deleted": i % 3 == 0}
                                                     for i in range(1, 11)))))
    ok(mvlog(settings, "create-view", "mv1", "AS", "SELECT * FROM t1 WHERE deleted = false"))
    env = {**os.environ, **env_of(settings), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    log = tmp_path / "run-view.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([*MVLOG, "run-view", "mv1", "--progress-interval", "1"], env=env,
                                   stdout=sink, stderr=subprocess.STDOUT)
    try:
        # Changes while the consumer runs: an update, a row becoming deleted, a delete, a new row.
        changes = lines({"id": 1, "v1": 11, "deleted": False}, {"id": 2, "v1": 20, "deleted": True},
                        {"id": 11, "v1": 110, "deleted": False})
        ok(mvlog(settings, "insert", "t1", input=changes))
        last = int(ok(mvlog(settings, "insert", "t1", "--delete", input=lines(4))).stdout)
        store = ViewStore(redis_client, settings.topic_prefix)
        deadline = time.monotonic() + 75
        while (store.mce("mv1") or 0) < last:
            assert process.poll() is None, f"run-view exited with {process.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"mv1 did not reach epoch {last}:\n{log.read_text()}"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert "SIGTERM: stopping mv1" in output and f"mv1: stopped at epoch {last}" in output
    assert "mv1: reading its backlog: up to epoch" in output  # the rows inserted before it started

    view = read_json(settings, "mv1")
    expected = {1: 11, 5: 50, 7: 70, 8: 80, 10: 100, 11: 110}
    assert view["epoch"] == last and view["state"] == "live"
    assert view["rows"] == [{"id": i, "v1": v, "deleted": False} for i, v in expected.items()]
    assert read_json(settings, "mv1", "--key", "7")["rows"] == [{"id": 7, "v1": 70, "deleted": False}]
    listing = {v["name"]: v for v in json.loads(ok(mvlog(settings, "views", "-o", "json")).stdout)}
    assert listing["mv1"]["mce"] == last and listing["mv1"]["rows"] == len(expected)
