"""``UNION ALL``: the rows of every branch, each branch a SELECT planned (and maintained) on its own.

The view's columns are the first branch's names, each of the type its branches' values combine to
(an int column in one branch and a float one in another is a float column). A row of branch ``i`` is
identified by ``i`` and its key in that branch, so the view key is the hidden column ``_branch`` followed
by every branch's key columns as hidden columns (``_b<i>_<column>``: NULL in the rows of other branches).
Keys never collide across branches, so each branch's changes map to the view's one for one.

The operator runs one nested operator per branch (see ``ViewOperator``) and maps their output changes
into the view's columns without leaving Arrow; the SQL is the branches' queries, each selecting the
view's columns, under ``UNION ALL``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from mvlog.row_schema import Column, ColumnType, Key, RowSchema
from mvlog.views.binder import IncompatibleTypes, common_type
from mvlog.views.change_batch import ChangeBatch
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.evaluate import arrow_type

if TYPE_CHECKING:
    from mvlog.views.plan import ViewPlan

BRANCH = "_branch"

# Where each view column of a branch's row comes from: a column of the branch, the branch's number, or NULL.
ColumnSource = str | int | None


def union_schema(branches: Sequence[ViewPlan]) -> RowSchema:
    """The view's schema: the branches' columns by position, then the hidden key columns."""
    names = branches[0].schema.visible_names
    for number, branch in enumerate(branches[1:], 2):
        if len(branch.schema.visible_names) != len(names):
            raise ViewDefinitionError(f"UNION ALL: branch {number} selects {len(branch.schema.visible_names)} "
                                      f"column(s), branch 1 selects {len(names)}")
    columns = []
    for position, name in enumerate(names):
        found = [b.schema.column(b.schema.visible_names[position]) for b in branches]
        try:
            kind = common_type([c.type for c in found])
        except IncompatibleTypes:
            kind = None
        if kind is None:
            types = ", ".join(f"branch {i + 1}: {c.type.value}" for i, c in enumerate(found))
            raise ViewDefinitionError(f"UNION ALL: column {position + 1} ({name}) has types that do not "
                                      f"combine ({types})")
        columns.append(Column(name, kind, any(c.nullable for c in found)))
    taken = {name.casefold() for name in names}
    hidden = [Column(_free(BRANCH, taken), ColumnType.INT, False, True)]
    for number, branch in enumerate(branches):
        for key in branch.schema.primary_key:
            column = branch.schema.column(key)
            hidden.append(Column(_free(f"_b{number}_{key}", taken), column.type, True, True))
    return RowSchema(tuple(columns + hidden), tuple(c.name for c in hidden))


def _free(name: str, taken: set[str]) -> str:
    while name.casefold() in taken:
        name = "_" + name
    taken.add(name.casefold())
    return name


def column_sources(schema: RowSchema, branches: Sequence[ViewPlan], number: int) -> list[ColumnSource]:
    """Per view column, where branch ``number``'s rows take it from."""
    visible = schema.visible_names
    sources: list[ColumnSource] = list(branches[number].schema.visible_names)
    sources.append(number)
    for other, branch in enumerate(branches):
        sources += [key if other == number else None for key in branch.schema.primary_key]
    assert len(sources) == len(schema.columns) and len(visible) == len(branches[number].schema.visible_names)
    return sources


def union_changes(schema: RowSchema, branches: Sequence[ViewPlan], outputs: Sequence[ChangeBatch]) -> ChangeBatch:
    """The view's changes of one epoch from each branch's (one change per branch key, so per view key)."""
    ops: list[pa.Array] = []
    befores: list[pa.Table] = []
    afters: list[pa.Table] = []
    keys: list[Key] = []
    widths = [len(b.schema.primary_key) for b in branches]
    for number, batch in enumerate(outputs):
        if not len(batch):
            continue
        sources = column_sources(schema, branches, number)
        ops.append(batch.ops)
        befores.append(_mapped(batch.before, batch.has_before, sources, schema))
        afters.append(_mapped(batch.after, batch.has_after, sources, schema))
        before, after = (None,) * sum(widths[:number]), (None,) * sum(widths[number + 1:])
        keys += [(number, *before, *key, *after) for key in batch.keys]
    if not ops:
        return ChangeBatch.empty(schema)
    return ChangeBatch(schema, pa.concat_arrays(ops), pa.concat_tables(befores), pa.concat_tables(afters), keys)


def _mapped(rows: pa.Table, present: pa.Array, sources: list[ColumnSource], schema: RowSchema) -> pa.Table:
    arrays = []
    for column, source in zip(schema.columns, sources, strict=True):
        kind = arrow_type(column.type)
        if isinstance(source, str):
            arrays.append(rows.column(source).cast(kind))
        elif source is None:
            arrays.append(pa.nulls(len(rows), kind))
        else:  # the branch number, where the change has a row
            arrays.append(pc.if_else(present, pa.scalar(source, kind), pa.scalar(None, kind)))
    return pa.table(arrays, names=schema.names)
