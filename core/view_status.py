"""What an operator sees about one table or view: state, MCE, lag, health, backfill, cache, backpressure.

The pieces other services publish (backfill progress, log-cache occupancy, backpressure, a staged
replacement) are optional: a view without them shows "-". ``mvlog status``, the dashboard and
``/metrics`` all render this one record, so they never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mvlog.epoch import epoch_millis
from mvlog.lag import LagSample
from mvlog.lag_status import Verdict
from mvlog.replacement import Status as ReplacementStatus
from mvlog.source_lag import SourceState


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """Rows backfilled so far out of an estimated total, and the measured rate (rows/s)."""

    rows_done: float
    rows_total: float | None
    rate: float | None
    vnodes_done: float | None = None

    @property
    def fraction(self) -> float | None:
        if not self.rows_total:
            return None
        return min(1.0, self.rows_done / self.rows_total)

    @property
    def eta_seconds(self) -> float | None:
        if self.rows_total is None or not self.rate or self.rate <= 0:
            return None
        return max(0.0, self.rows_total - self.rows_done) / self.rate

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> BackfillProgress | None:
        done = _float(fields.get("rows_done"))
        if done is None:
            return None
        return cls(done, _float(fields.get("rows_total")), _float(fields.get("rate")),
                   _float(fields.get("vnodes_done")))

    def to_json(self) -> dict[str, Any]:
        return {"rows_done": self.rows_done, "rows_total": self.rows_total, "rate": self.rate,
                "fraction": self.fraction, "eta_seconds": self.eta_seconds, "vnodes_done": self.vnodes_done}


@dataclass(frozen=True, slots=True)
class CacheOccupancy:
    """How full the log cache of a view's upstream is (bytes and epochs against their bounds)."""

    bytes: float
    max_bytes: float | None
    epochs: float | None
    max_epochs: float | None

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.bytes / self.max_bytes) if self.max_bytes else None

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> CacheOccupancy | None:
        used = _float(fields.get("bytes"))
        if used is None:
            return None
        return cls(used, _float(fields.get("max_bytes")), _float(fields.get("epochs")),
                   _float(fields.get("max_epochs")))

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "max_bytes": self.max_bytes, "epochs": self.epochs,
                "max_epochs": self.max_epochs, "fraction": self.fraction}


@dataclass(frozen=True, slots=True)
class Backpressure:
    """A view's ``max_epoch_lag`` and whether its upstream is held back for it right now."""

    max_epoch_lag: int | None
    holding: bool | None  # None: no log-cache worker reports it

    def to_json(self) -> dict[str, Any]:
        return {"max_epoch_lag": self.max_epoch_lag, "holding": self.holding}


@dataclass(frozen=True, slots=True)
class ViewStatus:
    name: str
    kind: str  # "table" | "view"
    sources: tuple[str, ...]
    state: str | None
    reason: str | None
    mce: int | None
    mce_committed_ts_ms: int | None
    rows: int
    lag: LagSample | None = None
    verdict: Verdict | None = None
    backfill: BackfillProgress | None = None
    cache: dict[str, CacheOccupancy] = field(default_factory=dict)  # upstream -> its cache
    backpressure: Backpressure | None = None
    replacement: dict[str, str] | None = None  # the staged replacement's record (connectors/redis/replacement_store.py)
    source: SourceState | None = None  # a source table's topic, dead letters, problem and lag behind its topic

    @property
    def replacement_summary(self) -> str | None:
        """One phrase for the view's replacement, None when there is none to show (none, or discarded)."""
        record = self.replacement
        if not record or record.get("status") == ReplacementStatus.DISCARDED:
            return None
        if record.get("status") == ReplacementStatus.APPLIED:
            return f"applied at epoch {record.get('applied_epoch', '?')}"
        if error := record.get("error"):
            return f"staged, stopped: {error}"
        if record.get("apply_requested"):
            return "staged, apply waiting"
        if mce := record.get("mce"):
            return f"staged, hydrated to epoch {mce}"
        return "staged, hydrating"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "sources": list(self.sources), "state": self.state,
            "reason": self.reason, "mce": self.mce,
            "mce_ms": epoch_millis(self.mce) if self.mce is not None else None,
            "mce_committed_ts_ms": self.mce_committed_ts_ms, "rows": self.rows,
            "lag": self.lag.to_json() if self.lag is not None else None,
            "status": self.verdict.to_json() if self.verdict is not None else None,
            "backfill": self.backfill.to_json() if self.backfill is not None else None,
            "cache": {name: c.to_json() for name, c in self.cache.items()} or None,
            "backpressure": self.backpressure.to_json() if self.backpressure is not None else None,
            "replacement": self.replacement,
            "replacement_summary": self.replacement_summary,
            "source": self.source.to_json() if self.source is not None else None,
        }
