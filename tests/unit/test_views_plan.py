"""Planning views: schemas, keys, types, SQL generation, and every refusal naming its construct."""

from __future__ import annotations

import pytest
import sqlglot

from mvlog.row_schema import Column, ColumnType, RowSchema
from mvlog.views import SqlSyntaxError, UnsupportedSql, ViewDefinitionError, plan_view, to_duckdb_sql, to_spark_sql

T1 = RowSchema.of({"id": "int", "v1": "int", "deleted": "boolean"}, ["id"])
T2 = RowSchema.of({"id": "int", "t1id": "int", "w": "float", "tag": "string", "raw": "bytes"}, ["id"])
UPSTREAMS = {"t1": T1, "t2": T2}


def plan(sql: str, name: str = "v"):
    return plan_view(name, sql, UPSTREAMS)


# -- the canonical chain t1 -> mv1 -> mv2, mv3 --------------------------------------------------------


def test_canonical_chain():
    mv1 = plan_view("mv1", "SELECT * FROM t1 WHERE deleted = false", {"t1": T1})
    assert mv1.sources == ("t1",)
    assert mv1.schema == T1  # same columns, types, nullability and key as the upstream
    assert [c.name for c in mv1.key_columns] == ["id"]
    assert not mv1.is_aggregate and not mv1.is_join

    mv2 = plan_view("mv2", "SELECT sum(v1) FROM mv1", {"mv1": mv1.schema})
    assert mv2.sources == ("mv1",)
    assert mv2.schema.columns == (Column("sum_v1", ColumnType.INT, nullable=True),)
    assert mv2.schema.primary_key == () and mv2.key_columns == ()
    assert mv2.is_aggregate

    mv3 = plan_view("mv3", "SELECT count(v1) FROM mv1", {"mv1": mv1.schema})
    assert mv3.schema.columns == (Column("count_v1", ColumnType.INT, nullable=False),)
    assert mv3.schema.primary_key == ()


# -- keys ----------------------------------------------------------------------------------------------


def test_projection_keeps_the_upstream_key_as_a_hidden_column_when_not_selected():
    p = plan("SELECT v1 FROM t1")
    hidden_id = Column("id", ColumnType.INT, nullable=False, hidden=True)
    assert p.schema.columns == (Column("v1", ColumnType.INT), hidden_id)
    assert p.schema.primary_key == ("id",)
    assert p.schema.visible_names == ["v1"]
    assert p.key_columns == (Column("id", ColumnType.INT, False, hidden=True),)


def test_renamed_key_column_is_the_key():
    p = plan("SELECT id AS k, v1 FROM t1")
    assert p.schema.names == ["k", "v1"] and p.schema.primary_key == ("k",)


def test_hidden_key_name_avoids_selected_names():
    p = plan("SELECT v1 AS id FROM t1")
    assert p.schema.names == ["id", "_id"] and p.schema.primary_key == ("_id",)
    assert p.schema.column("_id").hidden


def test_aggregate_key_is_the_group_by_values():
    p = plan("SELECT deleted, count(*) AS n FROM t1 GROUP BY deleted")
    assert p.schema.primary_key == ("deleted",)
    assert p.schema.column("deleted").nullable  # a NULL group is a group
    hidden = plan("SELECT count(*) AS n FROM t1 GROUP BY deleted, v1 + 1")
    assert hidden.schema.names == ["n", "deleted", "group_1"]
    assert hidden.schema.primary_key == ("deleted", "group_1")
    assert [c.hidden for c in hidden.schema.columns] == [False, True, True]


def test_group_by_a_select_alias():
    p = plan("SELECT v1 + 1 AS x, count(*) AS n FROM t1 GROUP BY x")
    assert p.schema.primary_key == ("x",)


