"""Progress bars of running backfills on standard error (``mvlog run-view``).

One bar per view whose consumer is backfilling: rows done of the estimated total (the upstreams' row
count at the last chunk read, so the total moves while the upstream writes), rows/s and ETA. The same
figures are in Redis (``backfill_progress``) for `mvlog status` and the dashboard.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from mvlog.services.pipeline.view_consumer import ViewConsumer


class BackfillBars:
    """Call :meth:`update` now and then; a line is printed when a view's backfill completes."""

    def __init__(self, consumers: Sequence[ViewConsumer], console: Console | None = None) -> None:
        self._consumers = consumers
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[rate]} rows/s"), TimeRemainingColumn(),
                                  console=console or Console(stderr=True), transient=False)
        self._tasks: dict[str, TaskID] = {}
        self._started: dict[str, float] = {}
        self._reported: set[str] = set()

    def __enter__(self) -> BackfillBars:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._progress.stop()

    def update(self) -> None:
        for consumer in self._consumers:
            name = consumer.entry.name
            backfill = consumer.backfills.chunked
            if backfill is None or name in self._reported:
                continue
            if name not in self._tasks:
                self._started[name] = time.monotonic()
                self._tasks[name] = self._progress.add_task(f"{name} backfill", total=backfill.rows_total or None,
                                                            rate="0")
            task = self._tasks[name]
            self._progress.update(task, completed=backfill.rows_done, total=max(backfill.rows_total, 1),
                                  rate=f"{backfill.meter.rate():,.0f}")
            if consumer.backfill is None:  # completed
                self._reported.add(name)
                self._progress.update(task, completed=backfill.rows_done, total=max(backfill.rows_done, 1))
                seconds = time.monotonic() - self._started[name]
                click.echo(f"{name}: backfill done: {backfill.rows_done:,} row(s) in {seconds:.1f} s, live at epoch "
                           f"{consumer.mce}", err=True)
