"""The peer engines of the Nexmark benchmark, each run on the same topics and broker as mvlog.

One module per engine exposes ``RUNNER`` (the :class:`.base.PeerRunner` interface ``bench/nexmark.py``
calls): :mod:`.spark` (Spark Structured Streaming, its own Kafka source and sink), :mod:`.quix` (Quix
Streams), :mod:`.pathway` (Pathway) and :mod:`.flink` (Flink SQL on a local mini-cluster). Each engine runs
as a child process in a virtualenv of its own (:mod:`.venvs`, from ``requirements/<engine>.txt``), so its
pins never touch mvlog's; the job it runs is the stand-alone script ``jobs/<engine>_job.py``. JVM jars come
from Maven Central through the poms under ``poms/`` (:mod:`.jars`). What a run measures (the output topic
tailed by the parent, the final result against DuckDB) is :mod:`.measure` and :mod:`.engine`; the queries
and their oracle are :mod:`.queries`. ``make bench-peers`` prepares the venvs and jars.

What each engine runs with (queries q0-q3, q17, q20-q22 on all four; parallelism 2, the machine's cores):

============================  ===========================================  ==============  ======================
engine                        version, jars                                guarantee       how
============================  ===========================================  ==============  ======================
Spark Structured Streaming    pyspark 4.2.0 + spark-sql-kafka-0-10_2.13    at-least-once   ``local[2]``, 2 shuffle
                              4.2.0 (+ kafka-clients 3.9.2, commons-pool2,                 partitions, default
                              spark-token-provider-kafka)                                  trigger, checkpointed
                                                                                           state; Spark's Kafka
                                                                                           sink is at-least-once
Quix Streams                  quixstreams 3.28.1                           exactly-once    ``processing_guarantee=
                                                                                           "exactly-once"``,
                                                                                           commit every 1 s, 2
                                                                                           processes, 1 group
Pathway                       pathway 0.33.0                               at-least-once   2 threads, autocommit
                                                                                           100 ms, no persistence
                                                                                           (free edition: at least
                                                                                           once)
Flink SQL                     apache-flink 2.2.1 (Java 17) +               exactly-once    mini-cluster,
                              flink-sql-connector-kafka 5.0.0-2.2                          EXACTLY_ONCE checkpoints
                                                                                           every 1 s, exactly-once
                                                                                           Kafka sink, sources
                                                                                           read_committed
============================  ===========================================  ==============  ======================

Spark is not mvlog's pyspark 4.3.0: ``spark-sql-kafka-0-10_2.13`` 4.3.0 is not on Maven Central (4.2.0 is),
and the connector must match Spark exactly, so the Spark peer has pyspark 4.2.0 in its own venv.
"""
