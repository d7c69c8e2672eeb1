"""Children that do not outlive whoever started them.

The local stack, the soak and the test fixtures start brokers, databases and pipeline processes. When the
starting process is SIGKILLed (a test's timeout, an operator's Ctrl-\\), its children would otherwise run on
as orphans holding ports and CPU: Linux's parent-death signal ends them instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that has Linux send ``sig`` to the child when its parent
    dies; ``None`` (nothing to do) elsewhere."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:  # pragma: no cover - runs in the child between fork and exec
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))

    return arm
