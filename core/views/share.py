"""The share of a view one Spark task's operator maintains, when the view is split over partitions.

A view's operator in Spark's tasks runs once per view partition, each on the input rows the routing
sends it (:mod:`mvlog.views.routing`). Most of those operators maintain whatever they are given, but
two kinds of views put more in a task's input than it owns, or expect a row from none:

- a hopping window's row falls in several windows, maybe of several partitions; each of those
  partitions gets the row once and keeps only its own windows (``rows``, a mask over the aggregate's
  input after WHERE and the windows' expansion);
- a global aggregate's one row has the empty key, so every input row goes to one partition. Its
  operator would emit that row over no input too (SQL's global row), so the other partitions' must
  not create it (``global_row``).

Saying so to the pure operator keeps the rule in one place: every path that runs an operator in a task
(live epochs, backfill, rebuild, derivation, hydration) asks the routing for the partition's share and
gets the same behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class OperatorShare:
    """What one operator maintains of its view: by default, all of it."""

    #: A mask over the aggregate's input (after WHERE and a window's expansion): the rows whose groups
    #: this operator maintains. None: every row it is given.
    rows: Callable[[pa.Table], pa.Array] | None = None
    #: Whether this operator maintains a global aggregate's one row (emits it over no input). A share
    #: without it refuses input rows of a global aggregate: they belong to the row's partition.
    global_row: bool = True
    #: The shares of its subqueries, by name: a GROUP BY subquery over a windowed one, whose task keeps
    #: only the inner windows there (:mod:`mvlog.views.subquery_join_routing`).
    inner: tuple[tuple[str, OperatorShare], ...] = ()


#: The whole view: one operator on the driver, or a task whose routing gives it only rows it owns.
WHOLE = OperatorShare()
