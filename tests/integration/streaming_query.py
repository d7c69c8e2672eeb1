"""Waiting on a Spark streaming query from a test."""

from __future__ import annotations

import time
from typing import Any


def started(query: Any, timeout: float = 120.0) -> None:
    """Until the streaming query ran its first micro-batch (its Python source worker is up); fails with
    the query's own error if it died meanwhile."""
    deadline = time.monotonic() + timeout
    while query.lastProgress is None:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the view's streaming query did not start"
        time.sleep(0.1)
