"""The peer engines of the Nexmark benchmark, each run on the same topics and broker as mvlog.

One module per engine exposes ``RUNNER`` (the :class:`.base.PeerRunner` interface ``bench/nexmark.py``
calls): :mod:`.spark` (Spark Structured Streaming, its own Kafka source and sink), :mod:`.quix` (Quix
Streams), :mod:`.pathway` (Pathway) and :mod:`.flink` (Flink SQL on a local mini-cluster). Each engine runs
as a child process in a virtualenv of its own (:mod:`.venvs`, from ``requirements/<engine>.txt``), so its
pins never touch mvlog's; the job it runs is the stand-alone script ``jobs/<engine>_job.py``. JVM jars come
from Maven Central through the poms under ``poms/`` (:mod:`.jars`). What a run measures (the output topic
tailed by the parent, the final result against DuckDB) is :mod:`.measure`; the queries and their oracle
are :mod:`.queries`.
"""
