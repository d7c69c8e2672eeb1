"""A Spark driver streaming JSON files into a table with ``writeStream.format("mvlog")``, as a child
process (its own JVM and Python workers, in its own process group) so a test can SIGKILL the whole
driver mid-run and restart the query from its checkpoint.

Usage: ``python -m tests.integration.processes.spark_stream_writer TABLE INPUT_DIR CHECKPOINT DDL``
with the ``MVLOG_*`` settings in the environment. Runs until killed.
"""

from __future__ import annotations

import sys

from mvlog.config import load_settings
from mvlog.services.spark.session import spark_session


def main(table: str, inputs: str, checkpoint: str, ddl: str) -> None:
    settings = load_settings()
    spark = spark_session(settings, "spark-stream-writer")
    stream = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).json(inputs)
    query = (stream.writeStream.format("mvlog").option("table", table)
             .option("topicPrefix", settings.topic_prefix).option("checkpointLocation", checkpoint).start())
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
