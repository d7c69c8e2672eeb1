"""One epoch of a view committed: its output encoded once, then the commit order of the
:class:`~mvlog.services.pipeline.committer.EpochCommitter` (Kafka transaction, then one Redis script).

Kept apart from the consumer's loop: the loop decides *which* epochs to compute and in what order, this
says what one computed epoch writes, and the committer when it counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from mvlog.catalog import CatalogEntry
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, CommittedEpoch, encode_batch
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.view_store import ViewStore, commit_from_encoded
from mvlog.services.pipeline.committer import EpochCommitter, ScriptCommit
from mvlog.services.pipeline.stage import EpochWork
from mvlog.views import EpochOutput


def commit_view_epoch(committer: EpochCommitter, store: ViewStore, entry: CatalogEntry, work: EpochWork,
                      output: EpochOutput) -> None:
    """The epoch's changes and barriers (and the stages' mutation) to Kafka in one transaction, then rows,
    operator state, epoch index and MCE (and the stages' fields) to Redis in one script; keys and rows are
    encoded once, for both."""
    epoch, encoded, follows = work.epoch, encode_batch(entry.key_columns, output.changes), committer.mce
    puts, deletes = output.state_puts_and_deletes()

    def produce(writer: ChangelogWriter) -> CommittedEpoch:
        return writer.commit_batches(epoch, follows, [encoded], mutation=work.mutation)

    def apply(index: Mapping[int, IndexEntry]) -> bool:
        return store.commit(entry.name, commit_from_encoded(
            epoch, output.changes.keys, encoded, index, state_puts=puts, state_deletes=deletes, follows=follows,
            **work.commit_fields))

    committer.commit(epoch, produce, ScriptCommit(apply))
