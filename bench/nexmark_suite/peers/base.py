"""The runner interface the peers implement, as the generator's side defines it (``..peer``), and the topic
names (``..model``): re-exported so every peer module imports them from one place.

(Until ``bench/nexmark_suite/peer.py`` was committed this module held a copy of it.)
"""

from __future__ import annotations

from ..model import NexmarkTopics
from ..peer import PeerJob, PeerResult, PeerRunner, SteadyPhase, SteadyProduced, percentile

__all__ = ["NexmarkTopics", "PeerJob", "PeerResult", "PeerRunner", "SteadyPhase", "SteadyProduced", "percentile"]
