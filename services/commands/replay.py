"""``mvlog replay``: re-derive a view's epochs from its upstreams, or re-deliver its changelog to a group.

Modelled on ``kafka-consumer-groups --reset-offsets``: every form shows its plan (epochs, partitions,
offsets, record counts) and changes nothing unless given ``--execute``; ``--dry-run`` says so
explicitly. ``--output json`` prints the plan (and what was done) as one JSON document.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.text import Text

from mvlog.config import Settings
from mvlog.connectors.kafka.consumer_groups import ConsumerGroupError
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.epoch import MAX_EPOCH, epoch_millis
from mvlog.replay import ReplayRangeError, ReplayTargetError, parse_datetime_ms, parse_duration_ms
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.output import console, epoch_time, output_option, print_json, print_table
from mvlog.services.commands.values import EPOCH
from mvlog.services.redelivery import RedeliveryPlan, Target, execute_redelivery, plan_redelivery


@click.group("replay")
def replay() -> None:
    """Re-derive a view's changes, or re-deliver its changelog to a consumer group (dry run by default)."""


_execute_option = click.option(
    "--dry-run/--execute", "dry_run", default=True, show_default=True,
    help="--dry-run (the default) only shows the plan; --execute does it.")


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.1f} epochs/s" if speed else "- epochs/s")


@contextmanager
def _progress(total: int, description: str) -> Iterator[Any]:
    """A progress bar on standard error with the rate and the time left (stdout stays clean for --output json)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _RateColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


@contextmanager
def _task_progress(description: str) -> Iterator[Any]:
    """A progress bar of a Spark job's tasks (``on_progress(done, total)``; the total grows as stages start)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                  TimeRemainingColumn(), console=console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@contextmanager
def _replay_errors(settings: Settings) -> Iterator[None]:
    with backend_errors(settings):
        try:
            yield
        except (ReplayRangeError, ReplayTargetError, ConsumerGroupError) as error:
            raise click.ClickException(str(error)) from error


# ------------------------------------------------------------------------------------------- redeliver


@replay.command("redeliver")
@click.argument("view")
@click.option("--group", "-g", required=True, help="The consumer group whose offsets on VIEW's changelog move.")
@click.option("--to-epoch", type=EPOCH, default=None, help="Re-deliver from this epoch on (the first committed one "
              "at or after it).")
@click.option("--to-datetime", default=None, help="Re-deliver from the first epoch opened at or after this ISO 8601 "
              "time (UTC unless it has an offset).")
@click.option("--by-duration", default=None, help="Re-deliver the last DURATION (e.g. 10m, 2h, 1d).")
@click.option("--to-earliest", is_flag=True, help="Re-deliver from the oldest retained epoch.")
@click.option("--to-latest", is_flag=True, help="Skip to the end: nothing is re-delivered.")
@_execute_option
@output_option
@pass_settings
def redeliver(settings: Settings, view: str, group: str, to_epoch: int | None, to_datetime: str | None,
              by_duration: str | None, to_earliest: bool, to_latest: bool, dry_run: bool, output: str) -> None:
    """Move GROUP's offsets on VIEW's changelog to the first record of an epoch, on every partition.

    Like `kafka-consumer-groups --reset-offsets`, in epochs: the group's consumers then receive that epoch
    and everything after it. Refused while the group has active members.
    """
    chosen = [x for x in (to_epoch is not None, to_datetime, by_duration, to_earliest, to_latest) if x]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-epoch, --to-datetime, --by-duration, --to-earliest, "
                               "--to-latest")
    try:
        time_ms = (parse_datetime_ms(to_datetime) if to_datetime else
                   int(time.time() * 1000) - parse_duration_ms(by_duration) if by_duration else None)
    except (ValueError, OverflowError) as error:  # OverflowError: a duration of 400 digits
        raise click.BadParameter(str(error) if isinstance(error, ValueError) else "duration too large") from None
    if time_ms is not None and not 0 <= time_ms <= epoch_millis(MAX_EPOCH):
        raise click.BadParameter(f"{to_datetime or by_duration} is outside the time that epochs span "
                                 f"(1970-01-01 to {epoch_time(MAX_EPOCH)[:10]})")
    target = Target(epoch=to_epoch, time_ms=time_ms, earliest=to_earliest, latest=to_latest)
    client = connect_redis(settings)
    with _replay_errors(settings):
        require_kafka(settings)
        plan = plan_redelivery(settings, client, view, group, target)
        if not dry_run:
            execute_redelivery(settings, plan)
    _show_redelivery(plan, output)


