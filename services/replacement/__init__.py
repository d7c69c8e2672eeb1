"""Replacing a view's definition in place: stage, hydrate read-only, inspect the diff, apply at an epoch.

* ``operations``: what users call (stage, request and wait for an apply, discard, diff, list) and the
  completion of an apply a crash interrupted.
* ``hydration``: where a staged replacement's first state comes from (an upstream's snapshot or its
  whole changelog).
* ``follower``: the replacement's operator, hydrated and then fed the view's epochs, writing only its own
  Redis keys.
* ``tasks``: the replacement's epochs computed by Spark's tasks beside its view's, committed into its keys.
* ``cut_over``: the cut-over computed by Spark's tasks, a view partition each (fixed first, then diffed,
  written and committed; the driver reads neither row set).
* ``stage``: all of it as a stage of the view's epoch pipeline, including the cut-over epoch (the
  driver's way, or ``cut_over``).
"""
