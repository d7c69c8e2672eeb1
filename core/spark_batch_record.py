"""The record, on the barriers of an epoch a Spark write committed, of which write and batch it holds.

A Spark streaming query replays a micro-batch id after a crash whenever its own commit log does not say
the batch was done, even if the sink had committed it. The table's epoch therefore carries (writer,
batch id) in a ``spark_batch`` barrier mutation, in the epoch's own Kafka transaction: the epoch and the
record that it holds that batch commit together or not at all, and a writer that finds its batch id
there skips the replay (:mod:`mvlog.services.tables.spark_sink`). Batch writes (``df.write``) record their
write id with ``batch = -1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mvlog.changes import Mutation

#: Barrier mutation kind of an epoch written by a Spark write.
SPARK_BATCH_MUTATION = "spark_batch"


@dataclass(frozen=True)
class SparkBatch:
    """Which Spark write, and which of its micro-batches (-1 for a batch write), an epoch holds."""

    writer: str  # a streaming query's stable identity (its checkpoint location or writerId option)
    batch: int
    mode: str = "append"  # append | overwrite


def spark_batch_mutation(table: str, batch: SparkBatch) -> Mutation:
    return Mutation(SPARK_BATCH_MUTATION, table, {"writer": batch.writer, "batch": batch.batch, "mode": batch.mode})


def spark_batch_of(mutation: Mutation | None) -> SparkBatch | None:
    """The Spark write a barrier's mutation records, None on other barriers."""
    if mutation is None or mutation.kind != SPARK_BATCH_MUTATION:
        return None
    payload = mutation.payload
    return SparkBatch(str(payload["writer"]), int(payload["batch"]), str(payload.get("mode", "append")))
