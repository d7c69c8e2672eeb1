"""Catalog entries: what a table or view is (its schema, definition, sources, partitions)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from mvlog.row_schema import Column, ColumnType, RowSchema


class CatalogError(LookupError):
    pass


class ViewDroppedError(CatalogError):
    """The view was dropped while a process maintained it: that process stops it, and only it."""


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    kind: str  # "table" | "view"
    schema: RowSchema
    partitions: int
    created_epoch: int = 0
    sql: str | None = None
    sources: tuple[str, ...] = ()
    version: int = 1
    options: dict[str, str] = field(default_factory=dict)

    @property
    def key_columns(self) -> tuple[str, ...]:
        return self.schema.primary_key

    def bumped(self, **changes: Any) -> CatalogEntry:
        return replace(self, version=self.version + 1, **changes)

    def to_record(self) -> dict[str, Any]:
        """The Avro record of ``schemas/catalog_entry.avsc``."""
        return {
            "name": self.name, "kind": self.kind, "sql": self.sql, "sources": list(self.sources),
            "columns": [{"name": c.name, "type": c.type.value, "nullable": c.nullable, "hidden": c.hidden}
                        for c in self.schema.columns],
            "primary_key": list(self.schema.primary_key), "partitions": self.partitions,
            "created_epoch": self.created_epoch, "version": self.version, "options": dict(self.options),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CatalogEntry:
        schema = RowSchema(tuple(Column(c["name"], ColumnType(c["type"]), c["nullable"], c["hidden"])
                                 for c in record["columns"]),
                           tuple(record["primary_key"]))
        return cls(record["name"], record["kind"], schema, record["partitions"], record["created_epoch"],
                   record["sql"], tuple(record["sources"]), record["version"], dict(record["options"]))
