"""One layout for everything mvlog keeps per view in Redis: ``<prefix>:{<view>}:<what>``.

The braces are Redis Cluster's hash tag: every key of one view lands in the same slot, so the Lua
scripts that commit an epoch (rows, operator state, index, MCE) may touch them together.
"""

from __future__ import annotations


def view_key(prefix: str, view: str, what: str) -> str:
    return f"{prefix}:{{{view}}}:{what}"
