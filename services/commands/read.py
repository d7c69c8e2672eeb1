"""``mvlog read``: a view's (or table's) rows from its serving state, with the epoch they reflect.

``--views a,b`` reads several views at one epoch: the minimum MCE among them. Their rows and MCEs are
read in one Redis transaction; a view whose MCE is above that epoch is taken back to it by undoing its
later epochs, read from its own changelog (Kafka is the truth; every change carries its before-image).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, undo_changes
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.rows_at_epoch import EpochNotReadableError, changes_after
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.schemas.codec import decode_row, encode_key
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis
from mvlog.services.commands.output import describe_epoch, epoch_time, output_option, print_json, print_table
from mvlog.services.commands.serving_state import require_serving_state
from mvlog.services.commands.values import parse_text


def parse_key(schema: RowSchema, values: Sequence[str]) -> Key:
    """``--key`` values as the view's key, parsed per key column type (one value per key column)."""
    columns = [schema.column(name) for name in schema.primary_key]
    shape = ", ".join(f"{c.name} {c.type.value}" for c in columns)
    if not columns:
        raise click.UsageError("this view has no key (a global aggregate, always one row): read it without --key")
    if len(values) != len(columns):
        raise click.UsageError(f"the key is ({shape}): give one --key per key column, in that order "
                               f"(got {len(values)} value(s))")
    try:
        return tuple(parse_text(column, text) for column, text in zip(columns, values, strict=True))
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--key") from None


def _sort_key(schema: RowSchema, row: Row) -> tuple[Any, ...]:
    return tuple((value is not None, value) for value in schema.key_of(row))


def read_rows(store: ViewStore, entry: CatalogEntry, key: Key | None) -> tuple[int | None, list[Row]]:
    """The rows (all, or the one of ``key``) and the MCE they reflect, read together."""
    if key is not None:
        epoch, found = store.get_rows_at_consistent_epoch(entry.name, [encode_key(entry.key_columns, key)])
        return epoch, [decode_row(value) for value in found.values()]
    epoch, pairs = store.read_at_consistent_epoch(entry.name)
    rows = [decode_row(value) for _, value in pairs]
    rows.sort(key=lambda row: _sort_key(entry.schema, row))
    return epoch, rows


class ConsistentReadError(click.ClickException):
    pass


def _changes_after(settings: Settings, store: ViewStore, entry: CatalogEntry, after: int, upto: int) -> list[Change]:
    try:
        return changes_after(settings, store, entry, after, upto)
    except EpochNotReadableError as exc:
        raise ConsistentReadError(str(exc)) from exc


def read_views_at_common_epoch(settings: Settings, store: ViewStore, entries: Sequence[CatalogEntry]
                               ) -> tuple[int, dict[str, list[Row]]]:
    """Rows of every view at the minimum MCE among them (each view sorted by key)."""
    found = store.read_many_at_consistent_epoch([e.name for e in entries])
    empty = [name for name, (mce, _) in found.items() if mce is None]
    if empty:
        raise ConsistentReadError(f"no committed epoch yet in {', '.join(empty)}: nothing to read consistently")
    epoch = min(mce for mce, _ in found.values() if mce is not None)
    result: dict[str, list[Row]] = {}
    for entry in entries:
        mce, pairs = found[entry.name]
        rows = {entry.schema.key_of(row): row for row in (decode_row(value) for _, value in pairs)}
        if mce is not None and mce > epoch:
            undo_changes(rows, _changes_after(settings, store, entry, epoch, mce))
        schema = entry.schema
        result[entry.name] = sorted(rows.values(), key=lambda row: _sort_key(schema, row))
    return epoch, result


def _parse_views(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if len(names) < 1:
        raise click.BadParameter("give view names separated by commas, e.g. --views mv1,mv2",
                                 param_hint="--views")
    if len(set(names)) != len(names):
        raise click.BadParameter(f"a view is named twice in {text!r}", param_hint="--views")
    return names


def _read_many(settings: Settings, names: list[str], output: str) -> None:
    client = connect_redis(settings)
    with backend_errors(settings):
        require_serving_state(settings, client)
        catalog = CatalogStore(settings, client)
        entries = [catalog.get(name) for name in names]
        store = ViewStore(client, settings.topic_prefix)
        epoch, rows = read_views_at_common_epoch(settings, store, entries)
    if output == "json":
        print_json({"epoch": epoch, "epoch_time": epoch_time(epoch), "views": {
            e.name: {"kind": e.kind, "columns": e.schema.visible_names,
                     "rows": [{c: row.get(c) for c in e.schema.visible_names} for row in rows[e.name]]}
            for e in entries}})
        return
    for entry in entries:
        columns = entry.schema.visible_names
        print_table(f"{entry.name} at {describe_epoch(epoch)}", columns,
                    [[row.get(name) for name in columns] for row in rows[entry.name]])
        click.echo(f"{len(rows[entry.name])} row(s).")


@click.command("read")
@click.argument("view", required=False)
@click.option("--views", "views_text", metavar="A,B,...",
              help="Read several views at one epoch, the minimum MCE among them (instead of VIEW).")
@click.option("--key", "-k", "key_values", multiple=True, metavar="VALUE",
              help="Read the one row of this key (parsed per the key column's type; bytes as base64). A key "
                   "of several columns: repeat --key in key order. Without --key: every row.")
@output_option
@pass_settings
def read(settings: Settings, view: str | None, views_text: str | None, key_values: tuple[str, ...],
         output: str) -> None:
    """Print the rows of VIEW (a view or a table) and the epoch they reflect.

    Rows and epoch are read together (one Redis transaction), so the rows are exactly the view at that
    epoch. Hidden key columns are left out, as in SELECT *. With --views, every view is shown at the
    same epoch, the minimum MCE among them.
    """
    if views_text is not None:
        if view is not None or key_values:
            raise click.UsageError("--views reads whole views: give neither VIEW nor --key with it")
        _read_many(settings, _parse_views(views_text), output)
        return
    if view is None:
        raise click.UsageError("name a VIEW to read, or several with --views A,B")
    client = connect_redis(settings)
    with backend_errors(settings):
        require_serving_state(settings, client)
        entry = CatalogStore(settings, client).get(view)
        key = parse_key(entry.schema, key_values) if key_values else None
        store = ViewStore(client, settings.topic_prefix)
        epoch, rows = read_rows(store, entry, key)
        state = store.lifecycle(view)
    columns = entry.schema.visible_names
    state_name = state.value if state is not None else "unknown"
    if output == "json":
        document: dict[str, Any] = {
            "view": view, "kind": entry.kind, "state": state_name, "epoch": epoch,
            "epoch_time": epoch_time(epoch) if epoch is not None else None, "columns": columns,
            "rows": [{name: row.get(name) for name in columns} for row in rows]}
        if key is not None:
            document["key"] = dict(zip(entry.schema.primary_key, key, strict=True))
        print_json(document)
        return
    if epoch is None:
        hint = f"; maintain it with: mvlog run-view {view}" if entry.kind == "view" else ""
        click.echo(f"{entry.kind} {view} has no committed epoch yet (state {state_name}){hint}", err=True)
    if key is not None and not rows:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(entry.schema.primary_key, key, strict=True))
        click.echo(f"No row with key {shown} in {view} at {describe_epoch(epoch)}.")
        return
    print_table(f"{view} at {describe_epoch(epoch)}", columns,
                [[row.get(name) for name in columns] for row in rows])
    click.echo(f"{len(rows)} row(s).")
