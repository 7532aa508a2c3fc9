"""The retraining window that follows the evidence: the rows since the served model's loss rose.

When the labels confirm a shift (a shadow evaluation found the champion degraded), a window of
the policy's fixed span (``TRITONFLOW_RETRAIN_WINDOW_DAYS``) mostly holds rows from before the
shift, and the challenger learns the old concept again. This module finds where the served model's
per-row loss rose and chooses the rows since then, with a floor on their number:

* :func:`change_point` locates one upward shift in the mean of a loss series and tests it. The
  estimate is Hinkley's maximum-likelihood change point of a mean shift, the point where the
  cumulative sum ``S_k = sum_{i<=k} (x_i - mean)`` is lowest (Hinkley 1970, "Inference about the
  change-point in a sequence of random variables", Biometrika 57(1); the same cumulative sum as
  Page's CUSUM, Page 1954, Biometrika 41(1/2)). Under no change, ``max_k |S_k| / (s * sqrt(n))``
  tends to the supremum of a Brownian bridge, whose law is Kolmogorov's
  (``scipy.stats.kstwobign``): that gives the p-value. The search repeats on the rows after a
  found point (binary segmentation on the right), so the latest of several rises wins.
* :func:`choose_window` applies :class:`EvidenceWindowPolicy`: the rows since the change point
  when there are at least ``min_post_shift_rows`` of them; else the latest ``min_post_shift_rows``
  labelled rows (the post-shift ones and just enough before them); without a significant rise the
  policy's span, unchanged. A window with fewer than ``followup_factor * min_post_shift_rows``
  post-shift rows asks for a follow-up retraining ``followup_hours`` later, when more post-shift
  labels have arrived: the first challenger after a shift is trained on little data and the next
  one should not wait for the next alert.

The loss is the squared error between the served score and the label (the Brier score for a
binary label): bounded for probabilities, defined for regression, and cheap.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from ground.exceptions import DataError
from ground.settings import DEFAULTS

#: Significance level of a change point (Kolmogorov p-value of the CUSUM statistic).
CHANGE_POINT_ALPHA = 0.01
#: Fewest rows on each side of a change point.
MIN_SEGMENT_ROWS = 20
#: Most rises looked for (binary segmentation to the right).
MAX_CHANGE_POINTS = 4
#: Window rules (``tritonflow.window_rule`` tag values).
RULES = ("since_change_point", "floor", "span", "recorded_change_point")


@dataclasses.dataclass(frozen=True)
class ChangePoint:
    """One upward shift in the mean of a loss series.

    Attributes:
        index: Position of the first row after the shift.
        p_value: Kolmogorov p-value of the CUSUM statistic (small: a real shift).
        statistic: ``max_k |S_k| / (s * sqrt(n))``.
        mean_before: Mean loss before the shift.
        mean_after: Mean loss from ``index`` on.
    """

    index: int
    p_value: float
    statistic: float
    mean_before: float
    mean_after: float


def _one_change_point(x: np.ndarray) -> ChangePoint | None:
    """Hinkley's estimate of one upward mean shift in ``x`` and its p-value (None: too short or flat)."""
    from scipy.stats import kstwobign

    n = len(x)
    if n < 2 * MIN_SEGMENT_ROWS:
        return None
    sd = float(np.std(x, ddof=1))
    if not sd > 0:
        return None
    s = np.cumsum(x - x.mean())
    inner = s[MIN_SEGMENT_ROWS - 1:n - MIN_SEGMENT_ROWS]
    k = int(np.argmin(inner)) + MIN_SEGMENT_ROWS  # first row after the lowest partial sum
    stat = float(-inner.min() / (sd * math.sqrt(n)))
    before, after = float(x[:k].mean()), float(x[k:].mean())
    if not after > before:
        return None
    return ChangePoint(index=k, p_value=float(kstwobign.sf(stat)), statistic=stat,
                       mean_before=before, mean_after=after)


def change_point(loss: Any, *, alpha: float = CHANGE_POINT_ALPHA) -> ChangePoint | None:
    """The latest significant upward shift in the mean of ``loss`` (time order), or None.

    Args:
        loss: Per-row losses in time order (finite numbers).
        alpha: Significance level.

    Raises:
        DataError: ``loss`` holds a non-finite value, or ``alpha`` is not in (0, 1).
    """
    x = np.asarray(loss, dtype=np.float64)
    if not 0 < alpha < 1:
        raise DataError(f"alpha={alpha!r}; expected a level in (0, 1)")
    if x.size and not np.isfinite(x).all():
        pos = int(np.flatnonzero(~np.isfinite(x))[0])
        raise DataError(f"loss[{pos}]={float(x[pos])!r}; expected finite per-row losses")
    found, offset = None, 0
    for _ in range(MAX_CHANGE_POINTS):
        cp = _one_change_point(x[offset:])
        if cp is None or cp.p_value >= alpha:
            break
        found = dataclasses.replace(cp, index=cp.index + offset)
        offset = found.index
    return found


