"""mvlog.join_bound: how far a view over several upstreams may plan, and its epochs there."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvlog.join_bound import PlanBound, UpstreamProgress, plan_bound, union_epochs


def test_running_upstreams_bound_at_the_least_latest_epoch() -> None:
    assert plan_bound([UpstreamProgress("a", 30), UpstreamProgress("b", 10)]) == PlanBound(10)


def test_a_stopped_upstream_behind_a_running_one_is_sealed_through_its_latest() -> None:
    bound = plan_bound([UpstreamProgress("a", 30), UpstreamProgress("b", 10, stopped=True)])
    assert bound == PlanBound(30, ("b",))


def test_a_stopped_upstream_ahead_needs_no_seal_and_does_not_raise_the_bound() -> None:
    bound = plan_bound([UpstreamProgress("a", 10), UpstreamProgress("b", 30, stopped=True)])
    assert bound == PlanBound(10)


def test_all_stopped_reach_the_last_epoch_of_them_all() -> None:
    bound = plan_bound([UpstreamProgress("a", 10, True), UpstreamProgress("b", 30, True),
                        UpstreamProgress("c", 0, True)])
    assert bound == PlanBound(30, ("a", "c"))


def test_no_upstream_is_refused() -> None:
    with pytest.raises(ValueError):
        plan_bound([])


@given(st.lists(st.tuples(st.integers(0, 100), st.booleans()), min_size=1, max_size=5))
def test_the_bound_is_safe(upstreams: list[tuple[int, bool]]) -> None:
    """No running upstream is passed; every stopped one behind the bound is sealed; the bound is an epoch
    some upstream has (or 0)."""
    progress = [UpstreamProgress(f"u{i}", latest, stopped) for i, (latest, stopped) in enumerate(upstreams)]
    bound = plan_bound(progress)
    assert all(bound.epoch <= u.latest for u in progress if not u.stopped)
    assert set(bound.seal) == {u.name for u in progress if u.stopped and u.latest < bound.epoch}
    assert bound.epoch in {u.latest for u in progress}


def test_union_epochs_sums_shared_epochs_within_the_range() -> None:
    a = [(1, 5), (4, 2), (9, 1)]
    b = [(2, 3), (4, 1), (12, 7)]
    assert union_epochs([a, b], 1, 9) == [(2, 3), (4, 3), (9, 1)]
    assert union_epochs([a, b], 12, 20) == []
