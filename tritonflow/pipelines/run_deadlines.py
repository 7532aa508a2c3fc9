"""How long a canary, a rollback or a publish run may take, from the settings: the runs' deadlines.

Cheap to import (only the settings), so DAG files use it at parse time: each of ``canary_promotion``,
``canary_rollback`` and ``model_publish`` carries an Airflow deadline alert at :func:`expected_run`'s
seconds after the run was queued (``tritonflow_plugin.deadlines``), which posts through the failure
notifier when the run has not ended by then.
"""

from __future__ import annotations

from typing import Sequence

from ground.settings import Settings
from ground.values import parse_steps

#: Seconds a promotion spends besides baking: loads, unloads, alias moves, analyses.
PROMOTION_OVERHEAD_S = 600.0
#: The runs that carry a deadline.
RUN_KINDS = ("canary", "rollback", "publish")


def canary_time_budget_s(steps: Sequence[int], bake_s: float, max_extensions: int,
                         pause_timeout_s: float = 0.0) -> float:
    """Longest a canary may take: every step baked ``1 + max_extensions`` times plus overhead.

    Under promotion policy ``approve-steps`` each of those bakes may end in a pause that waits up to
    ``pause_timeout_s`` for a person (0: no pauses).

    Used by the DAG to refuse parameters its promotion task's ``execution_timeout`` cannot hold.
    """
    bakes = len(steps) * (1 + int(max_extensions))
    return bakes * (float(bake_s) + float(pause_timeout_s)) + PROMOTION_OVERHEAD_S


def expected_run(kind: str, settings: Settings) -> tuple[float, str]:
    """Seconds a run of ``kind`` may take before its deadline alert fires, and how they were computed.

    * ``canary``: steps x bake x (1 + extensions) + the promotion's overhead, plus the approval's
      timeout when the default promotion policy asks for a person, plus a pause's timeout after each
      of those bakes under ``approve-steps``;
    * ``rollback``: loading the target and unloading the other (2 x the READY wait);
    * ``publish``: Model Analyzer's timeout + loading the version and its INT8 fallback (2 x the READY wait);

    each plus ``TRITONFLOW_DEADLINE_MARGIN_S``.

    Raises:
        ValueError: ``kind`` is not one of :data:`RUN_KINDS`.
    """
    margin = settings.deadline_margin_s
    if kind == "canary":
        steps = parse_steps(settings.canary_steps)
        paused = settings.promotion_policy == "approve-steps"
        pause_s = settings.canary_pause_timeout_s if paused else 0.0
        base = canary_time_budget_s(steps, settings.canary_bake_s, settings.canary_max_extensions, pause_s)
        bake = (f"({settings.canary_bake_s:g} s bake + {pause_s:g} s pause)" if paused
                else f"{settings.canary_bake_s:g} s bake")
        why = (f"{len(steps)} steps x {bake} x {1 + settings.canary_max_extensions} "
               f"+ {PROMOTION_OVERHEAD_S:g} s overhead")
        if settings.promotion_policy != "auto":
            base += settings.approval_timeout_h * 3600
            why += f" + {settings.approval_timeout_h:g} h for the approval"
    elif kind == "rollback":
        base = 2 * settings.load_timeout_s
        why = f"2 x {settings.load_timeout_s:g} s READY wait"
    elif kind == "publish":
        base = settings.analyzer_timeout_s + 2 * settings.load_timeout_s
        why = f"{settings.analyzer_timeout_s:g} s Model Analyzer + 2 x {settings.load_timeout_s:g} s READY wait"
    else:
        raise ValueError(f"run kind {kind!r}: expected one of {list(RUN_KINDS)}")
    return base + margin, f"{why} + {margin:g} s margin = {base + margin:g} s"


__all__ = ["PROMOTION_OVERHEAD_S", "RUN_KINDS", "canary_time_budget_s", "expected_run"]