def _show_redelivery(plan: RedeliveryPlan, output: str) -> None:
    if output == "json":
        print_json(plan.to_json())
        return
    start = f"epoch {plan.epoch} ({epoch_time(plan.epoch)})" if plan.epoch is not None else "the end (latest)"
    rows = [(p.partition, plan.current.get(p.partition), p.offset, p.epochs, p.changes, p.records)
            for p in plan.partitions]
    print_table(f"{plan.view}: group {plan.group} on {plan.topic} ({plan.group_state}) to {start}",
                ["partition", "current offset", "new offset", "epochs", "change events", "records"], rows,
                right_aligned=["partition", "current offset", "new offset", "epochs", "change events", "records"])
    if plan.executed:
        click.echo(f"Offsets of group {plan.group} moved: its consumers re-receive {plan.view} from {start}.")
    else:
        click.echo("Dry run: nothing changed. Run again with --execute to move the offsets.")


# ------------------------------------------------------------------------------------------- derive


@replay.command("derive")
@click.argument("view")
@click.option("--from-epoch", type=EPOCH, default=None, help="First epoch (default: the oldest retained; with "
              "--rebuild, the view's MCE).")
@click.option("--to-epoch", type=EPOCH, default=None, help="Last epoch, inclusive (default: the view's MCE).")
@click.option("--into-topic", "into", flag_value="topic", help="Write the re-derived epochs to a new changelog "
              "<prefix>.<view>.replay-<id>.changelog (or --topic-name) for inspection.")
@click.option("--rebuild", "into", flag_value="rebuild", help="Replace the view's rows and operator state in "
              "Redis with the re-derived ones (the range must end at the view's MCE; stop its consumer first).")
@click.option("--topic-name", default=None, help="With --into-topic: the name NAME of the new changelog "
              "<prefix>.NAME.changelog.")
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True,
              help="local: read the upstreams in this process; spark: bulk reads with the mvlog data source.")
@_execute_option
@output_option
@pass_settings
def derive(settings: Settings, view: str, from_epoch: int | None, to_epoch: int | None, into: str | None,
           topic_name: str | None, engine: str, dry_run: bool, output: str) -> None:
    """Re-derive VIEW's changes for a range of epochs from its upstream changelog(s).

    The operator's state at the range's start is rebuilt from the upstreams' changelogs from their first
    epoch (or, where retention deleted it, from the upstream's newest snapshot before the range and its
    changelog after it: --engine spark); each epoch of the range is then recomputed exactly as the view's
    consumer computed it.
    """
    from mvlog.services.rederive.derive import (
        Derivation,
        RedisRebuildSink,
        TopicSink,
        check_topic_name,
        plan_derivation,
    )

    if into is None:
        raise click.UsageError("say where the re-derived epochs go: --into-topic or --rebuild")
    if topic_name is not None and into != "topic":
        raise click.UsageError("--topic-name goes with --into-topic")
    client = connect_redis(settings)
    result: dict[str, Any] = {"executed": False, "dry_run": dry_run, "into": into}
    with _replay_errors(settings):
        require_kafka(settings)
        store = ViewStore(client, settings.topic_prefix)
        mce = store.mce(view)
        if into == "rebuild" and from_epoch is None:  # the state at the MCE needs that epoch only (and the
            from_epoch = mce                           # upstream rows before it), not the whole retained range
        plan = plan_derivation(settings, client, view, from_epoch, to_epoch)
        if into == "topic" and topic_name is not None:
            check_topic_name(settings, client, topic_name)
        if into == "rebuild" and plan.last != mce:
            raise click.ClickException(f"{view}: --rebuild recomputes the serving state at the view's MCE {mce}; "
                                       f"the range ends at {plan.last} (leave --to-epoch out)")
        tasks = _derivation_in_tasks(settings, client, plan, into) if engine == "spark" else None
        result["in_tasks"] = tasks is not None
        if not dry_run and tasks is not None:
            started = time.monotonic()
            with _task_progress(f"{view}: re-deriving, a Spark task per partition") as on_progress:
                if into == "topic":
                    derived = tasks.run(topic_name, on_progress)
                    result.update(topic=derived.topic, name=derived.name, epochs_written=derived.epochs,
                                  changes=derived.changes)
                else:
                    rebuilt = tasks.rebuild(on_progress)
                    result.update(rows=rebuilt.rows, changes=rebuilt.changes)
            result.update(executed=True, seconds=round(time.monotonic() - started, 3))
        elif not dry_run:
            entry = CatalogStore(settings, client).get(view)
            derivation = Derivation(settings, client, plan, engine)
            sink = TopicSink(settings, client, entry, topic_name) if into == "topic" else None
            started = time.monotonic()
            try:
                with _progress(len(plan.epochs), f"{view}: re-deriving") as advance:
                    changes = 0
                    for derived in derivation.epochs():
                        if sink is not None:
                            sink.write(derived)
                        changes += len(derived.changes)
                        advance()
            finally:
                if sink is not None:
                    sink.close()
            result.update(executed=True, changes=changes, seconds=round(time.monotonic() - started, 3))
            if sink is not None:
                result.update(topic=sink.topic, name=sink.name, epochs_written=sink.epochs)
            else:
                result["rows"] = RedisRebuildSink(store, entry).finish(derivation)
    _show_derivation(plan.to_json() | result, output)


