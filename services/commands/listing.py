"""``mvlog views``: every table and view with its sources, lifecycle state, MCE and row count."""

from __future__ import annotations

import time
from typing import Any

import click
import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis
from mvlog.services.commands.output import age, epoch_time, output_option, print_json, print_table
from mvlog.services.commands.serving_state import require_serving_state


def _int(value: str | None) -> int | None:
    return int(value) if value else None


def describe_all(client: redis.Redis, settings: Settings) -> list[dict[str, Any]]:
    """One record per catalog entry: the catalog's view of it and its serving state in Redis."""
    entries: list[CatalogEntry] = CatalogStore(settings, client).all()
    store = ViewStore(client, settings.topic_prefix)
    records = []
    for entry in entries:
        meta = store.meta(entry.name)
        mce = _int(meta.get("mce"))
        records.append({
            "name": entry.name, "kind": entry.kind, "sources": list(entry.sources),
            "state": meta.get("state"), "reason": meta.get("reason") or None,
            "mce": mce, "mce_time": epoch_time(mce) if mce is not None else None,
            "mce_committed_ts_ms": _int(meta.get("mce_ts_ms")), "rows": store.row_count(entry.name),
            "partitions": entry.partitions, "topic": settings.changelog_topic(entry.name), "sql": entry.sql,
        })
    return records


@click.command("views")
@output_option
@pass_settings
def views(settings: Settings, output: str) -> None:
    """List every table and view: kind, sources, state, max committed epoch (MCE), rows.

    "committed" is how long ago the last epoch was committed: a view whose consumer is not running keeps
    its state but its MCE stops moving.
    """
    client = connect_redis(settings)
    with backend_errors(settings):
        require_serving_state(settings, client)
        records = describe_all(client, settings)
    if output == "json":
        print_json(records)
        return
    if not records:
        click.echo(f"No tables or views under prefix {settings.topic_prefix!r} "
                   "(mvlog create-table / mvlog create-view).")
        return
    now_ms = int(time.time() * 1000)
    rows = []
    for r in records:
        state = r["state"] or "-"
        if r["reason"]:
            state += f" ({r['reason']})"
        rows.append([r["name"], r["kind"], ", ".join(r["sources"]) or "-", state,
                     r["mce"] if r["mce"] is not None else "-", age(r["mce_committed_ts_ms"], now_ms) or "-",
                     r["rows"]])
    print_table(None, ["name", "kind", "sources", "state", "MCE", "committed", "rows"], rows,
                right_aligned=["MCE", "rows"])
