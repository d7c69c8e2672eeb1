"""The restart policy of a failed view consumer: growing delays, then a lasting failure."""

from __future__ import annotations

from mvlog.restart_budget import RestartBudget


def test_delays_grow_then_the_view_is_given_up_on() -> None:
    budget = RestartBudget(max_restarts=4, window_s=600, base_delay_s=1, max_delay_s=5)
    assert [budget.after_failure(t) for t in (0, 10, 20, 30)] == [1, 2, 4, 5]
    assert budget.after_failure(40) is None
    assert budget.restarts == 4


def test_failures_older_than_the_window_no_longer_count() -> None:
    budget = RestartBudget(max_restarts=2, window_s=100, base_delay_s=1)
    assert budget.after_failure(0) == 1 and budget.after_failure(50) == 2
    assert budget.after_failure(99) is None
    assert budget.after_failure(151) == 1  # the failures at 0 and 50 are out of the window