def _derivation_in_tasks(settings: Settings, client: Any, plan: Any, into: str) -> Any:
    """The plan's derivation in Spark's tasks (:mod:`mvlog.services.rederive.tasks`; a two-view join's:
    :mod:`mvlog.services.rederive.join_tasks`), or None when the tasks do not run it (the driver engine
    derives it)."""
    from mvlog.services.rederive.join_tasks import JoinDerivation, JoinRebuild
    from mvlog.services.rederive.tasks import TaskDerivation

    if (tasks := TaskDerivation.for_plan(settings, client, plan)) is not None:
        return tasks
    if into == "rebuild":
        return JoinRebuild.for_plan(settings, client, plan)
    return JoinDerivation.for_plan(settings, client, plan)


def _show_derivation(document: dict[str, Any], output: str) -> None:
    if output == "json":
        print_json(document)
        return
    first, last = document["first_epoch"], document["last_epoch"]
    starts = [f"{u['view']}'s snapshot at epoch {u['snapshot_epoch']}" for u in document["upstreams"]
              if u.get("snapshot_epoch") is not None]
    click.echo(f"{document['view']}: {document['epochs']} epoch(s) from {first} ({epoch_time(first)}) to {last} "
               f"({epoch_time(last)}), operator state rebuilt from "
               + (", ".join(starts) + " (the others' first epoch)" if starts else "the upstreams' first epoch"))
    rows = [(u["view"], p["partition"], p["start_offset"], p["end_offset"], u["prefix_epochs"], u["range_epochs"],
             u["records"]) for u in document["upstreams"] for p in u["partitions"]]
    print_table(None, ["upstream", "partition", "from offset", "to offset", "epochs before", "epochs in range",
                       "change events (all partitions)"], rows,
                right_aligned=["partition", "from offset", "to offset", "epochs before", "epochs in range"])
    if document.get("in_tasks"):
        click.echo("Each partition of the view is re-derived by its own Spark task.")
    if not document["executed"]:
        click.echo("Dry run: nothing changed. Run again with --execute to re-derive.")
    elif document["into"] == "topic":
        click.echo(f"Wrote {document['epochs_written']} epoch(s), {document['changes']} change(s) to "
                   f"{document['topic']} in {document['seconds']} s.")
    else:
        click.echo(f"Rebuilt {document['view']}'s serving state at its MCE: {document['rows']} row(s), "
                   f"{document['changes']} change(s) re-derived in {document['seconds']} s.")
