"""What the commands print: rich tables for people, JSON for scripts (``--output table|json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from mvlog.epoch import epoch_millis
from mvlog.row_schema import RowSchema
from mvlog.services.commands.values import to_json

F = TypeVar("F", bound=Callable[..., Any])

output_option: Callable[[F], F] = click.option(
    "--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True,
    help="table: for people; json: one JSON document on standard output, for scripts.")


def console(stderr: bool = False) -> Console:
    """A console on the current standard output (or error); wide when it is not a terminal, so piped
    tables are never cut at 80 columns."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 1000
    return Console(file=stream, width=width, soft_wrap=False, highlight=False)


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                right_aligned: Sequence[str] = ()) -> None:
    out = console()
    if title:
        out.print(title, soft_wrap=True)
    table = Table()
    for name in columns:
        table.add_column(name, justify="right" if name in right_aligned else "left", overflow="fold")
    for row in rows:
        table.add_row(*(cell_text(value) for value in row))
    out.print(table)


def cell_text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray):
        return str(to_json(value))
    return str(value)


def print_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2, default=to_json))


def epoch_time(epoch: int) -> str:
    """When ``epoch`` was opened, in UTC (epochs are wall-clock milliseconds shifted left 16 bits)."""
    moment = datetime.fromtimestamp(epoch_millis(epoch) / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def describe_epoch(epoch: int | None) -> str:
    return "no committed epoch yet" if epoch is None else f"epoch {epoch} ({epoch_time(epoch)})"


def age(ts_ms: int | None, now_ms: int) -> str:
    """``ts_ms`` as an age ("3.2s ago"); "" when unknown."""
    if ts_ms is None:
        return ""
    seconds = max(0.0, (now_ms - ts_ms) / 1000)
    if seconds < 120:
        return f"{seconds:.1f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def describe_schema(schema: RowSchema) -> str:
    parts = []
    for column in schema.columns:
        if column.hidden:
            continue
        flags = " primary key" if column.name in schema.primary_key else "" if column.nullable else " not null"
        parts.append(f"{column.name} {column.type.value}{flags}")
    return ", ".join(parts)
