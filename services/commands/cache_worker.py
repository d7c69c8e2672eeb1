"""``mvlog cache-worker``: run a Faust log-cache worker in the foreground until SIGINT/SIGTERM.

Start several (each with its own ``--port``) to share the upstream partitions through Faust's group
assignment; Spark tasks find the worker of each partition in Redis.
"""

from __future__ import annotations

import click

from mvlog.config import Settings
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.values import PORT_OR_ANY


@click.command("cache-worker")
@click.option("--port", type=PORT_OR_ANY, default=None,
              help="Web server port on the bind host (default: settings' cache_port, 8322).")
@click.option("--worker-id", default=None, help="Name of this worker in Redis (default: random).")
@click.option("--upstream", "upstreams", multiple=True,
              help="Cache only these tables/views (repeatable; default: every one that a view reads).")
@click.option("--loglevel", type=click.Choice(["debug", "info", "warning", "error"]), default="warning",
              show_default=True)
@pass_settings
def cache_worker(settings: Settings, port: int | None, worker_id: str | None, upstreams: tuple[str, ...],
                 loglevel: str) -> None:
    """Cache recent epochs of upstream changelogs in memory and serve them to Spark tasks (Arrow IPC).

    Bounds: MVLOG_CACHE_MAX_BYTES (default 64 MiB) and MVLOG_CACHE_MAX_EPOCHS (per upstream). Binds
    MVLOG_BIND_HOST (127.0.0.1). Upstreams are read from the catalog at start: restart the worker to
    cache the upstream of a view created later (until then its readers read Kafka).
    """
    connect_redis(settings, wait=True).close()
    with backend_errors(settings):
        require_kafka(settings)
        from mvlog.services.log_cache.worker import LogCacheWorker  # faust is heavy: import on use

        worker = LogCacheWorker(settings, port=port, worker_id=worker_id,
                                upstreams=list(upstreams) if upstreams else None)
    if not worker.entries:
        raise click.ClickException("no view reads any table or view yet: nothing to cache "
                                   "(create a view first, or name upstreams with --upstream)")
    click.echo(f"log-cache worker {worker.worker_id} on {worker.url}, caching {', '.join(worker.entries)}",
               err=True)
    worker.run(loglevel=loglevel)
