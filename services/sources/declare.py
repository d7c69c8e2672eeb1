"""Declaring a source table: a root table fed by a topic the user already has (``mvlog create-table NAME
--from-topic TOPIC --format FORMAT``), its topic checked and, for Avro, its columns derived from the writer
schema; and what says a source cannot be read (:class:`SourceError`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis
from confluent_kafka.admin import AdminClient

from mvlog.config import Settings
from mvlog.connectors.kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
from mvlog.connectors.redis.source_status import SourceStatusStore
from mvlog.row_schema import RowSchema
from mvlog.services.tables.writer import Table
from mvlog.source_avro import SchemaResolver, derive_columns
from mvlog.source_spec import SourceFormat, SourceSpec, SourceSpecError


class SourceError(RuntimeError):
    """A source that cannot be read (not a source table, topic gone, offsets deleted by retention)."""


def source_topic_partitions(settings: Settings, topic: str) -> int:
    """The partition count of the source topic; a missing topic is named with what to do.

    Asks for the metadata of all topics: a metadata request naming the topic would have a broker with
    ``auto.create.topics.enable`` (the default) create it, and the missing topic would go unnoticed."""
    admin = AdminClient(settings.kafka_client_config())
    found = admin.list_topics(timeout=15.0).topics.get(topic)
    if found is None or found.error is not None:
        raise SourceError(f"source topic {topic!r} does not exist on {settings.bootstrap_servers}: create it (or "
                          "let its producer create it) first, or check the name")
    return len(found.partitions)


def avro_resolver(settings: Settings, spec: SourceSpec) -> SchemaResolver:
    """Schema id -> writer schema JSON of an Avro source: its ``.avsc`` schemas, then its registry's.
    A registry that does not answer stops the source (:class:`SourceError`); an id nobody knows is a
    bad record (the resolver returns None)."""
    url = spec.schema_registry or settings.schema_registry_url
    registry = SchemaRegistryClient(url) if url else None

    def resolve(schema_id: int) -> str | None:
        text = spec.avro_schemas.get(schema_id)
        if text is not None or registry is None:
            return text
        try:
            return registry.schema(schema_id)
        except SchemaRegistryError as error:
            raise SourceError(f"{spec.topic}: the writer schema id {schema_id} cannot be fetched: {error}") from None

    return resolve


def latest_value_schema(settings: Settings, spec: SourceSpec) -> str:
    """The writer schema columns are derived from when ``create-table`` names none: the registry's latest
    ``<topic>-value`` schema, else the ``.avsc`` schema of the highest id."""
    url = spec.schema_registry or settings.schema_registry_url
    if url:
        subject = f"{spec.topic}-value"
        try:
            found = SchemaRegistryClient(url).latest(subject)
        except SchemaRegistryError as error:
            raise SourceError(str(error)) from None
        if found is None:
            raise SourceError(f"the Schema Registry {url} has no subject {subject!r}: register the topic's value "
                              "schema, or declare the columns (-c NAME:TYPE)")
        return found[1]
    if spec.avro_schemas:
        return spec.avro_schemas[max(spec.avro_schemas)]
    raise SourceError("no columns (-c) and no Avro schema to derive them from: give a Schema Registry URL "
                      "(--schema-registry or MVLOG_SCHEMA_REGISTRY_URL) or --avro-schema ID=FILE.avsc")


def create_source_table(settings: Settings, name: str, columns: Mapping[str, str] | None,
                        primary_key: Sequence[str], topic: str, format: str | SourceFormat, *,
                        generated_key: str | None = None, partitions: int | None = None,
                        client: redis.Redis | None = None, schema_registry: str | None = None,
                        avro_schemas: Mapping[int, str] | None = None) -> SourceSpec:
    """Declare table ``name`` fed by ``topic`` in ``format`` (the Python side of
    ``mvlog create-table NAME --from-topic TOPIC --format FORMAT``); ``mvlog run-source`` ingests it.
    For an Avro format ``columns`` may be None: they are derived from the latest value schema
    (:func:`mvlog.source_avro.derive_columns`)."""
    spec = SourceSpec(topic, SourceFormat.parse(format) if isinstance(format, str) else format, generated_key,
                      schema_registry, dict(avro_schemas or {}))
    if columns is None:
        if not spec.format.is_avro:
            raise SourceSpecError(f"{spec.format.value} needs its columns declared (-c NAME:TYPE)")
        try:
            derived = derive_columns(latest_value_schema(settings, spec), spec.format.kind == "debezium")
        except ValueError as error:
            raise SourceSpecError(f"columns cannot be derived from the Avro schema: {error}") from None
        columns = {n: t.value for n, t in derived.items()}
    spec.check(RowSchema.of(columns, primary_key))
    source_topic_partitions(settings, topic)
    table = Table.create(settings, name, columns, primary_key, partitions=partitions, client=client,
                         options=spec.to_options(), auto_commit=False)
    SourceStatusStore(table.store.redis, settings.topic_prefix).forget(name)  # a dropped namesake's
    table.close()
    return spec

