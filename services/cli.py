"""The ``mvlog`` command line.

Layout, so that several people can add commands without touching each other's code:

* The group :func:`main` loads :class:`~mvlog.config.Settings` once (``--config FILE``, ``MVLOG_*``
  environment variables) and hands them to commands through :func:`pass_settings`.
* Small commands live in this file (the local stack ones below). Bigger ones live in their own module
  and are listed in :data:`LAZY_COMMANDS` as ``"name": "module:attribute"``; they are imported only when
  invoked, so ``mvlog --help`` stays fast and a command's heavy imports (pyspark, faust) never slow the
  others down.
* Errors a user can act on are shown as one clean line (``Error: ...``), never a traceback: raise
  ``click.ClickException`` or one of :data:`USER_ERRORS`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from pydantic import ValidationError

from mvlog.catalog import CatalogError
from mvlog.config import Settings, load_settings
from mvlog.infra.local_stack import LocalStack, StackError, record_stack, recorded_stacks
from mvlog.services.commands.values import PORT, SECONDS

F = TypeVar("F", bound=Callable[..., Any])

#: Commands implemented in other modules: name -> "module:attribute" (a click.Command).
LAZY_COMMANDS: dict[str, str] = {
    "alter-view": "mvlog.services.commands.definitions:alter_view_command",
    "cache-worker": "mvlog.services.commands.cache_worker:cache_worker",
    "create-table": "mvlog.services.commands.tables:create_table",
    "create-view": "mvlog.services.commands.definitions:create_view_command",
    "dashboard": "mvlog.services.commands.dashboard:dashboard",
    "demo": "mvlog.services.commands.demo:demo",
    "drop-table": "mvlog.services.commands.definitions:drop_table_command",
    "drop-view": "mvlog.services.commands.definitions:drop_view_command",
    "insert": "mvlog.services.commands.tables:insert",
    "lag": "mvlog.services.commands.status:lag",
    "lag-sampler": "mvlog.services.commands.status:lag_sampler",
    "read": "mvlog.services.commands.read:read",
    "replace": "mvlog.services.commands.replacement:replace",
    "replacement": "mvlog.services.commands.replacement:replacement",
    "replay": "mvlog.services.commands.replay:replay",
    "run-source": "mvlog.services.commands.sources:run_source",
    "run-view": "mvlog.services.commands.run_view:run_view",
    "snapshot": "mvlog.services.commands.snapshot:snapshot",
    "status": "mvlog.services.commands.status:status",
    "views": "mvlog.services.commands.listing:views",
}

#: Exceptions whose message is shown to the user as is (``Error: <message>``, exit code 1).
USER_ERRORS: tuple[type[BaseException], ...] = (StackError, ValidationError, FileNotFoundError, CatalogError)


class MvlogGroup(click.Group):
    """A click group that loads :data:`LAZY_COMMANDS` on demand and shows user errors cleanly."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in LAZY_COMMANDS:
            module_name, _, attribute = LAZY_COMMANDS[cmd_name].partition(":")
            command = cast(click.Command, getattr(importlib.import_module(module_name), attribute))
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as error:
            raise click.ClickException(_one_line(error)) from error


def _one_line(error: BaseException) -> str:
    if isinstance(error, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in error.errors()
        )
        return f"invalid settings: {problems}"
    return str(error)


@click.group(cls=MvlogGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML settings file (default: $MVLOG_CONFIG, else ./mvlog.toml when present).",
)
@click.version_option(package_name="mvlog")
@click.pass_context
def main(ctx: click.Context, config_file: Path | None) -> None:
    """mvlog: materialized views kept consistent across Kafka changelogs cut into epochs."""
    ctx.obj = _SettingsHolder(config_file)


class _SettingsHolder:
    """Loads the settings the first time a command asks for them (``--help`` never does)."""

    def __init__(self, config_file: Path | None) -> None:
        self.config_file = config_file
        self._settings: Settings | None = None

    def get(self) -> Settings:
        if self._settings is None:
            if self.config_file is not None and not self.config_file.is_file():
                raise click.ClickException(f"settings file {self.config_file} does not exist")
            self._settings = load_settings(self.config_file)
        return self._settings


