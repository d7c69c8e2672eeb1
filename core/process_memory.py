"""The peak memory of this process, as the bounded-memory checks (I4) read it.

``getrusage().ru_maxrss`` is the wrong number for a process started by a larger one: Linux keeps the
high-water mark across ``execve``, so a cache worker launched by a test runner holding Spark would report
the runner's peak as its own. ``VmHWM`` in ``/proc/self/status`` belongs to the current program only.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")


def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` figure in KiB (None where ``/proc`` is missing)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_kib() -> int:
    """Resident set size of this process now, in KiB (0 where ``/proc`` is missing)."""
    return _status_kib("VmRSS:") or 0


def peak_rss_kib() -> int:
    """Peak resident set size of this program so far, in KiB."""
    peak_kib = _status_kib("VmHWM:")
    if peak_kib is not None:
        return peak_kib
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # no /proc: not Linux
    return peak // 1024 if sys.platform == "darwin" else peak
