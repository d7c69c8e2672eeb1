"""The processes and operations of mvlog, built on the pure core and the connectors.

* Writers and consumers: ``tables/`` (a root table's epochs: computed, encoded and committed every
  barrier interval, from Python or a Spark DataFrame), ``pipeline/`` (a view maintained on Spark:
  the consumer loop, its stages' interface, and the ``EpochCommitter`` that owns the commit order of
  every epoch, a table's too), ``backfill/`` (a new view on a live upstream: chunked or from a snapshot),
  ``replacement/`` (replacing a view's definition in place).
* Control plane: ``view_ddl`` (create, drop, alter), ``control_plane`` (Redis rebuilt from Kafka after a
  wipe), ``rederive/`` (``replay derive``, and a view's state re-derived after a wipe),
  ``snapshot_compaction``, ``redelivery`` (replay), ``lag_sampler``, ``status_snapshot``.
* Processes users run: ``cli`` with ``commands/`` (the ``mvlog`` command), ``log_cache/`` (the Faust log
  cache worker), ``dashboard/`` (the lag web page), ``spark/`` (the session, the data source it registers, and
  the Python daemon its workers fork from), ``http_auth``.
"""
