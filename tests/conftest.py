"""Shared fixtures: a real broker and Redis for the integration tests.

Fixtures
--------
``stack`` (session)
    The running broker and Redis, as a :class:`StackEndpoints` (``bootstrap_servers``, ``redis_url``,
    ``kind``, and ``local``: the :class:`~mvlog.infra.local_stack.LocalStack` when it is the local
    one, for tests that stop or inspect the processes). With ``--stack=local`` (the default) it starts
    Apache Kafka (KRaft) + redis-server on free loopback ports in a temporary folder and stops them when
    the session ends; with ``--stack=docker`` it brings up Apache Kafka and Redis from ``infra/docker-compose.yml``
    through pytest-docker and waits until both answer. One stack serves the whole session.
``settings`` (function)
    :class:`mvlog.config.Settings` pointing at ``stack``, with a unique ``topic_prefix`` per test
    (``t`` + 8 hex digits), ``barrier_interval_ms=200``, ``partitions=3`` and a private ``stack_dir``.
    Tests share one broker and one Redis, so everything a test creates must be named from the prefix:
    Kafka topics (``settings.changelog_topic(view)`` etc.), consumer groups, transactional ids, and
    Redis keys (every mvlog Redis key starts with ``settings.topic_prefix``).
``redis_client`` (function)
    ``redis.Redis`` on the stack's Redis (bytes replies; with ``--redis-cluster``, mvlog's cluster client).
    Never FLUSHDB/FLUSHALL: other tests share the
    database. At teardown it deletes the keys that start with this test's ``topic_prefix``.
``own_redis`` (function)
    The URL of a redis-server of the test's own, without persistence, for tests that FLUSHALL it.
``redis_cluster`` (session)
    A Redis Cluster of three masters (``redis-server --cluster-enabled yes``, no replicas, joined by
    ``redis-cli --cluster create``) on free loopback ports in a temporary folder
    (:class:`~mvlog.infra.redis_cluster.LocalRedisCluster`), started on first use (about 2 s), ready once
    every master says ``cluster_state:ok``, stopped when the session ends.
    With ``--redis-cluster`` (or ``MVLOG_TEST_REDIS_CLUSTER=1``), ``settings``, ``make_settings`` and
    ``redis_client`` use it instead of the stack's redis-server, so any integration test can be run on it.
    Likewise ``--operators-in-tasks`` (``MVLOG_TEST_OPERATORS_IN_TASKS=1``) runs them with the views'
    operators in Spark's tasks where a view can take it (issue 19), and ``--spark-master``
    (``MVLOG_TEST_SPARK_MASTER``) on another master, e.g. ``local-cluster[2,1,1024]``.
``cluster_settings`` (function)
    ``settings`` on ``redis_cluster`` instead of the stack's Redis (``redis_cluster=True``); the broker is the
    stack's. ``cluster_client`` (function): mvlog's client of it (``connect``: redis-py's cluster client),
    deleting the test's keys at teardown.
``schema_registry`` (session)
    A real Schema Registry: Apicurio Registry (:mod:`mvlog.infra.schema_registry`, from Maven Central by
    ``make setup``) on a free port of 127.0.0.1, in-memory, started on first use and stopped when the session
    ends. ``schema_registry.url`` is its Confluent-compatible API (``.../apis/ccompat/v7``). Tests share it:
    name subjects from the test's ``topic_prefix``.
``make_settings`` (function)
    ``make_settings(**overrides)``: more :class:`Settings` on the same prefix (e.g. another view's
    process with other options).

Any test that uses ``stack`` (directly or through the fixtures above) is marked ``integration``
automatically, so ``pytest -m "not integration"`` runs the unit tests alone. ``MVLOG_*`` variables of
the caller's shell are dropped at start so a developer's exported settings never leak into tests.
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.redis_client import connect
from mvlog.infra.kafka_broker import DEFAULT_JVM_OPTIONS, KAFKA_JVM_ENV
from mvlog.infra.local_stack import LocalStack, find_redis_server, free_port, free_ports, kafka_answers, redis_answers
from mvlog.infra.redis_cluster import LocalRedisCluster
from mvlog.infra.schema_registry import RegistryServer
from mvlog.infra.spark_cds import driver_archive, java_options
from tests.cdc_fixtures import debezium, postgres  # noqa: F401  (the CDC pipeline's fixtures)

REPO_ROOT = Path(__file__).resolve().parent.parent
UNIT_TESTS = REPO_ROOT / "tests" / "unit"
COMPOSE_FILE = REPO_ROOT / "infra" / "docker-compose.yml"
STACK_FIXTURES = {"stack", "settings", "redis_client", "make_settings", "redis_cluster"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stack",
        choices=("local", "docker"),
        default=os.environ.get("MVLOG_TEST_STACK", "local"),
        help="broker + Redis for integration tests: 'local' starts Apache Kafka and redis-server as processes "
        "(default); 'docker' starts Apache Kafka and Redis from infra/docker-compose.yml (pytest-docker).",
    )
    parser.addoption(
        "--redis-cluster",
        action="store_true",
        default=os.environ.get("MVLOG_TEST_REDIS_CLUSTER", "") not in ("", "0"),
        help="run the tests of `settings` / `make_settings` / `redis_client` on the `redis_cluster` fixture (three "
        "masters) instead of the stack's redis-server; tests that make their own Redis client or server stay "
        "on a standalone one.",
    )
    parser.addoption(
        "--operators-in-tasks",
        action="store_true",
        default=os.environ.get("MVLOG_TEST_OPERATORS_IN_TASKS", "") not in ("", "0"),
        help="the settings of `settings` / `make_settings` turn on `operators_in_tasks` (issue 19): the views "
        "whose operators can run in Spark's tasks (filter/project keyed like their upstream, GROUP BY) do, in the "
        "oracle and exactly-once tests too.",
    )
    parser.addoption(
        "--spark-master",
        default=os.environ.get("MVLOG_TEST_SPARK_MASTER", ""),
        help="the `spark` fixture's master and the settings' `spark_master` (default: the settings' own, "
        "local[2]), e.g. 'local-cluster[2,1,1024]' for executors in their own JVMs and Python workers.",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name in [n for n in os.environ if n.startswith("MVLOG_") and not n.startswith("MVLOG_TEST_")]:
        del os.environ[name]
    os.environ[KAFKA_JVM_ENV] = os.environ.get("MVLOG_TEST_KAFKA_JVM_OPTS", BROKER_JVM_OPTIONS)
    # The Spark drivers' class archive, made once per machine (by xdist's controller, not each worker)
    # while the first tests run: drivers started before it exists start without it. A run of the unit
    # tests alone starts no driver and makes none.
    only_units = bool(config.args) and all(Path(a.split("::")[0]).resolve().is_relative_to(UNIT_TESTS)
                                           for a in config.args)
    if not hasattr(config, "workerinput") and not only_units:
        _ARCHIVE_BUILD.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _ARCHIVE_BUILD.is_alive():
        _ARCHIVE_BUILD.join(timeout=300)


#: The name under which a test records a result line for the CI log (see :func:`report`).
RESULT_PROPERTY = "result"


@pytest.fixture
def report(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """``report(line)``: a measured result (a ratio, a soak's summary) printed at the end of the run.

    The lines travel with the test's report, so they reach the log when pytest-xdist runs the test in a
    worker process, whose own output is not shown.
    """
    return lambda line: record_property(RESULT_PROPERTY, line)


class _TaskEpochCount(logging.Handler):
    """Counts the epochs views committed in Spark's tasks, per view (the ``epochs_in_tasks`` attribute,
    ``(view, epochs)``, of ``task_epochs``' debug record)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.epochs: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        counted = getattr(record, "epochs_in_tasks", None)
        if counted is not None:
            view, epochs = counted
            self.epochs[view] = self.epochs.get(view, 0) + epochs


@pytest.fixture(autouse=True)
def _own_stack_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's own record of the stacks ``mvlog up`` started (``$XDG_STATE_HOME/mvlog/stacks.json``):
    ``down`` and ``stack-status`` without a stack folder fall back to that record, and a test's must not
    find the stack another test runs meanwhile (nor the user's)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))


@pytest.fixture(autouse=True)
def _epochs_in_tasks(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ``--operators-in-tasks``: each test's result line says which views committed epochs in tasks, and
    how many (views of this process; a ``run-view`` child's are not counted), so a run shows the task path
    was taken, not only that the tests passed."""
    if not request.config.getoption("operators_in_tasks"):
        yield
        return
    logger = logging.getLogger("mvlog.services.pipeline.task_epochs")
    counter, level = _TaskEpochCount(), logger.level
    logger.addHandler(counter)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(counter)
        logger.setLevel(level)
        line = ", ".join(f"{view} {n}" for view, n in sorted(counter.epochs.items())) or "none"
        request.node.user_properties.append((RESULT_PROPERTY, f"epochs committed in tasks: {line}"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # A fixture's teardown records into the teardown report, which repeats the call's properties: both, once.
    lines = {(report.nodeid, value)
             for outcome in ("passed", "failed", "error", "")  # "": a passed teardown's report
             for report in terminalreporter.stats.get(outcome, [])
             if getattr(report, "when", None) in ("call", "teardown")
             for name, value in getattr(report, "user_properties", ()) if name == RESULT_PROPERTY}
    if lines:
        terminalreporter.section("results")
        for nodeid, value in sorted(lines):
            terminalreporter.write_line(f"{nodeid.rsplit('::', 1)[-1]}: {value}")


# The test files that take longest (CI's "slowest durations"), longest first. They are collected first, so
# pytest-xdist (``--dist loadfile --no-loadscope-reorder``) hands them out before everything else and the
# short files fill the gaps, instead of the long ones starting last and running on alone. The exactly-once
# test's two paths stay in one file, one after the other: split (session 26), they started together with
# the suite, each one's consumers started more slowly beside the other's, its workload wrote twice the
# epochs meanwhile, and each took twice as long (554 and 468 s against 245 and 245).
LONGEST_FIRST = tuple(f"tests/integration/{name}.py" for name in (
    "test_views_exactly_once", "test_log_cache", "test_soak", "test_operators_in_tasks_kills", "test_backfill",
    "test_log_cache_isolation", "test_operators_in_tasks",
    "test_replacement_crash", "test_source_tables", "test_demo", "test_durable_stack", "test_retention",
    "test_kafka_security", "test_nexmark", "test_operator_actions", "test_cdc_postgres", "test_redis_restart",
    "test_read_after_wipe", "test_rebuild_from_kafka", "test_snapshot", "test_replacement_join", "test_replacement",
))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if STACK_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


#: The JVM options of the tests' brokers (the session's, and those tests and their child processes start):
#: the JIT's first tier only. In a CI run the optimizing tier's compiler threads took as much of a broker's
#: CPU as its request handlers (C2 22 s, request handling 20 s after 7 minutes); brokers that live for
#: minutes under light load never repay that. ``MVLOG_TEST_KAFKA_JVM_OPTS`` replaces them.
BROKER_JVM_OPTIONS = f"{DEFAULT_JVM_OPTIONS} -XX:TieredStopAtLevel=1"

#: The JIT of the tests' Spark drivers. A test's driver lives for seconds to minutes and many tests
#: start one in a process of their own (the SIGKILL tests one per kill): the JIT's first tier only halves
#: a driver's start on two busy cores (49 s -> 22 s to the first query, load average 10), and the JVM
#: does little of mvlog's work. mvlog's own sessions keep the full JIT where the driver's JVM runs the
#: executors too (local mode: :data:`mvlog.services.spark.session.DRIVER_JAVA_OPTIONS`).
JIT_OPTIONS = "-XX:TieredStopAtLevel=1"


#: Makes the drivers' class archive (:func:`pytest_configure` starts it).
_ARCHIVE_BUILD = threading.Thread(target=driver_archive, args=(JIT_OPTIONS,), name="spark-cds", daemon=True)


def spark_conf_for_tests() -> dict[str, str]:
    """Spark settings of the tests' sessions: the JIT above, and the class archive of
    :mod:`mvlog.infra.spark_cds` once it exists (a quarter to a third off each start of a driver or a
    local cluster's executor)."""
    archive = driver_archive(JIT_OPTIONS, create=False)
    options = f"{JIT_OPTIONS} {java_options(archive)}".strip()
    # A local cluster's executors start with the driver's class path: the archive serves them too.
    return {"spark.driver.extraJavaOptions": options, "spark.executor.extraJavaOptions": options}


@dataclass(frozen=True)
class StackEndpoints:
    """Where the test stack answers."""

    kind: str  # "local" or "docker"
    bootstrap_servers: str
    redis_url: str
    local: LocalStack | None = None

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers, "redis_url": self.redis_url,
                                  "spark_conf": spark_conf_for_tests()}
        values.update(overrides)
        return Settings(**values)


# --------------------------------------------------------------------------- pytest-docker (--stack=docker)


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(COMPOSE_FILE)


@pytest.fixture(scope="session")
def docker_setup() -> list[str]:
    # The tests run Spark in local mode: the broker and Redis are all they need from the compose file.
    return ["up --wait kafka redis"]


@pytest.fixture(scope="session")
def docker_cleanup() -> list[str]:
    return ["down -v"]


# --------------------------------------------------------------------------------------------- the stack


@pytest.fixture(scope="session")
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StackEndpoints]:
    if request.config.getoption("--stack") == "docker":
        kafka_port, redis_port = free_ports(2)
        # infra/docker-compose.yml publishes (and advertises) these ports on 127.0.0.1.
        os.environ["MVLOG_KAFKA_PORT"], os.environ["MVLOG_REDIS_PORT"] = str(kafka_port), str(redis_port)
        try:
            services = request.getfixturevalue("docker_services")
        except Exception as error:
            pytest.fail(f"--stack=docker needs a running Docker engine with the compose plugin "
                        f"(`docker compose`); use --stack=local here. {error}", pytrace=False)
        bootstrap = f"127.0.0.1:{services.port_for('kafka', 9092)}"
        redis_port = services.port_for("redis", 6379)
        services.wait_until_responsive(lambda: kafka_answers(bootstrap, 2.0), timeout=120.0, pause=1.0)
        services.wait_until_responsive(lambda: redis_answers("127.0.0.1", redis_port, 2.0),
                                       timeout=60.0, pause=0.5)
        yield StackEndpoints("docker", bootstrap, f"redis://127.0.0.1:{redis_port}/0")
        return

    kafka_port, controller_port, redis_port = free_ports(3)
    local = LocalStack(
        data_dir=tmp_path_factory.mktemp("stack"),
        kafka_port=kafka_port,
        controller_port=controller_port,
        redis_port=redis_port,
        # Retention tests use small segments and retention.ms; the broker checks for them every second.
        broker_settings={"log.retention.check.interval.ms": "1000"},
        die_with_parent=True,  # a killed pytest leaves no broker behind
    )
    local.start()
    try:
        yield StackEndpoints("local", local.bootstrap_servers, local.redis_url, local)
    finally:
        gc.collect()  # release Kafka clients nobody holds while the broker still answers them
        local.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own, to FLUSHALL (the session's Redis is shared); its URL."""
    port = free_port()
    process = subprocess.Popen([str(find_redis_server()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not redis_answers("127.0.0.1", port, 0.5):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """Three Redis Cluster masters on loopback, for the session (started on first use)."""
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_settings(make_settings: Callable[..., Settings], redis_cluster: LocalRedisCluster) -> Settings:
    return make_settings(redis_url=redis_cluster.url, redis_cluster=True)


@pytest.fixture
def cluster_client(cluster_settings: Settings) -> Iterator[redis.Redis]:
    client = connect(cluster_settings, outage_timeout_s=10)
    try:
        yield client
    finally:
        keys = list(client.scan_iter(match=f"{cluster_settings.topic_prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])  # the cluster client deletes slot by slot
        client.close()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """Apicurio Registry's Confluent API on a free loopback port, for the session (started on first use)."""
    server = RegistryServer(tmp_path_factory.mktemp("schema-registry"), free_port()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def topic_prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_settings(stack: StackEndpoints, topic_prefix: str, tmp_path: Path,
                  request: pytest.FixtureRequest) -> Callable[..., Settings]:
    options = _option_overrides(request)

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "topic_prefix": topic_prefix,
            "barrier_interval_ms": 200,
            "partitions": 3,
            "stack_dir": tmp_path / "mvlog",
            **options,
        }
        values.update(overrides)
        return stack.settings(**values)

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def redis_client(settings: Settings) -> Iterator[redis.Redis]:
    client = (connect(settings, outage_timeout_s=10) if settings.redis_cluster
              else redis.Redis.from_url(settings.redis_url))
    try:
        yield client
    finally:
        keys = list(client.scan_iter(match=f"{settings.topic_prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()


def _option_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The settings ``--redis-cluster`` (the session's cluster instead of the stack's Redis),
    ``--operators-in-tasks`` and ``--spark-master`` set."""
    overrides: dict[str, Any] = {}
    if request.config.getoption("redis_cluster"):
        overrides.update(redis_url=request.getfixturevalue("redis_cluster").url, redis_cluster=True)
    if request.config.getoption("operators_in_tasks"):  # every epoch, however small (no driver-path shortcut)
        overrides.update(operators_in_tasks=True, tasks_min_records=0)
    if request.config.getoption("spark_master"):
        overrides["spark_master"] = request.config.getoption("spark_master")
    return overrides


def _shared_settings(request: pytest.FixtureRequest, stack: StackEndpoints) -> Settings:
    """The stack's settings, with the options above (on the session's Redis Cluster with ``--redis-cluster``)."""
    return stack.settings(**_option_overrides(request))


@pytest.fixture(scope="session")
def spark(stack: StackEndpoints, request: pytest.FixtureRequest) -> Iterator[Any]:
    """One Spark session in local mode for the whole test session, with ``format("mvlog")`` registered.

    The mvlog source is bound to the shared stack's settings; tests pass their own topic prefix (or
    whole settings) to it through its options, so one session serves all.
    """
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from mvlog.services.spark.session import spark_session

    session = spark_session(_shared_settings(request, stack))
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _mvlog_source_bound_to_the_shared_stack(request: pytest.FixtureRequest) -> None:
    """A test on the shared stack and ``spark`` gets ``format("mvlog")`` bound to that stack's settings.

    ``getOrCreate`` hands every caller in a process the same session, so an earlier test that made a
    session for a stack of its own (``spark_session(its settings)``) left its registration behind.
    """
    if "spark" in request.fixturenames and "stack" in request.fixturenames:
        from mvlog.services.spark.data_source import MvlogDataSource

        stack: StackEndpoints = request.getfixturevalue("stack")
        request.getfixturevalue("spark").dataSource.register(MvlogDataSource.for_settings(
            _shared_settings(request, stack)))
