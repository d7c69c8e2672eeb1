"""A view's health from its recent lag samples, with rules in the spirit of Burrow's.

Burrow judges a Kafka consumer from a sliding window of its committed offsets and lags, not from one
number: a lag that is high but shrinking is fine, a lag that grows at every step is a warning, and a
consumer whose position stops while the log moves on is an error. Here the position is the view's MCE
and the log's end is its upstreams' MCEs. Rules, first match wins:

1. The lifecycle says ``failed`` or ``paused``: **stopped** (``failed`` is an error, ``paused`` intended).
2. Fewer than two samples: **unknown**.
3. Lag 0 in the newest sample: **ok** (caught up).
4. The view's MCE did not move over the window while it lags: **stalled** (error) when an upstream's
   MCE moved, **stopped** when nothing moved (the consumer is not running, or the whole chain stopped).
5. Lag 0 in any sample of the window: **ok** (Burrow: a consumer that caught up in the window is fine).
6. Lag (epochs) never shrank between two samples and grew over the window: **lagging** (warning).
7. Otherwise **ok**: the view moves and keeps up, or catches up.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from mvlog.lag import LagSample, epochs_moved, upstreams_moved


class LagStatus(StrEnum):
    OK = "ok"
    LAGGING = "lagging"
    STALLED = "stalled"
    STOPPED = "stopped"
    UNKNOWN = "unknown"

    @property
    def severity(self) -> str:
        """Burrow's word for it: OK, WARN, ERR, STOP or - (not enough data)."""
        return _SEVERITY[self]


_SEVERITY = {LagStatus.OK: "OK", LagStatus.LAGGING: "WARN", LagStatus.STALLED: "ERR",
             LagStatus.STOPPED: "STOP", LagStatus.UNKNOWN: "-"}


@dataclass(frozen=True, slots=True)
class Verdict:
    status: LagStatus
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"status": self.status.value, "severity": self.status.severity, "reason": self.reason}


def _span_s(window: Sequence[LagSample]) -> float:
    return (window[-1].ts_ms - window[0].ts_ms) / 1000


def evaluate(window: Sequence[LagSample], lifecycle: str | None = None, lifecycle_reason: str = "") -> Verdict:
    """The status of a view from its samples, oldest first (the caller keeps the window's length)."""
    if lifecycle == "failed":
        return Verdict(LagStatus.STOPPED, f"failed: {lifecycle_reason}" if lifecycle_reason else "failed")
    if lifecycle == "paused":
        return Verdict(LagStatus.STOPPED, "paused")
    if len(window) < 2:
        return Verdict(LagStatus.UNKNOWN, "collecting lag samples")
    first, last = window[0], window[-1]
    if last.epochs == 0:
        return Verdict(LagStatus.OK, "caught up")
    if not epochs_moved(window):
        if upstreams_moved(window):
            return Verdict(LagStatus.STALLED, f"MCE unchanged for {_span_s(window):.1f}s while the upstream "
                                              f"moved on; {last.epochs} epoch(s) behind")
        return Verdict(LagStatus.STOPPED, f"nothing moved for {_span_s(window):.1f}s; "
                                          f"{last.epochs} epoch(s) behind")
    if any(s.epochs == 0 for s in window):
        return Verdict(LagStatus.OK, "caught up within the window")
    steps = list(itertools.pairwise(window))
    if all(b.epochs >= a.epochs for a, b in steps) and last.epochs > first.epochs:
        return Verdict(LagStatus.LAGGING, f"lag grew from {first.epochs} to {last.epochs} epochs in "
                                          f"{_span_s(window):.1f}s")
    return Verdict(LagStatus.OK, f"consuming; {last.epochs} epoch(s) behind")
