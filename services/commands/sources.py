"""``mvlog run-source NAME``: ingest a source table's topic into the table, exactly once, until stopped."""

from __future__ import annotations

import logging

import click

from mvlog.config import Settings
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.run_view import _StopOnSignal
from mvlog.source_records import BadRecordError


@click.command("run-source")
@click.argument("name")
@click.option("--until-caught-up", is_flag=True,
              help="Stop once every partition of the topic is ingested to its end (else run until stopped).")
@pass_settings
def run_source(settings: Settings, name: str, until_caught_up: bool) -> None:
    """Ingest table NAME's source topic (declared with `create-table NAME --from-topic TOPIC --format ...`).

    Every barrier interval the messages consumed become one epoch of the table, and the consumed offsets
    (consumer group <prefix>.NAME.source) commit in that epoch's Kafka transaction: a restart, even after
    SIGKILL, resumes exactly after the last committed epoch. SIGINT/SIGTERM commit what is read and stop.
    A bad record (undecodable, no key, wrong types, a row the table refuses) goes to the dead-letter
    topic <prefix>.NAME.dlq in the same transaction, with headers saying why and where it was, and
    ingestion goes on (counted in `mvlog status` and /metrics). A topic that is gone, or offsets deleted
    by retention, stop the source with what to do (exit code 1, and shown by `mvlog status`).
    """
    from mvlog.services.source_ingest import SourceError, SourceIngester

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = connect_redis(settings, wait=True)
    with backend_errors(settings):
        require_kafka(settings)
        try:
            with _StopOnSignal() as stop, SourceIngester(settings, name, client) as ingester:
                click.echo(f"{name}: ingesting topic {ingester.spec.topic} ({ingester.spec.format.value}), "
                           f"consumer group {ingester.group}", err=True)
                progress = ingester.run(stop.requested, until_caught_up=until_caught_up)
        except (SourceError, BadRecordError) as error:
            raise click.ClickException(str(error)) from None
    dead = f", {progress.dead_letters} bad record(s) dead-lettered" if progress.dead_letters else ""
    click.echo(f"{name}: {progress.messages} message(s), {progress.changes} change(s) in {progress.epochs} "
               f"epoch(s){'' if progress.last_epoch is None else f', last {progress.last_epoch}'}{dead}.", err=True)
