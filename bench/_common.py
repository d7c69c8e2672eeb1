"""Helpers shared by the benchmark scripts (not part of the mvlog package)."""

from __future__ import annotations

import os
import platform
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mvlog.infra.local_stack import LocalStack

REPO_ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> str:
    """One line: CPU model, usable cores, Python version and platform."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    python = f"{platform.python_implementation()} {platform.python_version()}"
    return f"machine: {cpu_model()}, {cores} core(s), {python}, {platform.system()} {platform.machine()}"


def peak_rss_mib() -> float:
    """Peak resident set size of this program so far, in MiB."""
    from mvlog.process_memory import peak_rss_kib

    return peak_rss_kib() / 1024


def sample_row(i: int) -> dict[str, object]:
    """A ~60-byte row (Avro map encoding of mvlog's value schema): an order line."""
    return {
        "id": i,
        "cust": f"c{i % 9973:05d}",
        "sku": f"S{(i * 7919) % 100000:06d}",
        "qty": 1 + i % 17,
        "price": round(1.0 + (i % 1000) * 0.37, 2),
        "paid": i % 3 != 0,
    }


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


@dataclass
class Throughput:
    """One side of a records/s comparison (mvlog or its baseline), and its printed line."""

    name: str
    records: int
    seconds: float
    wire_bytes: int  # keys + values on the wire
    detail: str = ""

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    def line(self) -> str:
        mb_s = self.wire_bytes / self.seconds / 1e6
        return (f"  {self.name:<9} {fmt_rate(self.rate):>9} records/s  {mb_s:6.1f} MB/s "
                f"({self.records:,} records, {self.wire_bytes / 1e6:.1f} MB in {self.seconds:.2f} s){self.detail}")


@contextmanager
def temporary_stack(prefix: str = "mvlog-bench-") -> Iterator[tuple[LocalStack, Path]]:
    """A local stack (Apache Kafka + redis-server) of the benchmark's own, on free loopback ports in a
    temporary folder, and that folder; stopped and deleted at the end, and killed with the benchmark if it
    dies (``die_with_parent``)."""
    from mvlog.infra.local_stack import LocalStack, free_ports

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        kafka_port, redis_port = free_ports(2)
        stack = LocalStack(data_dir=Path(tmp) / "stack", kafka_port=kafka_port, redis_port=redis_port,
                           die_with_parent=True)
        stack.start()
        try:
            yield stack, Path(tmp)
        finally:
            stack.stop()
