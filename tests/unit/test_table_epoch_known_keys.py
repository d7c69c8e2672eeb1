"""TableEpochEncoder reads no before-image of a key it knows has no row: it saw the table empty and knows
every key committed since (see mvlog.services.table_epoch); otherwise it reads them all, as before.

The store is a stand-in for the Redis rows (a pure unit test of the encoder's choice of keys to read)."""

from __future__ import annotations

from typing import cast

import pytest

from mvlog.catalog import CatalogEntry
from mvlog.changes import Op
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.schemas.codec import encode_key, encode_row
from mvlog.services import table_epoch
from mvlog.services.table_epoch import TableChange, TableEpochEncoder


class Rows:
    """A table's rows by key bytes, and the keys each read asked for."""

    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}
        self.asked: list[bytes] = []

    def row_count(self, view: str) -> int:
        return len(self.rows)

    def row_list(self, view: str, keys: list[bytes]) -> list[bytes | None]:
        self.asked += keys
        return [self.rows.get(kb) for kb in keys]

    def apply(self, changes: list[TableChange]) -> None:
        for kb, _, _, after, _ in changes:
            if after is None:
                self.rows.pop(kb, None)
            else:
                self.rows[kb] = after


def encoder() -> tuple[TableEpochEncoder, Rows]:
    entry = CatalogEntry("t", "table", RowSchema.of({"id": "int", "v": "string"}, ["id"]), 1)
    rows = Rows()
    return TableEpochEncoder(entry, cast(ViewStore, rows), cast(ChangelogWriter, None)), rows


def row(i: int, v: str = "a") -> Row:
    return {"id": i, "v": v}


def kb(i: int) -> bytes:
    return encode_key(("id",), (i,))


def commit(enc: TableEpochEncoder, rows: Rows, pending: dict[Key, Row | None]) -> list[TableChange]:
    changes = enc.changes(pending)
    rows.apply(changes)
    enc.committed(changes)
    return changes


def ops(changes: list[TableChange]) -> dict[bytes, str]:
    return {change[0]: change[1] for change in changes}


def test_from_an_empty_table_only_keys_with_a_row_are_read() -> None:
    enc, rows = encoder()
    commit(enc, rows, {(1,): row(1), (2,): row(2)})
    rows.asked.clear()
    changes = commit(enc, rows, {(2,): row(2, "b"), (3,): row(3), (1,): None, (9,): None})
    assert sorted(rows.asked) == sorted([kb(1), kb(2)])  # not 3 (new) nor 9 (a delete of no row)
    assert ops(changes) == {kb(1): Op.DELETE.value, kb(2): Op.UPDATE.value, kb(3): Op.CREATE.value}
    update = next(c for c in changes if c[0] == kb(2))
    assert update[2] == encode_row(row(2)) and update[3] == encode_row(row(2, "b"))
    rows.asked.clear()
    commit(enc, rows, {(1,): row(1, "again"), (3,): row(3, "c")})
    assert rows.asked == [kb(3)]  # 1 was deleted: known to have no row


def test_a_row_count_that_differs_from_the_known_keys_reads_every_before_image() -> None:
    enc, rows = encoder()
    commit(enc, rows, {(1,): row(1)})
    rows.rows[kb(5)] = encode_row(row(5))  # written by someone else
    rows.asked.clear()
    changes = commit(enc, rows, {(5,): row(5, "b"), (6,): row(6)})
    assert sorted(rows.asked) == sorted([kb(5), kb(6)])
    assert ops(changes) == {kb(5): Op.UPDATE.value, kb(6): Op.CREATE.value}
    rows.asked.clear()
    commit(enc, rows, {(7,): row(7)})
    assert rows.asked == [kb(7)]  # dropped for good (until the table is seen empty again)


def test_a_failed_epoch_forgets_the_keys() -> None:
    enc, rows = encoder()
    commit(enc, rows, {(1,): row(1)})
    enc.changes({(2,): row(2)})
    enc.forget()  # (Table.commit_epoch, when the commit raised)
    rows.asked.clear()
    commit(enc, rows, {(3,): row(3)})
    assert rows.asked == [kb(3)]


def test_more_keys_than_the_bound_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_epoch, "KNOWN_KEYS_MAX", 2)
    enc, rows = encoder()
    commit(enc, rows, {(i,): row(i) for i in range(3)})
    rows.asked.clear()
    commit(enc, rows, {(10,): row(10)})
    assert rows.asked == [kb(10)]


def test_without_the_compiled_codec_the_same_keys_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_epoch, "native_module", lambda: None)
    test_from_an_empty_table_only_keys_with_a_row_are_read()
