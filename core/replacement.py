"""Replacement views: the pure rules of staging a new definition for a view and cutting over to it.

A replacement is a staged definition of an existing view (Materialize's replacement materialized
views on mvlog's epochs). It hydrates read-only next to the view, and applying it at epoch ``e``
appends ``diff(view@e-, replacement@e)`` to the view's changelog as epoch ``e``'s changes. Views built
on the view keep reading the same changelog, so only schema changes they cannot notice are allowed:
unchanged columns (same name, type, nullability, visibility) and new nullable columns, with the same
primary key. Anything else is refused at stage time, naming the column and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mvlog.catalog import CatalogEntry, CatalogError
from mvlog.changes import Change, Op, change_between
from mvlog.row_schema import Key, Row, RowSchema

#: Catalog entry options that hold a staged replacement, so it is rebuilt from the catalog topic with
#: the view's entry after a Redis wipe (the entry's version is bumped by staging, applying, discarding).
OPTION_SQL = "replacement_sql"
OPTION_ID = "replacement_id"
REPLACEMENT_OPTIONS = frozenset({OPTION_SQL, OPTION_ID})

#: Barrier mutation kind of the epoch at which a replacement was applied.
APPLY_MUTATION = "apply_replacement"


class ReplacementError(CatalogError):
    """A replacement cannot be staged, applied or discarded; the message says why."""


class IncompatibleReplacementError(ReplacementError):
    """The replacement's schema would break readers of the view's changelog."""

    def __init__(self, view: str, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"incompatible replacement for {view}: " + "; ".join(self.problems)
                         + " (only new nullable columns may be added; other columns must keep their name, "
                         "type, nullability and the primary key)")


class Status(StrEnum):
    STAGED = "staged"  # hydrating or following the upstream, read-only
    APPLIED = "applied"  # now the view's definition
    DISCARDED = "discarded"


def schema_problems(old: RowSchema, new: RowSchema) -> list[str]:
    """Why ``new`` cannot replace ``old`` as the schema of a view's changelog (empty: compatible)."""
    problems: list[str] = []
    new_columns = {c.name: c for c in new.columns}
    old_names = {c.name for c in old.columns}
    for column in old.columns:
        replacement = new_columns.get(column.name)
        if replacement is None:
            problems.append(f"column {column.name!r} would be dropped")
            continue
        if replacement.type is not column.type:
            problems.append(f"column {column.name!r} changes type from {column.type.value} to "
                            f"{replacement.type.value}")
        if replacement.nullable != column.nullable:
            before, after = ("NOT NULL", "nullable") if replacement.nullable else ("nullable", "NOT NULL")
            problems.append(f"column {column.name!r} changes from {before} to {after}")
        if replacement.hidden != column.hidden:
            what = "hidden (a key column no longer selected)" if replacement.hidden else "visible"
            problems.append(f"column {column.name!r} becomes {what}")
    for column in new.columns:
        if column.name not in old_names and not column.nullable:
            problems.append(f"new column {column.name!r} is NOT NULL (new columns must be nullable: "
                            "rows written before the cut-over have no value for it)")
    if tuple(old.primary_key) != tuple(new.primary_key):
        problems.append(f"the primary key changes from ({', '.join(old.primary_key)}) to "
                        f"({', '.join(new.primary_key)})")
    return problems


def check_compatible(entry: CatalogEntry, schema: RowSchema, sources: Sequence[str]) -> None:
    """Raise :class:`IncompatibleReplacementError` unless ``schema`` over ``sources`` may replace ``entry``."""
    problems = schema_problems(entry.schema, schema)
    if tuple(sources) != tuple(entry.sources):
        problems.append(f"it reads {', '.join(sources)} but the view reads {', '.join(entry.sources)} "
                        "(a replacement keeps the view's upstreams)")
    if problems:
        raise IncompatibleReplacementError(entry.name, problems)


def with_staged(entry: CatalogEntry, replacement_id: str, sql: str) -> CatalogEntry:
    """The view's entry recording a staged replacement."""
    return entry.bumped(options={**entry.options, OPTION_ID: replacement_id, OPTION_SQL: sql})


def without_staged(entry: CatalogEntry) -> CatalogEntry:
    """The view's entry with no staged replacement."""
    return entry.bumped(options={k: v for k, v in entry.options.items() if k not in REPLACEMENT_OPTIONS})


def staged_in(entry: CatalogEntry) -> tuple[str, str] | None:
    """(id, sql) of the replacement the entry records as staged, if any."""
    replacement_id, sql = entry.options.get(OPTION_ID), entry.options.get(OPTION_SQL)
    return (replacement_id, sql) if replacement_id and sql else None


def applied_entry(entry: CatalogEntry, sql: str, schema: RowSchema, sources: Sequence[str],
                  version: int) -> CatalogEntry:
    """The view's entry once the replacement ``sql`` maintains it (``version`` fixed by the apply)."""
    options = {k: v for k, v in entry.options.items() if k not in REPLACEMENT_OPTIONS}
    return CatalogEntry(entry.name, entry.kind, schema, entry.partitions, entry.created_epoch, sql,
                        tuple(sources), version, options)


def diff_rows(old: Mapping[Key, Row], new: Mapping[Key, Row], schema: RowSchema) -> list[Change]:
    """The changes that turn the view's rows ``old`` into the replacement's rows ``new``.

    Rows are compared in the replacement's ``schema`` (a new nullable column is NULL in old rows), keys
    in a stable order so an apply that is redone after a crash writes the same changes.
    """
    changes: list[Change] = []
    for key in sorted(old.keys() | new.keys(), key=_order):
        before = schema.normalize(old[key]) if key in old else None
        after = schema.normalize(new[key]) if key in new else None
        change = change_between(key, before, after)
        if change is not None:
            changes.append(change)
    return changes


def _order(key: Key) -> tuple[Any, ...]:
    return tuple((value is None, type(value).__name__, value if value is not None else 0) for value in key)


@dataclass(frozen=True)
class DiffSummary:
    """What applying a replacement would change at one epoch: counts and a few examples of each."""

    epoch: int
    inserts: int = 0
    deletes: int = 0
    updates: int = 0
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # insert/delete/update -> rows

    @property
    def total(self) -> int:
        return self.inserts + self.deletes + self.updates

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "inserts": self.inserts, "deletes": self.deletes, "updates": self.updates,
                "samples": self.samples}


def summarize(epoch: int, changes: Sequence[Change], samples: int = 5) -> DiffSummary:
    """Counts of each kind of change, with up to ``samples`` examples of each."""
    counts = {Op.CREATE: 0, Op.DELETE: 0, Op.UPDATE: 0}
    examples: dict[str, list[dict[str, Any]]] = {"insert": [], "delete": [], "update": []}
    names = {Op.CREATE: "insert", Op.DELETE: "delete", Op.UPDATE: "update"}
    for change in changes:
        counts[change.op] += 1
        bucket = examples[names[change.op]]
        if len(bucket) < samples:
            bucket.append({"before": change.before, "after": change.after})
    return DiffSummary(epoch, counts[Op.CREATE], counts[Op.DELETE], counts[Op.UPDATE], examples)
