"""Parsing a view's SQL with sqlglot and refusing statement shapes outside the supported subset.

Views are written in Spark SQL (the dialect that also recomputes them), parsed once here. This module
only checks the shape of the statement (one SELECT, its clauses, the FROM and JOIN); expressions are
checked when they are bound. Every refusal carries the construct's name and its position, computed from
sqlglot's token offsets, because "unsupported SQL" alone does not tell a user what to change.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import sqlglot
from sqlglot import Token, TokenType, exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError

from mvlog.views.errors import SqlSyntaxError, UnsupportedSql, ViewDefinitionError
from mvlog.views.query import JoinKind

DIALECT = "spark"

Keyword = TokenType | str  # a token type, or words (e.g. a function's names: "CAST|TRY_CAST")

# Clauses of a SELECT that the subset does not have, with the keyword that introduces them.
REFUSED_CLAUSES: dict[str, tuple[str, Keyword | None]] = {
    "order": ("ORDER BY", TokenType.ORDER_BY),
    "limit": ("LIMIT", TokenType.LIMIT),
    "offset": ("OFFSET", TokenType.OFFSET),
    "qualify": ("QUALIFY", TokenType.QUALIFY),
    "windows": ("WINDOW clause", TokenType.WINDOW),
    "laterals": ("LATERAL VIEW", TokenType.LATERAL),
    "sort": ("SORT BY", TokenType.SORT_BY),
    "cluster": ("CLUSTER BY", TokenType.CLUSTER_BY),
    "distribute": ("DISTRIBUTE BY", TokenType.DISTRIBUTE_BY),
    "pivots": ("PIVOT", TokenType.PIVOT),
    "sample": ("TABLESAMPLE", TokenType.TABLE_SAMPLE),
    "hint": ("query hint", None),
}
_ALLOWED_CLAUSES = {"expressions", "from", "joins", "where", "group", "with", "distinct", "having"}
_SET_OPERATIONS: dict[type[exp.Expr], tuple[str, Keyword]] = {
    exp.Union: ("UNION", TokenType.UNION),
    exp.Intersect: ("INTERSECT", TokenType.INTERSECT),
    exp.Except: ("EXCEPT", TokenType.EXCEPT),
}


def arg(node: exp.Expr, name: str) -> object:
    """``node.args[name]``, also under sqlglot's trailing-underscore spelling (``from_``, ``with_``)."""
    value = node.args.get(name)
    return value if value is not None else node.args.get(name + "_")


@dataclass(frozen=True)
class TableRef:
    """One view named in FROM or JOIN (or a subquery there), with the alias its columns are qualified by."""

    view: str  # "" for a subquery
    alias: str
    node: exp.Table | exp.Subquery
    subquery: ParsedSelect | None = None  # a subquery in FROM, checked like the statement


@dataclass(frozen=True)
class JoinRef:
    """One JOIN of the FROM clause: its kind and its ON condition."""

    kind: JoinKind
    on: exp.Expr
    node: exp.Join


@dataclass(frozen=True)
class ParsedSelect:
    """A SELECT of the supported shape, with what is needed to point at any of its parts."""

    sql: str
    select: exp.Select
    tokens: tuple[Token, ...]
    tables: tuple[TableRef, ...]
    joins: tuple[JoinRef, ...]  # one per table after the first

    def position(self, node: exp.Expr, keyword: Keyword | None = None) -> tuple[int, int] | None:
        """(line, col), 1-based, of ``node``: the ``keyword`` token (a token type, or a word such as a
        function name) nearest before its first located token, else after it; without a keyword,
        its first located token. sqlglot locates identifiers, literals and most function names."""
        starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
        anchor = min(starts) if starts else None
        if keyword is None and isinstance(node, exp.Subquery | exp.Select):
            keyword = TokenType.SELECT
        if keyword is not None:
            candidates = [t.start for t in self.tokens if _matches(t, keyword)]
            before = [s for s in candidates if anchor is None or s <= anchor]
            after = [s for s in candidates if anchor is not None and s > anchor]
            if before:
                anchor = before[-1]
            elif after:
                anchor = after[0]
        return None if anchor is None else line_col(self.sql, anchor)

    def describe(self, node: exp.Expr, keyword: Keyword | None = None) -> str:
        """```fragment``` at line L, col C: the way every error message points at a piece of SQL."""
        where = self.position(node, keyword)
        at = f" at line {where[0]}, col {where[1]}" if where else ""
        return f"`{fragment(node)}`{at}"

    def unsupported(self, construct: str, node: exp.Expr, keyword: Keyword | None = None,
                    hint: str = "") -> UnsupportedSql:
        line, col = self.position(node, keyword) or (None, None)
        return UnsupportedSql(construct, fragment(node), line, col, hint=hint)


