"""mvlog processes ride out a restart of redis-server (issue 21, item 2, the Redis half).

redis-server (append-only file on) is SIGKILLed and restarted on the same port and folder a few seconds
later, as an operator's restart or a crash would. The clients of :mod:`mvlog.connectors.redis.redis_client`
wait for it: a ``mvlog run-view`` process and a table writer with its epoch loop go on, nothing lost or
doubled; so does the lag sampler. The client's pieces are checked against the same server: one log
line per state change, Lua scripts reloaded after the restart (NOSCRIPT), a probe that does not wait, and
a commit retried after its reply was lost counted as applied.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.packed_script import run_script
from mvlog.connectors.redis.view_store import EpochCommit, ViewStore
from mvlog.infra.local_stack import find_redis_server, free_port, redis_answers
from mvlog.services.lag_sampler import LagSampler
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from .test_durable_stack import check_table_exactly_once, check_views

pytestmark = pytest.mark.integration

_SCRIPT = Path(sys.executable).with_name("mvlog")
MVLOG = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "mvlog.services.cli"]
DOWN_S = 3.0  # how long redis-server stays down


class AofRedis:
    """A redis-server of the test's own with its append-only file, that can be SIGKILLed and restarted on
    the same port and folder (it comes back from the AOF)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(find_redis_server()), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
            stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not redis_answers("127.0.0.1", self.port, 0.5):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def restart_after(self, seconds: float) -> threading.Thread:
        """Start it again ``seconds`` from now, on a thread (the caller's commands meanwhile wait)."""
        def restart() -> None:
            time.sleep(seconds)
            self.start()

        thread = threading.Thread(target=restart, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[AofRedis]:
    server = AofRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _settings(aof_redis: AofRedis, **overrides: Any) -> Settings:
    return Settings(redis_url=aof_redis.url, **overrides)


# ------------------------------------------------------------------------- the client against a restart


def test_a_command_waits_through_a_restart_and_says_so_twice(aof_redis: AofRedis,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    client = redis_client.connect(_settings(aof_redis, redis_outage_timeout_s=60))
    client.set("k", "before")
    aof_redis.kill()
    restarted = aof_redis.restart_after(DOWN_S)
    with caplog.at_level(logging.INFO, logger="mvlog.connectors.redis.redis_client"):
        started = time.monotonic()
        assert client.get("k") == b"before"  # waited, then read back from the AOF
        waited = time.monotonic() - started
        assert client.incr("n") == 1
    restarted.join()
    assert DOWN_S - 0.5 < waited < DOWN_S + 10
    messages = [r.getMessage() for r in caplog.records]
    address = f"127.0.0.1:{aof_redis.port}"
    assert len(messages) == 2, messages  # one line per state change, not one per retry
    assert messages[0].startswith(f"Redis at {address} unreachable") and "waiting up to 60 s" in messages[0]
    assert messages[1].startswith(f"Redis at {address} back after ")


def test_a_command_gives_up_after_the_bound_and_a_probe_at_once(aof_redis: AofRedis) -> None:
    settings = _settings(aof_redis, redis_outage_timeout_s=1.5)
    client, probe = redis_client.connect(settings), redis_client.connect(settings, outage_timeout_s=0)
    client.ping()
    aof_redis.kill()
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        probe.ping()
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert 1.5 <= time.monotonic() - started < 5.0


def test_scripts_are_loaded_again_after_a_restart(aof_redis: AofRedis) -> None:
    """A restarted server has an empty script cache: redis-py's Script and mvlog's packed EVALSHA both
    load their script again (NOSCRIPT), on the command that waited for the server."""
    client = redis_client.connect(_settings(aof_redis))
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    assert script(keys=["a"]) == 1 and run_script(client, script, ["b"], []) == 1
    aof_redis.kill()
    aof_redis.restart_after(1.0)
    # A fresh key: the AOF is fsynced every second, so what the killed server held last may be gone.
    assert run_script(client, script, ["c"], []) == 1  # waited, NOSCRIPT, loaded, ran
    assert client.script_exists(script.sha) == [True]
    client.script_flush()
    before = int(client.get("a") or 0)
    assert script(keys=["a"]) == before + 1


def test_a_commit_retried_after_its_reply_was_lost_counts_as_applied(aof_redis: AofRedis) -> None:
    """The epoch's first attempt applied, its reply lost: the retry is refused at the MCE, and
    ``holds`` counts it as applied only at exactly that epoch."""
    store = ViewStore(redis_client.connect(_settings(aof_redis)), "p")
    commit = EpochCommit(epoch=5, row_puts={b"k": b"v"}, row_deletes=(), index={0: IndexEntry(5, 10, 1)}, follows=0)
    assert store.commit("v", commit)
    assert not store.commit("v", commit)  # the retry: refused at the MCE...
    assert store.holds("v", 5)  # ...and counted as applied
    assert not store.holds("v", 4)  # an older epoch's commit stays a refusal


def test_the_lag_sampler_goes_on_through_a_restart(aof_redis: AofRedis) -> None:
    settings = _settings(aof_redis, lag_sample_interval_ms=100)
    CatalogStore(settings, redis_client.connect(settings)).mark_rebuilt()  # a control plane (empty) is there
    sampler = LagSampler(settings).start()
    try:
        _wait(lambda: sampler.ticks >= 2, "the sampler to tick", 20)
        aof_redis.kill()
        aof_redis.restart_after(DOWN_S).join()
        ticks = sampler.ticks
        _wait(lambda: sampler.ticks >= ticks + 3, "the sampler to tick after the restart", 30)
        assert sampler._thread is not None and sampler._thread.is_alive()
    finally:
        sampler.stop()


# ---------------------------------------------------------------- a running pipeline against a restart


def _wait(condition: Callable[[], bool], what: str | Callable[[], str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for " + (
            what() if callable(what) else what)
        time.sleep(0.1)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_run_view_and_the_table_writer_ride_out_a_redis_restart(
        make_settings: Callable[..., Settings], aof_redis: AofRedis, tmp_path: Path,
        report: Callable[[str], None]) -> None:
    settings = make_settings(redis_url=aof_redis.url)
    client = redis_client.connect(settings)
    store = ViewStore(client, settings.topic_prefix)
    writer = Table.create(settings, "t1", {"id": "int", "v1": "int", "k": "string"}, ["id"], client=client)
    writer.upsert([{"id": i, "v1": i, "k": f"k{i % 3}"} for i in range(40)])
    writer.flush()
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE v1 > 0", client=client)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           **{name: value for name, value in settings.to_env().items()}}
    log_file = tmp_path / "run-view.log"
    stop_feeding = threading.Event()
    fed: list[int] = []

    def feed() -> None:  # upserts and deletes every 20 ms, through the outage (they queue in the writer)
        rng = random.Random(21)
        while not stop_feeding.wait(0.02):
            key = rng.randrange(60)
            if rng.random() < 0.2:
                writer.delete([key])
            else:
                writer.upsert([{"id": key, "v1": rng.randrange(-5, 100), "k": f"k{key % 3}"}])
            fed.append(key)

    with log_file.open("wb") as sink:
        process = subprocess.Popen([*MVLOG, "run-view", "mv1", "--progress-interval", "1"], env=env,
                                   stdout=sink, stderr=subprocess.STDOUT)
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        def alive() -> None:
            assert process.poll() is None, f"run-view exited with {process.returncode}:\n{log_file.read_text()}"

        def past(epoch: int) -> Callable[[], bool]:
            def check() -> bool:
                alive()
                return (store.mce("mv1") or 0) >= epoch
            return check

        first = store.mce("t1") or 0  # the writer commits an epoch every 200 ms: mv1 follows, never equals
        _wait(past(first), lambda: f"mv1 to follow t1:\n{log_file.read_text()}", 120)
        feeder.start()
        _wait(lambda: len(fed) > 50, "the feeder", 30)
        before = store.mce("t1") or 0
        aof_redis.kill()
        killed = time.monotonic()
        aof_redis.restart_after(DOWN_S).join()
        _wait(lambda: (store.mce("t1") or 0) > before + 3, "t1 to commit epochs after the restart", 60)
        alive()
        stop_feeding.set()
        feeder.join()
        writer.flush()  # raises if the writer's epoch loop had stopped
        writer.close()  # no epoch after this one
        assert writer.loop_error is None
        last = store.mce("t1") or 0
        _wait(past(last),
              lambda: f"mv1 to reach t1's last epoch {last} (at {store.mce('mv1')}):\n{log_file.read_text()}", 120)
        recovered = time.monotonic() - killed
        alive()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log_file.read_text()
    finally:
        stop_feeding.set()
        if process.poll() is None:
            process.kill()
            process.wait()
        writer.close()
    output = log_file.read_text()
    assert f"mv1: stopped at epoch {last}" in output
    assert f"Redis at 127.0.0.1:{aof_redis.port} unreachable" in output and "back after" in output, output
    assert "Traceback" not in output, output
    table = check_table_exactly_once(settings, client, "t1")
    assert table["mce"] == last
    checked = check_views(settings, client, "t1", ["mv1"])
    report(f"redis down {DOWN_S:.0f} s; mv1 at t1's last epoch {recovered:.1f} s after the kill; "
           f"{table['committed']} table epochs, {checked} view epochs checked by the oracle")
