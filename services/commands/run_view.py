"""``mvlog run-view``: maintain views in the foreground until SIGINT/SIGTERM.

One Spark session (local mode by default) runs one :class:`ViewConsumer` per view. The first SIGINT or
SIGTERM stops every consumer cleanly; a second one aborts at once. One view's trouble stays with that
view: a consumer that fails (or cannot start) is started again alone after a growing delay
(:class:`~mvlog.restart_budget.RestartBudget`: Spark workers that do not connect back in time, a Redis
being rebuilt, a broker restarting), and one that keeps failing marks its view 'failed' with the reason
and stops; a view dropped meanwhile stops alone (``drop-view`` asks through the view's consumer lease,
:mod:`mvlog.connectors.redis.consumer_lease`), and the others go on. The process exits when every view
stopped or on a signal, with code 1 if a view failed. Killing the process (SIGKILL) is safe too: each
epoch is committed atomically, and a restarted consumer carries on from the view's MCE.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import threading
import time
from dataclasses import dataclass
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING

import click
import redis

from mvlog.catalog import ViewDroppedError
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.consumer_lease import ConsumerLeases, holder_id
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.restart_budget import RestartBudget
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.backfill_progress import BackfillBars
from mvlog.services.commands.output import describe_epoch
from mvlog.services.commands.values import SECONDS

if TYPE_CHECKING:  # pyspark is imported when the command runs, so `mvlog --help` stays fast
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from mvlog.services.pipeline.view_consumer import ViewConsumer

log = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _StopOnSignal:
    """Sets ``requested`` on the first SIGINT/SIGTERM, then restores the default handlers (so a second
    signal aborts); restores the previous handlers on exit."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.signal_name = ""
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _StopOnSignal:
        for number in _STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(number).name
        self.requested.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]


_TRACEBACK = "Traceback (most recent call last):"
_RAISED = re.compile(r"^[A-Za-z_][\w.]*: \S")  # the last line of a Python traceback: "module.Error: message"


