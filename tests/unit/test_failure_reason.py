"""The one line a failed view's reason is cut to (``mvlog run-view``, ``mvlog status``)."""

from __future__ import annotations

from mvlog.services.commands.run_view import _short

SPARK_WRAPPED = ("[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source reader: "
                 "Traceback (most recent call last):\n") + """\
  File "/x/pyspark/sql/worker/plan_data_source_read.py", line 220, in main
    reader = data_source.streamReader(schema=schema)
  File "/x/mvlog/connectors/spark_source.py", line 88, in streamReader
    raise ViewNotFound("view mv1 is not in the catalog")
mvlog.core.catalog.ViewNotFound: view mv1 is not in the catalog
 SQLSTATE: 38000
JVM stacktrace:
org.apache.spark.sql.AnalysisException: [PYTHON_DATA_SOURCE_ERROR] ...
\tat org.apache.spark.sql.errors.QueryCompilationErrors$.pythonDataSourceError(QueryCompilationErrors.scala:2291)
"""


def test_a_python_error_wrapped_by_spark_is_named_by_its_raised_line() -> None:
    assert _short(RuntimeError(SPARK_WRAPPED)) == (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source reader: "
        "mvlog.core.catalog.ViewNotFound: view mv1 is not in the catalog")


def test_a_plain_error_keeps_its_first_line_within_the_limit() -> None:
    assert _short(ValueError("bad value\nmore")) == "bad value"
    assert _short(ValueError("x" * 500), limit=10) == "xxxxxxx..."
    assert _short(ValueError("")) == "ValueError"
