"""``mvlog status``, ``mvlog lag`` and ``mvlog lag-sampler``: how every view keeps up, for operators.

``status`` is one line per table and view (state, MCE, lag in epochs / seconds / records, health,
backfill progress, backpressure); ``lag`` is one line per view and upstream. Both take their lag and
health from the lag sampler when one runs (the dashboard runs one), else measure lag on the spot;
``--watch`` refreshes and judges health over its own window of samples.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
import redis
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from mvlog.config import Settings
from mvlog.connectors.kafka.broker_probe import unreachable_broker
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, redis_address
from mvlog.services.commands.output import age, console, output_option, print_json
from mvlog.services.commands.serving_state import require_serving_state
from mvlog.services.commands.values import seconds
from mvlog.services.lag_sampler import LagMonitor, LagSampler
from mvlog.services.status_snapshot import PipelineSnapshot, take_snapshot
from mvlog.view_status import ViewStatus

#: A refresh of ``--watch`` whose Redis command gets no answer within this long shows "waiting for Redis".
WATCH_SOCKET_TIMEOUT_S = 5.0
REDIS_AWAY = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)

STATUS_STYLE = {"ok": "green", "lagging": "yellow", "stalled": "bold red", "stopped": "red", "unknown": "dim"}


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def fmt_count(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:g}"


def describe_backfill(view: ViewStatus) -> str:
    progress = view.backfill
    if progress is None:
        return "-"
    done = fmt_count(progress.rows_done)
    if progress.fraction is None:
        return f"{done} rows"
    eta = f", ETA {fmt_seconds(progress.eta_seconds)}" if progress.eta_seconds is not None else ""
    return f"{progress.fraction:.0%} ({done}/{fmt_count(progress.rows_total)}){eta}"


def describe_backpressure(view: ViewStatus) -> str:
    bp = view.backpressure
    if bp is None:
        return "-"
    bound = f"max {bp.max_epoch_lag}" if bp.max_epoch_lag is not None else "no bound"
    return f"{bound}, holding upstream" if bp.holding else bound


def describe_cache(view: ViewStatus) -> str:
    parts = [f"{name} {c.fraction:.0%}" if c.fraction is not None else f"{name} {fmt_count(c.bytes)}B"
             for name, c in view.cache.items()]
    return ", ".join(parts) or "-"


def describe_source(view: ViewStatus) -> str:
    """A source table's topic, dead letters and problem (the lag columns hold its lag behind the topic)."""
    source = view.source
    if source is None:
        return "-"
    parts = [f"topic {source.topic}"]
    if source.dead_letters:
        parts.append(f"[yellow]{source.dead_letters} dead-lettered[/] ({source.dead_letter_topic})")
    parts.extend(f"[red]{problem}[/]" for problem in source.problems)
    return "; ".join(parts)


def _lag_cells(view: ViewStatus) -> tuple[str, str, str]:
    """Lag epochs, seconds and records: a view's behind its upstreams, a source table's behind its topic."""
    if view.lag is not None:
        return str(view.lag.epochs), fmt_seconds(view.lag.seconds), str(view.lag.records)
    if view.source is not None and view.source.lag is not None:
        return "-", fmt_seconds(view.source.lag.seconds), str(view.source.lag.records)
    return "-", "-", "-"


def _status_cell(view: ViewStatus) -> str:
    if view.verdict is None:
        return "-"
    status = view.verdict.status.value
    return f"[{STATUS_STYLE[status]}]{status}[/]"


def status_table(snapshot: PipelineSnapshot) -> Table:
    now_ms = snapshot.ts_ms
    table = Table(title=f"mvlog status, prefix {snapshot.prefix}; lag sampler: {snapshot.sampler or 'none'}",
                  title_justify="left")
    for name in ("view", "kind", "state", "MCE", "committed", "lag epochs", "lag s", "lag records", "status",
                 "backfill", "cache", "backpressure", "replacement", "source"):
        numeric = name in ("MCE", "lag epochs", "lag s", "lag records")
        table.add_column(name, justify="right" if numeric else "left", no_wrap=name != "source")
    for v in snapshot.views:
        table.add_row(
            v.name, v.kind, (v.state or "-") + (f" ({v.reason})" if v.reason else ""),
            str(v.mce) if v.mce is not None else "-", age(v.mce_committed_ts_ms, now_ms) or "-",
            *_lag_cells(v), _status_cell(v), describe_backfill(v), describe_cache(v),
            describe_backpressure(v), v.replacement_summary or "-", describe_source(v))
    return table