def test_join_key_is_left_key_then_right_key():
    p = plan("SELECT a.v1, b.w FROM t1 a JOIN t2 b ON a.id = b.t1id")
    assert p.sources == ("t1", "t2") and p.is_join
    assert p.schema.names == ["v1", "w", "id", "b_id"]
    assert p.schema.primary_key == ("id", "b_id")
    selected = plan("SELECT b.id AS bid, a.id FROM t1 a JOIN t2 b ON a.id = b.t1id")
    assert selected.schema.primary_key == ("id", "bid")


def test_outer_join_key_and_nullability():
    """A null-extended side has NULL in its key columns: they are nullable in the view, as are all of
    that side's columns; the preserved side keeps its nullability."""
    left = plan("SELECT a.id, a.deleted, b.w, b.t1id FROM t1 a LEFT JOIN t2 b ON a.id = b.t1id")
    assert left.schema.primary_key == ("id", "b_id")
    assert [(c.name, c.nullable, c.hidden) for c in left.schema.columns] == [
        ("id", False, False), ("deleted", True, False), ("w", True, False), ("t1id", True, False),
        ("b_id", True, True)]
    right = plan("SELECT a.id, b.id AS bid FROM t1 a RIGHT JOIN t2 b ON a.id = b.t1id")
    assert [(c.name, c.nullable) for c in right.schema.columns] == [("id", True), ("bid", False)]
    full = plan("SELECT a.*, b.w FROM t1 a FULL OUTER JOIN t2 b ON a.id = b.t1id AND b.w > 1", "full")
    assert full.schema.primary_key == ("id", "b_id") and all(c.nullable for c in full.schema.columns)
    join = full.query.joins[0]
    assert join.kind.value == "FULL" and len(join.on) == 1 and join.residual is not None
    assert 'FULL JOIN `t2` AS `b` ON `a`.`id` = `b`.`t1id` AND (`b`.`w` > CAST(1.0 AS DOUBLE))' in \
        to_spark_sql(full, {"t1": "t1", "t2": "t2"})


def test_outer_join_of_a_view_whose_key_may_be_null_keys_its_presence():
    """Grouped by a nullable column, a view's row may have the NULL key a null-extended row has: the
    key then holds the side's presence too (a hidden column, TRUE or NULL), rendered from a subquery."""
    grouped = plan("SELECT t1id, count(*) AS n FROM t2 GROUP BY t1id", "g")
    p = plan_view("v", "SELECT a.id, g.n FROM t1 a LEFT JOIN g ON a.id = g.t1id", {"t1": T1, "g": grouped.schema})
    assert p.schema.primary_key == ("id", "t1id", "g_present")
    assert p.schema.column("g_present") == Column("g_present", ColumnType.BOOLEAN, True, True)
    sql = to_duckdb_sql(p, {"t1": "t1", "g": "g"})
    assert 'LEFT JOIN (SELECT *, TRUE AS "__present" FROM "g") AS "g"' in sql
    inner = plan_view("v", "SELECT a.id, g.n FROM t1 a JOIN g ON a.id = g.t1id", {"t1": T1, "g": grouped.schema})
    assert inner.schema.primary_key == ("id", "t1id")  # never null-extended: no presence column
    preserved = plan_view("v", "SELECT a.id, g.n FROM t1 a RIGHT JOIN g ON a.id = g.t1id",
                          {"t1": T1, "g": grouped.schema})
    assert preserved.schema.primary_key == ("id", "t1id")  # t1's key is never NULL in its rows


def test_join_chain_key_and_on_scoping():
    p = plan("SELECT a.v1, c.w FROM t1 a JOIN t2 b ON a.id = b.t1id LEFT JOIN t2 c ON c.t1id = b.id")
    assert p.sources == ("t1", "t2") and p.schema.primary_key == ("id", "b_id", "c_id")
    assert [j.kind.value for j in p.query.joins] == ["INNER", "LEFT"]
    with pytest.raises(ViewDefinitionError, match=r"ON clause of the join of 'b' reads c, joined after it"):
        plan("SELECT a.v1 FROM t1 a JOIN t2 b ON a.id = b.t1id AND c.w > 0 JOIN t2 c ON c.id = b.id")
    with pytest.raises(ViewDefinitionError, match="different aliases"):
        plan("SELECT a.v1 FROM t1 a JOIN t2 b ON a.id = b.t1id JOIN t1 a ON a.id = b.id")


