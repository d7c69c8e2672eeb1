"""librdkafka's log, one line per state change instead of one per retry.

Every confluent-kafka client of a process logs each reconnect attempt while a broker is down ("Connect to
... failed: Connection refused", several a second per client), and a ``run-view`` process holds a dozen
clients: a broker restart of a few seconds printed thousands of lines. Every client mvlog builds logs to
:data:`KAFKA_LOG` (``Settings.kafka_client_config``), whose filter lets the first message of a kind through
and holds back the like ones that follow within a window, then says how many it held back.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

#: The digits of a message (ports, offsets, "after 0ms") do not make it a different kind of message.
_NUMBERS = re.compile(r"\d+")


@dataclass
class _Run:
    """Messages of one kind since the last one let through."""

    shown_at: float
    held: int = 0


class RepeatedMessages(logging.Filter):
    """Lets through the first message of each kind, then at most one per ``window_s`` that says how many
    like it were held back meanwhile.

    A kind is the message with its numbers blanked and, for librdkafka's ``(facility, client, message)``
    arguments, without the client's name: the same failure seen by every client of a process is one kind.
    """

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_kinds: int = 1000) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._max_kinds = max_kinds
        self._runs: dict[tuple[int, str], _Run] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.levelno, _NUMBERS.sub("#", _without_client(record)))
        now = self._clock()
        run = self._runs.get(kind)
        if run is not None and now - run.shown_at < self.window_s:
            run.held += 1
            return False
        if run is not None and run.held:
            record.msg = f"{record.msg} (%d like it held back in the last %.0f s)"
            record.args = (*_args(record), run.held, now - run.shown_at)
        if len(self._runs) >= self._max_kinds and kind not in self._runs:
            self._runs.pop(next(iter(self._runs)))  # the oldest kind: memory stays bounded
        self._runs[kind] = _Run(now)
        return True


def _args(record: logging.LogRecord) -> tuple[object, ...]:
    if isinstance(record.args, tuple):
        return record.args
    return () if record.args is None else (record.args,)


def _without_client(record: logging.LogRecord) -> str:
    args = _args(record)
    if len(args) == 3:  # confluent-kafka logs "%s [%s] %s" % (facility, client name, message)
        facility, _client, message = args
        return f"{facility} {message}"
    return record.getMessage()


#: The logger every confluent-kafka client of mvlog logs to.
KAFKA_LOG = logging.getLogger("mvlog.kafka")
KAFKA_LOG.addFilter(RepeatedMessages())
