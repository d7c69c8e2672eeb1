"""Nexmark on mvlog and on the peer engines, from the same Kafka topics.

What this package holds (``bench/nexmark.py`` is the entry script):

* :mod:`.model` - the ONE definition of the three topics (``nexmark-person``, ``nexmark-auction``,
  ``nexmark-bid``): their names, fields and types. mvlog's source tables and every peer runner are
  built from it, so all engines read the same data under the same names.
* :mod:`.generator` - the Nexmark event generator (a port of the reference generator's rules: event
  mix, sizes, key relations, event times); pure, no I/O.
* :mod:`.producer` - writes its events to the topics, paced or not (``python -m bench.nexmark_suite.producer``).
* :mod:`.peer` - the small interface ``bench/nexmark.py`` calls on each peer runner (``PeerResult``).
* :mod:`.queries` - the Nexmark queries q0-q22 as SQL over those tables (Spark SQL dialect, times as
  int epoch milliseconds).
* ``peers/`` - the peer engines' runners (Flink, Spark Structured Streaming, Quix Streams, Pathway).
"""
