"""Producer commands on root tables: ``mvlog create-table`` and ``mvlog insert`` (JSON lines in, one epoch)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import IO, Any

import click

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.row_schema import ColumnType, RowSchema
from mvlog.services.cli import pass_settings
from mvlog.services.commands.backends import backend_errors, connect_redis, require_kafka
from mvlog.services.commands.names import check_name
from mvlog.services.commands.output import describe_epoch, describe_schema
from mvlog.services.commands.values import PARTITIONS, key_from_json, row_from_json
from mvlog.services.tables.writer import RowValidationError, Table
from mvlog.source_spec import SourceFormat, SourceSpec, SourceSpecError

#: Refused lines shown one by one; the rest are counted.
MAX_PROBLEMS_SHOWN = 100


# ---------------------------------------------------------------------------------------- create-table


def parse_columns(specs: Sequence[str]) -> dict[str, ColumnType]:
    """``["id:int", "v1:int"]`` as column name -> type (clean errors for bad specs and duplicates)."""
    columns: dict[str, ColumnType] = {}
    for spec in specs:
        name, colon, type_name = spec.partition(":")
        if not colon or not name.strip() or not type_name.strip():
            raise click.BadParameter(f"{spec!r} is not NAME:TYPE (e.g. id:int); types: "
                                     f"{', '.join(ColumnType)}", param_hint="--column")
        name = check_name(name.strip(), "column")
        try:
            kind = ColumnType.parse(type_name)
        except ValueError as error:
            raise click.BadParameter(f"{spec!r}: {error}", param_hint="--column") from None
        if name in columns:
            raise click.BadParameter(f"column {name!r} is given twice", param_hint="--column")
        columns[name] = kind
    return columns


def parse_primary_key(values: Sequence[str], columns: dict[str, ColumnType]) -> list[str]:
    """``--primary-key a --primary-key b`` or ``--primary-key a,b``: key columns in key order."""
    key = [name.strip() for value in values for name in value.split(",") if name.strip()]
    for name in key:
        if name not in columns:
            raise click.BadParameter(f"{name!r} is not a column (columns: {', '.join(columns)})",
                                     param_hint="--primary-key")
    if len(set(key)) != len(key):
        raise click.BadParameter(f"a column appears twice in the key {', '.join(key)}", param_hint="--primary-key")
    if not key:
        raise click.BadParameter("name at least one column", param_hint="--primary-key")
    return key


@click.command("create-table")
@click.argument("name")
@click.option("--column", "-c", "columns", multiple=True, metavar="NAME:TYPE",
              help=f"A column (repeat for each, in order). Types: {', '.join(ColumnType)}; "
                   "key columns are NOT NULL, the others nullable. An Avro source without columns takes "
                   "them from its latest value schema.")
@click.option("--primary-key", "-k", "primary_key", multiple=True, required=True, metavar="COLUMN",
              help="Primary key column(s), in key order: repeat the option or separate with commas.")
@click.option("--partitions", type=PARTITIONS, default=None,
              help="Partitions of the table's changelog topic (default: settings' partitions).")
@click.option("--from-topic", "from_topic", default=None, metavar="TOPIC",
              help="Feed the table from this existing topic (run `mvlog run-source NAME` to ingest it).")
@click.option("--format", "source_format", default=None, metavar="FORMAT",
              help=f"Format of --from-topic's messages: {', '.join(SourceFormat)}.")
@click.option("--generated-key", "generated_key", default=None, metavar="COLUMN",
              help='append-json: the (string) key column filled with "<partition>-<offset>" of each message.')
@click.option("--schema-registry", "schema_registry", default=None, metavar="URL",
              help="Avro formats: the Schema Registry of the topic's schemas (default: MVLOG_SCHEMA_REGISTRY_URL).")
@click.option("--avro-schema", "avro_schemas", multiple=True, metavar="ID=FILE.avsc",
              help="Avro formats without a registry: the writer schema of Confluent schema id ID (repeatable).")
@pass_settings
def create_table(settings: Settings, name: str, columns: tuple[str, ...], primary_key: tuple[str, ...],
                 partitions: int | None, from_topic: str | None, source_format: str | None,
                 generated_key: str | None, schema_registry: str | None, avro_schemas: tuple[str, ...]) -> None:
    """Create root table NAME: its catalog entry and its changelog topic.

    Example: mvlog create-table t1 --column id:int --column v1:int --column deleted:boolean --primary-key id

    With --from-topic TOPIC --format FORMAT the table's rows come from an existing topic (see the
    README's "Source tables"), ingested exactly once by `mvlog run-source NAME`.
    """
    check_name(name, "table")
    schemas = _avro_schemas(avro_schemas)
    if not columns:
        if from_topic is not None and source_format is not None and source_format.strip().lower().endswith("-avro"):
            _create_avro_derived(settings, name, primary_key, partitions, from_topic, source_format,
                                 generated_key, schema_registry, schemas)
            return
        raise click.UsageError("give the table's columns (--column NAME:TYPE, repeatable)")
    types = parse_columns(columns)
    key = parse_primary_key(primary_key, types)
    schema = RowSchema.of({n: t.value for n, t in types.items()}, key)
    spec = _source_spec(from_topic, source_format, generated_key, schema, schema_registry, schemas)
    client = connect_redis(settings)
    with backend_errors(settings):
        if (existing := CatalogStore(settings, client).find(name)) is not None:
            raise click.ClickException(f"{existing.kind} {name!r} already exists")
        require_kafka(settings)
        if spec is not None:
            from mvlog.services.sources.declare import SourceError, create_source_table

            try:
                create_source_table(settings, name, {n: t.value for n, t in types.items()}, key, spec.topic,
                                    spec.format, generated_key=spec.generated_key, partitions=partitions,
                                    client=client, schema_registry=spec.schema_registry,
                                    avro_schemas=spec.avro_schemas)
            except SourceError as error:
                raise click.ClickException(str(error)) from None
            click.echo(f"Created table {name} ({describe_schema(schema)}) fed by topic {spec.topic} "
                       f"({spec.format.value}); changelog topic {settings.changelog_topic(name)}. "
                       f"Ingest it with: mvlog run-source {name}")
            return
        table = Table.create(settings, name, {n: t.value for n, t in types.items()}, key,
                             partitions=partitions, client=client, auto_commit=False)
        table.close()
    click.echo(f"Created table {name} ({describe_schema(schema)}) with {table.entry.partitions} partition(s); "
               f"changelog topic {settings.changelog_topic(name)}.")


def _avro_schemas(values: Sequence[str]) -> dict[int, str]:
    """``--avro-schema ID=FILE.avsc`` as schema id -> the file's JSON (checked to parse as Avro)."""
    from fastavro import parse_schema

    schemas: dict[int, str] = {}
    for value in values:
        schema_id, equals, path = value.partition("=")
        if not equals or not schema_id.strip().isdigit():
            raise click.BadParameter(f"{value!r} is not ID=FILE.avsc (ID: the Confluent schema id)",
                                     param_hint="--avro-schema")
        try:
            with open(path.strip(), encoding="utf-8") as file:
                text = file.read()
            parse_schema(json.loads(text))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise click.BadParameter(f"{path.strip()}: not a readable Avro schema: {error}",
                                     param_hint="--avro-schema") from None
        schemas[int(schema_id)] = json.dumps(json.loads(text), separators=(",", ":"))
    return schemas


