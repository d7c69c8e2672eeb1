"""The client Spark's tasks share per process (``redis_client.task_client``): one per Redis and bound, made
lazily (making it connects nothing), and what a restarted server needs to be survived is the same as
:func:`~mvlog.connectors.redis.redis_client.connect`'s (``test_redis_restart`` rides out a restart)."""

from __future__ import annotations

from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.redis_client import BoundedRetry


def test_tasks_of_one_process_share_one_client_per_redis_and_bound() -> None:
    here = Settings(redis_url="redis://127.0.0.1:1/0", topic_prefix="a")
    same_redis = Settings(redis_url="redis://127.0.0.1:1/0", topic_prefix="b")  # another view's task
    client = redis_client.task_client(here)
    assert redis_client.task_client(same_redis) is client
    assert redis_client.task_client(Settings(redis_url="redis://127.0.0.1:2/0")) is not client
    assert redis_client.task_client(here.model_copy(update={"redis_outage_timeout_s": 5.0})) is not client
    retry = client.get_connection_kwargs()["retry"]
    assert isinstance(retry, BoundedRetry) and retry.bound_s == here.redis_outage_timeout_s