@dataclasses.dataclass(frozen=True)
class EvidenceWindowPolicy:
    """How a retraining after a confirmed shift chooses its rows.

    Attributes:
        rule: ``evidence`` (follow the change point) or ``span`` (the fixed span only).
        min_post_shift_rows: Floor on the rows of an evidence window.
        lookback_factor: The change point is looked for in ``lookback_factor`` spans before the end.
        followup_factor: A window with fewer post-shift rows than ``followup_factor *
            min_post_shift_rows`` asks for a follow-up retraining.
        followup_hours: Hours after the window's end the follow-up is due.
        score_column: Inference-log column holding the served model's score (empty: none is
            logged, so no shift can be located and the span is kept).
    """

    rule: str = DEFAULTS.retrain_window_rule
    min_post_shift_rows: int = DEFAULTS.retrain_min_post_shift_rows
    lookback_factor: float = DEFAULTS.retrain_evidence_lookback_factor
    followup_factor: float = DEFAULTS.retrain_followup_factor
    followup_hours: float = DEFAULTS.retrain_followup_hours
    score_column: str = DEFAULTS.retrain_score_column

    def __post_init__(self) -> None:
        checks = [("rule", self.rule in ("evidence", "span"), "'evidence' or 'span'"),
                  ("min_post_shift_rows", self.min_post_shift_rows >= 1, ">= 1"),
                  ("lookback_factor", self.lookback_factor >= 1, ">= 1"),
                  ("followup_factor", self.followup_factor >= 0, ">= 0"),
                  ("followup_hours", self.followup_hours > 0, "> 0")]
        for field, ok, expected in checks:
            if not ok:
                raise DataError(f"retrain window policy {field}={getattr(self, field)!r}; expected {expected}")

    @classmethod
    def from_settings(cls, settings: Any) -> "EvidenceWindowPolicy":
        """The policy of the ``TRITONFLOW_RETRAIN_*`` settings."""
        return cls(rule=settings.retrain_window_rule,
                   min_post_shift_rows=int(settings.retrain_min_post_shift_rows),
                   lookback_factor=float(settings.retrain_evidence_lookback_factor),
                   followup_factor=float(settings.retrain_followup_factor),
                   followup_hours=float(settings.retrain_followup_hours),
                   score_column=settings.retrain_score_column)


@dataclasses.dataclass(frozen=True)
class WindowChoice:
    """The rows chosen for a retraining, and why.

    Attributes:
        rule: One of :data:`RULES`.
        reason: One sentence naming the evidence.
        start: First timestamp of the window (inclusive).
        change_point: Timestamp of the first row after the shift (None: none found).
        post_shift_rows: Labelled rows at or after the change point in the window.
        window_rows: Labelled rows in the window.
        followup_at: When a follow-up retraining is due (None: not needed).
        p_value: The change point's p-value (None: not tested).
    """

    rule: str
    reason: str
    start: pd.Timestamp
    change_point: pd.Timestamp | None
    post_shift_rows: int
    window_rows: int
    followup_at: pd.Timestamp | None
    p_value: float | None

    def tags(self) -> dict[str, str]:
        """The choice as string tags (``window_rule``, ``window_reason``, ...; ``''`` when unset)."""
        def text(v: Any) -> str:
            return "" if v is None else (v.isoformat() if isinstance(v, pd.Timestamp) else str(v))

        return {"window_rule": self.rule, "window_reason": self.reason[:480],
                "change_point": text(self.change_point), "post_shift_rows": str(self.post_shift_rows),
                "retrain_followup_at": text(self.followup_at),
                "change_point_p_value": "" if self.p_value is None else f"{self.p_value:.3g}"}


def row_loss(labelled: pd.DataFrame, label_column: str, score_column: str) -> pd.Series:
    """Squared error of the served score against the label, per row (NaN where either is missing)."""
    y = pd.to_numeric(labelled[label_column], errors="coerce")
    p = pd.to_numeric(labelled[score_column], errors="coerce")
    return (y - p) ** 2


def _followup(policy: EvidenceWindowPolicy, post: int, end: pd.Timestamp) -> pd.Timestamp | None:
    if post >= policy.followup_factor * policy.min_post_shift_rows:
        return None
    return end + pd.Timedelta(hours=policy.followup_hours)


