"""A micro-batch's admitted epochs: within both limits, at least one epoch, and no fewer than fit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mvlog.trigger_limit import last_admitted

sizes = st.lists(st.integers(0, 1000), max_size=30)
limits = st.one_of(st.none(), st.integers(1, 40))
record_limits = st.one_of(st.none(), st.integers(1, 5000))


@given(sizes, limits, record_limits)
def test_a_micro_batch_is_the_longest_prefix_within_the_limits(records: list[int], max_epochs: int | None,
                                                               max_records: int | None) -> None:
    epochs = [(100 + i, n) for i, n in enumerate(records)]
    last = last_admitted(epochs, max_epochs, max_records)
    if not epochs:
        assert last is None
        return
    assert last is not None
    taken = [e for e in epochs if e[0] <= last]
    assert len(taken) >= 1  # one epoch at least, however large
    if len(taken) > 1:
        assert max_records is None or sum(n for _, n in taken) <= max_records
    assert max_epochs is None or len(taken) <= max_epochs
    if len(taken) < len(epochs):  # stopped early: one more epoch would break a limit
        more = epochs[: len(taken) + 1]
        assert (max_epochs is not None and len(more) > max_epochs) or (
            max_records is not None and sum(n for _, n in more) > max_records)


def test_an_epoch_larger_than_the_record_limit_is_admitted_alone() -> None:
    assert last_admitted([(1, 500), (2, 1)], None, 100) == 1
    assert last_admitted([(1, 50), (2, 60), (3, 1)], 10, 100) == 1
    assert last_admitted([(1, 50), (2, 50), (3, 1)], 2, 100) == 2
