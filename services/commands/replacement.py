"""``mvlog replace`` and ``mvlog replacement diff|apply|discard|list|read``: replacement views.

A replacement stages a new definition for a running view; the view's `mvlog run-view` hydrates it
read-only, and applying it cuts the view over at its next epoch while the views built on it keep
running (see :mod:`mvlog.services.replacement.operations`).
"""

from __future__ import annotations

import time
from typing import IO, Any

import click

from mvlog.config import Settings
from mvlog.connectors.redis.replacement_store import ReplacementRecord
from mvlog.row_schema import Row, RowSchema
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.definitions import definition_sql
from mvlog.services.commands.output import age, describe_epoch, output_option, print_json, print_table
from mvlog.services.commands.values import SECONDS, count
from mvlog.services.replacement.operations import (
    apply_replacement,
    diff_replacement,
    discard_replacement,
    list_replacements,
    replacement_rows,
    stage_replacement,
)
from mvlog.views import ViewDefinitionError


@click.command("replace", context_settings={"ignore_unknown_options": True})
@click.argument("view")
@click.argument("definition", nargs=-1, type=click.UNPROCESSED, metavar="AS SELECT ...")
@click.option("--sql-file", type=click.File("r", encoding="utf-8"), default=None,
              help="Read the SELECT from this file ('-': standard input) instead of the arguments.")
@pass_settings
def replace(settings: Settings, view: str, definition: tuple[str, ...], sql_file: IO[str] | None) -> None:
    """Stage a replacement definition for VIEW, hydrated read-only by VIEW's `mvlog run-view`.

    Nothing reaches VIEW's changelog until `mvlog replacement apply VIEW`. The new definition must read
    the same upstreams and keep every column (name, type, nullability) and the primary key; it may add
    nullable columns. Anything else is refused, naming the column and the reason.
    """
    sql = definition_sql(definition, sql_file)
    client = connect_redis(settings)
    with backend_errors(settings):
        require_kafka(settings)
        try:
            record = stage_replacement(settings, view, sql, client=client)
        except ViewDefinitionError as error:
            raise click.ClickException(f"replacement for {view} refused, nothing staged: {error}") from error
    click.echo(f"Staged replacement {record.id} for {view}: {sql}")
    click.echo(f"`mvlog run-view {view}` hydrates it; then: mvlog replacement diff {view} / apply / discard")


@click.group("replacement")
def replacement() -> None:
    """Inspect, apply or discard staged replacements (stage one with `mvlog replace`)."""


def _sample_rows(samples: dict[str, list[dict[str, Any]]], schema: RowSchema) -> list[list[Any]]:
    out: list[list[Any]] = []
    for kind, changes in samples.items():
        for change in changes:
            image: Row = change["after"] or change["before"]
            key = ", ".join(f"{k}={image.get(k)!r}" for k in schema.primary_key)
            before = "" if change["before"] is None else _visible(change["before"], schema)
            after = "" if change["after"] is None else _visible(change["after"], schema)
            out.append([kind, key, before, after])
    return out


def _visible(row: Row, schema: RowSchema) -> str:
    return ", ".join(f"{n}={row.get(n)!r}" for n in schema.visible_names)


@replacement.command("diff")
@click.argument("view")
@click.option("--samples", type=count(0, "samples", 1000), default=5, show_default=True,
              help="Examples of each kind of change.")
@click.option("--timeout", type=SECONDS, default=10.0, show_default=True,
              help="Seconds to wait for the view and its replacement to be at the same epoch.")
@output_option
@pass_settings
def diff(settings: Settings, view: str, samples: int, timeout: float, output: str) -> None:
    """What applying VIEW's replacement would change now: inserts, deletes, updates, with samples.

    The view and the replacement are read at the same epoch.
    """
    client = connect_redis(settings)
    with backend_errors(settings):
        summary = diff_replacement(settings, view, samples=samples, timeout=timeout, client=client)
        _, plan, _ = replacement_rows(settings, view, client=client)
    if output == "json":
        print_json({"view": view, **summary.to_json()})
        return
    click.echo(f"{view} at {describe_epoch(summary.epoch)}: applying the replacement would insert "
               f"{summary.inserts}, delete {summary.deletes} and update {summary.updates} row(s).")
    if summary.total and samples:
        print_table("samples", ["change", "key", "before", "after"], _sample_rows(summary.samples, plan.schema))


@replacement.command("apply")
@click.argument("view")
@click.option("--timeout", type=SECONDS, default=60.0, show_default=True,
              help="Seconds to wait for the cut-over; then the apply is withdrawn and refused with the reason.")
