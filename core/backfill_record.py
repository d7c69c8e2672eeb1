"""A chunked backfill's progress as carried on the view's own barriers, so it comes back from Kafka.

Redis holds a backfill's positions (``pos:<upstream>:<vnode>``), counters and journal, committed with
each epoch. Redis is a projection of Kafka (I6): so every epoch of a backfill also carries what it
committed in a ``backfill_progress`` mutation on its barriers (the positions it moved, the counters,
whether it finished). Folding those mutations over the view's changelog in epoch order gives back,
at every epoch, the positions, counters and journal that Redis held at that epoch: what a rebuild
after a wipe restores, and what tells an oracle which upstream keys a view covered at each epoch.

Payload (JSON): ``{"positions": {<upstream>: {<vnode>: <member hex> | "done"}}, "rows_done": n,
"start_epoch": e, "done": bool}``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mvlog.backfill import BackfillPositions, Position

#: Barrier mutation kind of an epoch of a running chunked backfill.
BACKFILL_MUTATION = "backfill_progress"

_POSITION_PREFIX = "pos:"
_DONE = "done"

FieldValue = bytes | str | int


def position_field(source: str, vnode: int) -> str:
    """The name of a position in the view's backfill hash."""
    return f"{_POSITION_PREFIX}{source}:{vnode}"


def load_positions(stored: Mapping[bytes, bytes], sources: Iterable[str]) -> BackfillPositions:
    """The positions held in a backfill hash (as read from Redis)."""
    names = list(sources)
    positions: dict[tuple[str, int], Position] = {}
    for name, value in stored.items():
        text = name.decode()
        if text.startswith(_POSITION_PREFIX):
            source, _, vnode = text[len(_POSITION_PREFIX):].rpartition(":")
            if source in names:
                positions[(source, int(vnode))] = Position.decode(value)
    return BackfillPositions(names, positions)


def position_text(position: Position) -> str:
    """A position in a journal line: ``done``, ``-`` (the start) or the member in hex."""
    return "done" if position.done else "-" if position.last is None else position.last.hex()


def journal_line(epoch: int, source: str, vnode: int, start: Position, end: Position) -> str:
    """One committed chunk part: ``<epoch> <upstream> <vnode> <from> <to>``."""
    return f"{epoch} {source} {vnode} {position_text(start)} {position_text(end)}"


def progress_payload(fields: Mapping[str, FieldValue]) -> dict[str, Any]:
    """The mutation payload of one epoch's committed backfill fields (as ``BackfillStep.fields``)."""
    positions: dict[str, dict[str, str]] = {}
    payload: dict[str, Any] = {"positions": positions, "done": False}
    for name, value in fields.items():
        if name.startswith(_POSITION_PREFIX):
            source, _, vnode = name[len(_POSITION_PREFIX):].rpartition(":")
            raw = value if isinstance(value, bytes) else str(value).encode()
            positions.setdefault(source, {})[vnode] = _DONE if raw == b"" else raw.hex()
        elif name == "done":
            payload["done"] = bool(int(value))
        elif name in ("rows_done", "start_epoch"):
            payload[name] = int(value)
    return payload


class BackfillReplay:
    """Folds the ``backfill_progress`` payloads of a view's epochs, in epoch order.

    :meth:`apply` returns what the epoch committed to the backfill hash and journal; :attr:`positions`
    and :attr:`done` are the state after the last epoch folded.
    """

    def __init__(self, sources: Iterable[str], start: BackfillPositions | None = None) -> None:
        self.sources = list(sources)
        self.positions = start or BackfillPositions(self.sources)
        self.done = False
        self.seen = False  # whether any epoch carried a backfill payload

    def apply(self, epoch: int, payload: Mapping[str, Any]) -> tuple[dict[str, FieldValue], list[str]]:
        """The backfill hash fields and journal lines epoch ``epoch`` committed."""
        self.seen = True
        fields: dict[str, FieldValue] = {}
        journal: list[str] = []
        moved_by_source = dict(payload.get("positions", {}))
        for source in self.sources:  # in the order the backfill reads them: upstream by upstream, vnode by vnode
            moved = {int(vnode): text for vnode, text in dict(moved_by_source.get(source, {})).items()}
            for vnode, text in sorted(moved.items()):
                end = Position(done=True) if text == _DONE else Position(False, bytes.fromhex(str(text)))
                start = self.positions.get(source, vnode)
                self.positions.set(source, vnode, end)
                fields[position_field(source, vnode)] = end.encode()
                journal.append(journal_line(epoch, source, vnode, start, end))
        for name in ("rows_done", "start_epoch"):
            if name in payload:
                fields[name] = int(payload[name])
        if payload.get("done"):
            fields["done"] = 1
            self.done = True
        return fields, journal
