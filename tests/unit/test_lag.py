"""Pure lag logic: lag in seconds from epochs, samples, the Burrow-like status rules, undo of changes,
backfill ETA."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvlog.changes import Change, Op, apply_changes, change_between, undo_changes
from mvlog.epoch import epoch_from_millis
from mvlog.lag import LagSample, UpstreamLag, lag_seconds, measure
from mvlog.lag_status import LagStatus, evaluate
from mvlog.view_status import BackfillProgress, CacheOccupancy

T0 = 1_700_000_000_000


def ep(ms_after: int, seq: int = 0) -> int:
    return epoch_from_millis(T0 + ms_after, seq)


def sample(ts: int, mce: int | None, upstream_mce: int | None, lag: int, upstream: str = "u") -> LagSample:
    return LagSample("v", T0 + ts, mce, (UpstreamLag(upstream, upstream_mce, lag, lag_seconds(upstream_mce, mce),
                                                       lag * 10),))


def test_lag_seconds_is_the_time_between_the_epochs() -> None:
    assert lag_seconds(ep(2500), ep(1000)) == 1.5
    assert lag_seconds(ep(1000, 7), ep(1000, 2)) == 0  # same millisecond, another sequence number
    assert lag_seconds(ep(1000), ep(2000)) == 0  # never negative
    assert lag_seconds(None, ep(0)) is None
    assert lag_seconds(ep(0), None) is None


def test_a_join_lags_by_its_worst_side_and_by_the_records_of_both() -> None:
    s = measure("j", T0, ep(1000), {"a": ep(4000), "b": ep(2000)}, {"a": 30, "b": 10}, {"a": 300, "b": 7})
    assert (s.epochs, s.seconds, s.records) == (30, 3.0, 307)
    assert LagSample.from_json(s.to_json()) == s


def test_status_rules() -> None:
    # Caught up now.
    assert evaluate([sample(0, ep(0), ep(0), 0), sample(1000, ep(900), ep(900), 0)]).status == LagStatus.OK
    # Not enough samples.
    assert evaluate([sample(0, ep(0), ep(500), 3)]).status == LagStatus.UNKNOWN
    # The view's MCE is stuck while the upstream moves: stalled (an error).
    stalled = evaluate([sample(0, ep(0), ep(500), 3), sample(1000, ep(0), ep(1500), 8),
                        sample(2000, ep(0), ep(2500), 13)])
    assert stalled.status == LagStatus.STALLED and stalled.status.severity == "ERR"
    assert "13 epoch(s) behind" in stalled.reason
    # Nothing moves and the view is behind: stopped.
    assert evaluate([sample(0, ep(0), ep(500), 3), sample(1000, ep(0), ep(500), 3)]).status == LagStatus.STOPPED
    # The view moves but its lag grows at every step: lagging (a warning).
    lagging = evaluate([sample(0, ep(0), ep(500), 3), sample(1000, ep(300), ep(1500), 5),
                        sample(2000, ep(600), ep(2500), 9)])
    assert lagging.status == LagStatus.LAGGING and lagging.status.severity == "WARN"
    # It moves and its lag shrinks at some step: ok (catching up).
    assert evaluate([sample(0, ep(0), ep(500), 3), sample(1000, ep(300), ep(1500), 5),
                     sample(2000, ep(1400), ep(2500), 4)]).status == LagStatus.OK
    # Burrow: a window with a zero lag in it is ok even though the lag grew since.
    assert evaluate([sample(0, ep(0), ep(0), 0), sample(1000, ep(300), ep(1500), 2),
                     sample(2000, ep(600), ep(2500), 3)]).status == LagStatus.OK
    # The lifecycle wins over the samples.
    failed = evaluate([sample(0, ep(0), ep(0), 0)], "failed", "boom")
    assert failed.status == LagStatus.STOPPED and failed.reason == "failed: boom"
    assert evaluate([], "paused").status == LagStatus.STOPPED


@given(st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 3))), max_size=40),
       st.dictionaries(st.integers(0, 5), st.integers(0, 3), max_size=6))
def test_undo_takes_rows_back_to_before_the_changes(writes: list[tuple[int, int | None]],
                                                    start: dict[int, int]) -> None:
    before = {(k,): {"id": k, "v": v} for k, v in start.items()}
    rows = dict(before)
    changes = []
    for key, value in writes:  # each change is made against the current rows, as a writer does
        after = None if value is None else {"id": key, "v": value}
        change = change_between((key,), rows.get((key,)), after)
        if change is not None:
            changes.append(change)
            apply_changes(rows, [change])
    assert undo_changes(rows, changes) == before


def test_undo_of_a_backfill_read_removes_the_row() -> None:
    rows = apply_changes({}, [Change(Op.READ, (1,), None, {"id": 1})])
    assert undo_changes(rows, [Change(Op.READ, (1,), None, {"id": 1})]) == {}


def test_backfill_progress_and_cache_from_published_fields() -> None:
    progress = BackfillProgress.from_fields({"rows_done": "250", "rows_total": "1000", "rate": "50"})
    assert progress is not None
    assert progress.fraction == 0.25 and progress.eta_seconds == pytest.approx(15.0)
    assert BackfillProgress.from_fields({}) is None
    assert BackfillProgress.from_fields({"rows_done": "5"}) == BackfillProgress(5.0, None, None)
    cache = CacheOccupancy.from_fields({"bytes": "32", "max_bytes": "64", "epochs": "3"})
    assert cache is not None and cache.fraction == 0.5
    assert CacheOccupancy.from_fields({"max_bytes": "64"}) is None
