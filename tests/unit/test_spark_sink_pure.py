"""The pure parts of Spark writes: the DataFrame's columns against the table's, and the ``spark_batch``
barrier mutation through the wire format (its kind is an enum symbol of barrier.avsc)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BinaryType, DoubleType, LongType, StringType, StructField, StructType, TimestampType

from mvlog.catalog import CatalogEntry
from mvlog.changes import Barrier
from mvlog.row_schema import RowSchema
from mvlog.schemas.codec import decode_barrier, encode_barrier
from mvlog.services.tables.spark_sink import SparkWriteError, check_columns
from mvlog.spark_batch_record import SparkBatch, spark_batch_mutation, spark_batch_of

ENTRY = CatalogEntry("t", "table", RowSchema.of({"id": "int", "v": "float", "s": "string"}, ["id"]), 3)


def fields(*pairs: tuple[str, object]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in pairs])  # type: ignore[arg-type]


def test_columns_the_table_can_take_pass() -> None:
    check_columns(ENTRY, fields(("id", LongType()), ("v", LongType()), ("s", StringType())))
    check_columns(ENTRY, fields(("id", LongType()), ("v", DoubleType())))  # an omitted column is NULL


@pytest.mark.parametrize(("schema", "problem"), [
    (fields(("id", LongType()), ("colour", StringType())), "no column(s) 'colour'"),
    (fields(("v", DoubleType()),), "lacks the primary key column(s) 'id'"),
    (fields(("id", LongType()), ("v", TimestampType())), "column 'v' is float, the DataFrame's is timestamp"),
    (fields(("id", StringType()),), "column 'id' is int, the DataFrame's is string"),
    (fields(("id", LongType()), ("s", BinaryType())), "column 's' is string, the DataFrame's is binary"),
])
def test_columns_the_table_cannot_take_are_named(schema: StructType, problem: str) -> None:
    with pytest.raises(SparkWriteError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        check_columns(ENTRY, schema)


def test_spark_batch_mutation_round_trips_the_wire_format() -> None:
    batch = SparkBatch("file:/tmp/ckpt", 7, "overwrite")
    barrier = Barrier("t", 5, 4, True, 0, 0, 1, spark_batch_mutation("t", batch), "x")
    decoded = decode_barrier(encode_barrier(barrier))
    assert spark_batch_of(decoded.mutation) == batch
    assert spark_batch_of(None) is None
