"""``mvlog run-source NAME``: ingest a source table's topic into the table, exactly once, until stopped."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import click
import redis

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import EpochWriteError, RecordTooLargeError
from mvlog.restart_budget import RestartBudget
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.run_view import _StopOnSignal
from mvlog.source_records import BadRecordError

if TYPE_CHECKING:
    from mvlog.services.sources.ingester import IngestProgress


@click.command("run-source")
@click.argument("name")
@click.option("--until-caught-up", is_flag=True,
              help="Stop once every partition of the topic is ingested to its end (else run until stopped).")
@click.option("--accept-schema", "accept_schemas", multiple=True, type=int, metavar="ID",
              help="Avro: take messages of this writer schema id although the table's columns do not match it "
                   "(after a source stopped on a schema change; give it at every start). Repeatable.")
@pass_settings
def run_source(settings: Settings, name: str, until_caught_up: bool, accept_schemas: tuple[int, ...]) -> None:
    """Ingest table NAME's source topic (declared with `create-table NAME --from-topic TOPIC --format ...`).

    Every barrier interval the messages consumed become one epoch of the table, and the consumed offsets
    (consumer group <prefix>.NAME.source) commit in that epoch's Kafka transaction: a restart, even after
    SIGKILL, resumes exactly after the last committed epoch. SIGINT/SIGTERM commit what is read and stop.
    A bad record (undecodable, no key, wrong types, a row the table refuses) goes to the dead-letter
    topic <prefix>.NAME.dlq in the same transaction, with headers saying why and where it was, and
    ingestion goes on (counted in `mvlog status` and /metrics). A topic that is gone, offsets deleted
    by retention, or an Avro writer schema the table's columns cannot take (see --accept-schema) stop the
    source with what to do (exit code 1, and shown by `mvlog status`).
    """
    from mvlog.services.sources.declare import SourceError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = connect_redis(settings, wait=True)
    with backend_errors(settings):
        require_kafka(settings)
        try:
            with _StopOnSignal() as stop:
                progress = _ingest(settings, name, client, stop.requested, until_caught_up,
                                   frozenset(accept_schemas))
        except (SourceError, BadRecordError) as error:
            raise click.ClickException(str(error)) from None
    dead = f", {progress.dead_letters} bad record(s) dead-lettered" if progress.dead_letters else ""
    click.echo(f"{name}: {progress.messages} message(s), {progress.changes} change(s) in {progress.epochs} "
               f"epoch(s){'' if progress.last_epoch is None else f', last {progress.last_epoch}'}{dead}.", err=True)


def _ingest(settings: Settings, name: str, client: redis.Redis, stop: threading.Event,
            until_caught_up: bool, accept_schemas: frozenset[int] = frozenset()) -> IngestProgress:
    """Run an ingester until ``stop`` (or caught up); an epoch the broker failed (its transaction aborted, or
    a producer call that never returned after a broker restart) starts a new ingester after a growing delay:
    its writer fences the old one and it resumes from the committed offsets, so nothing is lost or doubled.
    Failures that keep coming (``view_restarts`` within ``view_restart_window_s``) stop the command."""
    from mvlog.services.sources.ingester import IngestProgress, SourceIngester

    budget = RestartBudget(settings.view_restarts, settings.view_restart_window_s)
    total = IngestProgress()
    while True:
        with SourceIngester(settings, name, client, accept_schemas=accept_schemas) as ingester:
            click.echo(f"{name}: ingesting topic {ingester.spec.topic} ({ingester.spec.format.value}), "
                       f"consumer group {ingester.group}", err=True)
            try:
                return total.plus(ingester.run(stop, until_caught_up=until_caught_up))
            except RecordTooLargeError:
                raise  # the same epoch again would fail the same way
            except EpochWriteError as error:
                total = total.plus(ingester.progress)
                reason = str(error)
        delay = budget.after_failure(time.monotonic())
        if delay is None:
            raise click.ClickException(f"{reason} ({budget.restarts} restarts within "
                                       f"{settings.view_restart_window_s:.0f} s: giving up)")
        click.echo(f"{reason}; ingesting again from the committed offsets in {delay:.0f} s", err=True)
        if stop.wait(delay):
            return total
