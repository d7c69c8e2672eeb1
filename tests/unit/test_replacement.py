"""Replacement views, the pure rules: which schema changes are accepted, and the cut-over's diff."""

from __future__ import annotations

import pytest

from mvlog.catalog import CatalogEntry
from mvlog.changes import Op, apply_changes
from mvlog.replacement import (
    IncompatibleReplacementError,
    applied_entry,
    check_compatible,
    diff_rows,
    schema_problems,
    staged_in,
    summarize,
    with_staged,
    without_staged,
)
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.views import plan_view

T1 = RowSchema.of({"id": "int", "v1": "int", "deleted": "boolean", "k": "string"}, ["id"])
T2 = RowSchema.of({"id": "int", "w": "int"}, ["id"])
UPSTREAMS = {"t1": T1, "t2": T2}
MV1_SQL = "SELECT * FROM t1 WHERE deleted = false"


def mv1_entry(sql: str = MV1_SQL) -> CatalogEntry:
    plan = plan_view("mv1", sql, UPSTREAMS)
    return CatalogEntry("mv1", "view", plan.schema, 3, 1, sql, plan.sources)


def problems_of(sql: str, old: str = MV1_SQL) -> list[str]:
    return schema_problems(plan_view("mv1", old, UPSTREAMS).schema, plan_view("mv1", sql, UPSTREAMS).schema)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM t1 WHERE deleted = false AND v1 > 0",  # only the filter changes
    "SELECT * FROM t1",
    "SELECT id, v1, deleted, k, v1 * 2 AS doubled FROM t1 WHERE deleted = false",  # a new nullable column
    "SELECT k, deleted, v1, id FROM t1",  # same columns in another order
])
def test_compatible_definitions_are_accepted(sql: str) -> None:
    assert problems_of(sql) == []
    plan = plan_view("mv1", sql, UPSTREAMS)
    check_compatible(mv1_entry(), plan.schema, plan.sources)  # does not raise


@pytest.mark.parametrize(("sql", "problem"), [
    ("SELECT id, v1, deleted FROM t1", "column 'k' would be dropped"),
    ("SELECT id, v1 / 2 AS v1, deleted, k FROM t1", "column 'v1' changes type from int to float"),
    ("SELECT id, v1, deleted, k, 1 AS one FROM t1", "new column 'one' is NOT NULL"),
    ("SELECT id, coalesce(v1, 0) AS v1, deleted, k FROM t1", "column 'v1' changes from nullable to NOT NULL"),
    ("SELECT v1, deleted, k FROM t1", "column 'id' becomes hidden"),
])
def test_incompatible_definitions_name_the_column_and_reason(sql: str, problem: str) -> None:
    found = problems_of(sql)
    assert any(p.startswith(problem) for p in found), found


def test_a_changed_primary_key_is_refused() -> None:
    old = RowSchema.of({"id": "int", "k": "string"}, ["id"])
    new = RowSchema.of({"id": "int", "k": "string"}, ["k"])
    assert schema_problems(old, new) == [
        "column 'id' changes from NOT NULL to nullable", "column 'k' changes from nullable to NOT NULL",
        "the primary key changes from (id) to (k)"]


def test_check_compatible_raises_with_every_problem_and_refuses_other_upstreams() -> None:
    plan = plan_view("mv1", "SELECT id, w FROM t2", UPSTREAMS)
    with pytest.raises(IncompatibleReplacementError) as refused:
        check_compatible(mv1_entry(), plan.schema, plan.sources)
    message = str(refused.value)
    assert message.startswith("incompatible replacement for mv1: ")
    for expected in ("column 'v1' would be dropped", "column 'k' would be dropped",
                     "column 'deleted' would be dropped", "it reads t2 but the view reads t1"):
        assert expected in message


def test_diff_turns_old_rows_into_new_rows() -> None:
    schema = plan_view("mv1", "SELECT id, v1, deleted, k, v1 * 2 AS doubled FROM t1", UPSTREAMS).schema
    old: dict[Key, Row] = {(1,): {"id": 1, "v1": 1, "deleted": False, "k": "a"},
           (2,): {"id": 2, "v1": 2, "deleted": False, "k": "b"},
           (3,): {"id": 3, "v1": None, "deleted": False, "k": "c"}}
    new: dict[Key, Row] = {(2,): {"id": 2, "v1": 2, "deleted": False, "k": "b", "doubled": 4},
           (3,): {"id": 3, "v1": None, "deleted": False, "k": "c", "doubled": None},
           (4,): {"id": 4, "v1": 4, "deleted": False, "k": "d", "doubled": 8}}
    changes = diff_rows(old, new, schema)
    assert [(c.op, c.key) for c in changes] == [(Op.DELETE, (1,)), (Op.UPDATE, (2,)), (Op.CREATE, (4,))]
    # (3,) is unchanged: the new nullable column is NULL in both
    assert apply_changes({k: schema.normalize(v) for k, v in old.items()}, changes) == new
    assert diff_rows(new, new, schema) == []
    summary = summarize(7, changes, samples=1)
    assert (summary.epoch, summary.inserts, summary.deletes, summary.updates, summary.total) == (7, 1, 1, 1, 3)
    assert summary.samples["update"] == [{"before": schema.normalize(old[(2,)]), "after": new[(2,)]}]


def test_diff_order_is_stable_with_null_and_mixed_keys() -> None:
    schema = RowSchema.of({"g": "string", "n": "int"}, ["g"])
    old: dict[Key, Row] = {("b",): {"g": "b", "n": 1}, (None,): {"g": None, "n": 2}}
    new: dict[Key, Row] = {("a",): {"g": "a", "n": 1}}
    assert [c.key for c in diff_rows(old, new, schema)] == [("a",), ("b",), (None,)]


def test_catalog_entry_round_trip_of_staging_and_applying() -> None:
    entry = mv1_entry()
    staged = with_staged(entry, "r1", "SELECT * FROM t1")
    assert staged.version == entry.version + 1 and staged_in(staged) == ("r1", "SELECT * FROM t1")
    assert CatalogEntry.from_record(staged.to_record()) == staged  # survives the catalog topic
    assert staged_in(without_staged(staged)) is None
    plan = plan_view("mv1", "SELECT * FROM t1", UPSTREAMS)
    applied = applied_entry(staged, plan.sql, plan.schema, plan.sources, staged.version + 1)
    assert (applied.sql, applied.version, staged_in(applied)) == ("SELECT * FROM t1", entry.version + 2, None)
