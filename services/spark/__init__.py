"""The Spark runtime of mvlog's processes (the data source's read side is :mod:`mvlog.connectors.spark`):

* :mod:`~mvlog.services.spark.session`: the session a consumer, a replay or a command runs on, local or a
  cluster's, with ``format("mvlog")`` registered;
* :mod:`~mvlog.services.spark.data_source`: that data source as sessions register it (its reads, and its
  writes into tables, imported only where a write is planned);
* :mod:`~mvlog.services.spark.daemon`: the Python daemon the sessions' workers fork from, with the modules
  mvlog's tasks run imported and frozen once.
"""
