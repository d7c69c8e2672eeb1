"""Per-record Nexmark functions in plain Python, shared by the Python engines' jobs (Quix Streams, and
Pathway's UDFs); stdlib only. They follow Spark's functions (as DuckDB does): ``regexp_extract`` and
``split_part`` give ``''`` where nothing matches."""

from __future__ import annotations

import datetime
import re
from typing import Any

_CHANNEL_ID = re.compile(r"(&|^)channel_id=([^&]*)")
_HOT_CHANNELS = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}


def day(date_time_ms: int) -> str:
    """``date_format(timestamp_millis(ms), 'yyyy-MM-dd')`` in UTC."""
    return datetime.datetime.fromtimestamp(date_time_ms / 1000, datetime.UTC).strftime("%Y-%m-%d")


def channel_id(channel: str, url: str) -> str:
    """q21's CASE: the hot channels' ids, else ``regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)``."""
    hot = _HOT_CHANNELS.get(channel.lower())
    if hot is not None:
        return hot
    match = _CHANNEL_ID.search(url)
    return match.group(2) if match else ""


def split_part(text: str, separator: str, number: int) -> str:
    """Spark's ``split_part`` for ``number`` >= 1: the number-th field, ``''`` past the last."""
    parts = text.split(separator)
    return parts[number - 1] if number <= len(parts) else ""


def q20_row(bid: dict[str, Any], auction: dict[str, Any]) -> dict[str, Any]:
    return {"auction": bid["auction"], "bidder": bid["bidder"], "price": bid["price"], "channel": bid["channel"],
            "url": bid["url"], "bid_date_time": bid["date_time"], "bid_extra": bid["extra"],
            "item_name": auction["item_name"], "description": auction["description"],
            "initial_bid": auction["initial_bid"], "reserve": auction["reserve"],
            "auction_date_time": auction["date_time"], "expires": auction["expires"], "seller": auction["seller"],
            "category": auction["category"], "auction_extra": auction["extra"]}
