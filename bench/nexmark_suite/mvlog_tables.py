"""mvlog's side of the schema: the three source tables and which queries mvlog plans today.

* **Tables**: ``person`` and ``auction`` keyed by ``id``, ``bid`` keyed by a generated string column
  ``bid_key`` (``"<partition>-<offset>"`` of its message), each an ``append-json`` source table fed by its
  topic (``mvlog create-table ... --from-topic T --format append-json``).
* **Runnable queries** are not a list kept by hand: a query is runnable when mvlog's planner
  (:func:`mvlog.views.plan_view`) accepts its SQL, and a refused one is reported with the planner's
  message (the construct and its position). As the SQL subset grows, more queries run, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

from mvlog.config import Settings
from mvlog.row_schema import RowSchema
from mvlog.services.sources.declare import create_source_table
from mvlog.views import ViewPlan, plan_view
from mvlog.views.errors import ViewDefinitionError

from .model import BID_GENERATED_KEY, TABLES_BY_NAME, NexmarkTable, NexmarkTopics
from .queries import QUERIES, NexmarkQuery

SOURCE_FORMAT = "append-json"


@dataclass(frozen=True)
class TableDeclaration:
    """One source table as mvlog declares it."""

    name: str
    columns: dict[str, str]  # column -> mvlog type
    primary_key: tuple[str, ...]
    generated_key: str | None  # the column append-json fills with "<partition>-<offset>"

    @property
    def schema(self) -> RowSchema:
        return RowSchema.of(self.columns, list(self.primary_key))


def declaration(table: NexmarkTable) -> TableDeclaration:
    columns = table.column_types()
    if table.key:
        return TableDeclaration(table.name, columns, table.key, None)
    return TableDeclaration(table.name, {**columns, BID_GENERATED_KEY: "string"}, (BID_GENERATED_KEY,),
                            BID_GENERATED_KEY)


DECLARATIONS: Mapping[str, TableDeclaration] = {name: declaration(t) for name, t in TABLES_BY_NAME.items()}


@dataclass(frozen=True)
class Planned:
    """A query as mvlog's planner sees it: its plan, or why it is refused."""

    query: NexmarkQuery
    plan: ViewPlan | None
    refusal: str | None  # the planner's message when refused

    @property
    def runnable(self) -> bool:
        return self.plan is not None


def plan_query(query: NexmarkQuery) -> Planned:
    """Ask the planner; an unknown table (q13's side_input) is a refusal like any other."""
    upstreams = {name: d.schema for name, d in DECLARATIONS.items()}
    try:
        return Planned(query, plan_view(query.id, query.sql, upstreams), None)
    except ViewDefinitionError as error:
        return Planned(query, None, " ".join(str(error).split()))


def plan_queries(ids: Iterable[str] | None = None) -> list[Planned]:
    """Each query (all by default) planned or refused, in order."""
    return [plan_query(QUERIES[i]) for i in (ids if ids is not None else QUERIES)]


def create_tables(settings: Settings, topics: NexmarkTopics, names: Iterable[str],
                  client: redis.Redis | None = None) -> None:
    """Declare the source tables ``names`` (of person / auction / bid) over ``topics``, in mvlog's catalog
    under ``settings.topic_prefix``; the topics must exist."""
    for name in names:
        spec = DECLARATIONS[name]
        create_source_table(settings, name, spec.columns, list(spec.primary_key), topics.topic_of(name),
                            SOURCE_FORMAT, generated_key=spec.generated_key, client=client)
