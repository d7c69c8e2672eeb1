"""The local stack really starts Apache Kafka and redis-server, serves Kafka transactions, and fails clearly."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from mvlog.config import Settings
from mvlog.infra import local_stack
from mvlog.infra.child_processes import pid_alive
from mvlog.infra.local_stack import (
    BinaryNotFoundError,
    LocalStack,
    PortInUseError,
    ProcessDiedError,
    StackError,
    free_ports,
    kafka_answers,
    redis_answers,
)

pytestmark = pytest.mark.integration

# The console script installed next to this interpreter (what a user runs), else the module.
_SCRIPT = Path(sys.executable).with_name("mvlog")
MVLOG = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "mvlog.services.cli"]


def _create_topic(settings: Settings, topic: str, partitions: int) -> None:
    admin = AdminClient(settings.kafka_client_config())
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(timeout=30)


def _read(settings: Settings, topic: str, partition: int, seconds: float) -> list[bytes | None]:
    """What a read_committed consumer gets from ``partition`` within ``seconds`` (assign(): no group)."""
    consumer = Consumer({**settings.kafka_client_config(), "group.id": f"{settings.topic_prefix}-reader",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "session.timeout.ms": settings.session_timeout_ms})
    values: list[bytes | None] = []
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def _transactional_producer(settings: Settings, name: str) -> Producer:
    producer = Producer({**settings.kafka_client_config(),
                         "transactional.id": f"{settings.topic_prefix}-{name}"})
    producer.init_transactions(30)
    return producer


def test_committed_records_are_read_and_open_transactions_are_not(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.smoke"
    _create_topic(settings, topic, settings.partitions)
    producer = _transactional_producer(settings, "smoke")
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"committed", partition=1)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"open", partition=1)
    producer.flush(30)

    assert _read(settings, topic, 1, seconds=3) == [b"committed"]

    producer.commit_transaction(30)
    assert _read(settings, topic, 1, seconds=3) == [b"committed", b"open"]


def test_read_committed_skips_aborted_records(settings: Settings) -> None:
    # Apache Kafka filters aborted transactions out of read_committed fetches (Tansu 0.6, the broker
    # before it, did not, which is why the cache worker's chain rule once served every reader).
    topic = f"{settings.topic_prefix}.aborts"
    _create_topic(settings, topic, 1)
    producer = _transactional_producer(settings, "aborts")
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed", partition=0)
    producer.commit_transaction(30)
    assert _read(settings, topic, 0, seconds=3) == [b"committed"]


def test_redis_answers_ping(redis_client: redis.Redis) -> None:
    assert redis_client.ping() is True


def test_settings_are_isolated_per_test(settings: Settings, make_settings) -> None:
    assert settings.topic_prefix.startswith("t") and len(settings.topic_prefix) == 9
    assert settings.partitions == 3 and settings.barrier_interval_ms == 200
    assert make_settings(partitions=5).topic_prefix == settings.topic_prefix


def test_stack_status_reports_both_processes_healthy(stack) -> None:
    if stack.local is None:
        pytest.skip("only the local stack has processes to inspect")
    statuses = stack.local.status()
    assert [s.name for s in statuses] == ["kafka", "redis"]
    assert all(s.running and s.healthy and s.pid for s in statuses)


def test_a_taken_port_is_named_with_its_owner(tmp_path: Path) -> None:
    kafka_port, redis_port = free_ports(2)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", redis_port))
        squatter.listen()
        stack = LocalStack(tmp_path / "s", kafka_port=kafka_port, redis_port=redis_port, die_with_parent=True)
        with pytest.raises(PortInUseError) as caught:
            stack.start()
    message = str(caught.value)
    assert f"port {redis_port}" in message
    assert f"pid {os.getpid()}" in message
    assert not kafka_answers(f"127.0.0.1:{kafka_port}", 1.0), "nothing may be left running"
    assert not (tmp_path / "s" / "kafka.pid").exists()


def test_a_missing_redis_server_says_how_to_install_it(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(local_stack.REDIS_BIN_ENV, raising=False)
    with pytest.raises(BinaryNotFoundError, match=r"apt-get install -y redis-server"):
        kafka_port, redis_port = free_ports(2)
        LocalStack(tmp_path / "s", kafka_port=kafka_port, redis_port=redis_port, die_with_parent=True).start()


def test_a_missing_java_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(local_stack.REDIS_BIN_ENV, str(local_stack.find_redis_server()))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    kafka_port, redis_port = free_ports(2)
    stack = LocalStack(tmp_path / "s", kafka_port=kafka_port, redis_port=redis_port, die_with_parent=True)
    with pytest.raises(BinaryNotFoundError, match=r"needs a Java runtime >= 17.*apt-get install -y openjdk-17"):
        stack.start()
    assert not stack.is_running() and not redis_answers("127.0.0.1", redis_port, 0.5)


def test_unresolved_kafka_jars_without_maven_say_how_to_install_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    java = shutil.which("java")
    assert java is not None
    bin_dir = tmp_path / "bin"  # java alone on PATH: no mvn
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(Path(java).resolve())
    monkeypatch.setenv(local_stack.REDIS_BIN_ENV, str(local_stack.find_redis_server()))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("MVLOG_KAFKA_HOME", str(tmp_path / "no-jars-here"))
    kafka_port, redis_port = free_ports(2)
    stack = LocalStack(tmp_path / "s", kafka_port=kafka_port, redis_port=redis_port, die_with_parent=True)
    with pytest.raises(BinaryNotFoundError, match=r"Maven is missing.*apt-get install -y maven"):
        stack.start()
    assert not stack.is_running()


def test_a_process_that_dies_at_start_shows_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'FATAL: cannot open the config (simulated)'\nexit 3\n")
    fake.chmod(0o755)
    kafka_port, redis_port = free_ports(2)
    stack = LocalStack(tmp_path / "s", kafka_port=kafka_port, redis_port=redis_port, redis_bin=fake,
                       die_with_parent=True)
    with pytest.raises(ProcessDiedError) as caught:
        stack.start()
    assert "exited with code 3" in str(caught.value)
    assert "cannot open the config (simulated)" in str(caught.value)
    # The broker that had started already is stopped again.
    assert not kafka_answers(f"127.0.0.1:{kafka_port}", 1.0)
    assert not stack.is_running()


def test_start_refuses_a_second_stack_in_the_same_folder(tmp_path: Path) -> None:
    ports = free_ports(4)
    second = LocalStack(tmp_path / "s", kafka_port=ports[2], redis_port=ports[3], die_with_parent=True)
    with LocalStack(tmp_path / "s", kafka_port=ports[0], redis_port=ports[1], die_with_parent=True) as first:
        with pytest.raises(StackError, match="already running"):
            second.start()
        assert not kafka_answers(f"127.0.0.1:{ports[2]}", 0.5), "the second stack started a broker"
        assert first.is_running()
    assert not first.is_running()


def _cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MVLOG, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_mvlog_up_and_down_start_and_stop_both_processes(tmp_path: Path) -> None:
    kafka_port, redis_port = free_ports(2)
    env = {**os.environ, "MVLOG_STACK_DIR": str(tmp_path / "stack")}
    up = _cli("up", "--kafka-port", str(kafka_port), "--redis-port", str(redis_port), env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert f"export MVLOG_BOOTSTRAP_SERVERS=127.0.0.1:{kafka_port}" in up.stdout
        assert f"export MVLOG_REDIS_URL=redis://127.0.0.1:{redis_port}/0" in up.stdout
        # `mvlog up` has exited; the processes it started keep running on their own.
        assert kafka_answers(f"127.0.0.1:{kafka_port}", 5.0)
        assert redis_answers("127.0.0.1", redis_port, 5.0)
        pids = [int((tmp_path / "stack" / f"{n}.pid").read_text()) for n in ("kafka", "redis")]

        again = _cli("up", env=env)  # idempotent: reports the running stack
        assert again.returncode == 0 and "already running" in again.stderr, again.stderr
        assert f"127.0.0.1:{kafka_port}" in again.stdout

        status = _cli("stack-status", env=env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("healthy") == 2
    finally:
        down = _cli("down", env=env)
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout
    for pid in pids:
        assert not pid_alive(pid)
    assert not kafka_answers(f"127.0.0.1:{kafka_port}", 1.0)
    assert not redis_answers("127.0.0.1", redis_port, 1.0)
    status = _cli("stack-status", env=env)
    assert status.returncode == 1
    assert "nothing to stop" in _cli("down", env=env).stdout


def test_mvlog_up_shows_a_clean_error_without_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "MVLOG_STACK_DIR": str(tmp_path / "stack"), "PATH": str(tmp_path / "empty")}
    env.pop(local_stack.REDIS_BIN_ENV, None)
    kafka_port, redis_port = free_ports(2)
    result = _cli("up", "--kafka-port", str(kafka_port), "--redis-port", str(redis_port), env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: redis-server was not found"), result.stderr
    assert "Traceback" not in result.stderr
    assert not kafka_answers(f"127.0.0.1:{kafka_port}", 1.0)


def test_mvlog_up_with_half_a_stack_starts_the_missing_half_and_keeps_the_data(tmp_path: Path) -> None:
    """Redis died while the broker runs: `mvlog up` starts Redis again (from its append-only file) and
    leaves the broker alone; nothing is deleted (before, it stopped the broker and started both empty)."""
    kafka_port, redis_port = free_ports(2)
    env = {**os.environ, "MVLOG_STACK_DIR": str(tmp_path / "stack")}
    up = _cli("up", "--kafka-port", str(kafka_port), "--redis-port", str(redis_port), env=env)
    try:
        assert up.returncode == 0, up.stderr
        settings = LocalStack.load(tmp_path / "stack").settings(topic_prefix="half")  # type: ignore[union-attr]
        topic = "half.kept"
        _create_topic(settings, topic, 1)
        producer = _transactional_producer(settings, "half")
        producer.begin_transaction()
        producer.produce(topic, value=b"kept", partition=0)
        producer.commit_transaction(30)
        redis.Redis(port=redis_port).set("half:key", b"kept")
        kafka_pid = int((tmp_path / "stack" / "kafka.pid").read_text())

        LocalStack.load(tmp_path / "stack").kill("redis")  # type: ignore[union-attr]
        again = _cli("up", env=env)
        assert again.returncode == 0, again.stderr
        assert "Kept kafka running; started redis" in again.stderr
        assert int((tmp_path / "stack" / "kafka.pid").read_text()) == kafka_pid
        assert pid_alive(kafka_pid)
        assert redis.Redis(port=redis_port).get("half:key") == b"kept"
        assert _read(settings, topic, 0, seconds=3) == [b"kept"]
    finally:
        down = _cli("down", "--purge", env=env)
    assert down.returncode == 0, down.stderr
    assert "Deleted" in down.stdout and "every table's, view's and catalog topic" in down.stdout
    assert not (tmp_path / "stack" / "kafka").exists() and not (tmp_path / "stack" / "redis").exists()
