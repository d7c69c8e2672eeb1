"""Views: a SQL subset planned once, maintained incrementally per epoch, recomputable on Spark/DuckDB.

Pure code (no I/O): the Spark consumer feeds each epoch's upstream changes (a ``ChangeBatch`` per
upstream) to a ``ViewOperator`` and persists the view's ``ChangeBatch`` and state writes it returns;
the snapshot backfill and the tests run ``to_spark_sql`` / ``to_duckdb_sql`` to recompute a view in full.
"""

from mvlog.views.change_batch import ChangeBatch
from mvlog.views.errors import InconsistentChanges, SqlSyntaxError, UnsupportedSql, ViewDefinitionError
from mvlog.views.operator import EpochOutput, ViewOperator
from mvlog.views.plan import ViewPlan, plan_view
from mvlog.views.render import to_duckdb_sql, to_spark_sql
from mvlog.views.state import InMemoryState, StateReader

__all__ = [
    "ChangeBatch",
    "EpochOutput",
    "InMemoryState",
    "InconsistentChanges",
    "SqlSyntaxError",
    "StateReader",
    "UnsupportedSql",
    "ViewDefinitionError",
    "ViewOperator",
    "ViewPlan",
    "plan_view",
    "to_duckdb_sql",
    "to_spark_sql",
]
