"""``mvlog demo``: the canonical chain of views, maintained live on one laptop.

What it does, in order:

1. **The stack.** It reuses a broker and Redis that already answer at the configured addresses
   (``mvlog up`` on the default ports, or ``MVLOG_BOOTSTRAP_SERVERS`` / ``MVLOG_REDIS_URL``), or the
   stack recorded in ``stack_dir`` by ``mvlog up --kafka-port ...``; otherwise it starts Apache Kafka +
   redis-server in ``stack_dir`` (``.mvlog/``) on the default ports, or on free ports (and says so)
   when something else holds those. ``--no-stack`` never starts one.
2. **The definitions**, under a fresh topic prefix per run (``demo<timestamp>``, or ``--prefix``: an
   existing table or view of that prefix is reused): ``t1(id, v1, deleted)``, ``mv1`` (t1's rows not
   deleted), ``mv2`` (sum of v1 over mv1), ``mv3`` (count of v1 over mv1), ``t2(id, name)`` and the
   join ``mvj`` of mv1 and t2.
3. **The pipeline**: a Faust log-cache worker (``mvlog cache-worker``, a child process) caching the
   upstreams' recent epochs, one Spark session in local mode running a :class:`ViewConsumer` per view
   (reading the cache first, Kafka otherwise), and, once every view's query ran its first micro-batch,
   a workload thread writing inserts, updates and deletes into t1 and t2 (``--rate`` changes/s). 15 s
   into the workload (or at half ``--duration``) ``mv4`` is created online on the live mv1 with a chunked
   backfill, and maintained from then on.
4. **Progress**: the lag dashboard (web page, ``/metrics``, with the lag sampler) on 127.0.0.1
   (``--dashboard-port``; a free port when that one is taken), whose address is printed; and every
   ``--interval`` seconds a table of every table and view: state, MCE, lag in epochs behind its
   upstreams' MCE, rows, and the aggregates' values.
5. **Stopping** after ``--duration`` seconds or on SIGINT/SIGTERM (a second signal aborts): the workload
   stops, the views catch up with the last writes, the final contents are checked (mv1 against t1, mv2
   and mv3 against mv1, mvj against mv1 and t2, mv4 against mv1) and summarized (``--output json``: one JSON line on
   standard output), then the consumers, the tables and the stack (only when the demo started it) stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.cache_registry import CacheRegistry
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.source_status import SourceLagProbe
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.infra.child_processes import die_with_parent
from mvlog.infra.local_stack import (
    DEFAULT_KAFKA_PORT,
    DEFAULT_REDIS_PORT,
    LocalStack,
    free_port,
    kafka_answers,
    port_in_use,
    port_owner,
)
from mvlog.row_schema import Row
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.demo_workload import DebeziumTopic, Workload, cdc_topic
from mvlog.services.commands.output import age, cell_text, console, output_option
from mvlog.services.commands.read import read_rows
from mvlog.services.commands.run_view import _short, _StopOnSignal, _wait_between_triggers
from mvlog.services.commands.values import PORT_OR_ANY, SECONDS, count, seconds
from mvlog.services.dashboard.server import DashboardServer
from mvlog.services.sources.declare import create_source_table
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view
from mvlog.source_spec import SourceSpec

if TYPE_CHECKING:  # pyspark is imported when the demo runs
    from pyspark.sql.streaming.query import StreamingQuery

    from mvlog.services.pipeline.view_consumer import ViewConsumer

#: The root tables: name -> (columns, primary key). t1 is a source table fed by a Debezium-shaped topic
#: (:mod:`mvlog.services.commands.demo_workload`), t2 is written through the Table API.
SOURCE_TABLE = "t1"
TABLES: dict[str, tuple[dict[str, str], list[str]]] = {
    "t1": ({"id": "int", "v1": "int", "deleted": "boolean"}, ["id"]),
    "t2": ({"id": "int", "name": "string"}, ["id"]),
}
#: The views, in creation (dependency) order.
VIEWS: dict[str, str] = {
    "mv1": "SELECT * FROM t1 WHERE deleted = false",
    "mv2": "SELECT sum(v1) AS total FROM mv1",
    "mv3": "SELECT count(v1) AS n FROM mv1",
    "mvj": "SELECT a.id, a.v1, b.name FROM mv1 a JOIN t2 b ON a.id = b.id",
}
#: The view created online, with a chunked backfill, while the workload runs (MV-on-MV: over mv1).
ONLINE_VIEW = ("mv4", "SELECT id, v1 * 2 AS v2 FROM mv1 WHERE v1 >= 500")
#: Seconds into the workload when it is created (or half the --duration when that is shorter).
ONLINE_VIEW_AFTER_S = 15.0
#: What the progress table shows in its "value" column: view -> column of its single row.
AGGREGATES = {"mv2": "total", "mv3": "n"}

DRAIN_TIMEOUT_S = 120.0
RESTARTS = 3  # per view: how often the demo restarts a view whose query failed
FIRST_BATCH_TIMEOUT_S = 300.0  # the views' first micro-batches, before the workload starts


# ------------------------------------------------------------------------------------------- the stack


@dataclass
class _Stack:
    settings: Settings
    started: LocalStack | None  # the stack the demo started (and stops), None when it reuses one


def _answers(settings: Settings) -> bool:
    client = redis_client.connect(settings, outage_timeout_s=0, socket_connect_timeout=2.0, socket_timeout=2.0)
    try:
        client.ping()
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
    return kafka_answers(settings.bootstrap_servers.split(",")[0].strip(), 3.0)


def _explicit_addresses() -> bool:
    return bool(os.environ.get("MVLOG_BOOTSTRAP_SERVERS") or os.environ.get("MVLOG_REDIS_URL"))


def ensure_stack(settings: Settings, no_stack: bool) -> _Stack:
    """The broker and Redis the demo uses: reused when they answer, else a local stack it starts."""
    if no_stack or _answers(settings):
        if not no_stack:
            click.echo(f"Using the running stack: Kafka {settings.bootstrap_servers}, Redis "
                       f"{settings.redis_url}.", err=True)
        return _Stack(settings, None)
    recorded = LocalStack.load(settings.stack_dir)
    if recorded is not None and recorded.is_running():
        reused = settings.model_copy(update={"bootstrap_servers": recorded.bootstrap_servers,
                                             "redis_url": recorded.redis_url})
        if _answers(reused):
            click.echo(f"Using the local stack running from {recorded.data_dir} (mvlog up): Kafka "
                       f"{recorded.bootstrap_servers}, Redis {recorded.redis_url}.", err=True)
            return _Stack(reused, None)
    if _explicit_addresses():
        raise click.ClickException(
            f"nothing answers at MVLOG_BOOTSTRAP_SERVERS={settings.bootstrap_servers} / MVLOG_REDIS_URL="
            f"{settings.redis_url}; start that stack, or unset both to let the demo start a local one")
    stack = LocalStack.from_settings(settings)
    for attribute, what, default in (("kafka_port", "Kafka", DEFAULT_KAFKA_PORT),
                                     ("redis_port", "Redis", DEFAULT_REDIS_PORT)):
        port = getattr(stack, attribute)
        if port_in_use(stack.host, port):
            chosen = free_port(stack.host)
            owner = port_owner(port) or "another process"
            click.echo(f"Port {port} (wanted for {what}) is taken by {owner}: using free port {chosen} "
                       f"instead{'' if port == default else f' (default {default})'}.", err=True)
            setattr(stack, attribute, chosen)
    click.echo(f"Starting the local stack in {stack.data_dir} (Apache Kafka on {stack.bootstrap_servers}, "
               f"redis-server on {stack.redis_url})...", err=True)
    stack.start()
    click.echo("Local stack started; the demo stops it when it ends.", err=True)
    return _Stack(settings.model_copy(update={"bootstrap_servers": stack.bootstrap_servers,
                                              "redis_url": stack.redis_url}), stack)


# ----------------------------------------------------------------------------------------- definitions


def create_definitions(settings: Settings, client: redis.Redis) -> None:
    """The tables and views of the demo, each created unless it exists already (idempotent): t1 over its
    Debezium topic (created first, as a connector would), t2 a table of its own."""
    catalog = CatalogStore(settings, client)
    for name, (columns, key) in TABLES.items():
        existing = catalog.find(name)
        if name == SOURCE_TABLE:
            if existing is None:
                topic = cdc_topic(settings, name)
                ensure_topic(settings, topic, settings.partitions)
                create_source_table(settings, name, columns, key, topic, "debezium-json", client=client)
            elif SourceSpec.from_options(existing.options) is None:
                raise click.ClickException(f"prefix {settings.topic_prefix!r} holds a {name} written through the "
                                           "Table API (an earlier demo); run the demo under a new --prefix")
        elif existing is None:
            Table.create(settings, name, columns, key, client=client, exist_ok=True, auto_commit=False).close()
    for name, sql in VIEWS.items():
        if catalog.find(name) is None:
            create_view(settings, name, sql, client=client)


# -------------------------------------------------------------------------------------------- progress


def _visible(entry: CatalogEntry, row: Row) -> dict[str, Any]:
    return {name: row.get(name) for name in entry.schema.visible_names}


def snapshot(settings: Settings, client: redis.Redis) -> list[dict[str, Any]]:
    """One record per table and view: state, MCE, lag (epochs) behind its upstreams, rows, value."""
    catalog = CatalogStore(settings, client)
    store = ViewStore(client, settings.topic_prefix)
    index = EpochIndex(client, settings.topic_prefix)
    names = [*TABLES, *VIEWS]
    if catalog.find(ONLINE_VIEW[0]) is not None:
        names.append(ONLINE_VIEW[0])
    entries = {name: catalog.get(name) for name in names}
    mces = store.mce_many(names)
    records = []
    for name in names:
        entry, meta = entries[name], store.meta(name)
        mce = mces[name]
        lag: int | None = None
        if entry.kind == "view":
            lag = 0
            for source in entry.sources:
                upstream = mces.get(source)
                if upstream is not None and upstream > (mce or 0):
                    lag = max(lag, len(index.between(source, 0, mce or 0, upstream)))
        value: Any = None
        if name in AGGREGATES:
            rows = read_rows(store, entry, None)[1]
            value = rows[0].get(AGGREGATES[name]) if rows else None
        records.append({"name": name, "kind": entry.kind, "sources": list(entry.sources),
                        "state": meta.get("state"), "reason": meta.get("reason") or None, "mce": mce,
                        "mce_ts_ms": int(meta["mce_ts_ms"]) if meta.get("mce_ts_ms") else None,
                        "lag_epochs": lag, "rows": store.row_count(name),
                        "value": {AGGREGATES[name]: value} if name in AGGREGATES else None})
    return records


def print_progress(records: list[dict[str, Any]], title: str) -> None:
    from rich.table import Table as RichTable

    now_ms = int(time.time() * 1000)
    table = RichTable(title=title, title_justify="left")
    for column in ("view", "kind", "state", "MCE", "committed", "lag", "rows", "value"):
        table.add_column(column, justify="right" if column in ("MCE", "lag", "rows") else "left", no_wrap=True)
    for r in records:
        state = (r["state"] or "-") + (f" ({r['reason']})" if r["reason"] else "")
        value = ", ".join(f"{k}={cell_text(v)}" for k, v in r["value"].items()) if r["value"] else ""
        table.add_row(r["name"], r["kind"], state, str(r["mce"]) if r["mce"] is not None else "-",
                      age(r["mce_ts_ms"], now_ms) or "-", "-" if r["lag_epochs"] is None else str(r["lag_epochs"]),
                      str(r["rows"]), value)
    console().print(table)


# ------------------------------------------------------------------------------------------ final check


def check_contents(settings: Settings, client: redis.Redis,
                   database: dict[Any, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Each view's rows against its upstreams' rows, as read from the serving state (views at rest)."""
    catalog = CatalogStore(settings, client)
    store = ViewStore(client, settings.topic_prefix)
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in [*TABLES, *VIEWS, ONLINE_VIEW[0]]:
        entry = catalog.find(name)
        if entry is not None:
            rows[name] = [_visible(entry, row) for row in read_rows(store, entry, None)[1]]
    t1 = {r["id"]: r for r in rows["t1"]}
    t2 = {r["id"]: r for r in rows["t2"]}
    mv1 = {r["id"]: r for r in rows["mv1"]}
    expected_mv1 = {k: r for k, r in t1.items() if r["deleted"] is False}
    v1s = [r["v1"] for r in mv1.values()]
    total = rows["mv2"][0]["total"] if rows["mv2"] else None
    n = rows["mv3"][0]["n"] if rows["mv3"] else None
    expected_join = sorted((k, r["v1"], t2[k]["name"]) for k, r in mv1.items() if k in t2)
    join = sorted((r["id"], r["v1"], r["name"]) for r in rows["mvj"])
    checks = {}
    if database is not None:  # what the "database" holds, which its Debezium topic carried into t1
        checks["t1 = the database's rows (its Debezium topic, ingested)"] = t1 == database
    checks |= {
        "mv1 = t1 rows not deleted": mv1 == expected_mv1,
        "mv2.total = sum(v1) over mv1": (total or 0) == sum(v1s) and (total is None) == (not v1s),
        "mv3.n = count(v1) over mv1": (n or 0) == len(v1s),
        "mvj = mv1 join t2 on id": join == expected_join,
    }
    if ONLINE_VIEW[0] in rows:  # created online, backfilled from mv1's rows while they changed
        online = sorted((r["id"], r["v2"]) for r in rows[ONLINE_VIEW[0]])
        checks[f"{ONLINE_VIEW[0]} = mv1 rows with v1 >= 500, v1 * 2"] = online == sorted(
            (k, r["v1"] * 2) for k, r in mv1.items() if r["v1"] >= 500)
    return {"t1_rows": len(t1), "t2_rows": len(t2), "mv1_rows": len(mv1), "mv1_sum_v1": sum(v1s),
            "mv1_count_v1": len(v1s), "mv2_total": total, "mv3_n": n, "mvj_rows": len(join),
            "checks": checks, "consistent": all(checks.values())}


