"""librdkafka's log: one line per kind of message and window, not one per reconnect attempt."""

from __future__ import annotations

import logging

from mvlog.client_log import RepeatedMessages


def _record(client: str, message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("mvlog.kafka", level, __file__, 1, "%s [%s] %s", ("FAIL", client, message), None)


def test_a_failure_seen_by_every_client_is_shown_once_per_window_with_how_many_were_held_back() -> None:
    now = [0.0]
    repeats = RepeatedMessages(window_s=60, clock=lambda: now[0])
    refused = "127.0.0.1:{port}/bootstrap: Connect to ipv4#127.0.0.1:{port} failed: Connection refused (after {ms}ms)"
    shown = []
    for i in range(500):
        now[0] = i * 0.05
        record = _record(f"rdkafka#consumer-{i % 7}", refused.format(port=45015, ms=i % 3))
        if repeats.filter(record):
            shown.append(record.getMessage())
    assert len(shown) == 1 and shown[0].startswith("FAIL [rdkafka#consumer-0] 127.0.0.1:45015/bootstrap: Connect")
    now[0] = 61.0
    again = _record("rdkafka#producer-3", refused.format(port=45015, ms=0))
    assert repeats.filter(again)
    assert again.getMessage().endswith("(499 like it held back in the last 61 s)")


def test_messages_of_other_kinds_and_levels_are_not_held_back() -> None:
    repeats = RepeatedMessages(window_s=60, clock=lambda: 0.0)
    assert repeats.filter(_record("c1", "Connect to a failed: Connection refused"))
    assert repeats.filter(_record("c1", "Broker: Not coordinator"))
    assert repeats.filter(_record("c1", "Connect to a failed: Connection refused", level=logging.WARNING))
    assert not repeats.filter(_record("c2", "Connect to a failed: Connection refused"))


def test_the_kinds_remembered_are_bounded() -> None:
    repeats = RepeatedMessages(window_s=60, clock=lambda: 0.0, max_kinds=10)
    for i in range(100):
        assert repeats.filter(logging.LogRecord("x", logging.ERROR, __file__, 1, f"kind {chr(65 + i % 26)}{'x' * i}",
                                                None, None))
    assert len(repeats._runs) == 10
