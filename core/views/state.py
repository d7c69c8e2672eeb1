"""Where an operator's state lives between epochs: read through ``StateReader``, written by the caller.

The operator never writes state itself; it returns the writes of an epoch, and the caller persists them
atomically with the view's rows and committed epoch (Redis in production). A crash between epochs thus
never leaves state that is ahead of, or behind, the view it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol


class StateReader(Protocol):
    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """The stored value of each key that has one; missing keys are absent from the result."""
        ...


class StoredState:
    """The state kept by a store, read through its function of many keys (a view's state in Redis:
    ``StoredState(partial(store.get_state, view))``)."""

    def __init__(self, read: Callable[[Sequence[bytes]], dict[bytes, bytes]]) -> None:
        self._read = read

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return self._read(keys)


class InMemoryState:
    """A dict-backed state store, for tests and for views small enough to rebuild on start."""

    def __init__(self, data: Mapping[bytes, bytes] | None = None) -> None:
        self.data: dict[bytes, bytes] = dict(data or {})

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return {key: self.data[key] for key in keys if key in self.data}

    def apply(self, writes: Mapping[bytes, bytes | None]) -> None:
        """Persist an epoch's writes (``None`` deletes the key)."""
        for key, value in writes.items():
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value

    def __len__(self) -> int:
        return len(self.data)


def inner_prefix(name: str) -> bytes:
    """The prefix of a subquery's (or union branch's) state keys inside its view's state: ``(<name>)``."""
    return b"(" + name.encode() + b")"


class PrefixedState:
    """The part of a state store under ``prefix``, read with keys relative to it: the state of an
    operator nested in another one (a subquery's), kept apart from its host's and its siblings'."""

    def __init__(self, reader: StateReader, prefix: bytes) -> None:
        self.reader = reader
        self.prefix = prefix

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        found = self.reader.get_many([self.prefix + key for key in keys])
        size = len(self.prefix)
        return {key[size:]: value for key, value in found.items()}


class LayeredState:
    """Writes of epochs not yet persisted, over the persisted state: what the operator of one partition
    reads when a Spark task computes several epochs in a row (state read from the committed store, each
    epoch's writes applied here before the next epoch; the store itself changes only when the driver
    commits). Reading never falls through to a key this layer deleted."""

    def __init__(self, base: StateReader) -> None:
        self.base = base
        self.writes: dict[bytes, bytes | None] = {}

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        found = {key: value for key in keys if (value := self.writes.get(key)) is not None}
        rest = [key for key in keys if key not in self.writes]
        if rest:
            found.update(self.base.get_many(rest))
        return found

    def apply(self, writes: Mapping[bytes, bytes | None]) -> None:
        """One epoch's writes (``None`` deletes the key), on top of the earlier ones."""
        self.writes.update(writes)
