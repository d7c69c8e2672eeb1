"""``mvlog run-view``: maintain views in the foreground until SIGINT/SIGTERM.

One Spark session (local mode by default) runs one :class:`ViewConsumer` per view. The first SIGINT or
SIGTERM stops every consumer cleanly (exit code 0); a second one aborts at once. A consumer that fails
marks its view 'failed' with the reason, stops the others and exits with code 1. Killing the process
(SIGKILL) is safe too: each epoch is committed atomically, and a restarted consumer carries on from
the view's MCE.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Sequence
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING

import click

from mvlog.config import Settings
from mvlog.connectors.catalog_store import CatalogStore
from mvlog.connectors.view_store import Lifecycle
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.backfill_progress import BackfillBars
from mvlog.services.commands.output import describe_epoch
from mvlog.services.commands.values import SECONDS

if TYPE_CHECKING:  # pyspark is imported when the command runs, so `mvlog --help` stays fast
    from pyspark.sql.streaming.query import StreamingQuery

    from mvlog.services.view_consumer import ViewConsumer

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


def _short(error: BaseException | object, limit: int = 400) -> str:
    """The first meaningful line of a (Spark) exception, without the JVM and Python stack traces."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _supervise(consumers: Sequence[ViewConsumer], queries: Sequence[StreamingQuery], stop: _StopOnSignal,
               progress_interval: float, verbose: bool) -> str | None:
    """Wait for a stop signal or a failed query; returns the failure (None after a signal)."""
    reported = {c.entry.name: c.mce for c in consumers}
    next_report = time.monotonic() + progress_interval
    with BackfillBars(consumers) as bars:
        return _watch(consumers, queries, stop, progress_interval, verbose, reported, next_report, bars)


def _watch(consumers: Sequence[ViewConsumer], queries: Sequence[StreamingQuery], stop: _StopOnSignal,
           progress_interval: float, verbose: bool, reported: dict[str, int], next_report: float,
           bars: BackfillBars) -> str | None:
    while not stop.requested.wait(0.2):
        bars.update()
        for consumer, query in zip(consumers, queries, strict=True):
            error = query.exception() or consumer.failure()  # an apply fails the query only at the next micro-batch
            if error is None and query.isActive:
                continue
            reason = _short(error) if error is not None else "the streaming query stopped"
            if verbose and error is not None:
                click.echo(str(error), err=True)
            consumer.store.set_lifecycle(consumer.entry.name, Lifecycle.FAILED, reason)
            return f"view {consumer.entry.name} failed at {describe_epoch(consumer.mce)}: {reason}"
        if progress_interval > 0 and time.monotonic() >= next_report:
            next_report = time.monotonic() + progress_interval
            for consumer in consumers:
                if consumer.mce != reported[consumer.entry.name]:
                    reported[consumer.entry.name] = consumer.mce
                    backfill = consumer.backfill
                    figures = (f"; backfill {backfill.rows_done:,}/{backfill.rows_total:,} rows, "
                               f"{backfill.meter.rate():,.0f} rows/s" if backfill is not None else "")
                    click.echo(f"{consumer.entry.name}: {describe_epoch(consumer.mce)}, "
                               f"{consumer.epochs_applied} epoch(s) applied{figures}", err=True)
    click.echo(f"{stop.signal_name}: stopping {', '.join(c.entry.name for c in consumers)}...", err=True)
    return None


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
    client = connect_redis(settings)
    failure: str | None = None
    with backend_errors(settings):
        catalog = CatalogStore(settings, client)
        for name in views:
            if (kind := catalog.get(name).kind) != "view":
                raise click.ClickException(f"{name!r} is a {kind}: only views are maintained by run-view")
        require_kafka(settings)
        from mvlog.services.spark_session import spark_session
        from mvlog.services.view_consumer import ViewConsumer

        spark = spark_session(settings, app_name=f"mvlog-run-view-{'-'.join(views)}")
        consumers: list[ViewConsumer] = []
        queries: list[StreamingQuery] = []
        try:
            with _StopOnSignal() as stop:
                for name in views:
                    if stop.requested.is_set():
                        break
                    consumer = ViewConsumer(settings, name, spark=spark, client=client)
                    consumers.append(consumer)
                    if (snapshot := consumer.snapshot_backfill) is not None:
                        click.echo(f"{name}: loading {snapshot.upstream.name}'s snapshot at "
                                   f"{describe_epoch(snapshot.epoch)} ({snapshot.record.rows:,} rows)...", err=True)
                    queries.append(consumer.start(partial(_report_catch_up, name)))
                    start = f"above {describe_epoch(consumer.mce)}" if consumer.mce else "from the start"
                    if consumer.backfill is not None:
                        done = consumer.backfill.rows_done
                        start = (f"backfilling online from {describe_epoch(consumer.backfill.start_epoch)}"
                                 + (f", resuming after {done:,} row(s)" if done else ""))
                    click.echo(f"{name}: maintaining from {', '.join(consumer.entry.sources)}, {start}", err=True)
                failure = _supervise(consumers, queries, stop, progress_interval, verbose)
        finally:
            for index, consumer in enumerate(consumers):
                if index < len(queries):
                    _wait_between_triggers(queries[index])
                try:
                    consumer.stop()
                except Exception as error:  # a failed query raises again on stop: already reported
                    if failure is None:
                        failure = f"view {consumer.entry.name}: stopping failed: {_short(error)}"
            spark.stop()
    for consumer in consumers:
        click.echo(f"{consumer.entry.name}: stopped at {describe_epoch(consumer.mce or None)}", err=True)
    if failure is not None:
        raise click.ClickException(failure)
