"""Kafka: the changelogs, which are mvlog's source of truth, and the topics around them.

Everything here talks to the broker (producers, consumers, the admin client) or decodes what it returns;
Redis is consulted only where Kafka offsets are planned from the epoch index.

* Writing: ``changelog_writer`` (one transaction per epoch, barriers on every partition), ``topics``
  (creating changelogs, their record limits), ``dead_letter`` (poison records to ``<view>.dlq``).
* Reading: ``changelog_reader`` (barrier-aligned, read_committed), ``changelog_records`` (classifying one
  record; never raises on bad input), ``retention`` (what the log still holds).
* Operating the broker: ``consumer_groups`` (re-delivery), ``kafka_security`` (TLS/SASL, refusals),
  ``broker_probe`` (is the broker reachable), ``schema_registry`` (writer schemas of Avro source topics).

One unit because they share one protocol, the wire format of the README (changes, barriers, headers,
transactional ids): a change to it touches these modules and nothing else in the I/O layer.
"""