def _create_avro_derived(settings: Settings, name: str, primary_key: tuple[str, ...], partitions: int | None,
                         topic: str, format_name: str, generated_key: str | None, schema_registry: str | None,
                         schemas: dict[int, str]) -> None:
    """create-table of an Avro source without columns: they come from its latest value schema."""
    from mvlog.services.sources.declare import SourceError, create_source_table

    key = [k.strip() for value in primary_key for k in value.split(",") if k.strip()]
    if not key:
        raise click.BadParameter("name at least one column", param_hint="--primary-key")
    client = connect_redis(settings)
    with backend_errors(settings):
        if (existing := CatalogStore(settings, client).find(name)) is not None:
            raise click.ClickException(f"{existing.kind} {name!r} already exists")
        require_kafka(settings)
        try:
            spec = create_source_table(settings, name, None, key, topic, format_name, generated_key=generated_key,
                                       partitions=partitions, client=client, schema_registry=schema_registry,
                                       avro_schemas=schemas)
        except (SourceError, SourceSpecError, ValueError) as error:
            raise click.ClickException(str(error)) from None
        entry = CatalogStore(settings, client).get(name)
    click.echo(f"Created table {name} ({describe_schema(entry.schema)}, columns from the Avro schema) fed by "
               f"topic {spec.topic} ({spec.format.value}); changelog topic {settings.changelog_topic(name)}. "
               f"Ingest it with: mvlog run-source {name}")


def _source_spec(topic: str | None, format_name: str | None, generated_key: str | None,
                 schema: RowSchema, schema_registry: str | None = None,
                 avro_schemas: dict[int, str] | None = None) -> SourceSpec | None:
    """The source declared by --from-topic/--format/--generated-key, checked against the schema."""
    if topic is None:
        if format_name is not None or generated_key is not None or schema_registry or avro_schemas:
            raise click.UsageError("--format and --generated-key declare a source table: give --from-topic too")
        return None
    if format_name is None:
        raise click.UsageError(f"--from-topic needs --format ({', '.join(SourceFormat)})")
    try:
        spec = SourceSpec(topic, SourceFormat.parse(format_name), generated_key, schema_registry,
                          dict(avro_schemas or {}))
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--format") from None
    try:
        spec.check(schema)
    except SourceSpecError as error:
        raise click.UsageError(str(error)) from None
    return spec


