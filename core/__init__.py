"""mvlog: materialized views kept consistent across Kafka changelogs cut into epochs.

The package root holds the pure domain model (epochs, vnodes, rows, changes, view plans); it does no I/O,
so the Faust and the Spark side share it and it is unit-tested without a broker. The I/O lives in
``mvlog.connectors`` (Kafka, Redis, Spark data source) and the processes in ``mvlog.services``.
"""

__version__ = "0.1.0"
