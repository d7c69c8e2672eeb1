"""The I/O layer under the pure core: Kafka, Redis and Spark, each behind a narrow module.

* Kafka changelogs: ``changelog_writer`` (one transaction per epoch), ``changelog_reader`` and
  ``changelog_records`` (barrier-aligned reads, poison records to ``dead_letter``), ``topics``,
  ``retention`` (what the log still holds), ``consumer_groups`` (re-delivery), ``kafka_security``,
  ``schema_registry`` (writer schemas of Avro source topics).
* Redis state: ``view_store`` (rows, MCE, operator state, backfill progress, in Lua scripts built on
  ``lua_prelude`` and sent by ``packed_script``), ``epoch_index``, ``catalog_store``, ``snapshot_store``,
  ``replacement_store``, ``lag_store``, ``cache_registry``, ``consumer_lease``, ``backpressure``,
  ``pipeline_status``, ``streamed_commit``; ``redis_keys`` is their one key layout per view and
  ``redis_client`` is how every process connects.
* Recovery: ``recovery`` rolls Redis forward from a changelog (Kafka is the truth), ``checkpoints``.
* Spark: ``spark_source`` (the ``mvlog`` Python data source), ``change_rows`` (changes as Arrow rows),
  ``log_cache_client`` (reads from the Faust log cache).

Nothing here imports ``mvlog.services``: processes are built on connectors, never the reverse.
"""
