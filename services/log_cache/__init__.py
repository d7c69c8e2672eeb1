"""The Faust log-cache worker: a bounded in-memory cache of upstream changelogs, served as Arrow IPC.

* :mod:`~mvlog.services.log_cache.worker`: the worker (its Faust app, agents, timers, rebalances);
* :mod:`~mvlog.services.log_cache.transport`: how it reads Kafka (Faust for the group, confluent-kafka
  for the records);
* :mod:`~mvlog.services.log_cache.feed`: an upstream's records decoded into Arrow IPC and aligned into
  committed epochs;
* :mod:`~mvlog.services.log_cache.serving`: its HTTP replies.
"""
