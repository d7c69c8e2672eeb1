"""``mvlog dashboard``: the lag dashboard on 127.0.0.1, with the lag sampler, until Ctrl-C."""

from __future__ import annotations

import click

from mvlog.config import Settings
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import connect_redis
from mvlog.services.commands.run_view import _StopOnSignal
from mvlog.services.commands.values import PORT_OR_ANY
from mvlog.services.dashboard.server import DashboardServer


@click.command("dashboard")
@click.option("--host", default=None, help="Address to bind (default: settings' bind_host, 127.0.0.1). "
                                           "The dashboard is read-only, but think before exposing it.")
@click.option("--port", type=PORT_OR_ANY, default=None,
              help="Port (default: settings' dashboard_port, 8321; 0: any free port).")
@click.option("--no-sampler", is_flag=True,
              help="Only show what a `mvlog lag-sampler` elsewhere records; never sample lag here.")
@pass_settings
def dashboard(settings: Settings, host: str | None, port: int | None, no_sampler: bool) -> None:
    """Serve the lag dashboard (web page, /api/status, /metrics) until Ctrl-C.

    The page shows the view graph, each view's state, MCE, lag (epochs, seconds, records), health,
    backfill progress, cache occupancy and backpressure, and a chart of lag over time. It changes
    nothing. Unless --no-sampler, this process also samples lag (one sampler per prefix at a time).
    """
    connect_redis(settings).close()  # a clean error now when Redis is not there
    server = DashboardServer(settings, host, port, sample=not no_sampler)
    try:
        server.start()
    except OSError as error:
        raise click.ClickException(f"cannot serve on {server.host}:{server.port}: {error.strerror or error}; "
                                   "choose another with --port") from error
    click.echo(f"mvlog dashboard on {server.url}  (metrics: {server.url}metrics; Ctrl-C stops)")
    with _StopOnSignal() as stop:
        while not stop.requested.wait(0.5):
            pass
    server.stop()
    click.echo("Dashboard stopped.", err=True)


