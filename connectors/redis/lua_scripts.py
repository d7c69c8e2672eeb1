"""mvlog's Redis Lua scripts: their text is in ``lua/*.lua``, composed here with the shared functions.

Redis runs each script in a fresh Lua environment, so shared helpers cannot be loaded once; they are
kept once, in ``lua/lib/*.lua``, and prefixed to the text of every script that calls them:

* ``each_chunk(command, key, first, count, width)``: ``redis.call(command, key, ...)`` over
  ``ARGV[first .. first + count * width - 1]`` in calls of at most 512 items of ``width`` arguments
  (Lua's stack is small); returns the index after the last argument used.
* ``refuse_epoch(meta, epoch_hex, follows)``: 0 when the view's MCE is at or above the epoch, -1 when
  it is not ``follows`` (``'none'``: no MCE; ``''``: unchecked), nil when the commit may go on.
* ``swap_staged(staged, live, count)``: for i in 0 .. count - 1, ``KEYS[staged + i]`` replaces
  ``KEYS[live + i]`` (RENAME), or ``KEYS[live + i]`` is deleted when nothing was staged for it.
* ``apply_staged(first, rows, keyorder, opstate)`` and ``staged_whole(first, n, counts)``: a task's six
  staged keys of one partition (:mod:`~mvlog.connectors.redis.partition_staging`) applied to a view's
  (or a staged replacement's) rows, key order and operator state; whether ``n`` partitions' staged keys
  hold the counts their tasks reported.

Each store reads its scripts once, at import (:func:`lua_script`), and registers them on its client; the
``KEYS``/``ARGV`` layout of a script is documented where the store builds them. Every piece is preceded
by a newline, as the scripts were when they were Python strings, so their text (and SHA1) is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.resources import files

_LUA = files("mvlog.connectors.redis") / "lua"

#: Names of the ``lua/`` files read so far (``lib/each_chunk``, ``view_commit``, ...): the unit tests
#: check that every file is read by some store.
LOADED: set[str] = set()


def read_lua(name: str) -> str:
    """The text of ``lua/<name>.lua`` (``name`` may be ``lib/<function>``)."""
    text = (_LUA / f"{name}.lua").read_text(encoding="utf-8")
    LOADED.add(name)
    return text


def lua_script(name: str, *, lib: Sequence[str] = (), constants: Mapping[str, int] | None = None) -> str:
    """Script ``lua/<name>.lua`` after the shared functions ``lua/lib/<each of lib>.lua`` it calls.

    ``constants`` replace their names in the script's own text (a Python constant the script shares,
    such as ``JOURNAL_LIMIT``); each must occur in it.
    """
    body = read_lua(name)
    for constant, value in (constants or {}).items():
        if constant not in body:
            raise ValueError(f"lua/{name}.lua does not use {constant}")
        body = body.replace(constant, str(value))
    return "".join("\n" + piece for piece in [*(read_lua(f"lib/{function}") for function in lib), body])
