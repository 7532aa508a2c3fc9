"""Canary promotion: move a model's traffic to the challenger in steps, judge each step, roll back.

* :mod:`~repository_sync.canary.policy`: :class:`CanaryPolicy`, the schedule and thresholds
  (from the settings with ``CanaryPolicy.from_settings``);
* :mod:`~repository_sync.canary.runner`: :func:`run_canary`, the step runner, and
  :func:`rollback`, the one rollback (gateway to the champion first, then the unload);
* :mod:`~repository_sync.canary.analysis`: :func:`analyse_step`, the verdict of one analysis;
* :mod:`~repository_sync.canary.metrics`: Triton's per-version Prometheus counters;
* :mod:`~repository_sync.canary.checks`: the checks on what the challenger answered (output
  health, expected behaviour, quality, coverage); a new canary check goes here;
* :mod:`~repository_sync.canary.class_shift`: the per-class check of a multi-class challenger;
* :mod:`~repository_sync.canary.preflight`: the memory pre-flight before any traffic moves;
* :mod:`~repository_sync.canary.pauses`: a person's decision at the end of each step's bake
  (continue, hold, roll back) under promotion policy ``approve-steps``.
"""