def test_subqueries_and_with_queries_are_inner_plans():
    p = plan("WITH g AS (SELECT t1id, count(*) AS n FROM t2 GROUP BY t1id) "
             "SELECT a.v1, g.n FROM (SELECT id, v1 FROM t1 WHERE NOT deleted) a LEFT JOIN g ON a.id = g.t1id")
    assert p.sources == ("t1", "t2") and [name for name, _ in p.inner] == ["$(a)", "$g"]
    assert p.upstream_schemas == {"t1": T1, "t2": T2}
    assert p.schema.primary_key == ("id", "t1id", "g_present")
    assert dict(p.inner)["$g"].schema.primary_key == ("t1id",)
    unused = plan("WITH g AS (SELECT * FROM t2) SELECT v1 FROM t1")
    assert unused.sources == ("t1",) and unused.inner == ()
    shadowing = plan("WITH t2 AS (SELECT * FROM t1 WHERE deleted) SELECT v1 FROM t2")  # WITH names come first
    assert shadowing.sources == ("t1",)
    with pytest.raises(ViewDefinitionError, match=r"a subquery in FROM needs a name: `\(SELECT \* FROM t1\)`"):
        plan("SELECT * FROM (SELECT * FROM t1)")
    with pytest.raises(ViewDefinitionError, match=r"column 'id' of subquery x is hidden"):
        plan("WITH x AS (SELECT v1 FROM t1) SELECT id FROM x")
    with pytest.raises(ViewDefinitionError, match=r"unknown view 'nope' in `nope` at line 1, col 26"):
        plan("WITH x AS (SELECT * FROM nope) SELECT * FROM t1")


def test_in_and_exists_are_semi_joins_that_leave_the_key_alone():
    p = plan("SELECT * FROM t1 a WHERE a.v1 > 0 AND EXISTS (SELECT 1 FROM t2 b WHERE b.t1id = a.id AND b.w > 1) "
             "AND v1 IN (SELECT t1id FROM t2)")
    assert p.schema == T1 and p.sources == ("t1", "t2")  # one row per t1 row, whatever the matches
    assert [j.kind.value for j in p.query.joins] == ["SEMI", "SEMI"] and len(p.query.sources) == 3
    anti = plan("SELECT id FROM t1 WHERE NOT EXISTS (SELECT 1 FROM t2 WHERE t2.t1id = t1.id)")
    assert [j.kind.value for j in anti.query.joins] == ["ANTI"]
    with pytest.raises(ViewDefinitionError, match=r"must select one column, not 2"):
        plan("SELECT * FROM t1 WHERE id IN (SELECT t1id, w FROM t2)")
    with pytest.raises(ViewDefinitionError, match=r"cannot compare int with string"):
        plan("SELECT * FROM t1 WHERE id IN (SELECT tag FROM t2)")


def test_union_all_key_is_the_branch_and_its_key():
    p = plan("SELECT v1 AS x, id FROM t1 UNION ALL SELECT w, id FROM t2 UNION ALL SELECT count(*), 0 FROM t2")
    assert p.union and p.sources == ("t1", "t2") and [n for n, _ in p.inner] == ["$(branch0)", "$(branch1)",
                                                                                 "$(branch2)"]
    assert [(c.name, c.type.value, c.nullable, c.hidden) for c in p.schema.columns] == [
        ("x", "float", True, False), ("id", "int", False, False), ("_branch", "int", False, True),
        ("_b0_id", "int", True, True), ("_b1_id", "int", True, True)]  # a global count has the empty key
    assert p.schema.primary_key == ("_branch", "_b0_id", "_b1_id")
    with pytest.raises(ViewDefinitionError, match=r"UNION ALL: branch 2 selects 2 column\(s\), branch 1 selects 1"):
        plan("SELECT v1 FROM t1 UNION ALL SELECT id, w FROM t2")
    with pytest.raises(ViewDefinitionError, match=r"column 1 \(v1\) has types that do not combine"):
        plan("SELECT v1 FROM t1 UNION ALL SELECT tag FROM t2")


