"""The independent oracle: a view evaluated in full by DuckDB (or Spark SQL) over its upstreams' rows.

Invariant I1 says rows(d, e) = Q(rows(u, e)) for every committed epoch e of d; the tests fold each
changelog up to every barrier and compare with this evaluation. Q is the view's definition at e (a
replacement applied at epoch a defines it from a on, read from the apply_replacement mutations of its
changelog); while a view created online still backfills, rows(u, e) is restricted to the upstream keys
its positions cover at e (from the backfill_progress mutations on its barriers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import duckdb
import pyarrow as pa
import redis

from mvlog.backfill import BackfillPositions
from mvlog.backfill_record import BACKFILL_MUTATION, BackfillReplay
from mvlog.catalog import CatalogEntry
from mvlog.changes import Epoch, apply_changes
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import ColumnType, Key, Row, RowSchema
from mvlog.schemas.codec import decode_row
from mvlog.services.backfill.chunked import coverage
from mvlog.services.view_ddl import plan_for
from mvlog.views import ViewPlan, to_duckdb_sql, to_spark_sql

ARROW = {ColumnType.INT: pa.int64(), ColumnType.FLOAT: pa.float64(), ColumnType.STRING: pa.string(),
         ColumnType.BOOLEAN: pa.bool_(), ColumnType.BYTES: pa.binary()}


@cache
def _duckdb() -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB per process: connecting costs ten times what a check's query does."""
    return duckdb.connect()


def duckdb_view_rows(plan: ViewPlan, upstreams: Mapping[str, tuple[RowSchema, list[Row]]],
                     sql: str | None = None) -> dict[Key, Row]:
    """Q(rows(u)) computed from scratch by DuckDB, keyed by the view's key (``sql``: the plan's DuckDB
    SQL, rendered once by a caller that checks many epochs; rendering costs a third of a check)."""
    con = _duckdb().cursor()  # a cursor of its own: registered tables never leak into another check
    try:
        for name, (schema, rows) in upstreams.items():
            arrow_schema = pa.schema([(c.name, ARROW[c.type]) for c in schema.columns])
            con.register(name, pa.Table.from_pylist([schema.normalize(r) for r in rows], arrow_schema))
        result = con.execute(sql or duckdb_sql(plan))
        names = [d[0] for d in result.description]
        rows = [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    finally:
        con.close()
    by_key = {plan.schema.key_of(row): row for row in rows}
    assert len(by_key) == len(rows), f"{plan.name}: the view's key is not unique in the oracle's result"
    return by_key


def duckdb_sql(plan: ViewPlan) -> str:
    """The view's definition as DuckDB SQL over tables named like its upstreams."""
    return to_duckdb_sql(plan, {s: s for s in plan.sources})


def assert_same_rows(name: str, actual: Mapping[Key, Row], expected: Mapping[Key, Row], schema: RowSchema,
                     context: Any = "") -> None:
    assert set(actual) == set(expected), f"{name} {context}: keys differ: {dict(actual)} != {dict(expected)}"
    for key, row in expected.items():
        for column in schema.columns:
            mine, theirs = actual[key][column.name], row[column.name]
            where = (name, context, key, column.name, mine, theirs)
            if column.type is ColumnType.FLOAT and mine is not None and theirs is not None:
                assert math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=1e-9), where
            else:
                assert mine == theirs, where


def rows_by_epoch(epochs: list[Epoch]) -> dict[int, dict[Key, Row]]:
    """The changelog summed up to each barrier: epoch -> rows."""
    rows: dict[Key, Row] = {}
    out: dict[int, dict[Key, Row]] = {}
    for epoch in epochs:
        apply_changes(rows, epoch.changes)
        out[epoch.epoch] = dict(rows)
    return out


def rows_at(history: dict[int, dict[Key, Row]], epoch: int) -> dict[Key, Row]:
    """rows(u, e): the upstream's rows at its last committed epoch at or before ``epoch``."""
    earlier = [e for e in history if e <= epoch]
    return history[max(earlier)] if earlier else {}


def definitions(epochs: list[Epoch], current_sql: str) -> list[tuple[int, str]]:
    """(first epoch, SQL) of each definition a view had, from the apply_replacement mutations of its
    changelog: epochs before the first cut-over had the definition it replaced."""
    applied = [(e.epoch, e.mutation.payload) for e in epochs
               if e.mutation is not None and e.mutation.kind == "apply_replacement"]
    if not applied:
        return [(0, current_sql)]
    return [(0, str(applied[0][1]["previous_sql"]))] + [(epoch, str(payload["sql"])) for epoch, payload in applied]


def coverage_by_epoch(epochs: list[Epoch], upstreams: Mapping[str, CatalogEntry]
                      ) -> dict[int, Callable[[str, Key], bool]]:
    """For a view created with a chunked backfill: epoch -> which upstream keys it covered at that epoch,
    from the ``backfill_progress`` mutations on its own barriers (epochs once the backfill is done, and
    epochs of any other view, are absent: the view then holds its whole upstream)."""
    replay = BackfillReplay(upstreams)
    out: dict[int, Callable[[str, Key], bool]] = {}
    for epoch in epochs:
        mutation = epoch.mutation
        if mutation is None or mutation.kind != BACKFILL_MUTATION or replay.done:
            continue
        replay.apply(epoch.epoch, mutation.payload)
        if not replay.done:
            out[epoch.epoch] = coverage(BackfillPositions(upstreams, dict(replay.positions.items())), upstreams)
    return out


