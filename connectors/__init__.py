"""The I/O layer under the pure core: one package per system mvlog talks to.

* :mod:`mvlog.connectors.kafka`: the changelogs, the truth. An epoch is one Kafka transaction; readers
  align epochs on barriers; topics, retention, consumer groups, security, dead letters, the schema
  registry of Avro sources.
* :mod:`mvlog.connectors.redis`: the serving copy and the control plane. View state (rows, MCE,
  operator state, backfill progress), the epoch index, the catalog's copy, replacements, lag, leases,
  the log cache's registry; one key layout and one client; the Lua scripts in ``redis/lua/*.lua``.
* :mod:`mvlog.connectors.spark`: the ``mvlog`` Python data source (driver planning, executor reads)
  and its row shape, with the executors' read through the log cache.

Two modules stay here, beside the three packages, because each is a rule *between* Kafka and Redis
rather than a client of one of them; putting them in either package would hide half of what they read:

* ``recovery``: rolls a view's Redis state forward from its changelog (Kafka is the truth, Redis is
  behind after a crash or a wipe): it reads with :mod:`~mvlog.connectors.kafka.changelog_reader` and
  commits with :mod:`~mvlog.connectors.redis.view_store`.
* ``checkpoints``: which committed epochs are checkpoints; the flag is on the barriers in Kafka, found
  at the offsets the Redis epoch index holds.

The packages import each other sideways where one system points into another (the changelog reader
follows the epoch index; the view store commits the bytes the changelog writer encoded). Nothing here
imports ``mvlog.services``: processes are built on connectors, never the reverse.
"""
