"""A view's epoch pipeline on Spark.

* ``view_consumer``: the loop that maintains one view; ``micro_batch_worker``: applies its micro-batches
  on one thread while Spark reads the next.
"""