def upstream_rows_at(schemas: Mapping[str, RowSchema], history: Mapping[str, dict[int, dict[Key, Row]]], plan: ViewPlan,
                     epoch: int, covers: Callable[[str, Key], bool] | None = None
                     ) -> dict[str, tuple[RowSchema, list[Row]]]:
    """Each upstream's rows at ``epoch`` (only the keys ``covers`` names, when given): the oracle's input."""
    out = {}
    for source in plan.sources:
        rows = rows_at(history[source], epoch)
        kept = [row for key, row in rows.items() if covers is None or covers(source, key)]
        out[source] = (schemas[source], kept)
    return out


@dataclass(frozen=True)
class Definition:
    """One definition of a view, from epoch ``start`` on, planned and rendered as DuckDB SQL once (rendering
    costs a third of a check)."""

    start: int
    plan: ViewPlan
    sql: str


class ViewDefinitions:
    """Every definition a view had (:func:`definitions`) and the schemas of their upstreams: the oracle's
    view at any epoch."""

    def __init__(self, catalog: CatalogStore, name: str, epochs: list[Epoch], current_sql: str) -> None:
        plans = [(start, plan_for(catalog, name, sql)) for start, sql in definitions(epochs, current_sql)]
        self.items = [Definition(start, plan, duckdb_sql(plan)) for start, plan in plans]
        self.sources = sorted({s for d in self.items for s in d.plan.sources})
        self.schemas = {s: catalog.get(s).schema for s in self.sources}

    @property
    def current(self) -> ViewPlan:
        return self.items[-1].plan

    def at(self, epoch: int) -> Definition:
        """The definition at ``epoch`` (a replacement applied at epoch e defines the view from e on)."""
        return next(d for d in reversed(self.items) if d.start <= epoch)

    def expected(self, history: Mapping[str, dict[int, dict[Key, Row]]], epoch: int,
                 covers: Callable[[str, Key], bool] | None = None) -> tuple[ViewPlan, dict[Key, Row]]:
        """The definition's plan at ``epoch`` and Q(rows(u, epoch)) by DuckDB."""
        definition = self.at(epoch)
        upstreams = upstream_rows_at(self.schemas, history, definition.plan, epoch, covers)
        return definition.plan, duckdb_view_rows(definition.plan, upstreams, definition.sql)


def check_oracle(settings: Settings, client: redis.Redis, names: list[str], spark: Any | None = None) -> int:
    """Assert I1 at every committed epoch of every view; returns the number of (view, epoch) checked."""
    catalog = CatalogStore(settings, client)
    store = ViewStore(client, settings.topic_prefix)
    history: dict[str, dict[int, dict[Key, Row]]] = {}
    checked = 0
    for name in names:  # upstreams first
        entry = catalog.get(name)
        mce = store.mce(name)
        with ChangelogReader(settings, name, entry.key_columns, entry.partitions, store.index,
                             upto_epoch=mce) as reader:
            epochs = list(reader.epochs(idle_timeout=10.0))
        history[name] = rows_by_epoch(epochs)
        assert epochs and epochs[-1].epoch == mce, f"{name}: the changelog ends at its MCE"
        # Redis' serving rows are the changelog summed up to the MCE.
        served = {entry.schema.key_of(decode_row(v)): decode_row(v) for _, v in store.scan_rows(name)}
        assert_same_rows(name, served, history[name][mce], entry.schema, "redis vs changelog")
        if entry.kind == "table":
            continue
        views = ViewDefinitions(catalog, name, epochs, entry.sql or "")
        plan = views.current
        # One epoch (and barrier) per upstream epoch up to the view's MCE, which is one of them: a join's
        # epochs are the union of its upstreams' (mvlog.join_bound). How far the view must have got is the
        # caller's to wait for and assert (ViewConsumer.wait_for_epoch).
        reachable = mce
        # A view backfilled online (chunked, or from a snapshot at E) starts at its upstreams' epoch of its
        # creation (or at E), not at their start.
        first = min(history[name]) if entry.options.get("backfill") in ("chunked", "snapshot") else 0
        upstream_epochs = {e for s in plan.sources for e in history[s] if first <= e <= reachable}
        assert set(history[name]) == upstream_epochs, (
            f"{name}: one epoch (and barrier) per upstream epoch; upstream epochs missing: "
            f"{sorted(upstream_epochs - set(history[name]))}, epochs no upstream has: "
            f"{sorted(set(history[name]) - upstream_epochs)}")
        covered = coverage_by_epoch(epochs, {s: catalog.get(s) for s in plan.sources})
        for epoch, rows in history[name].items():
            at, expected = views.expected(history, epoch, covered.get(epoch))
            assert_same_rows(name, rows, expected, at.schema, f"epoch {epoch}")
            checked += 1
        if spark is not None:
            frames = {}
            for source in plan.sources:
                schema = catalog.get(source).schema
                ddl = ", ".join(f"`{c.name}` {c.type.spark_sql}" for c in schema.columns)
                source_rows = [schema.normalize(r) for r in rows_at(history[source], mce).values()]
                spark.createDataFrame(source_rows, ddl).createOrReplaceTempView(f"{settings.topic_prefix}_{source}")
                frames[source] = f"{settings.topic_prefix}_{source}"
            result = [r.asDict() for r in spark.sql(to_spark_sql(plan, frames)).collect()]
            expected = {plan.schema.key_of(r): r for r in result}
            assert_same_rows(name, history[name][mce], expected, plan.schema, "spark sql at the MCE")
    return checked