def _matches(token: Token, keyword: Keyword) -> bool:
    if isinstance(keyword, TokenType):
        return bool(token.token_type == keyword)
    return token.text.upper() in keyword.upper().split("|")


def fragment(node: exp.Expr) -> str:
    return node.sql(dialect=DIALECT)


def line_col(sql: str, offset: int) -> tuple[int, int]:
    line = sql.count("\n", 0, offset) + 1
    col = offset - (sql.rfind("\n", 0, offset) + 1) + 1
    return line, col


def parse_select(sql: str) -> ParsedSelect:
    """Parse ``sql`` and check it is one SELECT over one view or a chain of joins."""
    tokens, statement = parse_statement(sql)
    partial = ParsedSelect(sql, exp.Select(), tokens, (), ())
    for kind, (construct, keyword) in _SET_OPERATIONS.items():
        if isinstance(statement, kind):
            raise partial.unsupported(construct, statement, keyword)
    if isinstance(statement, exp.Subquery):
        raise partial.unsupported("parenthesized query", statement)
    if not isinstance(statement, exp.Select):
        raise partial.unsupported(f"{statement.key.upper()} statement", statement,
                                  hint="a view is defined by a SELECT")
    _check_clauses(partial, statement)
    tables, joins = _check_from(partial, statement)
    return ParsedSelect(sql, statement, tokens, tables, joins)


@dataclass(frozen=True)
class UnionAll:
    """``branch UNION ALL branch ...``: each branch a SELECT of the supported shape, in order."""

    parsed: ParsedSelect  # the statement's context (its SELECT is a placeholder)
    node: exp.Union
    branches: tuple[ParsedSelect, ...]


def parse_union_all(sql: str) -> UnionAll | None:
    """The branches of ``sql`` when it is a UNION ALL of SELECTs (None for any other statement, which
    :func:`parse_select` checks)."""
    tokens, statement = parse_statement(sql)
    if not isinstance(statement, exp.Union):
        return None
    partial = ParsedSelect(sql, exp.Select(), tokens, (), ())
    nodes: list[exp.Expr] = []
    node: exp.Expr = statement
    while isinstance(node, exp.Union):
        for name in ("by_name", "side", "kind", "on", "order", "limit", "offset"):
            if node.args.get(name):
                raise partial.unsupported(f"UNION ALL with {name.replace('_', ' ').upper()}", node, TokenType.UNION)
        if node.args.get("distinct"):  # pointed at by the keyword before its right-hand query
            raise partial.unsupported("UNION", node.expression, TokenType.UNION,
                                      hint="UNION removes duplicates; write UNION ALL")
        nodes.append(node.expression)
        node = node.this
    nodes.append(node)
    branches = tuple(check_subquery(partial, branch) for branch in reversed(nodes))
    return UnionAll(partial, statement, branches)


def parse_statement(sql: str) -> tuple[tuple[Token, ...], exp.Expr]:
    """The tokens and the one statement of ``sql``."""
    try:
        tokens = tuple(sqlglot.tokenize(sql, read=DIALECT))
        for token, following in itertools.pairwise(tokens):
            if token.token_type == TokenType.WINDOW and following.token_type == TokenType.L_PAREN:
                token.token_type = TokenType.VAR  # Spark's window(ts, '10 seconds'), not a WINDOW clause
        dialect = Dialect.get_or_raise(DIALECT)
        statements = [s for s in dialect.parser().parse(list(tokens), sql) if s is not None]
    except ParseError as error:
        raise _syntax_error(sql, error) from None
    except TokenError:
        quote = _unclosed_quote(sql)
        if quote is None:
            raise SqlSyntaxError(sql, None, None, "the SQL cannot be split into tokens") from None
        raise SqlSyntaxError(sql, *line_col(sql, quote), f"{sql[quote]} is never closed") from None
    _refuse_empty_items(sql, tokens)
    if not statements:
        raise ViewDefinitionError("the view's SQL is empty; expected SELECT ... FROM ...")
    if len(statements) > 1:
        raise UnsupportedSql("more than one statement", fragment(statements[1]),
                             hint="a view is defined by exactly one SELECT")
    return tokens, statements[0]


# A comma followed by one of these (or by nothing) separates nothing: sqlglot drops such empty items
# silently (``SELECT id, FROM t1`` parses as ``SELECT id FROM t1``), so a typo would define a view.
_NOT_AFTER_COMMA = {TokenType.COMMA, TokenType.R_PAREN, TokenType.FROM, TokenType.WHERE, TokenType.GROUP_BY,
                    TokenType.JOIN, TokenType.ON, TokenType.SEMICOLON}