def pass_settings(command: F) -> F:
    """Decorator: call the command with the loaded :class:`Settings` as its first argument."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        holder = click.get_current_context().find_object(_SettingsHolder)
        settings = holder.get() if holder is not None else load_settings()
        return command(settings, *args, **kwargs)

    return cast(F, wrapper)


# ------------------------------------------------------------------------------------ the local stack

_stack_dir_option = click.option(
    "--stack-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the stack's pid files, logs and data (default: settings' stack_dir, .mvlog/).",
)
_find_help = ("Without --stack-dir, the stack is the one of the settings' stack_dir (MVLOG_STACK_DIR, exported "
              "by `mvlog up`), else the one `mvlog up` recorded for this user at the settings' ports (or the "
              "only one it recorded), from any directory.")


@main.command()
@_stack_dir_option
@click.option("--kafka-port", type=PORT, default=None,
              help="Broker port on 127.0.0.1 (default: the port of MVLOG_BOOTSTRAP_SERVERS, 19092).")
@click.option("--redis-port", type=PORT, default=None,
              help="Redis port on 127.0.0.1 (default: the port of MVLOG_REDIS_URL, 16379).")
@click.option("--timeout", type=SECONDS, default=90.0, show_default=True,
              help="Seconds to wait for each process to answer.")
@pass_settings
def up(settings: Settings, stack_dir: Path | None, kafka_port: int | None, redis_port: int | None,
       timeout: float) -> None:
    """Start the local stack (Apache Kafka + redis-server on loopback) in the background.

    Prints the `export` lines that point mvlog at it on standard output, so `eval "$(mvlog up)"` works.
    The stack is durable: its topics and Redis data stay in the stack folder across `mvlog down` and
    `mvlog up`. When one of the two runs already, only the other is started; nothing is deleted.
    """
    stack = LocalStack.from_settings(settings, data_dir=stack_dir, kafka_port=kafka_port,
                                     redis_port=redis_port, start_timeout_s=timeout)
    running = LocalStack.load(stack.data_dir)
    if running is not None and running.is_running():
        click.echo(f"A local stack is already running from {running.data_dir}.", err=True)
        record_stack(running.data_dir)
        _print_addresses(running, settings)
        return
    fresh = not stack.kafka_dir.exists()
    report = stack.start()
    record_stack(stack.data_dir)  # so that `mvlog down` finds it from any directory
    if report.kept:
        click.echo(f"Kept {' and '.join(report.kept)} running; started {' and '.join(report.started)} "
                   f"(data and logs in {stack.data_dir}).", err=True)
    else:
        state = "new, empty" if fresh else "its data kept from the last run"
        click.echo(f"Local stack started ({state}; data and logs in {stack.data_dir}).", err=True)
    _print_addresses(stack, settings)


def _print_addresses(stack: LocalStack, settings: Settings) -> None:
    click.echo(f"  Kafka:  {stack.bootstrap_servers}", err=True)
    click.echo(f"  Redis:  {stack.redis_url}", err=True)
    click.echo(f"  logs:   {stack.log_dir}", err=True)
    click.echo("Point mvlog at it with:", err=True)
    for name, value in stack.env().items():
        click.echo(f"export {name}={value}")
    click.echo("Stop it with: mvlog down (its data stays; --purge deletes it)", err=True)


def _find_stack(settings: Settings, stack_dir: Path | None) -> tuple[Path, LocalStack | None]:
    """The folder of the stack that `down` and `stack-status` act on, with the stack recorded there.

    `mvlog up` may have run in another directory, so the relative default ``.mvlog`` is not enough: see
    :data:`_find_help` for the order. Several recorded stacks and no way to choose is refused, naming them.
    """
    if stack_dir is not None:
        return stack_dir, LocalStack.load(stack_dir)
    if (here := LocalStack.load(settings.stack_dir)) is not None:
        return settings.stack_dir, here
    recorded = recorded_stacks()
    wanted = LocalStack.from_settings(settings)
    matching = [s for s in recorded if (s.kafka_port, s.redis_port) == (wanted.kafka_port, wanted.redis_port)]
    explicit = bool({"bootstrap_servers", "redis_url"} & settings.model_fields_set)
    candidates = matching if matching or explicit else recorded
    if len(candidates) > 1:
        raise click.ClickException("several local stacks run: " + ", ".join(str(s.data_dir) for s in candidates)
                                   + "; choose one with --stack-dir")
    return (candidates[0].data_dir, candidates[0]) if candidates else (settings.stack_dir, None)


@main.command(epilog=_find_help)
@_stack_dir_option
@click.option("--purge", is_flag=True,
              help="Also delete the stack's data: every topic of the broker and every Redis key.")
@pass_settings
def down(settings: Settings, stack_dir: Path | None, purge: bool) -> None:
    """Stop the local stack started by `mvlog up`; its data stays for the next `mvlog up` unless --purge."""
    data_dir, found = _find_stack(settings, stack_dir)
    stack = found or LocalStack.from_settings(settings, data_dir=data_dir)
    record_stack(data_dir, forget=True)
    if stack.stop():
        click.echo(f"Local stack in {data_dir} stopped.")
    else:
        click.echo(f"No local stack is running from {data_dir}; nothing to stop.")
    if purge:
        deleted = stack.purge()
        if deleted:
            click.echo("Deleted " + " and ".join(
                f"{folder} ({what})" for folder, what in zip(deleted, _purged_what(stack, deleted), strict=True)))
        else:
            click.echo(f"No data in {data_dir}; nothing to delete.")
    else:
        click.echo(f"Its data stays in {data_dir} (`mvlog down --purge` deletes it).")


def _purged_what(stack: LocalStack, deleted: list[Path]) -> list[str]:
    names = {stack.kafka_dir: "the broker's log: every table's, view's and catalog topic",
             stack.redis_dir: "Redis's append-only file: every view's state and the control plane"}
    return [names.get(folder, "data") for folder in deleted]


@main.command("stack-status", epilog=_find_help)
@_stack_dir_option
@pass_settings
def stack_status(settings: Settings, stack_dir: Path | None) -> None:
    """Show whether the local stack's broker and Redis run and answer (exit code 1 when not)."""
    data_dir, stack = _find_stack(settings, stack_dir)
    if stack is None:
        click.echo(f"No local stack recorded in {data_dir} (start one with `mvlog up`).")
        click.get_current_context().exit(1)
    statuses = stack.status()
    for status in statuses:
        click.echo(status.describe())
    if not all(s.healthy for s in statuses):
        click.echo(f"Logs: {stack.log_dir}")
        click.get_current_context().exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
