"""Commands that show serving state (``read``, ``views``, ``status``) first make sure Redis holds it.

Redis is a projection of Kafka. After a wipe (or a new, empty Redis) nothing would be there to read
until a consumer or writer noticed and rebuilt it, so a reader would see empty views and "no committed
epoch yet". Instead the first process to look rebuilds the control plane (whichever it is), and a
reader arriving while another process rebuilds waits for that rebuild (its lock) rather than show a
half-built state: both say so on standard error.
"""

from __future__ import annotations

import click
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.services.control_plane import ensure_control_plane, rebuild_running


def require_serving_state(settings: Settings, client: redis.Redis) -> None:
    """Rebuild Redis from Kafka when it was wiped, or wait for the rebuild another process runs (a new,
    empty stack goes through the same path, silently: there is nothing to rebuild)."""
    catalog = CatalogStore(settings, client)
    if not catalog.wiped():
        return
    if rebuild_running(client, settings.topic_prefix):
        click.echo("A rebuild of Redis from Kafka is running (another process): waiting for it...", err=True)
    if ensure_control_plane(settings, client) and (names := catalog.names()):
        click.echo(f"Redis held none of mvlog's state (wiped or replaced): rebuilt {len(names)} table(s) and "
                   f"view(s) from Kafka.", err=True)