# ------------------------------------------------------------------------------------------ companions


def start_dashboard(settings: Settings, port: int | None) -> DashboardServer:
    """The lag dashboard and its lag sampler, on ``port`` (settings' dashboard_port), else a free port."""
    wanted = settings.dashboard_port if port is None else port
    try:
        return DashboardServer(settings, port=wanted).start()
    except OSError as error:
        server = DashboardServer(settings, port=0).start()
        click.echo(f"Port {wanted} (wanted for the dashboard) is not free ({error.strerror or error}): using "
                   f"{server.port} instead.", err=True)
        return server


@dataclass
class ChildProcess:
    """An mvlog command the demo runs beside itself as a child process, logging to the stack dir."""

    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, settings: Settings, args: list[str], log_name: str) -> ChildProcess:
        log_path = Path(settings.stack_dir) / f"{log_name}-{settings.topic_prefix}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")}, **settings.to_env()}
        with log_path.open("ab") as log:
            # A session of its own: the terminal's Ctrl-C reaches the demo, which stops its children in
            # order (the source after its last epoch is awaited), and they end with the demo if it is killed.
            process = subprocess.Popen([sys.executable, "-m", "mvlog.services.cli", *args], env=env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       preexec_fn=die_with_parent())
        return cls(process, log_path)

    def failure(self) -> str | None:
        """Why the process is gone (its exit code and the log's last line), None while it runs."""
        code = self.process.poll()
        if code is None:
            return None
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return f"exit {code}" + (f": {lines[-1]}" if lines else "")

    def stop(self) -> None:
        """SIGTERM (a source ingester commits what it read), SIGKILL after 20 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_companions(settings: Settings, dashboard_port: int | None) -> list[Callable[[], None]]:
    """Services that run beside the pipeline for the whole demo; returns their stops (called in reverse):
    the Faust log-cache worker (the views' consumers read recent epochs from it, Kafka otherwise) and
    the lag dashboard with its sampler."""
    port = free_port() if port_in_use(settings.bind_host, settings.cache_port) else settings.cache_port
    worker = ChildProcess.start(settings, ["cache-worker", "--port", str(port)], "cache-worker")
    click.echo(f"Log-cache worker (Faust): http://{settings.bind_host}:{port}/  (log: {worker.log_path})", err=True)
    dashboard = start_dashboard(settings, dashboard_port)
    click.echo(f"Lag dashboard: {dashboard.url}  (Prometheus: {dashboard.url}metrics)", err=True)
    return [worker.stop, dashboard.stop]


# ---------------------------------------------------------------------------------------------- command


def current_rows(settings: Settings, client: redis.Redis, name: str) -> list[dict[str, Any]]:
    """The visible rows ``name`` serves now (a demo reusing its prefix starts from them)."""
    entry = CatalogStore(settings, client).get(name)
    return [_visible(entry, row) for row in read_rows(ViewStore(client, settings.topic_prefix), entry, None)[1]]


def _wait_ingested(settings: Settings, client: redis.Redis, source: ChildProcess, timeout: float) -> int:
    """Until the source table's ingester committed its topic's end; returns an epoch of the table at or
    after the one that did. The committed offsets are in Kafka once that epoch's transaction commits, a
    moment before its MCE reaches Redis, so the epoch is the first MCE after the one seen then."""
    entry = CatalogStore(settings, client).get(SOURCE_TABLE)
    store = ViewStore(client, settings.topic_prefix)
    probe = SourceLagProbe(settings)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if (gone := source.failure()) is not None:
                raise click.ClickException(f"mvlog run-source {SOURCE_TABLE} stopped ({gone}); see {source.log_path}")
            lags = probe.measure([entry])
            if lags and lags[0].records == 0:
                break
            if time.monotonic() > deadline:
                raise click.ClickException(f"{SOURCE_TABLE} did not ingest its topic within {timeout:.0f} s "
                                           f"(lag: {lags[0].records if lags else '?'} records); see {source.log_path}")
            time.sleep(0.2)
        seen = store.mce(SOURCE_TABLE) or 0
        while (mce := store.mce(SOURCE_TABLE) or 0) <= seen:  # the source cuts an epoch every interval
            if time.monotonic() > deadline or source.failure() is not None:
                raise click.ClickException(f"{SOURCE_TABLE} committed no epoch after ingesting its topic")
            time.sleep(0.05)
        return mce
    finally:
        probe.close()


def _wait_caught_up(consumers: list[ViewConsumer], targets: dict[str, int], timeout: float) -> bool:
    """Wait until every view's MCE reached its target epoch (False on timeout or a failed query)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(c.mce >= targets[c.entry.name] for c in consumers):
            return True
        if any(c.failure() is not None for c in consumers):
            return False
        time.sleep(0.2)
    return False


def _wait_running(settings: Settings, spark: Any, client: Any, consumers: list[ViewConsumer],
                  queries: list[StreamingQuery], restarts: dict[str, int], stop: threading.Event,
                  timeout: float) -> str | None:
    """Wait until every view's streaming query ran its first micro-batch (its Python workers are up), so
    that the timed workload meets running views: on a loaded laptop Spark's first batches take tens of
    seconds. A failed query is restarted as later on; the failure once a view is out of restarts or
    ``timeout`` passed."""
    click.echo("Waiting for the views' first micro-batches...", err=True)
    started = time.monotonic()
    while not stop.is_set():
        if (failure := _restart_failed(settings, spark, client, consumers, queries, restarts)) is not None:
            return failure
        if all(q.lastProgress is not None for q in queries):
            click.echo(f"The views run (after {time.monotonic() - started:.0f} s).", err=True)
            return None
        if time.monotonic() - started > timeout:
            waiting = [c.entry.name for c, q in zip(consumers, queries, strict=True) if q.lastProgress is None]
            return f"views {', '.join(waiting)} ran no micro-batch within {timeout:g} s"
        stop.wait(0.2)
    return None


def _view_consumer(settings: Settings, name: str, spark: Any, client: Any) -> ViewConsumer:
    """The consumer of view ``name``, configured as the demo runs each of its views (not started)."""
    from mvlog.services.pipeline.view_consumer import ViewConsumer

    return ViewConsumer(settings, name, spark=spark, client=client, trigger_interval="500 milliseconds")


def _restart_failed(settings: Settings, spark: Any, client: Any, consumers: list[ViewConsumer],
                    queries: list[StreamingQuery], restarts: dict[str, int]) -> str | None:
    """Restart a view whose query failed, as a supervisor would, up to :data:`RESTARTS` times per view;
    the failure once a view is out of restarts.

    A restart is safe at any point: the consumer carries on from its MCE (epochs are applied once). It
    is what keeps the demo going through a transient error, such as a Spark Python worker that did not
    connect back in time on an overloaded machine.
    """
    for i, consumer in enumerate(consumers):
        if (error := consumer.failure()) is None:
            continue
        name = consumer.entry.name
        if restarts.get(name, 0) >= RESTARTS:
            return _failed_query([consumer])
        restarts[name] = restarts.get(name, 0) + 1
        click.echo(f"view {name} failed ({_short(error)}); restarting it ({restarts[name]}/{RESTARTS})", err=True)
        with contextlib.suppress(Exception):  # a failed query raises its error again on stop
            consumer.stop()
        consumers[i] = _view_consumer(settings, name, spark, client)
        queries[i] = consumers[i].start()
    return None


def _failed_query(consumers: list[ViewConsumer]) -> str | None:
    for consumer in consumers:
        if (error := consumer.failure()) is None:
            continue
        reason = _short(error)
        consumer.store.set_lifecycle(consumer.entry.name, Lifecycle.FAILED, reason)
        return f"view {consumer.entry.name} failed: {reason}"
    return None


@click.command("demo")
@click.option("--duration", type=SECONDS, default=None,
              help="Seconds to run the workload (default: until Ctrl-C / SIGTERM).")
@click.option("--interval", type=seconds(0.2), default=2.0, show_default=True,
              help="Seconds between progress tables.")
@click.option("--rate", type=count(1, "changes per second", 1_000_000), default=300, show_default=True,
              help="Changes per second the workload writes into t1 and t2.")
@click.option("--prefix", default=None,
              help="Topic prefix of the demo's tables and views (default: demo<timestamp>, fresh per run; "
                   "an existing prefix is reused).")
@click.option("--no-stack", is_flag=True,
              help="Never start a local stack: use the broker and Redis of the settings as they are.")
@click.option("--dashboard-port", type=PORT_OR_ANY, default=None,
              help="Port of the lag dashboard on 127.0.0.1 (default: settings' dashboard_port, 8321; 0: any).")
@output_option
@pass_settings
def demo(settings: Settings, duration: float | None, interval: float, rate: int, prefix: str | None,
         no_stack: bool, dashboard_port: int | None, output: str) -> None:
    """Run the canonical chain of views live on one laptop: t1 -> mv1 -> mv2, mv3 and mv1 JOIN t2 -> mvj.

    Starts (or reuses) the local stack, creates the tables and views under a fresh prefix, runs their
    Spark consumers in local mode and a workload writing into t1 and t2, and prints a progress table
    every --interval seconds until --duration elapses or Ctrl-C. At the end the views catch up, their
    contents are checked against their upstreams, and a summary is printed (--output json: one line).
    """
    # A fresh prefix per run: the broker keeps topics in memory, a re-run never meets the last one's.
    topic_prefix = prefix or f"demo{time.strftime('%Y%m%d%H%M%S')}"
    Settings(**{**settings.model_dump(), "topic_prefix": topic_prefix})  # a bad --prefix: a clean error
    stack = ensure_stack(settings, no_stack)
    try:
        _run_demo(stack.settings.model_copy(update={"topic_prefix": topic_prefix}), duration, interval, rate,
                  dashboard_port, output)
    finally:
        if stack.started is not None:
            stack.started.stop()
            click.echo(f"Local stack in {stack.started.data_dir} stopped.", err=True)


def _run_demo(settings: Settings, duration: float | None, interval: float, rate: int,
              dashboard_port: int | None, output: str) -> None:
    client = connect_redis(settings)
    failure: str | None = None
    summary: dict[str, Any] = {}
    stops: list[Callable[[], None]] = []
    with backend_errors(settings):
        require_kafka(settings)
        create_definitions(settings, client)
        click.echo(f"Tables {', '.join(TABLES)} and views {', '.join(VIEWS)} ready under prefix "
                   f"{settings.topic_prefix!r}:", err=True)
        for name, sql in VIEWS.items():
            click.echo(f"  {name} = {sql}", err=True)
        click.echo("Starting Spark (local mode) and the views' consumers...", err=True)
        from mvlog.services.spark.session import spark_session

        spark = spark_session(settings, app_name=f"mvlog-demo-{settings.topic_prefix}")
        consumers: list[ViewConsumer] = []
        queries: list[StreamingQuery] = []
        tables: list[Table] = []
        workload: Workload | None = None
        source: ChildProcess | None = None
        restarts: dict[str, int] = {}
        try:
            with _StopOnSignal() as stop:
                stops = start_companions(settings, dashboard_port)
                for name in VIEWS:
                    if stop.requested.is_set():
                        break
                    consumer = _view_consumer(settings, name, spark, client)
                    consumers.append(consumer)
                    queries.append(consumer.start())
                failure = _wait_running(settings, spark, client, consumers, queries, restarts, stop.requested,
                                        timeout=FIRST_BATCH_TIMEOUT_S)
                source = ChildProcess.start(settings, ["run-source", SOURCE_TABLE], "run-source")
                stops.append(source.stop)
                tables = [Table.open(settings, name) for name in TABLES if name != SOURCE_TABLE]
                database = DebeziumTopic(settings, SOURCE_TABLE, "id", rows=current_rows(settings, client,
                                                                                         SOURCE_TABLE))
                workload = Workload(database, tables[0], rate, seed=time.time_ns())
                if failure is None and not stop.requested.is_set():
                    workload.start()
                    until = "until Ctrl-C" if duration is None else f"for {duration:g} s"
                    click.echo(f"Workload: about {rate} inserts/updates/deletes per second, {until}: t1's as "
                               f"Debezium change events on topic {database.topic}, ingested by `mvlog run-source "
                               f"t1` (log: {source.log_path}); t2's through the Table API.", err=True)
                started = time.monotonic()
                end = None if duration is None else started + duration
                online_at = started + min(ONLINE_VIEW_AFTER_S, duration / 2 if duration is not None else 1e9)
                next_print = started
                while failure is None and not stop.requested.is_set():
                    now = time.monotonic()
                    if end is not None and now >= end:
                        break
                    if now >= online_at and len(consumers) == len(VIEWS):
                        name, sql = ONLINE_VIEW
                        if CatalogStore(settings, client).find(name) is None:
                            create_view(settings, name, sql, client=client, backfill="chunked")
                        click.echo(f"Created {name} = {sql} online, on the live mv1: it backfills in chunks while "
                                   "the workload runs.", err=True)
                        consumer = _view_consumer(settings, name, spark, client)
                        consumers.append(consumer)
                        queries.append(consumer.start())
                    if (failure := _restart_failed(settings, spark, client, consumers, queries,
                                                   restarts)) is not None:
                        break
                    if workload.error is not None:
                        failure = f"the workload stopped: {workload.error}"
                        break
                    if (gone := source.failure()) is not None:
                        failure = f"mvlog run-source {SOURCE_TABLE} stopped ({gone}); see {source.log_path}"
                        break
                    if now >= next_print:
                        next_print += interval
                        print_progress(snapshot(settings, client),
                                       f"mvlog demo [{settings.topic_prefix}] {now - started:.0f}s: "
                                       f"{workload.changes} changes written")
                    stop.requested.wait(min(0.2, max(0.0, next_print - time.monotonic())))
                if stop.requested.is_set():
                    click.echo(f"{stop.signal_name}: stopping the workload...", err=True)
                workload.stop()
                summary = {"prefix": settings.topic_prefix, "changes_written": workload.changes,
                           "seconds": round(time.monotonic() - started, 1)}
                if failure is None:
                    # Commit the last writes now; the tables keep committing (empty) epochs, which the
                    # join needs to move past the other side's last epoch.
                    last = {table.entry.name: table.flush() for table in tables}
                    last[SOURCE_TABLE] = _wait_ingested(settings, client, source, DRAIN_TIMEOUT_S)
                    targets = {"mv1": last["t1"], "mv2": last["t1"], "mv3": last["t1"],
                               "mvj": max(last["t1"], last["t2"]), ONLINE_VIEW[0]: last["t1"]}
                    click.echo("Waiting for the views to catch up with the last writes...", err=True)
                    caught_up = _wait_caught_up(consumers, targets, DRAIN_TIMEOUT_S)
                    # The tables stop here; the views then follow them to their last (empty) epochs.
                    source.stop()
                    for table in tables:
                        table.close()
                    if caught_up:
                        final = ViewStore(client, settings.topic_prefix).mce_many(list(TABLES))
                        _wait_caught_up(consumers, {"mv1": final["t1"] or 0, "mv2": final["t1"] or 0,
                                                    "mv3": final["t1"] or 0, "mvj": 0,
                                                    ONLINE_VIEW[0]: final["t1"] or 0}, 15.0)
                    failure = _failed_query(consumers)
                    records = snapshot(settings, client)
                    print_progress(records, f"mvlog demo [{settings.topic_prefix}] final")
                    summary["caught_up"] = caught_up
                    summary["views"] = {r["name"]: {k: r[k] for k in ("kind", "state", "mce", "lag_epochs", "rows",
                                                                      "value")} for r in records}
                    registry = CacheRegistry(client, settings.topic_prefix)
                    reads = {name: registry.reads(name) for name in (*TABLES, "mv1")}
                    summary["read_from_cache"] = {name: {"cache": c, "kafka": k} for name, (c, k) in reads.items()}
                    if caught_up:
                        summary.update(check_contents(settings, client, database.rows))
                    elif failure is None:
                        click.echo(f"The views did not catch up within {DRAIN_TIMEOUT_S:.0f} s: contents not "
                                   "checked.", err=True)
        finally:
            if workload is not None:
                workload.stop()
            for index, consumer in enumerate(consumers):
                if index < len(queries):
                    _wait_between_triggers(queries[index])
                try:
                    consumer.stop()
                except Exception as error:  # a failed query raises again on stop
                    if failure is None:
                        failure = f"view {consumer.entry.name}: stopping failed: {_short(error)}"
            for table in tables:
                table.close()
            spark.stop()
            for stop_companion in reversed(stops):
                stop_companion()
    if summary:
        _print_summary(summary, output)
    if failure is not None:
        raise click.ClickException(failure)
    if summary.get("consistent") is False:
        raise click.ClickException("the final contents of the views do not match their upstreams (see above)")


def _print_summary(summary: dict[str, Any], output: str) -> None:
    if output == "json":
        click.echo(json.dumps(summary, default=str, separators=(",", ":")))
        return
    click.echo(f"Wrote {summary['changes_written']} changes in {summary['seconds']} s under prefix "
               f"{summary['prefix']!r}.")
    if cached := summary.get("read_from_cache"):
        shares = ", ".join(f"{name} {r['cache']}/{r['cache'] + r['kafka']}" for name, r in cached.items())
        click.echo(f"Partition-epochs the consumers read from the log cache (of all they read): {shares}.")
    if "checks" in summary:
        click.echo(f"mv2.total = {summary['mv2_total']} (sum of v1 over mv1's {summary['mv1_rows']} rows: "
                   f"{summary['mv1_sum_v1']}); mv3.n = {summary['mv3_n']}; mvj: {summary['mvj_rows']} rows.")
        for name, passed in summary["checks"].items():
            click.echo(f"  {'ok  ' if passed else 'FAIL'} {name}")