def _short(error: BaseException | object, limit: int = 400) -> str:
    """The first meaningful line of a (Spark) exception, without the JVM and Python stack traces.

    Spark wraps an error raised in a Python data source as "[PYTHON_DATA_SOURCE_ERROR] ...: Traceback (most
    recent call last):" followed by the trace: the line that says what was raised is taken from the trace.
    """
    text = str(error)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    first = lines[0].strip() if lines else type(error).__name__
    if first.endswith(_TRACEBACK):
        raised = next((line for line in lines[1:] if _RAISED.match(line)), None)
        first = first.removesuffix(_TRACEBACK).rstrip() + (f" {raised}" if raised else "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


@dataclass
class _Running:
    """One view this process maintains: its consumer and its streaming query."""

    consumer: ViewConsumer
    query: StreamingQuery


class _Supervisor:
    """Watches the views of one run-view process: progress lines, lease renewals, and each view's end (a
    failure, a drop, a stop request) handled for that view alone."""

    def __init__(self, settings: Settings, client: redis.Redis, spark: SparkSession, progress_interval: float,
                 verbose: bool) -> None:
        self.settings = settings
        self.client = client
        self.spark = spark
        self.catalog = CatalogStore(settings, client)
        self.store = ViewStore(client, settings.topic_prefix)
        self.leases = ConsumerLeases(client, settings.topic_prefix)
        self.holder = holder_id()
        self.progress_interval = progress_interval
        self.verbose = verbose
        self.running: dict[str, _Running] = {}
        self.consumers: list[ViewConsumer] = []  # the last consumer started of each view
        self.budgets: dict[str, RestartBudget] = {}
        self.restarts_due: dict[str, float] = {}  # view -> time.monotonic() of its next start
        self.starting: set[str] = set()  # views being started again, on threads of their own
        self.failures: list[str] = []
        self._reported: dict[str, int] = {}
        self._next_report = time.monotonic() + progress_interval
        self._held: set[str] = set()
        self._closed = threading.Event()
        # Renewed on a thread of its own: starting a view (its catch-up) can take longer than a lease.
        self._renewer = threading.Thread(target=self._renew, name="mvlog-consumer-leases", daemon=True)
        self._renewer.start()

    def claim(self, name: str) -> None:
        """Hold ``name``'s lease from before its consumer starts, so ``drop-view`` sees it running."""
        self._held.add(name)
        self.leases.hold(name, self.holder)

    def add(self, consumer: ViewConsumer, query: StreamingQuery) -> None:
        if self._closed.is_set():  # a restart that finished its catch-up as the process stopped
            consumer.stop()
            return
        self.running[consumer.entry.name] = _Running(consumer, query)
        self._reported[consumer.entry.name] = consumer.mce

    def start(self, name: str) -> None:
        """Start ``name``'s consumer (its catch-up first); a failure goes to :meth:`failed`."""
        from mvlog.services.pipeline.view_consumer import ViewConsumer

        try:
            consumer = ViewConsumer(self.settings, name, spark=self.spark, client=self.client)
        except Exception as error:
            self.failed(name, error)
            return
        self.consumers[:] = [c for c in self.consumers if c.entry.name != name]  # in place: BackfillBars reads it
        self.consumers.append(consumer)
        try:
            if (snapshot := consumer.backfills.snapshot) is not None:
                click.echo(f"{name}: loading {snapshot.upstream.name}'s snapshot at "
                           f"{describe_epoch(snapshot.epoch)} ({snapshot.record.rows:,} rows)...", err=True)
            self.add(consumer, consumer.start(partial(_report_catch_up, name)))
        except Exception as error:
            with contextlib.suppress(Exception):
                consumer.stop()
            self.failed(name, error)
            return
        click.echo(f"{name}: maintaining from {', '.join(consumer.entry.sources)}, {_starting_point(consumer)}",
                   err=True)

    def failed(self, name: str, error: BaseException | str) -> None:
        """``name``'s consumer failed (it is stopped): start it again after a delay while its restart
        budget lasts, else mark the view failed and give its lease back."""
        if self._closed.is_set():  # a restart that was cut short by the process stopping
            log.debug("%s: stopped while starting: %s", name, error)
            return
        dropped = isinstance(error, ViewDroppedError) or (self.catalog.find(name) is None
                                                          and not self.catalog.wiped())
        delay = None if dropped else self._budget(name).after_failure(time.monotonic())
        if delay is None:
            self.fail(name, error)
            self.release(name)
            return
        reason = _short(error) if isinstance(error, BaseException) else error
        if self.verbose and isinstance(error, BaseException):
            click.echo(str(error), err=True)
        click.echo(f"{name}: {reason}; starting it again in {delay:.0f} s "
                   f"(restart {self.budgets[name].restarts} of {self.budgets[name].max_restarts} "
                   f"within {self.budgets[name].window_s / 60:.0f} min)", err=True)
        self.restarts_due[name] = time.monotonic() + delay

    def _budget(self, name: str) -> RestartBudget:
        if name not in self.budgets:
            self.budgets[name] = RestartBudget(self.settings.view_restarts, self.settings.view_restart_window_s)
        return self.budgets[name]

    def _start_due(self) -> None:
        """Start the views whose restart is due, each on a thread of its own: a restart's catch-up may take
        minutes, during which the other views' failures must still be seen and restarted."""
        now = time.monotonic()
        for name, due in list(self.restarts_due.items()):
            if due <= now:
                del self.restarts_due[name]
                self.starting.add(name)
                threading.Thread(target=self._restart, args=(name,), name=f"mvlog-restart-{name}",
                                 daemon=True).start()

    def _restart(self, name: str) -> None:
        try:
            self.start(name)
        finally:
            self.starting.discard(name)

    def _renew(self) -> None:
        while not self._closed.wait(1.0):
            for name in list(self._held):
                try:
                    self.leases.hold(name, self.holder)
                except redis.RedisError as error:  # Redis away: the lease lapses, nothing else depends on it
                    log.debug("lease of %s: %s", name, error)

    def fail(self, name: str, error: BaseException | str) -> None:
        """Mark ``name`` failed with the reason, unless it was dropped (then there is nothing to mark)."""
        if isinstance(error, ViewDroppedError) or (self.catalog.find(name) is None and not self.catalog.wiped()):
            click.echo(f"{name}: the view was dropped; stopped it", err=True)
            return
        reason = _short(error) if isinstance(error, BaseException) else error
        if self.verbose and isinstance(error, BaseException):
            click.echo(str(error), err=True)
        self.store.set_lifecycle(name, Lifecycle.FAILED, reason)
        self.failures.append(f"view {name} failed: {reason}")
        others = f"; {', '.join(n for n in self.running if n != name)} go on" if len(self.running) > 1 else ""
        click.echo(f"{name}: failed: {reason}{others}", err=True)

    def watch(self, stop: _StopOnSignal, bars: BackfillBars) -> None:
        """Until a stop signal or until no view is left."""
        while (self.running or self.restarts_due or self.starting) and not stop.requested.wait(0.2):
            bars.update()
            for name, view in list(self.running.items()):
                if (request := self.leases.stop_requested(name)) is not None:
                    click.echo(f"{name}: stopping it alone: {request}", err=True)
                    self.stop_one(name)
                    continue
                if (error := view.consumer.failure()) is None:
                    continue
                self.stop_one(name, release=False)
                self.failed(name, error)
            for name in list(self.restarts_due):
                if self.leases.stop_requested(name) is not None:  # dropped while it waited: not again
                    del self.restarts_due[name]
                    self.release(name)
            self._start_due()
            self._report_progress()
        if stop.requested.is_set():
            click.echo(f"{stop.signal_name}: stopping {', '.join(self.running)}...", err=True)

    def stop_one(self, name: str, *, release: bool = True) -> None:
        """Stop one view's consumer cleanly, then give its lease back (``drop-view`` waits for that)
        unless it is to be started again."""
        view = self.running.pop(name)
        _wait_between_triggers(view.query)
        try:
            view.consumer.stop()
        except Exception as error:  # a failed query raises again on stop: reported already
            log.debug("%s: stopping: %s", name, error)
        finally:
            if release:
                self.release(name)

    def release(self, name: str) -> None:
        self._held.discard(name)
        self.leases.release(name, self.holder)

    def stop_all(self) -> None:
        self._closed.set()  # first: a restart under way then stops its consumer instead of adding it
        self.restarts_due.clear()
        for name in list(self.running):
            self.stop_one(name)
        for name in list(self._held):
            self.release(name)

    def _report_progress(self) -> None:
        if self.progress_interval <= 0 or time.monotonic() < self._next_report:
            return
        self._next_report = time.monotonic() + self.progress_interval
        for name, view in self.running.items():
            consumer = view.consumer
            if consumer.mce != self._reported[name]:
                self._reported[name] = consumer.mce
                backfill = consumer.backfill
                figures = (f"; backfill {backfill.rows_done:,}/{backfill.rows_total:,} rows, "
                           f"{backfill.meter.rate():,.0f} rows/s" if backfill is not None else "")
                click.echo(f"{name}: {describe_epoch(consumer.mce)}, {consumer.epochs_applied} epoch(s) applied"
                           f"{figures}", err=True)


def _wait_between_triggers(query: StreamingQuery, timeout: float = 10.0) -> None:
    """Give the query up to ``timeout`` seconds to finish the trigger it is in, so stopping it rarely
    interrupts an epoch half-way (that is safe, but Spark reports it with long stack traces)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not query.isActive or not query.status.get("isTriggerActive", False):
                return
        except Exception:  # a query that died meanwhile: stop() reports it
            return
        time.sleep(0.02)


def _report_catch_up(name: str, epoch: int, last: int) -> None:
    click.echo(f"{name}: reading its backlog: up to {describe_epoch(epoch)} of {describe_epoch(last)}", err=True)


@click.command("run-view")
@click.argument("names", nargs=-1, required=True, metavar="NAME [NAME ...]")
@click.option("--progress-interval", type=SECONDS, default=10.0, show_default=True,
              help="Seconds between progress lines on standard error (0: none).")
@click.option("--verbose", "-v", is_flag=True, help="Show a failed consumer's full error (Spark stack traces).")
@pass_settings
def run_view(settings: Settings, names: tuple[str, ...], progress_interval: float, verbose: bool) -> None:
    """Maintain views in the foreground (one Spark session) until SIGINT or SIGTERM.

    Each view NAME is brought up to date from its upstream changelog, then follows it epoch by epoch; its
    rows and MCE are visible with `mvlog read` and `mvlog views`. Running a second `run-view` of the
    same view fences this one.
    """
    views = list(dict.fromkeys(names))
    client = connect_redis(settings, wait=True)
    with backend_errors(settings):
        catalog = CatalogStore(settings, client)
        for name in views:
            if (kind := catalog.get(name).kind) != "view":
                raise click.ClickException(f"{name!r} is a {kind}: only views are maintained by run-view")
        require_kafka(settings)
        from mvlog.services.spark.session import spark_session

        spark = spark_session(settings, app_name=f"mvlog-run-view-{'-'.join(views)}")
        supervisor = _Supervisor(settings, client, spark, progress_interval, verbose)
        try:
            with _StopOnSignal() as stop:
                for name in views:
                    if stop.requested.is_set():
                        break
                    supervisor.claim(name)
                    supervisor.start(name)
                with BackfillBars(supervisor.consumers) as bars:
                    supervisor.watch(stop, bars)
        finally:
            supervisor.stop_all()
            spark.stop()
    for consumer in supervisor.consumers:
        click.echo(f"{consumer.entry.name}: stopped at {describe_epoch(consumer.mce or None)}", err=True)
    if supervisor.failures:
        raise click.ClickException("; ".join(supervisor.failures))


def _starting_point(consumer: ViewConsumer) -> str:
    if consumer.backfill is not None:
        done = consumer.backfill.rows_done
        return (f"backfilling online from {describe_epoch(consumer.backfill.start_epoch)}"
                + (f", resuming after {done:,} row(s)" if done else ""))
    return f"above {describe_epoch(consumer.mce)}" if consumer.mce else "from the start"
