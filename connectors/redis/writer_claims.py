"""Which kept transactional writer of a view partition called ``init_transactions`` last:
``<prefix>:{view}:writer:p<partition>`` in Redis.

A Spark Python worker keeps the writer of a partition it wrote from one micro-batch to the next
(:mod:`mvlog.services.pipeline.kept_writers`). When the partition's task of a later micro-batch ran in
another worker, that worker's ``init_transactions`` fenced the kept one, which only finds out when it
next commits. Each writer claims its partition after its ``init_transactions``, and a kept writer is used
again only while the claim is still its own, so a known-fenced writer is dropped before any work is done
with it. The claim is a hint, not the fence: Kafka's producer epoch is. A writer still holding the claim
may be fenced too (a worker died between its ``init_transactions`` and its claim), and then fails at its
commit as any fenced writer does.
"""

from __future__ import annotations

import redis

from mvlog.connectors.redis.redis_keys import view_key

#: A claim outlives the consumer that made it by this much at most (a kept writer idle longer than this is
#: made again: its claim is gone).
CLAIM_TTL_S = 24 * 3600


def claim_key(prefix: str, view: str, partition: int) -> str:
    return view_key(prefix, view, f"writer:p{partition}")


class WriterClaims:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis, self.prefix = client, prefix

    def _key(self, view: str, partition: int) -> str:
        return claim_key(self.prefix, view, partition)

    def claim(self, view: str, partition: int, writer: str) -> None:
        """``writer`` (a kept writer's token) called ``init_transactions`` last for this partition."""
        self.redis.set(self._key(view, partition), writer, ex=CLAIM_TTL_S)

    def holds(self, view: str, partition: int, writer: str) -> bool:
        """Whether no writer of this partition called ``init_transactions`` since ``writer`` claimed it."""
        found = self.redis.get(self._key(view, partition))
        return (found.decode() if isinstance(found, bytes) else found) == writer