def lag_rows(snapshot: PipelineSnapshot, only: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per view and upstream, and one per source table behind its topic (upstream ``topic:NAME``,
    no epochs: a topic has none)."""
    rows = []
    for v in snapshot.views:
        source = v.source
        if source is not None and source.lag is not None and (not only or v.name in only):
            rows.append({"view": v.name, "upstream": f"topic:{source.topic}", "view_mce": v.mce,
                         "upstream_mce": None, "epochs": None, "seconds": source.lag.seconds,
                         "records": source.lag.records, "ts_ms": source.lag.ts_ms, "status": None,
                         "reason": "; ".join(source.problems) or None, "dead_letters": source.dead_letters})
        if v.lag is None or (only and v.name not in only):
            continue
        for up in v.lag.upstreams:
            rows.append({"view": v.name, "upstream": up.upstream, "view_mce": v.lag.mce,
                         "upstream_mce": up.upstream_mce, "epochs": up.epochs, "seconds": up.seconds,
                         "records": up.records, "ts_ms": v.lag.ts_ms,
                         "status": v.verdict.status.value if v.verdict else None,
                         "reason": v.verdict.reason if v.verdict else None})
    return rows


def lag_table(snapshot: PipelineSnapshot, only: tuple[str, ...]) -> Table:
    table = Table(title=f"mvlog lag, prefix {snapshot.prefix}", title_justify="left")
    for name in ("view", "upstream", "view MCE", "upstream MCE", "epochs", "seconds", "records", "status",
                 "why"):
        numeric = name in ("view MCE", "upstream MCE", "epochs", "seconds", "records")
        table.add_column(name, justify="right" if numeric else "left", no_wrap=name != "why")
    for r in lag_rows(snapshot, only):
        status = r["status"] or ("-" if r["epochs"] is None else "unknown")
        shown = f"[{STATUS_STYLE[status]}]{status}[/]" if status in STATUS_STYLE else status
        table.add_row(r["view"], r["upstream"], str(r["view_mce"] or "-"), str(r["upstream_mce"] or "-"),
                      "-" if r["epochs"] is None else str(r["epochs"]), fmt_seconds(r["seconds"]), str(r["records"]),
                      shown, r["reason"] or "")
    return table


def _run(settings: Settings, watch: float | None, output: str, render: Callable[[PipelineSnapshot], Table],
         document: Callable[[PipelineSnapshot], Any]) -> None:
    if watch is not None:
        _watch(settings, watch, output, render, document)
        return
    client = connect_redis(settings)
    with backend_errors(settings):
        require_serving_state(settings, client)
    if (problem := unreachable_broker(settings.bootstrap_servers, 2.0)) is not None:
        click.echo(f"Warning: the Kafka broker at {settings.bootstrap_servers} is unreachable ({problem}): no "
                   "table or view commits an epoch until it is back; the figures below are the last ones.", err=True)
    with backend_errors(settings):
        snapshot = take_snapshot(settings, client)
    if output == "json":
        print_json(document(snapshot))
    else:
        console().print(render(snapshot))


@dataclass
class _Outages:
    """What ``--watch`` last found away (Redis, the broker), and since when: pure, times given by the caller."""

    redis_since: float | None = None
    redis_error: str = ""
    broker_problem: str | None = None

    def redis_down(self, now: float, error: BaseException) -> None:
        if self.redis_since is None:
            self.redis_since = now
        self.redis_error = str(error)

    def redis_back(self) -> None:
        self.redis_since = None

    def state(self) -> tuple[bool, str | None]:
        """What is away, without how long: a change of it is worth a line."""
        return self.redis_since is not None, self.broker_problem

    def lines(self, settings: Settings, now: float) -> list[str]:
        said = []
        if self.redis_since is not None:
            said.append(f"waiting for Redis at {redis_address(settings)}: unreachable for "
                        f"{fmt_seconds(now - self.redis_since)} ({self.redis_error}); the figures below are the "
                        "last ones")
        if self.broker_problem is not None:
            said.append(f"Kafka broker at {settings.bootstrap_servers} unreachable ({self.broker_problem}): no "
                        "table or view commits an epoch until it is back")
        return said

    def to_json(self, settings: Settings, now: float) -> dict[str, Any]:
        return {"redis": None if self.redis_since is None else {
                    "waiting_for": redis_address(settings), "down_s": round(now - self.redis_since, 1),
                    "error": self.redis_error},
                "broker": None if self.broker_problem is None else {
                    "unreachable": settings.bootstrap_servers, "error": self.broker_problem}}


def _watch(settings: Settings, watch: float, output: str, render: Callable[[PipelineSnapshot], Table],
           document: Callable[[PipelineSnapshot], Any]) -> None:
    """Refresh until Ctrl-C, through outages: a refresh that finds Redis away shows the last figures under
    "waiting for Redis", and the broker's state is probed at every refresh. Commands fail at once rather
    than wait (the next refresh tries again), so the screen never freezes on a dead server."""
    client = connect_redis(settings)
    watch_client = redis_client.connect(settings, outage_timeout_s=0, socket_timeout=WATCH_SOCKET_TIMEOUT_S)
    with backend_errors(settings):
        require_serving_state(settings, client)
        monitor = LagMonitor(settings, watch_client)
        monitor.preload()
    outages = _Outages()
    last: PipelineSnapshot | None = None
    said_for = [outages.state()]

    def refresh() -> Any:
        nonlocal last
        outages.broker_problem = unreachable_broker(settings.bootstrap_servers, min(watch, 2.0))
        try:
            if outages.redis_since is not None:  # back: a wiped or replaced Redis is rebuilt (or waited for)
                require_serving_state(settings, watch_client)
            last = take_snapshot(settings, watch_client, monitor)
            outages.redis_back()
        except REDIS_AWAY as error:
            outages.redis_down(time.monotonic(), error)
        now = time.monotonic()
        if output == "json":
            shown = document(last) if last is not None else {}
            away = outages.to_json(settings, now)
            if isinstance(shown, dict):  # status: the outages beside the figures, in the same document
                return {**shown, **away}
            if outages.state() != said_for[0]:  # lag's rows keep their shape: outages are said on stderr
                lines = outages.lines(settings, now)
                click.echo("Warning: " + " ".join(lines) if lines else "Redis and the Kafka broker answer again.",
                           err=True)
                said_for[0] = outages.state()
            return shown
        warnings = [Text(line, style="bold red") for line in outages.lines(settings, now)]
        return Group(*warnings, render(last)) if last is not None else Group(*warnings)

    with backend_errors(settings):
        try:
            if output == "json":  # one JSON document per line and refresh
                while True:
                    click.echo(_compact(refresh()))
                    time.sleep(watch)
            with Live(refresh(), console=console(), auto_refresh=False) as live:
                while True:
                    time.sleep(watch)
                    live.update(refresh(), refresh=True)
        except KeyboardInterrupt:
            pass


def _compact(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"), default=str)


_watch_option = click.option(
    "--watch", "-w", type=seconds(0.1), default=None, is_flag=False, flag_value=1.0, metavar="[SECONDS]",
    help="Refresh every SECONDS (default 1) until Ctrl-C, judging health over this command's own samples.")


@click.command("status")
@_watch_option
@output_option
@pass_settings
def status(settings: Settings, watch: float | None, output: str) -> None:
    """Every table and view: state, MCE, lag (epochs, seconds, records), health, backfill, backpressure.

    Health follows Burrow-like rules over the last samples: ok, lagging (lag grew at every sample),
    stalled (MCE stuck while the upstream moves), stopped (paused, failed, or nothing moves).
    """
    _run(settings, watch, output, status_table, lambda s: s.to_json())


@click.command("lag")
@click.argument("views", nargs=-1)
@_watch_option
@output_option
@pass_settings
def lag(settings: Settings, views: tuple[str, ...], watch: float | None, output: str) -> None:
    """Lag of each view (or VIEWS) behind each of its upstreams, in epochs, seconds and records, and of
    each source table behind its topic (records and seconds: the age of its oldest message not ingested)."""
    if views:
        client = connect_redis(settings)
        with backend_errors(settings):
            catalog = CatalogStore(settings, client)
            for name in views:
                entry = catalog.get(name)
                if entry.kind != "view" and "source.topic" not in entry.options:
                    raise click.ClickException(f"{name} is a table written by mvlog: only views and source tables "
                                               "lag behind something")
    _run(settings, watch, output, lambda s: lag_table(s, views), lambda s: lag_rows(s, views))


@click.command("lag-sampler")
@pass_settings
def lag_sampler(settings: Settings) -> None:
    """Sample every view's lag into Redis until Ctrl-C (the dashboard runs one itself).

    Only one sampler writes at a time (a lease in Redis); a second one waits and takes over when the
    first stops.
    """
    client = connect_redis(settings, wait=True)
    sampler = LagSampler(settings, client)
    click.echo(f"Sampling lag every {sampler.interval_s:g}s under prefix {settings.topic_prefix!r} "
               f"(history: {settings.lag_history} samples per view). Ctrl-C stops.", err=True)
    try:
        sampler.run()
    except KeyboardInterrupt:
        pass
    except redis.RedisError as error:
        raise click.ClickException(f"Redis: {error}") from error
    finally:
        sampler.stop()
