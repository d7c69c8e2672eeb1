"""When a failed view consumer is started again, and when it is given up on.

A consumer fails for passing reasons as often as for lasting ones: Spark's Python worker does not connect
back in time on a loaded machine, Redis is wiped and an upstream's MCE reads 0 until the rebuild, a broker
restarts under a read. A process that maintains several views restarts the failed one alone, after a
growing delay; a view that keeps failing (``max_restarts`` within ``window_s``) is a lasting problem and
is marked failed with its reason, for an operator to decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RestartBudget:
    """The restarts of one view: at most ``max_restarts`` within any ``window_s`` seconds, the n-th of a
    run of failures after ``base_delay_s * 2**(n-1)`` seconds (at most ``max_delay_s``)."""

    max_restarts: int = 5
    window_s: float = 600.0
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    _failures: list[float] = field(default_factory=list)

    def after_failure(self, now: float) -> float | None:
        """The delay before the next start, or None once the budget is spent (give up)."""
        self._failures = [t for t in self._failures if now - t < self.window_s]
        if len(self._failures) >= self.max_restarts:
            return None
        self._failures.append(now)
        delay: float = self.base_delay_s * 2.0 ** (len(self._failures) - 1)
        return min(self.max_delay_s, delay)

    @property
    def restarts(self) -> int:
        """Restarts within the current window (what the progress line says)."""
        return len(self._failures)