def test_self_join_needs_aliases_and_reads_the_view_once():
    p = plan("SELECT a.id, b.id AS id2 FROM t1 a JOIN t1 b ON a.v1 = b.v1")
    assert p.sources == ("t1",)
    assert p.schema.primary_key == ("id", "id2")
    with pytest.raises(ViewDefinitionError, match="different aliases"):
        plan("SELECT * FROM t1 JOIN t1 ON t1.v1 = t1.v1")


def test_star_over_a_view_with_hidden_columns_leaves_them_out():
    mv = plan("SELECT v1 FROM t1", "mv")
    p = plan_view("p", "SELECT * FROM mv", {"mv": mv.schema})
    assert p.schema.visible_names == ["v1"]
    assert p.schema.primary_key == ("id",) and p.schema.column("id").hidden
    with pytest.raises(ViewDefinitionError, match=r"column 'id' of view 'mv' is hidden"):
        plan_view("p", "SELECT id FROM mv", {"mv": mv.schema})


def test_schema_json_round_trip_keeps_hidden_columns():
    p = plan("SELECT v1 FROM t1")
    data = p.schema.to_json()
    assert data["columns"][1] == {"name": "id", "type": "int", "nullable": False, "hidden": True}
    assert RowSchema.from_json(data) == p.schema
    assert "hidden" not in T1.to_json()["columns"][0]  # schemas without hidden columns keep their JSON


# -- types ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("expression", "kind", "nullable"), [
    ("v1 + 1", ColumnType.INT, True),
    ("id * 2", ColumnType.INT, False),
    ("id + 1.5", ColumnType.FLOAT, False),
    ("id / 2", ColumnType.FLOAT, True),  # Spark: `/` is fractional; x / 0 is NULL
    ("-id", ColumnType.INT, False),
    ("v1 > 2", ColumnType.BOOLEAN, True),
    ("v1 IS NULL", ColumnType.BOOLEAN, False),
    ("NOT deleted AND id > 0", ColumnType.BOOLEAN, True),
    ("CASE WHEN deleted THEN 1 ELSE 2.5 END", ColumnType.FLOAT, False),
    ("CASE WHEN deleted THEN 'x' END", ColumnType.STRING, True),
    ("CASE v1 WHEN 1 THEN 'one' ELSE 'other' END", ColumnType.STRING, False),
    ("coalesce(v1, 0)", ColumnType.INT, False),
    ("coalesce(v1, NULL)", ColumnType.INT, True),
    ("'s'", ColumnType.STRING, False),
    ("true", ColumnType.BOOLEAN, False),
])
def test_expression_types(expression, kind, nullable):
    column = plan(f"SELECT {expression} AS x FROM t1").schema.column("x")
    assert (column.type, column.nullable) == (kind, nullable)


@pytest.mark.parametrize(("expression", "kind", "nullable"), [
    ("count(*)", ColumnType.INT, False),
    ("count(v1)", ColumnType.INT, False),
    ("sum(v1)", ColumnType.INT, True),
    ("sum(w)", ColumnType.FLOAT, True),
    ("avg(v1)", ColumnType.FLOAT, True),
    ("min(tag)", ColumnType.STRING, True),
    ("max(raw)", ColumnType.BYTES, True),
    ("sum(v1) / count(*)", ColumnType.FLOAT, True),
    ("max(v1) - min(v1)", ColumnType.INT, True),
])
def test_aggregate_types(expression, kind, nullable):
    p = plan(f"SELECT {expression} AS x FROM t1 a JOIN t2 b ON a.id = b.t1id")
    column = p.schema.column("x")
    assert (column.type, column.nullable) == (kind, nullable)


