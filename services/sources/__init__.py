"""Source tables: root tables fed by the topics users already have (Debezium, upsert, append), exactly once.

* ``declare``: ``mvlog create-table NAME --from-topic TOPIC --format FORMAT`` (the topic checked, Avro
  columns derived from the writer schema) and :class:`~.declare.SourceError`, what says a source cannot
  be read.
* ``epoch_reader``: the epoch being read: messages decoded into the table's pending writes, bad records
  into dead letters, Debezium's redeliveries dropped, the offsets read past.
* ``commit_behind``: one epoch commit in flight on its own thread while the next epoch is read.
* ``ingester``: ``mvlog run-source``'s loop: consume, cut an epoch every barrier interval (paced while a
  backlog is read), commit it with its offsets in its own Kafka transaction.
* ``committed``: what the committed epochs' barriers recorded (dead letters, Debezium positions), read
  back from the changelog when an ingester starts.

The pure rules (formats, fast decoders, Avro evolution, redelivery filter, offsets on barriers, pace) are in
``mvlog.source_*``; the Spark writer into a table is ``mvlog.services.tables.spark_sink``.
"""
