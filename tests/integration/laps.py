"""How long each phase of a long test took, for its report line: where the suite's minutes go."""

from __future__ import annotations

import time


class Laps:
    """Phases timed back to back; a phase lapped again (a loop's) adds up."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, what: str) -> None:
        """End the running phase as ``what`` and start the next."""
        now = time.monotonic()
        self.times[what] = self.times.get(what, 0.0) + now - self._last
        self._last = now

    def __str__(self) -> str:
        return ", ".join(f"{what} {seconds:.1f} s" for what, seconds in self.times.items())