# -- errors: unknown names ------------------------------------------------------------------------------


def test_unknown_upstream_view_is_named_with_the_known_views():
    with pytest.raises(ViewDefinitionError, match=r"unknown view 'nope'.*known views: t1, t2") as error:
        plan("SELECT * FROM nope")
    assert not isinstance(error.value, UnsupportedSql)


def test_unknown_column_is_named():
    with pytest.raises(ViewDefinitionError, match=r"unknown column 'v9' in `v9` at line 1, col 8; t1 has"):
        plan("SELECT v9 FROM t1")
    with pytest.raises(ViewDefinitionError, match=r"unknown view or alias 'x'"):
        plan("SELECT x.v1 FROM t1")


def test_ambiguous_column_is_named():
    with pytest.raises(ViewDefinitionError, match=r"ambiguous column 'id'.*a and b"):
        plan("SELECT id FROM t1 a JOIN t2 b ON a.id = b.t1id")


def test_view_cannot_read_itself():
    with pytest.raises(ViewDefinitionError, match="cannot read itself"):
        plan_view("t1", "SELECT * FROM t1", UPSTREAMS)


# -- errors: types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sql", "names"), [
    ("SELECT 'a' + 1 AS x FROM t1", ["`'a' + 1`", "needs numbers", "string and int"]),
    ("SELECT sum(tag) FROM t2", ["`SUM(tag)`", "sum needs numbers, got string"]),
    ("SELECT avg(deleted) FROM t1", ["`AVG(deleted)`", "avg needs numbers"]),
    ("SELECT * FROM t1 WHERE v1", ["`v1`", "WHERE needs a boolean, this is int"]),
    ("SELECT * FROM t1 WHERE v1 = 'x'", ["`v1 = 'x'`", "cannot compare int with string"]),
    ("SELECT * FROM t1 WHERE v1 > 0 AND id", ["AND needs booleans, got int"]),
    ("SELECT CASE WHEN deleted THEN 1 ELSE 'x' END AS c FROM t1", ["CASE branches", "int", "string"]),
    ("SELECT coalesce(v1, 'x') AS c FROM t1", ["COALESCE arguments", "int", "string"]),
    ("SELECT -deleted AS x FROM t1", ["unary - needs a number, got boolean"]),
    ("SELECT a.* FROM t1 a JOIN t2 b ON a.deleted = b.t1id", ["cannot join boolean with int"]),
])
def test_type_errors_name_the_expression(sql, names):
    with pytest.raises(ViewDefinitionError) as error:
        plan(sql)
    assert not isinstance(error.value, UnsupportedSql)
    for name in names:
        assert name in str(error.value)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT v1, count(*) FROM t1", r"column 'v1' in `v1` at line 1, col 8 must be in GROUP BY"),
    ("SELECT deleted, v1 FROM t1 GROUP BY deleted", r"column 'v1' .* must be in GROUP BY"),
    ("SELECT * FROM t1 WHERE sum(v1) > 0", r"function `SUM\(v1\)` at line 1, col 24 is not allowed in WHERE"),
    ("SELECT sum(max(v1)) FROM t1", r"aggregate function `MAX\(v1\)` .* not allowed in another aggregate"),
    ("SELECT count(*) FROM t1 GROUP BY sum(v1)", r"aggregate function in GROUP BY"),
    ("SELECT *, count(*) FROM t1", r"`\*` .* in an aggregate view"),
    ("SELECT id, id FROM t1", r"duplicate column name 'id'"),
    ("SELECT * FROM t1 a JOIN t2 b ON a.id = b.t1id", r"duplicate column name 'id'"),
    ("SELECT v1 AS `my col` FROM t1", r"column name 'my col' is not a valid name"),
    ("SELECT NULL AS n FROM t1", r"cannot infer a type for column 'n'"),
    ("SELECT v1 FROM", r"syntax error at line 1, col 11: Expected table name but got the end of the SQL"),
    ("SELECT 1", r"no FROM clause"),
])
def test_definition_errors(sql, message):
    with pytest.raises(ViewDefinitionError, match=message):
        plan(sql)


