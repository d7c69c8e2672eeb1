"""The Nexmark topics every engine reads: names, fields, types (the one place they are defined).

Three plain Kafka topics, one JSON object per message (UTF-8), written by :mod:`.generator`:

* ``nexmark-person``  ``{"id", "name", "email_address", "credit_card", "city", "state", "date_time", "extra"}``
* ``nexmark-auction`` ``{"id", "item_name", "description", "initial_bid", "reserve", "date_time", "expires",
  "seller", "category", "extra"}``
* ``nexmark-bid``     ``{"auction", "bidder", "price", "channel", "url", "date_time", "extra"}``

``date_time`` and ``expires`` are int epoch **milliseconds** (mvlog has no timestamp type), every other
number is an int (Nexmark's BIGINT), text is a string. The message key is the JSON text of the record's
id (person, auction) or of its auction (bid), so a multi-partition topic keeps each auction's bids in one
partition; mvlog's ``append-json`` tables ignore it. The message timestamp is the producer's clock at the
``produce`` call (CreateTime): latencies are measured from it.

Field names are the reference's (``emailAddress``, ``itemName``, ``dateTime`` ...) in snake_case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Column types: "int" (64-bit integer; Spark BIGINT, Flink BIGINT) or "string" (Spark STRING, Flink VARCHAR).
INT = "int"
STRING = "string"

_SPARK = {INT: "BIGINT", STRING: "STRING"}
_FLINK = {INT: "BIGINT", STRING: "VARCHAR"}


@dataclass(frozen=True)
class NexmarkTable:
    """One of the three record kinds: its table name, columns (in order) and key."""

    name: str  # "person" | "auction" | "bid": the table name the queries use
    columns: tuple[tuple[str, str], ...]  # (field, INT | STRING), in the order of the JSON objects
    key: tuple[str, ...]  # the primary key in mvlog (bid: none; mvlog generates one, see BID_GENERATED_KEY)
    message_key: str  # the field whose JSON text is the Kafka message key (it picks the partition)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def column_types(self) -> dict[str, str]:
        """``{field: "int" | "string"}`` (mvlog's column types, as ``create-table -c`` takes them)."""
        return dict(self.columns)

    def spark_ddl(self) -> str:
        """``"id BIGINT, name STRING, ..."`` for ``from_json`` / ``createDataFrame``."""
        return ", ".join(f"`{name}` {_SPARK[kind]}" for name, kind in self.columns)

    def flink_columns(self) -> str:
        """``"`id` BIGINT, `name` VARCHAR, ..."`` for a Flink ``CREATE TABLE`` (no watermark)."""
        return ", ".join(f"`{name}` {_FLINK[kind]}" for name, kind in self.columns)


PERSON = NexmarkTable(
    "person",
    (("id", INT), ("name", STRING), ("email_address", STRING), ("credit_card", STRING), ("city", STRING),
     ("state", STRING), ("date_time", INT), ("extra", STRING)),
    key=("id",), message_key="id")
AUCTION = NexmarkTable(
    "auction",
    (("id", INT), ("item_name", STRING), ("description", STRING), ("initial_bid", INT), ("reserve", INT),
     ("date_time", INT), ("expires", INT), ("seller", INT), ("category", INT), ("extra", STRING)),
    key=("id",), message_key="id")
BID = NexmarkTable(
    "bid",
    (("auction", INT), ("bidder", INT), ("price", INT), ("channel", STRING), ("url", STRING),
     ("date_time", INT), ("extra", STRING)),
    key=(), message_key="auction")

TABLES: tuple[NexmarkTable, ...] = (PERSON, AUCTION, BID)
TABLES_BY_NAME: Mapping[str, NexmarkTable] = {t.name: t for t in TABLES}

# A bid has no natural key: mvlog's append-json table generates one, "<partition>-<offset>" of its message.
BID_GENERATED_KEY = "bid_key"

DEFAULT_TOPIC_PREFIX = "nexmark-"


@dataclass(frozen=True)
class NexmarkTopics:
    """Where the three record kinds are: topic names and their partition count (default: 1 each)."""

    person: str = DEFAULT_TOPIC_PREFIX + "person"
    auction: str = DEFAULT_TOPIC_PREFIX + "auction"
    bid: str = DEFAULT_TOPIC_PREFIX + "bid"
    partitions: int = 1

    @classmethod
    def with_prefix(cls, prefix: str, partitions: int = 1) -> NexmarkTopics:
        """``<prefix>person``, ``<prefix>auction``, ``<prefix>bid`` (a run of its own on a shared broker)."""
        return cls(prefix + "person", prefix + "auction", prefix + "bid", partitions)

    def topic_of(self, table: str) -> str:
        """The topic of table ``"person"``, ``"auction"`` or ``"bid"``."""
        try:
            return {"person": self.person, "auction": self.auction, "bid": self.bid}[table]
        except KeyError:
            raise ValueError(f"no Nexmark table {table!r}; the tables are person, auction and bid") from None

    def all(self) -> tuple[str, str, str]:
        return self.person, self.auction, self.bid
