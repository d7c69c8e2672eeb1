"""Lag of a view behind each of its upstreams, in epochs, seconds and records.

Lag is measured against the upstream's max committed epoch (MCE), never against a broker offset: in
epochs (upstream epochs indexed above the view's MCE), in seconds (the upstream's MCE was opened this
long after the view's; epochs are wall-clock milliseconds shifted left 16 bits) and in records (change
events of those epochs, from the epoch index). A view with no committed epoch yet lags by everything the
upstream has. A join lags behind each side separately; its overall lag is the worst side's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mvlog.epoch import epoch_millis


def lag_seconds(upstream_mce: int | None, view_mce: int | None) -> float | None:
    """Time between the upstream's MCE and the view's (0 when caught up; None when either is unknown)."""
    if upstream_mce is None or view_mce is None:
        return None
    return max(0, epoch_millis(upstream_mce) - epoch_millis(view_mce)) / 1000


@dataclass(frozen=True, slots=True)
class UpstreamLag:
    """How far a view is behind one upstream."""

    upstream: str
    upstream_mce: int | None
    epochs: int
    seconds: float | None
    records: int

    def to_json(self) -> dict[str, Any]:
        return {"upstream": self.upstream, "upstream_mce": self.upstream_mce, "epochs": self.epochs,
                "seconds": self.seconds, "records": self.records}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UpstreamLag:
        return cls(data["upstream"], data["upstream_mce"], data["epochs"], data["seconds"], data["records"])


@dataclass(frozen=True, slots=True)
class LagSample:
    """One measurement of a view's lag behind all its upstreams, at wall-clock time ``ts_ms``."""

    view: str
    ts_ms: int
    mce: int | None
    upstreams: tuple[UpstreamLag, ...]

    @property
    def epochs(self) -> int:
        return max((u.epochs for u in self.upstreams), default=0)

    @property
    def seconds(self) -> float | None:
        known = [u.seconds for u in self.upstreams if u.seconds is not None]
        return max(known) if known else None

    @property
    def records(self) -> int:
        """Records still to read, over all upstreams."""
        return sum(u.records for u in self.upstreams)

    def upstream_mces(self) -> dict[str, int | None]:
        return {u.upstream: u.upstream_mce for u in self.upstreams}

    def to_json(self) -> dict[str, Any]:
        return {"view": self.view, "ts_ms": self.ts_ms, "mce": self.mce, "epochs": self.epochs,
                "seconds": self.seconds, "records": self.records,
                "upstreams": [u.to_json() for u in self.upstreams]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LagSample:
        return cls(data["view"], data["ts_ms"], data["mce"],
                   tuple(UpstreamLag.from_json(u) for u in data["upstreams"]))


def measure(view: str, ts_ms: int, view_mce: int | None, upstream_mces: Mapping[str, int | None],
            epochs_after: Mapping[str, int], records_after: Mapping[str, int]) -> LagSample:
    """Assemble a sample from what the epoch index says about each upstream above ``view_mce``."""
    return LagSample(view, ts_ms, view_mce, tuple(
        UpstreamLag(name, upstream_mces[name], epochs_after[name], lag_seconds(upstream_mces[name], view_mce),
                    records_after[name])
        for name in upstream_mces))


def epochs_moved(window: Sequence[LagSample]) -> bool:
    """Whether the view's MCE changed within the window."""
    return len({s.mce for s in window}) > 1


def upstreams_moved(window: Sequence[LagSample]) -> bool:
    """Whether any upstream's MCE changed within the window."""
    if len(window) < 2:
        return False
    first, last = window[0].upstream_mces(), window[-1].upstream_mces()
    return any(first.get(name) != mce for name, mce in last.items())