# -- errors: syntax --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sql", "problem", "line", "col"), [
    ("SELECT id, FROM t1", "expected an expression after `,`, found `FROM`", 1, 10),  # sqlglot accepts it
    ("SELECT id, v1, FROM t1 WHERE v1 > 1", "expected an expression after `,`, found `FROM`", 1, 14),
    ("SELECT id,, v1 FROM t1", "expected an expression after `,`, found `,`", 1, 10),
    ("SELECT , id FROM t1", "expected an expression before `,`", 1, 8),
    ("SELECT deleted, count(*) FROM t1 GROUP BY deleted,", "expected an expression after `,`, found the end of the SQL",
     1, 50),
    ("SELECT * * FROM t1", "incomplete expression before or at `FROM`", 1, 12),
    ("SELECT id\n, v1 * FROM t1", "incomplete expression before or at `FROM`", 2, 8),
    ("SELECT id FROM t1 WHERE v1 = = 2", "incomplete expression before or at `=`", 1, 30),
    ("SELECT id +* 2 FROM t1", "unexpected `2`", 1, 14),
    ("SELECT 'abc FROM t1", "' is never closed", 1, 8),
])
def test_syntax_errors_show_the_sql_with_a_caret(sql, problem, line, col):
    """Refused (never planned), in words, with the line received and a caret under the position; sqlglot's
    class and token reprs (``<class 'sqlglot...Mul'>``) never show."""
    with pytest.raises(SqlSyntaxError) as error:
        plan(sql)
    message = str(error.value)
    assert message.splitlines()[0] == f"syntax error at line {line}, col {col}: {problem}"
    assert message.splitlines()[1:] == [f"  {sql.splitlines()[line - 1]}", "  " + " " * (col - 1) + "^"]
    assert "<" not in message.replace(sql, "") and "sqlglot" not in message


# -- errors: unsupported SQL ------------------------------------------------------------------------------


NO_EQUALITY = "join without an equality between the joined views"


