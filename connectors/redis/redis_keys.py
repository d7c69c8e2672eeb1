"""One layout for every key mvlog keeps in Redis, so that each multi-key change touches one Redis Cluster slot.

* Per table or view: ``<prefix>:{<view>}:<what>`` (:func:`view_key`). The braces are Redis Cluster's hash
  tag: every key of one view lands in the same slot, so the Lua scripts and MULTI transactions that change
  several of them together (rows, operator state, index, MCE) run on a cluster; two views are two tags,
  spread over the cluster's masters.
* The control plane that changes together: ``<prefix>:{~control-plane}:<what>`` (:func:`control_key`): the
  catalog and the marker that says Redis holds the control plane, written in one transaction. ``~`` cannot
  be in a view's name (its changelog topic's name allows letters, digits, ``.``, ``_`` and ``-``), so this
  tag is never a view's.
* Keys that are only ever read or written alone (the lag's current values and sampler lease, the log-cache
  registry and occupancy, the rebuild lock) keep ``<prefix>:<what>`` without a tag: any slot will do.
"""

from __future__ import annotations

#: The hash tag of the control-plane keys written together (see the module docstring).
CONTROL_TAG = "~control-plane"


def view_key(prefix: str, view: str, what: str) -> str:
    return f"{prefix}:{{{view}}}:{what}"


def control_key(prefix: str, what: str) -> str:
    """The key of ``what`` (``catalog``, ``marker``) of the control plane, under its one hash tag."""
    return f"{prefix}:{{{CONTROL_TAG}}}:{what}"
