"""``mvlog snapshot VIEW``: write a Parquet snapshot of a table or view at its newest checkpoint epoch.

Built from the view's last snapshot plus its changelog since (or from the changelog's start with
``--from-scratch``), recorded in Redis, older snapshots beyond ``--keep`` deleted. A warning (standard
error) says when the changelog's Kafka retention does not cover the snapshot interval.
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from mvlog.config import Settings
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.output import describe_epoch
from mvlog.services.commands.values import count
from mvlog.snapshot_plan import SnapshotError


@click.command("snapshot")
@click.argument("view")
@click.option("--from-scratch", is_flag=True, help="Build it from the changelog's start, not the last snapshot.")
@click.option("--keep", type=count(1, "snapshots"), default=None,
              help="Keep this many snapshots of VIEW (default: MVLOG_SNAPSHOT_KEEP, 3).")
@click.option("--list", "list_only", is_flag=True, help="Only list VIEW's snapshots.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_settings
def snapshot(settings: Settings, view: str, from_scratch: bool, keep: int | None, list_only: bool,
             output: str) -> None:
    """Write a snapshot of VIEW (a table or a view) at its newest checkpoint epoch under the snapshot folder
    (MVLOG_SNAPSHOT_DIR, default <stack_dir>/snapshots): Parquet, one folder per vnode, sorted by key."""
    client = connect_redis(settings)
    if list_only:
        records = SnapshotStore.of(settings, client).all(view)
        if output == "json":
            click.echo(json.dumps([json.loads(r.to_json()) for r in records]))
        for record in records if output == "text" else []:
            click.echo(f"{describe_epoch(record.epoch)}: {record.rows} rows, {record.path}")
        return
    with backend_errors(settings):
        require_kafka(settings)
        from mvlog.services.snapshot_compaction import build_snapshot
        from mvlog.services.spark.session import spark_session

        console = Console(stderr=True)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      transient=True) as progress:
            task = progress.add_task(f"snapshot of {view}: starting Spark", total=None)
            from pyspark.sql import SparkSession

            embedded = SparkSession.getActiveSession() is not None  # called from a process that has one
            spark = spark_session(settings, app_name=f"mvlog-snapshot-{view}")
            try:
                def stage(text: str) -> None:
                    progress.update(task, description=f"snapshot of {view}: {text}")

                result = build_snapshot(settings, view, spark, client=client, from_scratch=from_scratch, keep=keep,
                                        on_stage=stage)
            except SnapshotError as error:
                raise click.ClickException(str(error)) from error
            finally:
                if not embedded:
                    spark.stop()
    if result.warning is not None:
        click.echo(f"Warning: {result.warning}", err=True)
    record = result.record
    if output == "json":
        click.echo(json.dumps({**json.loads(record.to_json()), "built": result.built, "warning": result.warning,
                               "dropped": [r.epoch for r in result.dropped]}))
        return
    origin = f"the snapshot at epoch {record.base_epoch}" if record.base_epoch else "the changelog's start"
    verb = "Wrote" if result.built else "Already had"
    click.echo(f"{verb} snapshot of {view} at {describe_epoch(record.epoch)}: {record.rows} rows from {origin}, "
               f"in {record.path}.")
    if result.dropped:
        click.echo(f"Deleted {len(result.dropped)} older snapshot(s): epochs "
                   f"{', '.join(str(r.epoch) for r in result.dropped)}.")
