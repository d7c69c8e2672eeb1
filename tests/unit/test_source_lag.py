"""A source table's lag behind its topic and its dead-letter total on the barriers (pure rules)."""

from __future__ import annotations

from mvlog.changes import Mutation
from mvlog.source_lag import PartitionPosition, SourceLag, SourceState, missing_topic, source_lag
from mvlog.source_offsets import dead_letters_of, offsets_mutation, offsets_of
from mvlog.source_pace import EpochPace

NOW = 1_000_000


def test_caught_up_lags_nothing() -> None:
    lag = source_lag("t", "topic", "g", NOW, [PartitionPosition(0, 10, 0, 10), PartitionPosition(1, 5, 0, 5)])
    assert (lag.records, lag.seconds, lag.problems) == (0, 0.0, ())


def test_records_from_committed_to_end_and_seconds_from_the_oldest_unread_message() -> None:
    lag = source_lag("t", "topic", "g", NOW, [
        PartitionPosition(0, 10, 0, 25, NOW - 4_000),  # 15 unread, the oldest 4 s old
        PartitionPosition(1, 7, 0, 9, NOW - 1_500),
        PartitionPosition(2, 3, 0, 3),  # idle: nothing unread
    ])
    assert lag.records == 17 and lag.seconds == 4.0 and lag.partitions == 3


def test_never_committed_lags_from_the_start_and_a_clock_ahead_counts_zero() -> None:
    lag = source_lag("t", "topic", "g", NOW, [PartitionPosition(0, None, 100, 130, NOW + 5_000)])
    assert lag.records == 30 and lag.seconds == 0.0


def test_unread_message_not_fetched_in_time_leaves_seconds_unknown() -> None:
    lag = source_lag("t", "topic", "g", NOW, [PartitionPosition(0, 0, 0, 3, None)])
    assert lag.records == 3 and lag.seconds is None
    known = source_lag("t", "topic", "g", NOW, [PartitionPosition(0, 0, 0, 3, None),
                                                PartitionPosition(1, 0, 0, 2, NOW - 2_000)])
    assert known.seconds == 2.0  # the worst known age still shows


def test_offsets_deleted_by_retention_are_a_problem_with_what_to_do() -> None:
    lag = source_lag("t", "topic", "mv.t.source", NOW, [PartitionPosition(1, 40, 100, 150, NOW - 1_000)])
    assert lag.records == 50  # what is still in the topic
    (problem,) = lag.problems
    assert "topic[1]: retention deleted offsets 40 to 99" in problem and "60 message(s)" in problem
    assert "reset group mv.t.source" in problem


def test_missing_topic_is_a_problem() -> None:
    lag = missing_topic("t", "gone", NOW)
    assert lag.partitions == 0 and "source topic 'gone' does not exist" in lag.problems[0]


def test_json_round_trip_and_state_problems() -> None:
    lag = source_lag("t", "topic", "g", NOW, [PartitionPosition(0, 1, 5, 6, NOW)])
    assert SourceLag.from_json(lag.to_json()) == lag
    state = SourceState("topic", "upsert-json", 3, "mv.t.dlq", "the ingester stopped", lag)
    assert state.problems == ["the ingester stopped", *lag.problems]
    assert state.to_json()["dead_letters"] == 3 and state.with_lag(None).lag is None


def test_dead_letter_total_rides_on_the_offsets_mutation() -> None:
    mutation = offsets_mutation("t", "topic", {0: 5, 1: 7}, None, 4)
    assert dead_letters_of(mutation) == 4 and offsets_of(mutation) == {0: 5, 1: 7}
    assert dead_letters_of(offsets_mutation("t", "topic", {0: 1})) == 0
    assert dead_letters_of(Mutation("pause", "t", {})) == 0 and dead_letters_of(None) == 0


def test_pace_caps_an_epoch_at_what_its_work_does_within_the_interval() -> None:
    pace = EpochPace(0.2, share=0.5, min_messages=100)
    assert pace.max_messages() is None  # nothing measured: the interval alone cuts
    pace.observe(10, 1.0)  # too small an epoch to say anything about the cost per message
    assert pace.max_messages() is None
    pace.observe(20_000, 2.0)  # 0.1 ms per message: 0.1 s of the 0.2 s interval fits 1000
    assert pace.max_messages() == 1000
    pace.observe(1000, 0.2)  # 0.2 ms per message: the moving average says 0.15 ms
    assert pace.max_messages() == 666
    pace.observe(1000, 100.0)  # a very slow machine: never below the minimum (epochs must progress)
    assert pace.max_messages() == 100