_PARSER_CLASS = re.compile(r"<class '[\w.]+'>")
_PARSER_TOKEN = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: .*?>")


def _refuse_empty_items(sql: str, tokens: Sequence[Token]) -> None:
    """Refuse a comma with no expression after it (a trailing comma) or a list that starts with one."""
    for before, after in zip(tokens, [*tokens[1:], None], strict=False):  # the last token has None after it
        if before.token_type == TokenType.COMMA and (after is None or after.token_type in _NOT_AFTER_COMMA):
            found = "the end of the SQL" if after is None else f"`{after.text}`"
            raise SqlSyntaxError(sql, *line_col(sql, before.start), f"expected an expression after `,`, found {found}")
        if before.token_type == TokenType.SELECT and after is not None and after.token_type == TokenType.COMMA:
            raise SqlSyntaxError(sql, *line_col(sql, after.start), "expected an expression before `,`")


def _syntax_error(sql: str, error: ParseError) -> SqlSyntaxError:
    """sqlglot's first error in words, at the start of the token it highlights (sqlglot's col is the
    token's last column); its class and token reprs (``<class 'sqlglot...Mul'>``) never reach a user."""
    if not error.errors:
        return SqlSyntaxError(sql, None, None, str(error).splitlines()[0])
    first = error.errors[0]
    highlight = str(first.get("highlight") or "")
    description = str(first.get("description") or "")
    near = f"`{highlight}`" if highlight else "the end of the SQL"
    if description.startswith("Required keyword") or _PARSER_CLASS.search(description):
        problem = f"incomplete expression before or at {near}"
    elif description.startswith("Invalid expression / Unexpected token"):
        problem = f"unexpected {near}"
    else:
        problem = _PARSER_TOKEN.sub(lambda m: "the end of the SQL" if m[1] == "SENTINEL" else f"`{m[2]}`",
                                    description)
    line, col = first.get("line"), first.get("col")
    if not isinstance(line, int) or not isinstance(col, int):
        return SqlSyntaxError(sql, None, None, problem)
    return SqlSyntaxError(sql, line, max(1, col - len(highlight) + 1) if "\n" not in highlight else col, problem)


def _unclosed_quote(sql: str) -> int | None:
    """The offset of the quote that opens a string or quoted name never closed (what the tokenizer
    fails on, without saying where), else None."""
    quote: str | None = None
    start = index = 0
    while index < len(sql):
        char = sql[index]
        if quote is None:
            if char in "'\"`":
                quote, start = char, index
        elif char == "\\" and quote != "`":
            index += 1  # an escaped character inside a string
        elif char == quote:
            quote = None
        index += 1
    return start if quote is not None else None


def check_subquery(parsed: ParsedSelect, node: exp.Expr) -> ParsedSelect:
    """A subquery (in FROM, or a WITH's common table expression) checked as a statement is: one SELECT
    of the supported shape. Positions stay those in the whole statement."""
    for kind, (construct, keyword) in _SET_OPERATIONS.items():
        if isinstance(node, kind):
            raise parsed.unsupported(construct, node, keyword)
    if isinstance(node, exp.Subquery):
        raise parsed.unsupported("parenthesized query", node)
    if not isinstance(node, exp.Select):
        raise parsed.unsupported(f"{node.key.upper()} in a subquery", node)
    _check_clauses(parsed, node)
    tables, joins = _check_from(parsed, node)
    return replace(parsed, select=node, tables=tables, joins=joins)


def common_table_expressions(parsed: ParsedSelect, node: exp.Expr | None = None
                             ) -> list[tuple[str, ParsedSelect, exp.CTE]]:
    """The WITH clause of ``parsed``'s SELECT (or of ``node``): (name, its query, its node), in order."""
    clause = arg(node if node is not None else parsed.select, "with")
    if not isinstance(clause, exp.With):
        return []
    if clause.args.get("recursive"):
        raise parsed.unsupported("WITH RECURSIVE", clause, TokenType.WITH,
                                 hint="a recursive query is not maintained incrementally")
    out = []
    for cte in clause.expressions:
        alias = cte.args.get("alias")
        if isinstance(alias, exp.TableAlias) and alias.columns:
            raise parsed.unsupported("column aliases on a common table expression", cte)
        out.append((cte.alias, check_subquery(parsed, cte.this), cte))
    return out


