"""Commands say what they did (issue 21, item 5), against the real broker and Redis: insert replaces a
whole row unless --merge, drop-table, a syntax error in create-view shown with a caret, and `down` /
`stack-status` finding the stack that `mvlog up` started in another directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.infra.child_processes import pid_alive
from mvlog.infra.local_stack import free_ports, redis_answers

from .test_cli_views import MVLOG, T1, lines, mvlog, ok, read_json, refused, topic_exists

pytestmark = pytest.mark.integration


def test_insert_replaces_the_row_and_merge_keeps_omitted_columns(settings: Settings) -> None:
    ok(mvlog(settings, *T1))
    ok(mvlog(settings, "insert", "t1", input=lines({"id": 6, "v1": 60, "deleted": True},
                                                   {"id": 7, "v1": 70, "deleted": True})))
    assert "omitted" in ok(mvlog(settings, "insert", "--help")).stdout

    # The default is a full-row replace: the omitted column becomes NULL, as documented.
    ok(mvlog(settings, "insert", "t1", input=lines({"id": 6, "v1": 61})))
    assert read_json(settings, "t1", "--key", "6")["rows"] == [{"id": 6, "v1": 61, "deleted": None}]

    # --merge: omitted columns keep their committed values; two lines of one key merge in order; a new key
    # gets NULL for what it omits.
    result = ok(mvlog(settings, "insert", "t1", "--merge",
                      input=lines({"id": 7, "v1": 71}, {"id": 7, "deleted": False}, {"id": 8, "v1": 80})))
    assert "3 row(s) merged" in result.stderr
    rows = read_json(settings, "t1")["rows"]
    assert rows == [{"id": 6, "v1": 61, "deleted": None}, {"id": 7, "v1": 71, "deleted": False},
                    {"id": 8, "v1": 80, "deleted": None}]
    # A merged row is still validated: the problem is named, the row left as it was.
    result = mvlog(settings, "insert", "t1", "--merge", input=lines({"id": 7, "v1": "x"}, {"v1": 1}))
    assert result.exit_code == 1
    assert "line 1: field 'v1': expected int, got str 'x'" in result.stderr
    assert "line 2: field 'id': primary key column is missing or null" in result.stderr
    assert read_json(settings, "t1", "--key", "7")["rows"] == [{"id": 7, "v1": 71, "deleted": False}]
    assert "exclude each other" in refused(mvlog(settings, "insert", "t1", "--merge", "--delete", input=""), code=2)


def test_drop_table_is_refused_while_views_read_it_then_deletes_everything(
        settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    ok(mvlog(settings, *T1))
    ok(mvlog(settings, "insert", "t1", input=lines({"id": 1, "v1": 10, "deleted": False})))
    ok(mvlog(settings, "create-view", "mv1", "AS", "SELECT * FROM t1"))
    ok(mvlog(settings, "create-view", "mv2", "AS", "SELECT id FROM t1"))
    assert "cannot drop table 't1': mv1, mv2 depend on it; drop them first" in refused(
        mvlog(settings, "drop-table", "t1"))
    assert "'mv1' is a view, not a table" in refused(mvlog(settings, "drop-table", "mv1"))
    ok(mvlog(settings, "snapshot", "t1"))
    snapshots = settings.snapshot_root
    assert any(snapshots.rglob("*")), "the snapshot was written"
    ok(mvlog(settings, "drop-view", "mv1"))
    ok(mvlog(settings, "drop-view", "mv2"))

    dropped = ok(mvlog(settings, "drop-table", "t1")).stdout
    assert f"Dropped table t1 (catalog entry, rows, snapshots and topic {settings.changelog_topic('t1')})" in dropped
    assert CatalogStore(settings, redis_client).names() == []
    assert list(redis_client.scan_iter(f"{settings.topic_prefix}:{{t1}}:*")) == []
    assert not topic_exists(settings, settings.changelog_topic("t1"))
    assert not any(p.is_file() for p in snapshots.rglob("*")), list(snapshots.rglob("*"))
    assert "unknown table or view 't1'" in refused(mvlog(settings, "drop-table", "t1"))
    # The name is free again, and the new table starts empty.
    ok(mvlog(settings, *T1))
    assert read_json(settings, "t1")["rows"] == []


def test_create_view_syntax_error_shows_the_sql_with_a_caret(settings: Settings, redis_client: redis.Redis) -> None:
    ok(mvlog(settings, *T1))
    error = refused(mvlog(settings, "create-view", "bad", "AS", "SELECT id, FROM t1"))
    assert ("view bad refused, nothing created: syntax error at line 1, col 10: expected an expression after "
            "`,`, found `FROM`\n  SELECT id, FROM t1\n           ^") in error
    error = refused(mvlog(settings, "create-view", "bad", "AS", "SELECT v1 * * 2 FROM t1"))
    assert "SELECT v1 * * 2 FROM t1\n" in error and "<class" not in error and "sqlglot" not in error
    assert CatalogStore(settings, redis_client).names() == ["t1"]


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MVLOG, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_down_and_stack_status_find_the_stack_from_another_directory(tmp_path: Path) -> None:
    """`mvlog up` in one directory (default stack folder ./.mvlog); `stack-status` and `down` from another
    one find it, through the exported settings and, with nothing exported, through the user's record."""
    started_in, elsewhere, state = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "state"
    started_in.mkdir()
    elsewhere.mkdir()
    bare = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")} | {"XDG_STATE_HOME": str(state)}
    kafka_port, redis_port = free_ports(2)
    up = _run(["up", "--kafka-port", str(kafka_port), "--redis-port", str(redis_port)], started_in, bare)
    try:
        assert up.returncode == 0, up.stderr
        exported = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines())
        assert exported["MVLOG_STACK_DIR"] == str((started_in / ".mvlog").resolve())
        pids = [int((started_in / ".mvlog" / f"{name}.pid").read_text()) for name in ("kafka", "redis")]

        status = _run(["stack-status"], elsewhere, bare | exported)  # eval "$(mvlog up)", then cd elsewhere
        assert status.returncode == 0 and status.stdout.count("healthy") == 2, status.stdout + status.stderr
        status = _run(["stack-status"], elsewhere, bare)  # a new shell: nothing exported
        assert status.returncode == 0 and status.stdout.count("healthy") == 2, status.stdout + status.stderr

        down = _run(["down"], elsewhere, bare)
        assert down.returncode == 0, down.stderr
        assert f"Local stack in {(started_in / '.mvlog').resolve()} stopped." in down.stdout, down.stdout
        assert not any(pid_alive(pid) for pid in pids)
        assert not redis_answers("127.0.0.1", redis_port, 1.0)
        assert "nothing to stop" in _run(["down"], elsewhere, bare).stdout  # forgotten once stopped
    finally:
        _run(["down", "--stack-dir", str(started_in / ".mvlog")], started_in, bare)
