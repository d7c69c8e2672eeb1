"""The operator and producer commands of ``mvlog`` (registered in ``mvlog.services.cli.LAZY_COMMANDS``).

One module per concept: ``tables`` (create-table, insert), ``definitions`` (create-view, drop-view),
``read`` (read), ``run_view`` (run-view), ``listing`` (views); and what they share: ``backends``
(reaching Redis and Kafka, clean errors), ``values`` (typed values from the command line and JSON),
``output`` (tables and JSON on standard output).
"""
