"""What a source table reads: the user's topic and the format of its messages.

A source table is a root table whose rows come from a topic mvlog does not own (an application's event
topic, Debezium's topic of a database table) instead of ``Table.upsert``. Its settings live in the
catalog entry's ``options`` (strings, under ``source.*``), so a catalog rebuilt from Kafka after a
Redis wipe still knows where the table's rows come from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from mvlog.row_schema import ColumnType, RowSchema

_TOPIC, _FORMAT, _GENERATED_KEY = "source.topic", "source.format", "source.generated_key"
_REGISTRY = "source.schema_registry"  # the Schema Registry URL of an Avro source (else the settings')
_AVRO_SCHEMA = "source.avro.schema."  # + schema id: a writer schema's JSON given as an .avsc file


class SourceFormat(StrEnum):
    """How a message of the source topic maps to a change of the table's rows (see README, Source tables)."""

    UPSERT_JSON = "upsert-json"  # key = primary key, value = whole row, null value = delete (KTable)
    APPEND_JSON = "append-json"  # every message a new row
    DEBEZIUM_JSON = "debezium-json"  # Debezium's envelope: op, before, after, source
    UPSERT_AVRO = "upsert-avro"  # as upsert-json, Confluent-framed Avro
    APPEND_AVRO = "append-avro"  # as append-json, Confluent-framed Avro
    DEBEZIUM_AVRO = "debezium-avro"  # as debezium-json, Debezium's AvroConverter (Confluent framing)

    @property
    def is_avro(self) -> bool:
        return self.value.endswith("-avro")

    @property
    def kind(self) -> str:
        """``upsert``, ``append`` or ``debezium``: the mapping of a message to changes, whatever the encoding."""
        return self.value.split("-", 1)[0]

    @classmethod
    def parse(cls, name: str) -> SourceFormat:
        try:
            return cls(name.strip().lower())
        except ValueError:
            raise ValueError(f"unknown source format {name!r}; use one of {', '.join(cls)}") from None


class SourceSpecError(ValueError):
    """A source declaration that cannot work with the table's schema (refused at create time)."""


@dataclass(frozen=True)
class SourceSpec:
    """The source of a table: ``topic`` in ``format``; ``generated_key`` names the key column an
    ``append-json`` table fills with ``"<partition>-<offset>"`` of each message (else the key columns
    come from the message's value)."""

    topic: str
    format: SourceFormat
    generated_key: str | None = None
    schema_registry: str | None = None  # Avro: the registry's URL for this table (else the settings')
    avro_schemas: Mapping[int, str] = field(default_factory=dict)  # Avro: schema id -> writer schema JSON

    def to_options(self) -> dict[str, str]:
        options = {_TOPIC: self.topic, _FORMAT: self.format.value}
        if self.generated_key is not None:
            options[_GENERATED_KEY] = self.generated_key
        if self.schema_registry is not None:
            options[_REGISTRY] = self.schema_registry
        for schema_id, text in sorted(self.avro_schemas.items()):
            options[f"{_AVRO_SCHEMA}{schema_id}"] = text
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceSpec | None:
        """The source of a catalog entry, None for a table written through ``Table`` (or a view)."""
        if _TOPIC not in options:
            return None
        schemas = {int(name[len(_AVRO_SCHEMA):]): text for name, text in options.items()
                   if name.startswith(_AVRO_SCHEMA)}
        return cls(options[_TOPIC], SourceFormat.parse(options[_FORMAT]), options.get(_GENERATED_KEY),
                   options.get(_REGISTRY), schemas)

    def check(self, schema: RowSchema) -> None:
        """Refuse a declaration the table's schema cannot serve, with what to change."""
        if not self.topic.strip():
            raise SourceSpecError("the source topic name is empty")
        if not self.format.is_avro and (self.schema_registry is not None or self.avro_schemas):
            raise SourceSpecError(f"Avro schemas and a Schema Registry are for Avro formats, not {self.format.value}")
        if self.generated_key is None:
            return
        if self.format.kind != "append":
            raise SourceSpecError(f"a generated key is for append-json sources, not {self.format.value} "
                                  "(append-avro takes one too)")
        if self.generated_key not in schema.names:
            raise SourceSpecError(f"generated key column {self.generated_key!r} is not a column")
        if schema.primary_key != (self.generated_key,):
            raise SourceSpecError(f"the primary key must be the generated key column {self.generated_key!r} alone, "
                                  f"not {', '.join(schema.primary_key)}")
        if schema.column(self.generated_key).type is not ColumnType.STRING:
            raise SourceSpecError(f"generated key column {self.generated_key!r} must be a string column "
                                  "(it holds \"<partition>-<offset>\")")


def source_group(topic_prefix: str, table: str) -> str:
    """The consumer group whose committed offsets say how far ``table`` ingested its source topic."""
    return f"{topic_prefix}.{table}.source"