@pytest.mark.parametrize(("sql", "construct", "position"), [
    ("SELECT * FROM t1 ORDER BY v1", "ORDER BY", (1, 18)),
    ("SELECT * FROM t1 LIMIT 10", "LIMIT", (1, 18)),
    ("SELECT * FROM t1 LIMIT 10 OFFSET 5", "LIMIT", (1, 18)),
    ("SELECT v1, row_number() OVER (PARTITION BY v1) AS r FROM t1", "window function", (1, 12)),
    ("SELECT sum(v1) OVER () AS s FROM t1", "window function", (1, 8)),
    ("SELECT * FROM (SELECT v1 FROM t1 UNION ALL SELECT t1id FROM t2) x", "UNION", (1, 34)),
    ("SELECT * FROM (SELECT * FROM t1 ORDER BY v1) x", "ORDER BY", (1, 33)),
    ("WITH x AS (SELECT v1 FROM t1 LIMIT 3) SELECT * FROM x", "LIMIT", (1, 30)),
    ("WITH RECURSIVE x AS (SELECT * FROM t1) SELECT * FROM x", "WITH RECURSIVE", (1, 1)),
    ("SELECT * FROM (SELECT * FROM t1) x(a, b, c)", "column aliases on a subquery in FROM", (1, 16)),
    ("SELECT * FROM t1 WHERE id NOT IN (SELECT t1id FROM t2)", "NOT IN (subquery)", (1, 24)),
    ("SELECT * FROM t1 WHERE v1 > 0 OR id IN (SELECT t1id FROM t2)", "subquery", (1, 34)),
    ("SELECT * FROM t1 WHERE v1 + 1 IN (SELECT t1id FROM t2)", "IN (subquery) of an expression", (1, 24)),
    ("SELECT * FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE t2.t1id > t1.id)",
     "correlated condition other than an equality", (1, 55)),
    ("SELECT * FROM t1 WHERE EXISTS (SELECT t1id, count(*) FROM t2 WHERE t2.t1id = t1.id GROUP BY t1id)",
     "EXISTS over an aggregate subquery", (1, 24)),
    ("SELECT (SELECT max(v1) FROM t1) AS m FROM t1", "subquery", (1, 9)),
    ("SELECT * FROM t1 WHERE EXISTS (SELECT * FROM t2)", "EXISTS without a correlating equality", (1, 24)),
    ("SELECT a.v1 FROM t1 a JOIN t2 b ON a.id < b.t1id", NO_EQUALITY, (1, 23)),
    ("SELECT a.v1 FROM t1 a JOIN t2 b ON a.id = b.t1id OR a.v1 = b.t1id", NO_EQUALITY, (1, 23)),
    ("SELECT a.v1 FROM t1 a LEFT JOIN t2 b ON a.id + 1 = b.t1id", NO_EQUALITY, (1, 23)),
    ("SELECT a.v1 FROM t1 a JOIN t2 b ON a.id = a.v1", NO_EQUALITY, (1, 23)),
    ("SELECT a.v1 FROM t1 a JOIN t2 b ON a.id = b.t1id FULL JOIN t1 c ON c.v1 > b.w", NO_EQUALITY, (1, 50)),
    ("SELECT a.v1 FROM t1 a CROSS JOIN t2 b", "CROSS JOIN", (1, 23)),
    ("SELECT a.v1 FROM t1 a, t2 b", "CROSS JOIN", (1, 24)),
    ("SELECT a.v1 FROM t1 a NATURAL JOIN t2 b", "NATURAL JOIN", (1, 23)),
    ("SELECT a.v1 FROM t1 a LEFT SEMI JOIN t2 b ON a.id = b.t1id", "LEFT SEMI JOIN", (1, 23)),
    ("SELECT a.v1 FROM t1 a LEFT ANTI JOIN t2 b ON a.id = b.t1id", "LEFT ANTI JOIN", (1, 23)),
    ("SELECT a.v1 FROM t1 a JOIN t2 b USING (id)", "JOIN ... USING", (1, 33)),
    ("SELECT a.v1 FROM t1 a JOIN t2 b", "JOIN without ON", (1, 23)),
    ("SELECT v1 FROM t1 UNION SELECT t1id FROM t2", "UNION", (1, 19)),
    ("SELECT v1 FROM t1 UNION ALL SELECT t1id FROM t2 UNION SELECT 1", "UNION", (1, 49)),
    ("SELECT v1 FROM t1 UNION ALL SELECT t1id FROM t2 ORDER BY v1", "UNION ALL with ORDER", (1, 19)),
    ("SELECT v1 FROM t1 EXCEPT SELECT t1id FROM t2", "EXCEPT", (1, 19)),
    ("SELECT v1 FROM t1 INTERSECT SELECT t1id FROM t2", "INTERSECT", (1, 19)),
    ("SELECT foo(v1) AS f FROM t1", "function foo()", (1, 8)),
    ("SELECT reverse(tag) AS u FROM t2", "function reverse()", (1, 8)),
    ("SELECT stddev(v1) AS s FROM t1", "aggregate function stddev()", (1, 8)),
    ("SELECT DISTINCT count(*) AS n FROM t1 GROUP BY s", "SELECT DISTINCT over an aggregate", (1, 8)),
    ("SELECT count(DISTINCT v1, v2) AS n FROM t1", "count(DISTINCT ...) of several expressions", (1, 8)),
    ("SELECT CAST(v1 AS string) AS s FROM t1", "CAST", (1, 8)),
    ("SELECT * FROM t1 WHERE v1 IN (SELECT t1id FROM t2) OR v1 = 1", "subquery", (1, 24)),
    ("SELECT * FROM t1 WHERE v1 BETWEEN SYMMETRIC 1 AND 2", "BETWEEN SYMMETRIC", (1, 24)),
    ("SELECT * FROM t2 WHERE tag LIKE 'a%'", "LIKE", (1, 24)),
    ("SELECT v1 & 2 AS m FROM t1", "operator &", (1, 8)),
    ("SELECT * FROM t1 WHERE v1 <=> 1", "operator <=>", (1, 24)),
    ("SELECT * FROM t1 WHERE deleted IS TRUE", "IS TRUE", (1, 24)),
    ("SELECT count(*) FROM t1 GROUP BY 1", "GROUP BY position", (1, 34)),
    ("SELECT deleted, count(*) FROM t1 GROUP BY ROLLUP (deleted)", "GROUP BY ROLLUP", (1, 43)),
    ("SELECT * FROM t1; SELECT * FROM t2", "more than one statement", None),
    ("INSERT INTO t1 VALUES (1, 2, false)", "INSERT statement", (1, 13)),
])
def test_unsupported_sql_names_the_construct_and_where_it_is(sql, construct, position):
    with pytest.raises(UnsupportedSql) as error:
        plan(sql)
    assert isinstance(error.value, ViewDefinitionError) and isinstance(error.value, ValueError)
    assert error.value.construct == construct
    assert f"unsupported SQL: {construct}" in str(error.value)
    assert f"`{error.value.fragment}`" in str(error.value) and error.value.fragment
    if position is not None:
        assert (error.value.line, error.value.col) == position
        assert f"at line {position[0]}, col {position[1]}" in str(error.value)