def _check_clauses(parsed: ParsedSelect, select: exp.Select) -> None:
    for name, value in select.args.items():
        clause = name.rstrip("_")
        if not value or clause in _ALLOWED_CLAUSES:
            continue
        construct, keyword = REFUSED_CLAUSES.get(clause, (clause.upper(), None))
        node = value if isinstance(value, exp.Expr) else select
        if isinstance(value, list) and value and isinstance(value[0], exp.Expr):
            node = value[0]
        raise parsed.unsupported(construct, node, keyword)
    distinct = select.args.get("distinct")
    if isinstance(distinct, exp.Distinct) and distinct.args.get("on") is not None:
        raise parsed.unsupported("SELECT DISTINCT ON", distinct.args["on"], TokenType.DISTINCT,
                                 hint="write SELECT DISTINCT over whole rows, or a top-N per group")
    group = select.args.get("group")
    if isinstance(group, exp.Group):
        for name in ("rollup", "cube", "grouping_sets", "totals", "all"):
            if group.args.get(name):
                construct = f"GROUP BY {name.replace('_', ' ').upper()}"
                raise parsed.unsupported(construct, group, TokenType.GROUP_BY)
    if not select.expressions:
        raise ViewDefinitionError("the view's SELECT list is empty")


def _check_from(parsed: ParsedSelect, select: exp.Select) -> tuple[tuple[TableRef, ...], tuple[JoinRef, ...]]:
    source = arg(select, "from")
    if not isinstance(source, exp.From):
        raise ViewDefinitionError("the view's SELECT has no FROM clause; a view reads one view or a join "
                                  "of several")
    if source.expressions:
        raise parsed.unsupported("FROM with several views (implicit cross join)", source, TokenType.FROM,
                                 hint="write FROM a JOIN b ON a.x = b.y")
    tables = [_table(parsed, source.this)]
    joins: Sequence[exp.Join] = select.args.get("joins") or []
    refs = []
    for join in joins:
        kind = _check_join(parsed, join)
        tables.append(_table(parsed, join.this))
        refs.append(JoinRef(kind, join.args["on"], join))
    return tuple(tables), tuple(refs)


def _check_join(parsed: ParsedSelect, join: exp.Join) -> JoinKind:
    side = str(join.args.get("side") or "").upper()
    kind = str(join.args.get("kind") or "").upper()
    method = str(join.args.get("method") or "").upper()
    if method:
        raise parsed.unsupported(f"{method} JOIN", join, getattr(TokenType, method, None))
    if kind and kind not in ("INNER", "OUTER"):
        construct = f"{side} {kind} JOIN" if side else f"{kind} JOIN"
        raise parsed.unsupported(construct, join, getattr(TokenType, side or kind, None),
                                 hint="the joins are [INNER], LEFT, RIGHT and FULL [OUTER] JOIN ... ON")
    if join.args.get("using"):
        raise parsed.unsupported("JOIN ... USING", join, TokenType.USING, hint="write ON a.x = b.x")
    on = join.args.get("on")
    if on is None or (isinstance(on, exp.Boolean) and "start" not in on.meta):  # Spark reads it as ON TRUE
        raise parsed.unsupported("JOIN without ON", join, TokenType.JOIN, hint="write ON a.x = b.y")
    return JoinKind(side) if side else JoinKind.INNER


def _table(parsed: ParsedSelect, node: exp.Expr) -> TableRef:
    if isinstance(node, exp.Subquery):
        alias = node.args.get("alias")
        if not isinstance(alias, exp.TableAlias) or not alias.name:
            raise ViewDefinitionError(f"a subquery in FROM needs a name: {parsed.describe(node)} AS name")
        if alias.columns:
            raise parsed.unsupported("column aliases on a subquery in FROM", node)
        return TableRef("", alias.name, node, check_subquery(parsed, node.this))
    if isinstance(node, exp.Select):
        raise parsed.unsupported("subquery in FROM", node, TokenType.SELECT)
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        raise parsed.unsupported(f"{node.key.upper()} in FROM", node, hint="FROM must name a view")
    for name in ("laterals", "joins", "pivots", "sample", "version", "when", "partition", "changes"):
        if node.args.get(name):
            raise parsed.unsupported(REFUSED_CLAUSES.get(name, (name.upper(), None))[0], node)
    if node.args.get("db") or node.args.get("catalog"):
        raise ViewDefinitionError(f"view names are not qualified by a database: {parsed.describe(node)}")
    alias = node.args.get("alias")
    if isinstance(alias, exp.TableAlias) and alias.columns:
        raise parsed.unsupported("column aliases on a view in FROM", node)
    return TableRef(node.name, node.alias_or_name, node)
