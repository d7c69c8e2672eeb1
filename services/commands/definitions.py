"""Operator commands on definitions: ``mvlog create-view``, ``drop-view``, ``alter-view`` and ``drop-table``."""

from __future__ import annotations

from typing import IO

import click

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.names import check_name
from mvlog.services.commands.output import describe_schema
from mvlog.services.commands.values import PARTITIONS, count
from mvlog.services.view_ddl import BACKFILL_METHODS, alter_view, create_view, drop_table, drop_view, plan_for
from mvlog.views import ViewDefinitionError
from mvlog.views.task_path import Upstream, describe, task_path


def definition_sql(words: tuple[str, ...], sql_file: IO[str] | None) -> str:
    """The SELECT of ``create-view NAME AS SELECT ...`` (the leading AS is optional) or of --sql-file."""
    if sql_file is not None:
        if words:
            raise click.UsageError("give the SQL either after the view name or with --sql-file, not both")
        sql = sql_file.read()
    else:
        parts = list(words)
        if parts and parts[0].upper() == "AS":
            parts = parts[1:]
        sql = " ".join(parts)
    if not sql.strip():
        raise click.UsageError("no SQL: mvlog create-view NAME AS SELECT ... (or --sql-file FILE)")
    return sql.strip()


@click.command("create-view", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("definition", nargs=-1, type=click.UNPROCESSED, metavar="AS SELECT ...")
@click.option("--sql-file", type=click.File("r", encoding="utf-8"), default=None,
              help="Read the SELECT from this file ('-': standard input) instead of the arguments.")
@click.option("--partitions", type=PARTITIONS, default=None,
              help="Partitions of the view's changelog topic (default: settings' partitions).")
@click.option("--backfill", type=click.Choice(BACKFILL_METHODS), default="chunked", show_default=True,
              help="How the view gets the upstreams' existing rows: 'chunked' reads them online from their "
                   "serving state while they keep writing; 'changelog' replays their changelogs from the start; "
                   "'snapshot' starts from the upstream's latest snapshot (mvlog snapshot) and replays the "
                   "epochs after it; 'auto' picks snapshot when the upstream has one and holds more than "
                   "MVLOG_SNAPSHOT_BACKFILL_MIN_ROWS rows, else chunked.")
@pass_settings
def create_view_command(settings: Settings, name: str, definition: tuple[str, ...], sql_file: IO[str] | None,
                        partitions: int | None, backfill: str) -> None:
    """Create view NAME defined by a SELECT over tables and views.

    The SQL subset (README, "View SQL"): SELECT expressions FROM views, inner, outer, semi and anti
    equi-joins, subqueries and WITH queries, WHERE, GROUP BY (count, sum, min, max, avg; tumbling and
    hopping windows) with HAVING, ROW_NUMBER() top-N and UNION ALL. Anything else is refused, naming the
    construct and its position, and nothing is created. Quote what the shell would expand:

      mvlog create-view mv1 AS "SELECT * FROM t1 WHERE deleted = false"

    The view starts in state 'creating'; `mvlog run-view NAME` maintains it. The last line says whether
    its operator runs in Spark's tasks (MVLOG_OPERATORS_IN_TASKS) or on the driver.
    """
    check_name(name, "view")
    sql = definition_sql(definition, sql_file)
    client = connect_redis(settings)
    with backend_errors(settings):
        require_kafka(settings)
        try:
            entry = create_view(settings, name, sql, client=client, partitions=partitions, backfill=backfill)
        except ViewDefinitionError as error:
            raise click.ClickException(f"view {name} refused, nothing created: {error}") from error
    sources = ", ".join(entry.sources)
    key = ", ".join(f"{c}{' (hidden)' if entry.schema.column(c).hidden else ''}"
                    for c in entry.schema.primary_key) or "(none: one row)"
    click.echo(f"Created view {name} over {sources}: {describe_schema(entry.schema)}; key {key}; "
               f"{entry.partitions} partition(s), changelog topic {settings.changelog_topic(name)}.")
    method = entry.options.get("backfill", "changelog")
    how = {"chunked": "backfills online from the upstreams' rows",
           "snapshot": f"starts from {sources}'s latest snapshot, then replays the epochs after it",
           }.get(method, "replays the upstreams' changelogs from their start")
    if backfill == "auto":
        click.echo(f"Backfill: {method} ({entry.options.get('backfill_auto', '')}).")
    click.echo(f"Its state is 'creating' until a consumer maintains it ({how}): mvlog run-view {name}")
    click.echo(f"Operator: {operator_placement(settings, CatalogStore(settings, client), entry)}.")


def operator_placement(settings: Settings, catalog: CatalogStore, entry: CatalogEntry) -> str:
    """Where the view's operator runs, as :func:`~mvlog.views.task_path.describe` says it, and whether the
    setting that moves it to Spark's tasks is on."""
    upstreams = [catalog.get(source) for source in entry.sources]
    plan = plan_for(catalog, entry.name, entry.sql or "")
    path = task_path(plan, [Upstream(tuple(u.key_columns), u.partitions) for u in upstreams], entry.partitions)
    if path is None or settings.operators_in_tasks:
        return describe(path, plan)
    return f"on the driver (MVLOG_OPERATORS_IN_TASKS is off; with it on: {describe(path, plan)})"


@click.command("drop-view")
@click.argument("name")
@pass_settings
def drop_view_command(settings: Settings, name: str) -> None:
    """Drop view NAME: its catalog entry, serving state and changelog topic.

    Refused while other views are defined on it (they are named); drop those first. A `mvlog run-view`
    maintaining it is asked to stop this view first (its other views go on); the drop waits for that.
    """
    client = connect_redis(settings)
    with backend_errors(settings):
        entry = CatalogStore(settings, client).get(name)
        if entry.kind != "view":
            raise click.ClickException(f"{name!r} is a {entry.kind}, not a view")
        require_kafka(settings)
        stopped = drop_view(settings, name, client=client)
    if stopped is not None:
        click.echo(f"Stopped its consumer in run-view process {stopped} (the process goes on with its other views).")
    click.echo(f"Dropped view {name} (catalog entry, serving state and topic {settings.changelog_topic(name)}).")


@click.command("drop-table")
@click.argument("name")
@pass_settings
def drop_table_command(settings: Settings, name: str) -> None:
    """Drop root table NAME: its catalog entry, rows (serving state, epoch index), snapshots and changelog topic.

    Refused while views are defined on it (they are named); drop those first. Stop whatever writes into
    NAME before dropping it.
    """
    client = connect_redis(settings)
    with backend_errors(settings):
        require_kafka(settings)
        drop_table(settings, name, client=client)
    click.echo(f"Dropped table {name} (catalog entry, rows, snapshots and topic {settings.changelog_topic(name)}).")


@click.command("alter-view")
@click.argument("name")
@click.option("--max-epoch-lag", type=count(0, "epochs"), default=None,
              help="Backpressure: upstream writers wait while NAME lags this many epochs (0 removes the bound).")
@click.option("--backfill-rate-limit", type=count(0, "rows per second"), default=None,
              help="Cap NAME's backfill at this many rows/s (0 removes the cap); applies while it runs.")
@pass_settings
def alter_view_command(settings: Settings, name: str, max_epoch_lag: int | None,
                       backfill_rate_limit: int | None) -> None:
    """Change settings of view NAME while it runs."""
    changes = {key: (value or None) for key, value in
               (("max_epoch_lag", max_epoch_lag), ("backfill_rate_limit", backfill_rate_limit)) if value is not None}
    if not changes:
        raise click.UsageError("nothing to change: give --max-epoch-lag and/or --backfill-rate-limit")
    client = connect_redis(settings)
    with backend_errors(settings):
        entry = alter_view(settings, name, client=client, **changes)
    shown = ", ".join(f"{k}={entry.options.get(k, 'unset')}" for k in sorted(changes))
    click.echo(f"Altered view {name}: {shown} (catalog version {entry.version}).")