def _since(policy: EvidenceWindowPolicy, ts: pd.Series, cp_at: pd.Timestamp, end: pd.Timestamp,
           rule: str, evidence: str, p_value: float | None) -> WindowChoice:
    """The window since ``cp_at``, widened back to the floor when it holds too few rows."""
    post = int((ts >= cp_at).sum())
    floor = policy.min_post_shift_rows
    if post >= floor:
        reason = f"{evidence}; trained on the {post} labelled rows since it (floor {floor})"
        start = cp_at
    else:
        rule = "floor"
        start = ts.iloc[max(0, len(ts) - floor)]
        reason = (f"{evidence}; only {post} labelled rows since it, below the floor of {floor}: "
                  f"the latest {min(floor, len(ts))} labelled rows")
    followup = _followup(policy, post, end)
    if followup is not None:
        reason += (f"; {post} post-shift rows < {policy.followup_factor:g} x {floor}: a follow-up "
                   f"retraining is due {policy.followup_hours:g} h after the window's end")
    return WindowChoice(rule=rule, reason=reason, start=start, change_point=cp_at, post_shift_rows=post,
                        window_rows=int((ts >= start).sum()), followup_at=followup, p_value=p_value)


def choose_window(labelled: pd.DataFrame, *, label_column: str, policy: EvidenceWindowPolicy,
                  span_start: Any, end: Any, recorded_change_point: Any = None) -> WindowChoice:
    """Choose the training rows of a retraining after a confirmed shift.

    Args:
        labelled: The labelled log rows of the lookback (``timestamp``, the label, the score).
        label_column: The label column.
        policy: The window policy.
        span_start: Start of the policy's fixed span (the old rule's window).
        end: End of the window (exclusive).
        recorded_change_point: A change point recorded by an earlier retraining (a follow-up
            reuses it instead of searching again).

    Returns:
        The :class:`WindowChoice`; rows with ``timestamp >= start`` form the window.

    Raises:
        DataError: ``labelled`` lacks the timestamp or the label column.
    """
    for col in ("timestamp", label_column):
        if col not in labelled.columns:
            raise DataError(f"labelled rows lack column {col!r}; have {sorted(map(str, labelled.columns))}")
    ts = pd.to_datetime(labelled["timestamp"], utc=True).sort_values(kind="stable").reset_index(drop=True)
    start, stop = pd.Timestamp(span_start), pd.Timestamp(end)
    span_rows = int((ts >= start).sum())

    def span(why: str) -> WindowChoice:
        return WindowChoice(rule="span", reason=why, start=start, change_point=None, post_shift_rows=0,
                            window_rows=span_rows, followup_at=None, p_value=None)

    if policy.rule == "span":
        return span("TRITONFLOW_RETRAIN_WINDOW_RULE=span: the policy's fixed span")
    if recorded_change_point not in (None, ""):
        at = pd.Timestamp(recorded_change_point)
        at = at.tz_localize("UTC") if at.tzinfo is None else at.tz_convert("UTC")
        return _since(policy, ts, at, stop, "recorded_change_point",
                      f"change point {at.isoformat()} recorded by the previous retraining", None)
    if not policy.score_column:
        return span("no score column is set (TRITONFLOW_RETRAIN_SCORE_COLUMN): no loss to locate a shift "
                    "in; the policy's span")
    if policy.score_column not in labelled.columns:
        return span(f"the inference log has no score column {policy.score_column!r} "
                    "(TRITONFLOW_RETRAIN_SCORE_COLUMN): no loss to locate a shift in; the policy's span")
    ordered = labelled.assign(timestamp=pd.to_datetime(labelled["timestamp"], utc=True))
    ordered = ordered.sort_values("timestamp", kind="stable")
    loss = row_loss(ordered, label_column, policy.score_column)
    ok = loss.notna().to_numpy() & np.isfinite(loss.to_numpy(dtype=np.float64, na_value=np.nan))
    found = change_point(loss.to_numpy(dtype=np.float64, na_value=np.nan)[ok])
    if found is None:
        return span(f"no significant rise in the served model's loss over {int(ok.sum())} labelled rows "
                    f"(CUSUM, alpha {CHANGE_POINT_ALPHA}): the policy's span")
    at = pd.Timestamp(ordered["timestamp"].iloc[np.flatnonzero(ok)[found.index]])
    evidence = (f"the served model's loss rose from {found.mean_before:.3f} to {found.mean_after:.3f} "
                f"at {at.isoformat()} (CUSUM p={found.p_value:.2g})")
    return _since(policy, ts, at, stop, "since_change_point", evidence, found.p_value)


__all__ = ["CHANGE_POINT_ALPHA", "MAX_CHANGE_POINTS", "MIN_SEGMENT_ROWS", "RULES", "ChangePoint",
           "EvidenceWindowPolicy", "WindowChoice", "change_point", "choose_window", "row_loss"]
