"""Redis: a view's serving copy and mvlog's control plane, behind one key layout and one client.

Kafka holds the truth (:mod:`mvlog.connectors.kafka`); Redis holds what is served and coordinated, and
everything in it can be rebuilt from the changelogs and the catalog topic. Each module is one store, one
kind of Redis state; each talks to Redis only (``catalog_store`` also reloads its copy from the
compacted catalog topic, ``source_status`` also measures a source's lag from Kafka: both keep their
result here):

* View serving state, a store per kind: ``view_meta`` (MCE and lifecycle), ``view_rows`` (rows,
  operator state and key order, read), ``epoch_commit`` (an epoch's commit of all of them with its index
  and MCE, one script), ``backfill_store`` (positions, journal, progress), ``load_staging`` (a snapshot
  backfill's first epoch), on the keys of ``view_keyspace``; ``view_store`` is all of them at once, for
  the processes that handle a view's whole state. ``streamed_commit`` (an epoch's rows queued while
  Kafka is still written), ``epoch_index`` (where each epoch's barriers are in Kafka),
  ``snapshot_store``, ``replacement_store`` (a staged replacement and its cut-over).
* Control plane: ``catalog_store``, ``consumer_lease``, ``backpressure``, ``lag_store``,
  ``pipeline_status``, ``source_status``, ``cache_registry`` (which log cache worker holds a partition),
  ``table_writers`` (whether a table's writer runs or stopped, and the epoch readers sealed it through),
  ``writer_claims`` (which producer of a view partition in tasks was made last).
* Plumbing: ``redis_keys`` (every key of a view shares its hash tag ``{view}``, so multi-key scripts run on
  Redis Cluster), ``redis_client`` (how every process connects, and waits through a restart),
  ``lua_scripts`` (the scripts in ``lua/*.lua`` with their shared functions in ``lua/lib/``),
  ``packed_script`` (a script with many arguments sent in one packed ``EVALSHA``), ``chunked_writes``
  (a staging's many fields sent as commands of bounded size).

One unit because these modules share the key layout, the client and its retry policy, and the rule that
a multi-key change is one Lua script (atomic, refusing an epoch at or below the MCE).
"""
