"""Change-event codec: fastavro against the reference ``avro`` package (and mvlog's own codec).

Each side encodes the same change events (creates of ~60-byte rows, mvlog's ``change_event.avsc``) to
schemaless Avro binary, and decodes mvlog's bytes of them (what a consumer reads off the changelog)
back into :class:`mvlog.changes.Change` objects, in the same run:

* fastavro: ``schemaless_writer``/``schemaless_reader`` with the parsed schema (what "fastavro" means
  in the README: the library a Python consumer of mvlog topics would use);
* avro: the reference package's ``DatumWriter``/``DatumReader`` (pure Python), made once;
* mvlog codec: ``encode_change``/``decode_change`` as mvlog's writers and readers use them (the
  compiled ``native_codec``: byte for byte fastavro's output, the same values back).

fastavro and mvlog's codec give the same bytes, and all three decode to the same changes (checked
before timing). Each side runs ``--repeat`` times, interleaved; the best run counts. The last line is
fastavro's encode+decode rate over avro's.

    /tmp/venv/bin/python bench/codec.py [--records 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import fastavro

from mvlog.changes import Change, Op
from mvlog.schemas.codec import decode_change, encode_change, encode_key, encode_row
from mvlog.vnode import vnode_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, fmt_rate, machine_info, peak_rss_mib, sample_row

VIEW = "orders"
KEY_COLUMNS = ("id",)
TS_MS = 1_700_000_000_000


_SCHEMA_TEXT = (REPO_ROOT / "schemas" / "change_event.avsc").read_text()
# Source fields beyond view/epoch/vnode take their schema defaults, as mvlog's encode_change does when
# not given them (the reference package does not fill defaults in by itself).
_SOURCE = next(f for f in json.loads(_SCHEMA_TEXT)["fields"] if f["name"] == "source")["type"]
_SOURCE_DEFAULTS = {f["name"]: f["default"] for f in _SOURCE["fields"] if f["name"] not in ("view", "epoch", "vnode")}


def _datum(view: str, epoch: int, vnode: int, change: Change, ts_ms: int) -> dict[str, Any]:
    return {"before": change.before, "after": change.after, "op": change.op.value,
            "source": {"view": view, "epoch": epoch, "vnode": vnode, **_SOURCE_DEFAULTS}, "ts_ms": ts_ms}


class FastavroCodec:
    """The change event with fastavro's generic ``schemaless_writer``/``schemaless_reader``."""

    def __init__(self) -> None:
        self._schema = fastavro.parse_schema(json.loads(_SCHEMA_TEXT))

    def encode(self, view: str, epoch: int, vnode: int, change: Change, ts_ms: int) -> bytes:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, self._schema, _datum(view, epoch, vnode, change, ts_ms))
        return buffer.getvalue()

    def decode(self, key: tuple[Any, ...], data: bytes) -> tuple[Change, dict[str, Any]]:
        buffer = io.BytesIO(data)
        datum: Any = fastavro.schemaless_reader(buffer, self._schema, None)
        if buffer.tell() != len(data):
            raise ValueError("trailing bytes")
        return Change(Op(datum["op"]), key, datum["before"], datum["after"]), datum["source"]


class ReferenceAvroCodec:
    """The same with the reference ``avro`` package (pure Python); writer and reader made once."""

    def __init__(self) -> None:
        schema = avro.schema.parse(_SCHEMA_TEXT)
        self._writer = avro.io.DatumWriter(schema)
        self._reader = avro.io.DatumReader(schema, schema)

    def encode(self, view: str, epoch: int, vnode: int, change: Change, ts_ms: int) -> bytes:
        buffer = io.BytesIO()
        self._writer.write(_datum(view, epoch, vnode, change, ts_ms), avro.io.BinaryEncoder(buffer))
        return buffer.getvalue()

    def decode(self, key: tuple[Any, ...], data: bytes) -> tuple[Change, dict[str, Any]]:
        buffer = io.BytesIO(data)
        datum: dict[str, Any] = self._reader.read(avro.io.BinaryDecoder(buffer))  # type: ignore[assignment]
        if buffer.tell() != len(data):
            raise ValueError("trailing bytes")
        return Change(Op(datum["op"]), key, datum["before"], datum["after"]), datum["source"]


Encode = Callable[[str, int, int, Change, int], bytes]
Decode = Callable[[tuple[Any, ...], bytes], tuple[Change, dict[str, Any]]]


