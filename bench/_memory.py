"""Peak resident memory of a benchmark phase's processes, by role, from the kernel's high-water marks.

Issue 19 asks for the peak RSS of the driver and of the executors during a catch-up, and for the driver's
to stay flat as the changes grow. Sampling RSS from a thread of the benchmark would itself be CPU of the
driver's Python process, which the same run measures (``_cpu.py``); instead the kernel's own peak is
used: writing ``5`` to ``/proc/<pid>/clear_refs`` resets a process's ``VmHWM`` (Linux 4.0+, own
processes or root), and ``VmHWM`` read after the phase is its peak RSS since. A process that starts
during the phase (a new Python worker) has its whole life's peak, as it should; one that ends during
it is missing (Spark reuses its Python workers, ``spark.python.worker.reuse``, so few do).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from _cpu import Members, descendants


def reset_peaks(pids: Iterable[int]) -> None:
    """Start each process's peak RSS over from its current RSS."""
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            continue  # gone, or not ours


def peak_mib(pid: int) -> float:
    """``VmHWM`` of a process in MiB; 0 when it is gone (or a kernel thread)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass(frozen=True)
class PeakRss:
    """Peak RSS in MiB of the driver's processes and of each executor (its JVM, its Python workers)."""

    driver_py: float
    driver_jvm: float
    driver_workers: float  # the largest Python worker the driver's JVM runs (plans reads)
    executor_jvms: tuple[float, ...]
    executor_workers: float  # the largest Python worker of any executor
    executors_total: float  # every executor process's peak, summed (an upper bound of their joint peak)

    @classmethod
    def of(cls, members: Members, driver: int, driver_jvm: int) -> PeakRss:
        """Read the peaks of the processes ``members`` found (scanned after the phase)."""
        children: dict[int, list[int]] = {}
        for stat in members.stats.values():
            children.setdefault(stat.ppid, []).append(stat.pid)
        trees = {pid: descendants(children, pid) for pid in members.executors}
        workers = [peak_mib(pid) for tree in trees.values() for pid in tree - set(members.executors)]
        return cls(peak_mib(driver), peak_mib(driver_jvm),
                   max((peak_mib(pid) for pid in members.roles["driver_workers"]), default=0.0),
                   tuple(peak_mib(pid) for pid in members.executors), max(workers, default=0.0),
                   sum(peak_mib(pid) for tree in trees.values() for pid in tree))

    def line(self) -> str:
        jvms = " / ".join(f"{mib:.0f}" for mib in self.executor_jvms)
        return (f"peak RSS (MiB): driver Python {self.driver_py:.0f}, driver JVM {self.driver_jvm:.0f}, its Python "
                f"workers <= {self.driver_workers:.0f}; executor JVMs {jvms}, their Python workers <= "
                f"{self.executor_workers:.0f}, all executors' processes {self.executors_total:.0f}")
