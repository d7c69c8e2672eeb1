"""Name resolution of one SELECT: which of its sources, and which column, a column reference names.

Names resolve the way Spark resolves them: case-insensitively, a qualifier (``a.v1``) picks the source
by its alias, an unqualified name must be in exactly one source, and a key column a subquery carries but
does not select is hidden. Errors name the query's sources and their columns, so a typo is fixed from
the message alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from mvlog.row_schema import Column
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.expr import ColumnRef
from mvlog.views.parse import ParsedSelect, fragment
from mvlog.views.query import Source


class Scope:
    """The sources of one parsed SELECT, by side (the FROM order), and the columns they offer."""

    def __init__(self, parsed: ParsedSelect, sources: Sequence[Source],
                 nullable_sides: frozenset[int] = frozenset()) -> None:
        self.parsed = parsed
        self.sources = tuple(sources)
        self.nullable_sides = nullable_sides  # sources an outer join may null-extend: every column nullable

    def column(self, node: exp.Column) -> ColumnRef:
        side, column = self.resolve(node)
        return ColumnRef(side, column.name, column.type, column.nullable or side in self.nullable_sides)

    def resolves(self, node: exp.Column) -> bool:
        """Whether ``node`` names a column of a source (GROUP BY falls back to SELECT aliases if not)."""
        try:
            self.resolve(node)
        except ViewDefinitionError:
            return False
        return True

    def resolve(self, node: exp.Column) -> tuple[int, Column]:
        """The side (source index) and column ``node`` names; a ViewDefinitionError saying why not."""
        if isinstance(node.this, exp.Star):
            raise self.parsed.unsupported(f"{fragment(node)} outside the SELECT list", node)
        if node.args.get("db") or node.args.get("catalog"):
            raise ViewDefinitionError(
                f"column references are `column` or `view.column`: {self.parsed.describe(node)}")
        qualifier = node.table
        sides = range(len(self.sources))
        if qualifier:
            sides = range(0)
            matches = [i for i, s in enumerate(self.sources) if s.alias.casefold() == qualifier.casefold()]
            if not matches:
                names = ", ".join(self._source_label(s) for s in self.sources)
                raise ViewDefinitionError(f"unknown view or alias {qualifier!r} in {self.parsed.describe(node)}; "
                                          f"the query reads {names}")
            sides = range(matches[0], matches[0] + 1)
        found: list[tuple[int, Column]] = []
        for side in sides:
            column = self._lookup(side, node.name)
            if column is not None:
                found.append((side, column))
        if not found:
            raise ViewDefinitionError(f"unknown column {node.name!r} in {self.parsed.describe(node)}; "
                                      + "; ".join(self._columns_label(i) for i in sides))
        if len(found) > 1:
            aliases = " and ".join(self.sources[side].alias for side, _ in found)
            example = f"{self.sources[found[0][0]].alias}.{node.name}"
            raise ViewDefinitionError(f"ambiguous column {node.name!r} in {self.parsed.describe(node)}: it is in "
                                      f"{aliases}; qualify it, e.g. {example}")
        side, column = found[0]
        if column.hidden:
            source = self.sources[side]
            owner = f"subquery {source.alias}" if source.view.startswith("$") else f"view {source.view!r}"
            raise ViewDefinitionError(f"column {column.name!r} of {owner} is hidden (a key "
                                      f"column the view does not select) in {self.parsed.describe(node)}")
        return side, column

    def _lookup(self, side: int, name: str) -> Column | None:
        schema = self.sources[side].schema
        if name in schema.names:
            return schema.column(name)
        folded = [c for c in schema.columns if c.name.casefold() == name.casefold()]
        return folded[0] if len(folded) == 1 else None

    def _source_label(self, source: Source) -> str:
        if source.view.startswith("$"):  # a subquery's or WITH query's internal name
            return f"subquery {source.alias}"
        return source.view if source.alias == source.view else f"{source.view} AS {source.alias}"

    def _columns_label(self, side: int) -> str:
        source = self.sources[side]
        return f"{self._source_label(source)} has columns {', '.join(source.schema.visible_names)}"

