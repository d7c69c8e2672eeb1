"""How status is presented: views in graph order, epochs exact in the page's JSON, metrics from a snapshot."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mvlog.catalog import CatalogEntry
from mvlog.lag import LagSample, UpstreamLag
from mvlog.lag_status import LagStatus, Verdict
from mvlog.row_schema import RowSchema
from mvlog.services.dashboard.app import epochs_as_strings
from mvlog.services.dashboard.metrics import pipeline_registry
from mvlog.services.status_snapshot import PipelineSnapshot, in_graph_order
from mvlog.source_lag import SourceLag, SourceState
from mvlog.view_status import ViewStatus

SCHEMA = RowSchema.of({"id": "int"}, ["id"])
BIG = (1 << 62) + 1  # an epoch a JavaScript number would round


def entry(name: str, *sources: str) -> CatalogEntry:
    return CatalogEntry(name, "view" if sources else "table", SCHEMA, 1, sources=sources)


def test_views_come_after_everything_they_read() -> None:
    entries = [entry("a_join", "mv1", "t2"), entry("mv1", "t1"), entry("t2"), entry("mv2", "mv1"), entry("t1")]
    assert [e.name for e in in_graph_order(entries)] == ["t1", "t2", "mv1", "a_join", "mv2"]


def test_epochs_become_strings_and_nothing_else_does() -> None:
    document = {"mce": BIG, "rows": 3, "lag": {"mce": BIG, "upstreams": [{"upstream_mce": BIG, "epochs": 2}]},
                "other": None}
    assert epochs_as_strings(document) == {"mce": str(BIG), "rows": 3, "other": None,
                                           "lag": {"mce": str(BIG), "upstreams": [{"upstream_mce": str(BIG),
                                                                                    "epochs": 2}]}}


def test_metrics_of_a_snapshot_follow_the_conventions() -> None:
    lag = LagSample("j", 1_000, 10 << 16, (UpstreamLag("a", 12 << 16, 2, 0.002, 7),
                                           UpstreamLag("b", 11 << 16, 1, 0.001, 3)))
    source = SourceState("shop.s", "upsert-json", 3, "p.s.dlq", None, SourceLag("s", "shop.s", 900, 42, 1.5, 2))
    views = [ViewStatus("a", "table", (), "live", None, 12 << 16, 5_000, 4),
             ViewStatus("j", "view", ("a", "b"), "live", None, 10 << 16, 4_000, 2, lag,
                        Verdict(LagStatus.LAGGING, "grew")),
             ViewStatus("s", "table", (), "live", None, 12 << 16, 5_000, 4, source=source)]
    text = generate_latest(pipeline_registry(lambda: PipelineSnapshot(0, "p", None, views))).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # Gauges, but for the one count that only grows: a source table's dead-lettered records.
    assert all(f.type == ("counter" if f.name == "mvlog_source_dead_letters" else "gauge") for f in families.values())
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert values["mvlog_view_epoch_lag", (("upstream", "a"), ("view", "j"))] == 2
    assert values["mvlog_view_lag_records", (("upstream", "b"), ("view", "j"))] == 3
    assert values["mvlog_view_max_committed_epoch_timestamp_seconds", (("view", "a"),)] == 0.012
    assert values["mvlog_view_status", (("status", "lagging"), ("view", "j"))] == 1
    assert values["mvlog_view_status", (("status", "ok"), ("view", "j"))] == 0
    assert ("mvlog_view_status", (("status", "ok"), ("view", "a"))) not in values  # a table has no status
    assert values["mvlog_view_state", (("state", "live"), ("view", "a"))] == 1
    of_s = (("table", "s"), ("topic", "shop.s"))
    assert values["mvlog_source_lag_records", of_s] == 42 and values["mvlog_source_lag_seconds", of_s] == 1.5
    assert values["mvlog_source_dead_letters_total", of_s] == 3 and values["mvlog_source_problem", of_s] == 0


def test_a_replacement_is_summed_up_in_one_phrase_through_its_life() -> None:
    def summary(record: dict[str, str] | None) -> str | None:
        return ViewStatus("mv1", "view", ("t1",), "live", None, 1, None, 0, replacement=record).replacement_summary

    staged = {"id": "r1", "status": "staged", "staged_ts_ms": "1"}
    assert summary(None) is None
    assert summary(staged) == "staged, hydrating"
    assert summary({**staged, "mce": "42"}) == "staged, hydrated to epoch 42"
    assert summary({**staged, "mce": "42", "apply_requested": "5"}) == "staged, apply waiting"
    assert summary({**staged, "error": "upstream dropped"}) == "staged, stopped: upstream dropped"
    assert summary({**staged, "status": "applied", "applied_epoch": "43"}) == "applied at epoch 43"
    assert summary({**staged, "status": "discarded"}) is None


def test_the_status_table_has_a_replacement_column() -> None:
    from rich.console import Console

    from mvlog.services.commands.status import status_table

    view = ViewStatus("mv1", "view", ("t1",), "live", None, 7, None, 0,
                      replacement={"id": "r1", "status": "staged", "mce": "7"})
    snapshot = PipelineSnapshot(prefix="p", ts_ms=0, views=[view], sampler=None)
    console = Console(width=400, record=True)
    console.print(status_table(snapshot))
    text = console.export_text()
    assert "replacement" in text and "staged, hydrated to epoch 7" in text


def test_a_backfills_binary_positions_are_left_out_of_its_status_fields() -> None:
    """A chunked backfill's hash holds its positions as encoded keys, not text: the status reads the
    text fields and leaves those out (decoding them failed the status, the dashboard and /metrics)."""
    from mvlog.connectors.redis.pipeline_status import text_fields

    raw = {b"done_rows": b"120", b"pos:t1:7": b"\xaf\x00\x01", b"state": b"running"}
    assert text_fields(raw) == {"done_rows": "120", "state": "running"}
