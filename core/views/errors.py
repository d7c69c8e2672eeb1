"""Errors of view definitions and of incremental maintenance.

A view definition is refused at create time, so every message must let the user fix the SQL without
reading mvlog's code: it names the construct and where it is in the statement.
"""

from __future__ import annotations


class ViewDefinitionError(ValueError):
    """The SQL of a view cannot be planned (unknown view or column, type error, unsupported SQL)."""


class UnsupportedSql(ViewDefinitionError):  # noqa: N818 - the name the catalog and CLI report
    """Valid SQL that is outside the subset mvlog maintains incrementally."""

    def __init__(self, construct: str, fragment: str, line: int | None = None, col: int | None = None,
                 hint: str = "") -> None:
        self.construct = construct
        self.fragment = fragment
        self.line = line
        self.col = col
        where = f" at line {line}, col {col}" if line is not None else ""
        message = f"unsupported SQL: {construct}{where}: `{fragment}`"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


class SqlSyntaxError(ViewDefinitionError):
    """SQL that does not parse: the message shows the line received with a caret under the problem, in
    words (never the parser's internals), because the user has only the SQL they typed to go by."""

    def __init__(self, sql: str, line: int | None, col: int | None, problem: str) -> None:
        self.line = line
        self.col = col
        self.problem = problem
        if line is None or col is None:
            super().__init__(f"syntax error: {problem}\n  {sql}")
            return
        lines = sql.splitlines() or [""]
        text = lines[min(line, len(lines)) - 1].replace("\t", " ")  # one column per character: the caret lines up
        super().__init__(f"syntax error at line {line}, col {col}: {problem}\n  {text}\n  {' ' * (col - 1)}^")


class InconsistentChanges(ValueError):  # noqa: N818 - mirrors ViewDefinitionError's wording
    """An epoch's input does not fit the operator's state: the upstream changelog or the state is corrupt.

    Raised instead of guessing, so a broken upstream is noticed before it silently corrupts the view.
    """
