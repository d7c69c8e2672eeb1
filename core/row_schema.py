"""Row schemas of tables and views, and row validation.

mvlog rows are flat records of a few scalar types. The same schema is used to validate rows before an
epoch commits, to type the Spark data source's columns and to describe a view in the catalog.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

Row = dict[str, Any]
Key = tuple[Any, ...]


class ColumnType(StrEnum):
    INT = "int"
    FLOAT = "float"
    STRING = "string"
    BOOLEAN = "boolean"
    BYTES = "bytes"

    @classmethod
    def parse(cls, name: str) -> ColumnType:
        aliases = {
            "int": cls.INT, "integer": cls.INT, "bigint": cls.INT, "long": cls.INT, "smallint": cls.INT,
            "float": cls.FLOAT, "double": cls.FLOAT, "real": cls.FLOAT, "decimal": cls.FLOAT,
            "string": cls.STRING, "varchar": cls.STRING, "text": cls.STRING,
            "boolean": cls.BOOLEAN, "bool": cls.BOOLEAN,
            "bytes": cls.BYTES, "binary": cls.BYTES, "blob": cls.BYTES,
        }
        try:
            return aliases[name.strip().lower()]
        except KeyError:
            raise ValueError(f"unknown column type {name!r}; use one of {', '.join(cls)}") from None

    @property
    def spark_sql(self) -> str:
        return {"int": "BIGINT", "float": "DOUBLE", "string": "STRING", "boolean": "BOOLEAN",
                "bytes": "BINARY"}[self.value]


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool = True
    # A hidden column is stored with every row but is not part of ``SELECT *``: a view keeps the key
    # components it does not project (e.g. the upstream primary key of ``SELECT v1 FROM t1``) this way,
    # so the view's primary key is always made of columns and ``key_of(row)`` works for every row.
    hidden: bool = False


@dataclass(frozen=True)
class FieldError:
    """Why one row was refused: which row (its index in the call), which field, what is wrong."""

    row_index: int
    field: str
    problem: str

    def __str__(self) -> str:
        return f"row {self.row_index}: field {self.field!r}: {self.problem}"


@dataclass(frozen=True)
class RowSchema:
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    _by_name: Mapping[str, Column] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {c.name: c for c in self.columns}
        if len(by_name) != len(self.columns):
            raise ValueError("duplicate column names")
        missing = [k for k in self.primary_key if k not in by_name]
        if missing:
            raise ValueError(f"primary key column(s) {missing} are not columns")
        object.__setattr__(self, "_by_name", by_name)

    @classmethod
    def of(cls, columns: Mapping[str, str], primary_key: Sequence[str]) -> RowSchema:
        """``RowSchema.of({"id": "int", "v1": "int"}, ["id"])``; primary key columns are not nullable."""
        pk = tuple(primary_key)
        return cls(tuple(Column(n, ColumnType.parse(t), n not in pk) for n, t in columns.items()), pk)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def visible_names(self) -> list[str]:
        """The columns ``SELECT *`` returns (hidden key columns left out)."""
        return [c.name for c in self.columns if not c.hidden]

    def column(self, name: str) -> Column:
        return self._by_name[name]

    def key_of(self, row: Mapping[str, Any]) -> Key:
        return tuple(row[k] for k in self.primary_key)

    def key_row(self, key: Key) -> Row:
        return dict(zip(self.primary_key, key, strict=True))

    def validate(self, row: Any, index: int = 0) -> list[FieldError]:
        """All problems of one row (empty when it is valid)."""
        if not isinstance(row, Mapping):
            return [FieldError(index, "*", f"expected a mapping of column to value, got {type(row).__name__}")]
        errors = [FieldError(index, name, "unknown column") for name in row if name not in self._by_name]
        for column in self.columns:
            if column.name not in row or row[column.name] is None:
                if not column.nullable:
                    what = "primary key column" if column.name in self.primary_key else "column"
                    errors.append(FieldError(index, column.name, f"{what} is missing or null"))
                continue
            problem = _type_problem(column.type, row[column.name])
            if problem:
                errors.append(FieldError(index, column.name, problem))
        return errors

    def validate_key(self, key: Any, index: int = 0) -> list[FieldError]:
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) != len(self.primary_key):
            return [FieldError(index, ",".join(self.primary_key),
                               f"key {key!r} has {len(key)} value(s), the primary key has {len(self.primary_key)}")]
        return self.validate(self.key_row(key) | {c.name: None for c in self.columns
                                                  if c.name not in self.primary_key and c.nullable}, index)

    def normalize(self, row: Mapping[str, Any]) -> Row:
        """A full row in column order, missing nullable columns set to None, ints widened to floats."""
        out: Row = {}
        for column in self.columns:
            value = row.get(column.name)
            if value is not None and column.type is ColumnType.FLOAT:
                value = float(value)
            out[column.name] = value
        return out

    def to_json(self) -> dict[str, Any]:
        return {"columns": [_column_json(c) for c in self.columns], "primary_key": list(self.primary_key)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RowSchema:
        columns = tuple(Column(c["name"], ColumnType(c["type"]), bool(c["nullable"]),
                               bool(c.get("hidden", False))) for c in data["columns"])
        return cls(columns, tuple(data["primary_key"]))


def _column_json(column: Column) -> dict[str, Any]:
    """``hidden`` is written only when set, so schemas without hidden columns keep their JSON."""
    out: dict[str, Any] = {"name": column.name, "type": column.type.value, "nullable": column.nullable}
    if column.hidden:
        out["hidden"] = True
    return out


def _type_problem(kind: ColumnType, value: Any) -> str | None:
    got = type(value).__name__
    match kind:
        case ColumnType.INT:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"expected int, got {got} {value!r}"
            if not INT64_MIN <= value <= INT64_MAX:
                return f"int {value} does not fit in 64 bits"
        case ColumnType.FLOAT:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"expected float, got {got} {value!r}"
            if isinstance(value, float) and math.isnan(value):
                return "NaN is not allowed"
        case ColumnType.STRING:
            if not isinstance(value, str):
                return f"expected string, got {got} {value!r}"
        case ColumnType.BOOLEAN:
            if not isinstance(value, bool):
                return f"expected boolean, got {got} {value!r}"
        case ColumnType.BYTES:
            if not isinstance(value, bytes | bytearray):
                return f"expected bytes, got {got}"
    return None
