"""Root tables: what people write through becomes epochs of the table's changelog.

* :mod:`~mvlog.services.tables.writer`: :class:`~mvlog.services.tables.writer.Table`, rows validated and
  batched, each epoch committed (Kafka transaction, then Redis) by the pipeline's committer;
* :mod:`~mvlog.services.tables.epoch`: one epoch's pending writes folded against the committed rows and
  encoded;
* :mod:`~mvlog.services.tables.epoch_loop`: the epochs a table commits every barrier interval, on a thread
  of its own;
* :mod:`~mvlog.services.tables.spark_sink`: the writing side of ``format("mvlog")``, a DataFrame into a
  table, one epoch per (micro-)batch.
"""
