"""``mvlog replace`` and ``mvlog replacement ...`` as a user runs them: clean refusals with the reason.

No consumer runs here (the Spark side is covered by test_replacement.py), so the replacement stays
unhydrated: what a user sees when `mvlog run-view` is not running.
"""

from __future__ import annotations

import json

import pytest

from mvlog.config import Settings

from .test_cli_views import T1, mvlog, ok, refused

pytestmark = pytest.mark.integration


def test_replacement_commands(settings: Settings) -> None:
    ok(mvlog(settings, *T1))
    ok(mvlog(settings, "create-view", "mv1", "AS", "SELECT * FROM t1 WHERE deleted = false"))

    error = refused(mvlog(settings, "replace", "mv1", "AS", "SELECT id, v1 FROM t1"))
    assert "incompatible replacement for mv1: column 'deleted' would be dropped" in error
    error = refused(mvlog(settings, "replace", "mv1", "AS", "SELECT * FROM t1 WHERE nope = 1"))
    assert "replacement for mv1 refused, nothing staged" in error and "nope" in error
    assert "unknown table or view 'mv9'" in refused(mvlog(settings, "replace", "mv9", "AS", "SELECT * FROM t1"))
    assert "'t1' is a table" in refused(mvlog(settings, "replace", "t1", "AS", "SELECT * FROM t1"))

    staged = ok(mvlog(settings, "replace", "mv1", "AS", "SELECT * FROM t1 WHERE deleted = false AND v1 > 0"))
    assert "Staged replacement" in staged.stdout
    listed = json.loads(ok(mvlog(settings, "replacement", "list", "--output", "json")).stdout)
    assert [(r["view"], r["status"], r["epoch"], r["sql"]) for r in listed] == [
        ("mv1", "staged", None, "SELECT * FROM t1 WHERE deleted = false AND v1 > 0")]
    assert "not hydrated yet" in refused(mvlog(settings, "replacement", "diff", "mv1", "--timeout", "0.2"))
    error = refused(mvlog(settings, "replacement", "apply", "mv1", "--timeout", "0.3"))
    assert "not applied within 0.3s: it is not hydrated yet" in error and "stays staged" in error
    assert "Discarded replacement" in ok(mvlog(settings, "replacement", "discard", "mv1")).stdout
    assert "was discarded" in refused(mvlog(settings, "replacement", "apply", "mv1"))
    assert "was discarded" in refused(mvlog(settings, "replacement", "read", "mv1"))
    assert "mv1" in ok(mvlog(settings, "replacement", "list")).stdout