def mvlog_decode(key: tuple[Any, ...], data: bytes) -> tuple[Change, dict[str, Any]]:
    """mvlog's reader takes the key from the row image and checks it against the record's Kafka key."""
    return decode_change(KEY_COLUMNS, encode_key(KEY_COLUMNS, key), data)


def _time_side(encode: Encode, decode: Decode, changes: Sequence[Change], vnodes: Sequence[int],
               epoch: int, wire: Sequence[bytes]) -> tuple[float, float]:
    """Seconds to encode all changes, and seconds to decode their bytes as mvlog writes them."""
    gc.collect()
    start = time.perf_counter()
    for change, vnode in zip(changes, vnodes, strict=True):
        encode(VIEW, epoch, vnode, change, TS_MS)
    middle = time.perf_counter()
    for change, data in zip(changes, wire, strict=True):
        decode(change.key, data)
    end = time.perf_counter()
    return middle - start, end - middle


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="change events per run (default 20000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side; the best counts (default 3)")
    args = parser.parse_args(argv)

    rows = [sample_row(i) for i in range(args.records)]
    changes = [Change(Op.CREATE, (row["id"],), None, row) for row in rows]
    vnodes = [vnode_of(str(row["id"]).encode()) for row in rows]
    epoch = (TS_MS << 16) | 1
    row_bytes = sum(len(encode_row(row)) for row in rows) / len(rows)
    wire = [encode_change(VIEW, epoch, vnode, change, TS_MS) for change, vnode in zip(changes, vnodes, strict=True)]
    wire_bytes = sum(map(len, wire))

    plain, reference = FastavroCodec(), ReferenceAvroCodec()
    differing = 0
    for change, vnode in zip(changes[:200], vnodes[:200], strict=True):
        ours = encode_change(VIEW, epoch, vnode, change, TS_MS)
        if plain.encode(VIEW, epoch, vnode, change, TS_MS) != ours:
            raise SystemExit(f"mvlog's codec and fastavro encode {change} differently")
        differing += reference.encode(VIEW, epoch, vnode, change, TS_MS) != ours
        expected = mvlog_decode(change.key, ours)
        if plain.decode(change.key, ours) != expected or reference.decode(change.key, ours) != expected:
            raise SystemExit(f"the packages decode mvlog's bytes of {change} differently")

    fastavro_name, avro_name = f"fastavro {fastavro.__version__}", f"avro {avro.__version__}"
    sides: dict[str, tuple[Encode, Decode]] = {
        fastavro_name: (plain.encode, plain.decode),
        avro_name: (reference.encode, reference.decode),
        "mvlog codec": (encode_change, mvlog_decode),
    }
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):  # interleaved, so both sides see the same machine state
        for name, (encode, decode) in sides.items():
            result = _time_side(encode, decode, changes, vnodes, epoch, wire)
            if name not in best or sum(result) < sum(best[name]):
                best[name] = result

    n = args.records
    print(f"codec benchmark: {n:,} change events (creates), rows ~{row_bytes:.0f} bytes, "
          f"events ~{wire_bytes / n:.0f} bytes; best of {args.repeat}")
    print(machine_info())
    rates: dict[str, float] = {}
    for name, (enc_s, dec_s) in best.items():
        rates[name] = n / (enc_s + dec_s)
        print(f"  {name:<16} encode {fmt_rate(n / enc_s):>10} rec/s   decode {fmt_rate(n / dec_s):>10} rec/s   "
              f"encode+decode {fmt_rate(rates[name]):>10} rec/s   ({wire_bytes / (enc_s + dec_s) / 1e6:.1f} MB/s)")
    if differing:
        print(f"  note: avro {avro.__version__} wrote other bytes than mvlog for {differing} of 200 checked events: "
              "it takes the last union branch that fits, so int and boolean row values become doubles; "
              "it decodes mvlog's bytes correctly")
    print(f"  peak RSS {peak_rss_mib():.0f} MiB")
    print(f"  mvlog codec: encode_change/decode_change as the writers and readers use them (compiled "
          f"native_codec): {rates['mvlog codec'] / rates[fastavro_name]:.1f}x fastavro, "
          f"{rates['mvlog codec'] / rates[avro_name]:.1f}x avro")
    print(f"ratio fastavro/avro (encode+decode records/s): {rates[fastavro_name] / rates[avro_name]:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