# ---------------------------------------------------------------------------------------------- insert


class _Input:
    """The accepted rows (or keys) of the input with their line numbers, and the refused lines."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.lines: list[int] = []
        self.problems: list[tuple[int, str]] = []  # (line number, message)
        self.refused_lines: set[int] = set()

    def refuse(self, line: int, message: str) -> None:
        self.problems.append((line, message))
        self.refused_lines.add(line)


def _read_input(source: IO[str], entry: CatalogEntry, delete: bool) -> _Input:
    parsed = _Input()
    for number, text in enumerate(source, start=1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except ValueError as error:
            detail = f"{error.msg} (column {error.colno})" if isinstance(error, json.JSONDecodeError) else error
            parsed.refuse(number, f"invalid JSON: {detail}")
            continue
        item, problems = key_from_json(entry.schema, data) if delete else row_from_json(entry.schema, data)
        if problems:
            for field, problem in problems:
                parsed.refuse(number, f"field {field!r}: {problem}")
            continue
        parsed.items.append(item)
        parsed.lines.append(number)
    return parsed


def _write(table: Table, parsed: _Input, delete: bool, merge: bool) -> int:
    """Queue the parsed rows/keys; returns how many lines were accepted (refusals go to ``parsed``)."""
    if not parsed.items:
        return 0
    try:
        if delete:
            table.delete(parsed.items)
        elif merge:
            table.merge(parsed.items)
        else:
            table.upsert(parsed.items)
    except RowValidationError as error:
        for problem in error.errors:
            parsed.refuse(parsed.lines[problem.row_index], f"field {problem.field!r}: {problem.problem}")
        return len(parsed.items) - len({p.row_index for p in error.errors})
    return len(parsed.items)


@click.command("insert")
@click.argument("table_name", metavar="TABLE")
@click.option("--file", "-f", "source", type=click.File("r", encoding="utf-8"), default="-",
              help="JSON lines to read (default: standard input).")
@click.option("--delete", is_flag=True,
              help='Delete instead: each line is a key, {"id": 1} (a full row too), [1, "a"] for a key of '
                   "several columns in key order, or a bare value for a one-column key.")
@click.option("--merge", is_flag=True,
              help="Update only the columns each line gives: an omitted column keeps its current value "
                   "(for a key with no row yet it is NULL).")
@pass_settings
def insert(settings: Settings, table_name: str, source: IO[str], delete: bool, merge: bool) -> None:
    """Write rows into TABLE: one JSON object per line, committed as one epoch at the end.

    A line replaces the whole row of its key (Kafka's upsert convention): a column the line omits becomes
    NULL, also when the row existed. With --merge, omitted columns keep their current values instead.

    Prints the committed epoch on standard output. A refused line (bad JSON, unknown column, wrong type,
    missing key) is reported on standard error with its line number, field and problem; the other
    lines are still written, and the exit code is 1. Bytes columns take base64 text.
    """
    if delete and merge:
        raise click.UsageError("--delete and --merge exclude each other")
    client = connect_redis(settings)
    with backend_errors(settings):
        entry = CatalogStore(settings, client).get(table_name)
        if entry.kind != "table":
            raise click.ClickException(f"{table_name!r} is a {entry.kind}: rows go into tables; a view is "
                                       "written by its consumer (`mvlog run-view`)")
        if (fed_by := SourceSpec.from_options(entry.options)) is not None:
            raise click.ClickException(f"table {table_name!r} is fed by topic {fed_by.topic}: write to that topic "
                                       f"(`mvlog run-source {table_name}` ingests it)")
        require_kafka(settings)
        parsed = _read_input(source, entry, delete)  # all of it before writing: an interrupted read writes nothing
        epoch: int | None = None
        accepted = 0
        table = Table(settings, entry, client, auto_commit=False)
        try:
            accepted = _write(table, parsed, delete, merge)
            if accepted:
                epoch = table.flush()
        finally:
            table.close()

    for line, message in sorted(parsed.problems)[:MAX_PROBLEMS_SHOWN]:
        click.echo(f"line {line}: {message}", err=True)
    if len(parsed.problems) > MAX_PROBLEMS_SHOWN:
        click.echo(f"... and {len(parsed.problems) - MAX_PROBLEMS_SHOWN} more problem(s)", err=True)
    refused = len(parsed.refused_lines)
    what = "key(s) deleted" if delete else "row(s) merged" if merge else "row(s) written"
    refused_note = f"; {refused} line(s) refused" if refused else ""
    if epoch is None:
        click.echo(f"{table_name}: nothing committed (no line accepted{refused_note}).", err=True)
    else:
        click.echo(epoch)
        click.echo(f"{table_name}: {accepted} {what} in {describe_epoch(epoch)}{refused_note}.", err=True)
    if refused:
        click.get_current_context().exit(1)