def test_position_on_a_later_line():
    sql = "SELECT v1,\n       id\nFROM t1\nORDER BY v1"
    with pytest.raises(UnsupportedSql) as error:
        plan(sql)
    assert (error.value.line, error.value.col) == (4, 1)


# -- SQL for full recomputation -------------------------------------------------------------------------


def test_spark_sql_reads_the_given_tables_and_selects_every_column():
    p = plan("SELECT v1 / 2 AS h, v1 FROM t1 WHERE deleted = false")
    sql = to_spark_sql(p, {"t1": "snap_t1"})
    assert sql == ("SELECT CAST(`t1`.`v1` AS DOUBLE) / NULLIF(CAST(2.0 AS DOUBLE), 0) AS `h`, "
                   "`t1`.`v1` AS `v1`, `t1`.`id` AS `id` FROM `snap_t1` AS `t1` "
                   "WHERE `t1`.`deleted` = FALSE")
    parsed = sqlglot.parse_one(sql, read="spark")
    assert [e.alias for e in parsed.expressions] == p.schema.names


def test_duckdb_sql_for_join_and_group_by():
    p = plan("SELECT a.deleted, count(*) AS n, avg(b.w) AS aw FROM t1 a JOIN t2 b ON a.id = b.t1id "
             "GROUP BY a.deleted")
    sql = to_duckdb_sql(p, {"t1": "x1", "t2": "main.x2"})
    assert sql == ('SELECT "a"."deleted" AS "deleted", COUNT(*) AS "n", AVG("b"."w") AS "aw" '
                   'FROM "x1" AS "a" INNER JOIN "main"."x2" AS "b" ON "a"."id" = "b"."t1id" '
                   'GROUP BY "a"."deleted"')


def test_sql_needs_a_table_for_every_upstream():
    p = plan("SELECT a.v1 FROM t1 a JOIN t2 b ON a.id = b.t1id")
    with pytest.raises(ViewDefinitionError, match=r"no table given for upstream view\(s\) t2"):
        to_spark_sql(p, {"t1": "x"})


@pytest.mark.parametrize("sql", ["", "   ", "\n-- only a comment\n"])
def test_empty_sql_is_refused_in_words(sql: str) -> None:
    """An empty definition (a made-up replacement record has none) is a definition error, not a crash."""
    with pytest.raises(ViewDefinitionError, match="empty"):
        plan(sql)
