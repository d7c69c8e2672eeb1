"""The interface between ``bench/nexmark.py`` and a peer engine's runner (``peers/<engine>.py``).

``bench/nexmark.py`` fills the topics, then for each peer and each query calls
``runner.run(job) -> PeerResult``. A runner module exposes ``RUNNER: PeerRunner`` (an object with ``name``,
``guarantee``, ``supports`` and ``run``). The contract:

**Catch-up** (throughput). ``job.topics`` already hold ``job.expected_events`` events (persons + auctions +
bids, written by :func:`.producer.produce` before any clock starts). The runner starts the engine on
query ``job.query`` reading those topics from the beginning (a consumer group / checkpoint of its own:
nothing of an earlier run may be reused), and measures from the start of its job (engine start included
or not: say which in ``note``) until the effect of the last input event is committed in its output
(for an exactly-once Kafka sink: the transaction holding it committed). ``events_per_s =
expected_events / seconds``.

**Steady latency** (when ``job.steady`` is given). With its job running on ``job.steady.topics`` (empty,
this run's own), the runner calls ``job.steady.produce()`` once: it writes ``events`` events paced at
``rate`` events/s (the first ``warmup_events`` are not to be counted) and returns, per event number, the
wall-clock time of its ``produce`` call (``time.time()``, also the message's Kafka timestamp). In this paced
mode an event's ``date_time`` is its scheduled produce time: ``produced.base_time_ms + number * 1000 /
rate``, which the produce time exceeds by a few ms at most (``produced.produce_time(number)`` is exact). The
latency of an event is the time from its produce call to its effect being committed in the output
(``latency_p50_ms``, ``latency_p99_ms``: nearest-rank percentiles over the counted events, use
:func:`percentile`).

**Result check**. ``final_rows`` are the query's output rows after catch-up (the final state: for an
updating query, the last value per key with retracted rows gone), as dicts named like the columns of
``queries.QUERIES[job.query]``; ``bench/nexmark.py`` compares them across engines and with mvlog's.
``None`` when the engine cannot say (then the table says so).

``guarantee`` is what the run was configured for: ``"exactly-once"``, ``"at-least-once"`` or
``"at-most-once"``, with the details (checkpoint interval, sink) in ``note``. Parallelism is
``job.parallelism`` (2 on this machine) unless the engine cannot set it (say so in ``note``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .model import NexmarkTopics


@dataclass(frozen=True)
class SteadyProduced:
    """What the steady phase's producer wrote: produce times by event number, and how event time maps."""

    produce_times: Sequence[float]  # time.time() at each event's produce call, by event number
    base_time_ms: int  # date_time of event 0
    rate: float  # events/s, of wall-clock time and of event time
    warmup_events: int  # events 0 .. warmup_events-1 are warm-up, not counted

    def produce_time(self, number: int) -> float:
        return self.produce_times[number]

    def number_of(self, date_time_ms: int) -> int:
        """The first event number whose date_time is ``date_time_ms`` (event times are ms, several events
        can share one)."""
        return max(0, math.ceil((date_time_ms - self.base_time_ms) * self.rate / 1000))


@dataclass(frozen=True)
class SteadyPhase:
    """The steady-rate latency phase of one run (see the module doc)."""

    topics: NexmarkTopics  # empty topics of this run's own
    rate: float
    events: int
    warmup_events: int
    produce: Callable[[], SteadyProduced]  # blocking; call it once, after the job runs on ``topics``


@dataclass(frozen=True)
class PeerJob:
    """One query on one engine."""

    query: str  # "q0" .. "q22"
    sql: str  # the query in Spark SQL over person / auction / bid (queries.QUERIES[query].sql)
    bootstrap: str  # Kafka bootstrap servers (loopback)
    topics: NexmarkTopics  # the catch-up topics, already filled
    expected_events: int  # events in those topics
    work_dir: Path  # a fresh folder for this run's checkpoints, logs, ...
    parallelism: int = 2
    steady: SteadyPhase | None = None
    timeout_s: float = 600.0  # give up (and say so in the result) after this long


@dataclass
class PeerResult:
    """What one run measured (``None``: not measured, with why in ``note``)."""

    engine: str  # "Flink SQL", "Spark Structured Streaming", "Quix Streams", "Pathway"
    query: str
    events_per_s: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    guarantee: str  # "exactly-once" | "at-least-once" | "at-most-once"
    final_rows: list[dict[str, Any]] | None
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # anything else worth printing (seconds, ...)


class PeerRunner(Protocol):
    """What ``peers/<engine>.py`` exposes as ``RUNNER``."""

    name: str  # as printed in the table's header
    guarantee: str

    def supports(self, query: str) -> str | None:
        """``None`` when the engine runs ``query`` here; otherwise why not (printed in the table)."""

    def run(self, job: PeerJob) -> PeerResult:
        """Run ``job`` (catch-up, then the steady phase when ``job.steady``); never leave a process behind."""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]
