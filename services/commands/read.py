"""``mvlog read``: a view's (or table's) rows from its serving state, with the epoch they reflect."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.catalog_store import CatalogStore
from mvlog.connectors.view_store import ViewStore
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.schemas.codec import decode_row, encode_key
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis
from mvlog.services.commands.output import describe_epoch, epoch_time, output_option, print_json, print_table
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


@click.command("read")
@click.argument("view")
@click.option("--key", "-k", "key_values", multiple=True, metavar="VALUE",
              help="Read the one row of this key (parsed per the key column's type; bytes as base64). A key "
                   "of several columns: repeat --key in key order. Without --key: every row.")
@output_option
@pass_settings
def read(settings: Settings, view: str, key_values: tuple[str, ...], output: str) -> None:
    """Print the rows of VIEW (a view or a table) and the epoch they reflect.

    Rows and epoch are read together (one Redis transaction), so the rows are exactly the view at that
    epoch. Hidden key columns are left out, as in SELECT *.
    """
    client = connect_redis(settings)
    with backend_errors(settings):
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