@pass_settings
def apply(settings: Settings, view: str, timeout: float) -> None:
    """Cut VIEW over to its replacement at VIEW's next epoch (at or after its MCE).

    That epoch's changes are the difference between the old and the new definition's rows, with an
    apply_replacement mutation on its barriers; from then on the new definition maintains VIEW and the
    views built on it keep running. Needs VIEW's `mvlog run-view` and a new upstream epoch.
    """
    client = connect_redis(settings)
    shown = [False]

    def waiting(record: ReplacementRecord, view_mce: int | None) -> None:
        if not shown[0]:
            shown[0] = True
            state = f"at epoch {record.mce}" if record.hydrated else "hydrating"
            click.echo(f"Waiting for {view}'s next epoch (replacement {state}, view at "
                       f"{describe_epoch(view_mce)}; up to {timeout:g}s)...", err=True)

    started = time.monotonic()
    with backend_errors(settings):
        applied = apply_replacement(settings, view, timeout=timeout, client=client, on_wait=waiting)
    click.echo(f"Applied replacement {applied.id} to {view} at {describe_epoch(applied.epoch)}: catalog version "
               f"{applied.version} ({time.monotonic() - started:.1f}s).")


@replacement.command("discard")
@click.argument("view")
@pass_settings
def discard(settings: Settings, view: str) -> None:
    """Drop VIEW's staged replacement and its state (a pending apply is cancelled with it)."""
    client = connect_redis(settings)
    with backend_errors(settings):
        require_kafka(settings)
        replacement_id = discard_replacement(settings, view, client=client)
    click.echo(f"Discarded replacement {replacement_id} of {view}.")


@replacement.command("list")
@output_option
@pass_settings
def list_command(settings: Settings, output: str) -> None:
    """Every view's replacement: staged (hydrating or at an epoch), applied or discarded."""
    client = connect_redis(settings)
    with backend_errors(settings):
        records = list_replacements(settings, client=client)
    documents = [{"view": r.view, "id": r.id, "status": r.status.value, "sql": r.sql, "epoch": r.mce,
                  "apply_requested": r.apply_requested, "cut_epoch": r.cut_epoch, "applied_epoch": r.applied_epoch,
                  "applied_version": r.applied_version, "error": (r.fields or {}).get("error"),
                  "hydration_epoch": r.hydration_epoch, "hydrated_from": (r.fields or {}).get("hydrated_from")}
                 for r in records]
    if output == "json":
        print_json(documents)
        return
    if not records:
        click.echo("No replacements (stage one with: mvlog replace VIEW AS SELECT ...).")
        return
    now_ms = int(time.time() * 1000)
    rows = []
    for r in records:
        fields = r.fields or {}
        if r.status.value == "staged":
            error = fields.get("error")
            state = f"error: {error}" if error else (f"at epoch {r.mce}" if r.hydrated else "hydrating")
            if r.cut_epoch is not None:  # it can only complete now
                state = f"cutting over at epoch {r.cut_epoch} in Spark's tasks"
            elif not error and "hydrated_from" in fields:
                state += f" (started from {fields['hydrated_from']})"
            when = age(int(fields["staged_ts_ms"]), now_ms) if "staged_ts_ms" in fields else ""
        elif r.status.value == "applied":
            state, when = f"at epoch {r.applied_epoch}, version {r.applied_version}", age(
                int(fields.get("applied_ts_ms", now_ms)), now_ms)
        else:
            state, when = "", age(int(fields.get("discarded_ts_ms", now_ms)), now_ms)
        rows.append([r.view, r.id, r.status.value, state, when, r.sql])
    print_table(None, ["view", "id", "status", "state", "since", "definition"], rows)


@replacement.command("read")
@click.argument("view")
@output_option
@pass_settings
def read(settings: Settings, view: str, output: str) -> None:
    """Print the rows of VIEW's staged replacement and the epoch they reflect (hidden key columns left out)."""
    client = connect_redis(settings)
    with backend_errors(settings):
        record, plan, rows = replacement_rows(settings, view, client=client)
    columns = plan.schema.visible_names
    rows.sort(key=lambda row: tuple((v is not None, v) for v in plan.schema.key_of(row)))
    if output == "json":
        print_json({"view": view, "replacement": record.id, "epoch": record.mce, "columns": columns,
                    "rows": [{n: row.get(n) for n in columns} for row in rows]})
        return
    if not record.hydrated:
        click.echo(f"The replacement of {view} is not hydrated yet (`mvlog run-view {view}` hydrates it).", err=True)
    print_table(f"replacement {record.id} of {view} at {describe_epoch(record.mce)}", columns,
                [[row.get(n) for n in columns] for row in rows])
    click.echo(f"{len(rows)} row(s).")
