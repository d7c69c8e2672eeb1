"""``format("mvlog")`` as Spark sessions register it: the reads of
:mod:`mvlog.connectors.spark.spark_source` and the writes of :mod:`mvlog.services.tables.spark_sink`.

A module of its own, light on imports, because cloudpickle pickles the registered class by reference: each
Python worker Spark starts to look up, create or plan a read imports this module, and workers are forked
anew for those calls. With the class beside the writers, every such worker also imported the table writer,
the changelog writer and (through pyarrow's first ``pa.array``, which loads pyarrow's pandas shim) pandas:
0.36 s of CPU more per worker, on top of the reads' own 0.29 s. The writers are imported where a write is
planned.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from mvlog.connectors.spark import spark_source


class MvlogDataSource(spark_source.MvlogDataSource):
    """``format("mvlog")``: the reads of :class:`mvlog.connectors.spark.spark_source.MvlogDataSource`, and
    writes into a table (``option("table", ...)``, :mod:`mvlog.services.tables.spark_sink`)."""

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from mvlog.services.tables.spark_sink import batch_writer

        return batch_writer(self.settings, self.entry, schema, overwrite, self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802 (Spark API)
        from mvlog.services.tables.spark_sink import stream_writer

        return stream_writer(self.settings, self.entry, schema, overwrite, self.options)


__all__ = ["MvlogDataSource"]
