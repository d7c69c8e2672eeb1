"""The key layout on a Redis Cluster: the keys that one script or transaction changes together share a slot,
and the options that carry a Redis Cluster's settings to the data source round-trip. Pure: stores are built
on a client that never connects; slots are computed as Redis does (CRC16 of the hash tag, mod 16384)."""

from __future__ import annotations

import redis
from redis.crc import key_slot

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.consumer_lease import ConsumerLeases
from mvlog.connectors.redis.load_staging import LOAD_KEYS
from mvlog.connectors.redis.partition_staging import PartitionStaging
from mvlog.connectors.redis.redis_keys import CONTROL_TAG, control_key, view_key
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.source_options import OPTION_FIELDS, connection_options, settings_overrides


def _client() -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=1)  # never connected to


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))


def test_every_key_a_view_script_touches_is_in_the_views_slot() -> None:
    client, prefix, view = _client(), "p", "mv1"
    store, replacements, staging = ViewStore(client, prefix), ReplacementStore(client, prefix), \
        PartitionStaging(client, prefix)
    keys = [store.key(view, what) for what in ("meta", "rows", "opstate", "keyorder", "backfill", "journal",
                                               "backfill_progress", *LOAD_KEYS, "rows.rebuild",
                                               "rows.stage.abc", "lag", "writer", "snapshots")]
    keys += [store.index.key(view, p) for p in range(8)]
    keys += replacements._keys(view)
    keys += [k for p in range(4) for k in staging.staged_keys(view, 123, p)]
    keys += [ConsumerLeases(client, prefix)._key(view, what) for what in ("consumer", "stop")]
    assert {_slot(k) for k in keys} == {_slot("{mv1}")}
    # Two views, two tags: a cluster may place them on two masters.
    assert _slot(store.key("mv2", "meta")) != _slot(store.key(view, "meta"))


def test_the_catalog_and_its_marker_share_a_slot_no_view_can_have() -> None:
    catalog = CatalogStore(Settings(topic_prefix="p"), _client())
    assert catalog.key == control_key("p", "catalog") and catalog.marker_key == control_key("p", "marker")
    assert _slot(catalog.key) == _slot(catalog.marker_key)  # written in one MULTI by put()
    # A view's name is part of its changelog topic's name ([A-Za-z0-9._-]): never the control plane's tag.
    assert "~" in CONTROL_TAG and view_key("p", CONTROL_TAG, "x") != view_key("p", "control-plane", "x")


def test_the_data_source_options_carry_a_clusters_settings() -> None:
    for cluster in (False, True):
        settings = Settings(bootstrap_servers="h:1", redis_url="redis://h:2/0", redis_cluster=cluster,
                            topic_prefix="q")
        options = connection_options(settings)
        assert set(options) == set(OPTION_FIELDS)
        assert Settings(**settings_overrides(options)).model_dump(include=set(OPTION_FIELDS.values())) == \
            settings.model_dump(include=set(OPTION_FIELDS.values()))
    assert settings_overrides({"redisCluster": "TRUE "}) == {"redis_cluster": True}
    assert settings_overrides({"redisUrl": ""}) == {}  # an empty option overrides nothing