@dataclass
class OracleReport:
    """I1 checked without stopping at the first difference: what a soak prints at its end."""

    epochs_checked: int = 0
    rows_lost: int = 0  # rows the oracle has at an epoch that the view lacks (or holds with other values)
    rows_doubled: int = 0  # rows the view has at an epoch that the oracle lacks (or holds with other values)
    problems: list[str] = field(default_factory=list)
    # Views that changed definition: (first epoch, SQL) of each, as checked.
    definitions: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    # Views checked while their chunked backfill ran: (first, last) epoch checked on the covered keys.
    backfilled: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.rows_lost and not self.rows_doubled


def _same_row(mine: Row, theirs: Row, schema: RowSchema) -> bool:
    for column in schema.columns:
        a, b = mine.get(column.name), theirs.get(column.name)
        if column.type is ColumnType.FLOAT and a is not None and b is not None:
            if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9):
                return False
        elif a != b:
            return False
    return True


def _count_differences(report: OracleReport, where: str, actual: Mapping[Key, Row],
                       expected: Mapping[Key, Row], schema: RowSchema) -> None:
    lost = sum(1 for k, row in expected.items() if k not in actual or not _same_row(actual[k], row, schema))
    doubled = sum(1 for k, row in actual.items() if k not in expected or not _same_row(row, expected[k], schema))
    if lost or doubled:
        report.problems.append(f"{where}: {lost} row(s) lost, {doubled} row(s) doubled or wrong")
    report.rows_lost += lost
    report.rows_doubled += doubled


def oracle_report(settings: Settings, client: redis.Redis, names: list[str]) -> OracleReport:
    """I1 at every committed epoch of every view (upstreams first in ``names``), counting differences."""
    catalog = CatalogStore(settings, client)
    store = ViewStore(client, settings.topic_prefix)
    history: dict[str, dict[int, dict[Key, Row]]] = {}
    report = OracleReport()
    for name in names:
        entry = catalog.get(name)
        mce = store.mce(name)
        if mce is None:
            report.problems.append(f"{name}: no committed epoch")
            continue
        with ChangelogReader(settings, name, entry.key_columns, entry.partitions, store.index,
                             upto_epoch=mce) as reader:
            epochs = list(reader.epochs(idle_timeout=10.0))
        history[name] = rows_by_epoch(epochs)
        if not epochs or epochs[-1].epoch != mce:
            report.problems.append(f"{name}: the changelog ends at {epochs[-1].epoch if epochs else None}, "
                                   f"not at its MCE {mce}")
            continue
        served = {entry.schema.key_of(decode_row(v)): decode_row(v) for _, v in store.scan_rows(name)}
        _count_differences(report, f"{name} redis vs changelog", served, history[name][mce], entry.schema)
        if entry.kind == "table":
            continue
        views = ViewDefinitions(catalog, name, epochs, entry.sql or "")
        sources = views.sources
        if any(s not in history for s in sources):
            report.problems.append(f"{name}: an upstream could not be read")
            continue
        reachable = min(max(history[s]) for s in sources)
        # A view backfilled online (chunked, or from a snapshot at E) starts at its upstreams' epoch of its
        # creation (or at E), not at their start.
        first = min(history[name]) if entry.options.get("backfill") in ("chunked", "snapshot") else 0
        upstream_epochs = {e for s in sources for e in history[s] if first <= e <= reachable}
        if missing := upstream_epochs - set(history[name]) - {e for e in upstream_epochs if e > mce}:
            report.problems.append(f"{name}: {len(missing)} upstream epoch(s) without an epoch of its own")
        if extra := set(history[name]) - upstream_epochs:
            report.problems.append(f"{name}: {len(extra)} epoch(s) that no upstream has")
        covered = coverage_by_epoch(epochs, {s: catalog.get(s) for s in sources})
        for epoch, rows in history[name].items():
            at, expected = views.expected(history, epoch, covered.get(epoch))
            _count_differences(report, f"{name} epoch {epoch}", rows, expected, at.schema)
            report.epochs_checked += 1
        if len(views.items) > 1:
            report.definitions[name] = definitions(epochs, entry.sql or "")
        if covered:
            report.backfilled[name] = (min(covered), max(covered))
    return report
