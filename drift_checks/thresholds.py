"""Dynamic drift thresholds: the P95 of each feature's own statistic over its recent history.

For each (model, feature, statistic) the threshold of the current hour is a quantile of that
statistic's hourly values over the previous ``window_days`` (default 30 days = up to 720 hourly
windows; the current hour is excluded):

* distance statistics (PSI, Wasserstein, JS, unseen share; drift when value >= threshold): the
  ``quantile`` (default 0.95, "P95") of past values: an hour is unusual when it exceeds what 95 %
  of normal hours reached;
* p-value statistics (KS, chi-square; drift when value <= threshold): the bad tail is LOW, so the
  threshold is the ``1 - quantile`` quantile (P5) of past p-values.

Until ``min_history`` hourly values exist (default 48), the statistic's static default from the
registry (:mod:`drift_checks.statistics`, Evidently's defaults) applies. A quantile that is not
finite (cannot happen from a clean history, checked anyway) also falls back to the static value,
so a NaN can never switch an alarm off.

Per-feature weights give the weighted dataset score :func:`weighted_score`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Iterable, Mapping

from drift_checks.history import HistoryStore
from drift_checks.statistics import REGISTRY
from tritonflow.exceptions import SettingsError

#: Default look-back of the dynamic threshold (days).
DEFAULT_WINDOW_DAYS = 30
#: Default quantile of distance statistics (P95); p-values use 1 - quantile (P5).
DEFAULT_QUANTILE = 0.95
#: Hourly values needed before the dynamic threshold replaces the static one (windows).
DEFAULT_MIN_HISTORY = 48


@dataclasses.dataclass(frozen=True)
class ThresholdPolicy:
    """How thresholds are chosen.

    Attributes:
        window_days: Look-back in days.
        quantile: Quantile for distance statistics, in (0.5, 1); p-values use ``1 - quantile``.
        min_history: Hourly values required before the dynamic threshold applies.
        static: Overrides of the registry's static thresholds ``{statistic: value}``.
    """

    window_days: float = DEFAULT_WINDOW_DAYS
    quantile: float = DEFAULT_QUANTILE
    min_history: int = DEFAULT_MIN_HISTORY
    static: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.5 < self.quantile < 1:
            raise SettingsError(f"quantile={self.quantile!r}; expected a number in (0.5, 1), e.g. 0.95")
        if self.window_days <= 0:
            raise SettingsError(f"window_days={self.window_days!r}; expected > 0 days, e.g. 30")
        if self.min_history < 1:
            raise SettingsError(f"min_history={self.min_history!r}; expected >= 1 windows, e.g. 48")

    @classmethod
    def from_settings(cls, settings=None, **overrides) -> "ThresholdPolicy":
        """Policy from ``drift_history_window_days``, ``drift_quantile``,
        ``drift_min_history_windows`` settings (registry defaults where a field is absent)."""
        from tritonflow.settings import get_settings

        s = settings or get_settings()
        kw = dict(
            window_days=getattr(s, "drift_history_window_days", DEFAULT_WINDOW_DAYS),
            quantile=getattr(s, "drift_quantile", DEFAULT_QUANTILE),
            min_history=getattr(s, "drift_min_history_windows", DEFAULT_MIN_HISTORY),
        )
        kw.update(overrides)
        return cls(**kw)

    def tail_quantile(self, statistic: str) -> float:
        """The quantile used for ``statistic``: ``quantile`` or ``1 - quantile`` for p-values."""
        return 1 - self.quantile if REGISTRY[statistic].direction == "p_value" else self.quantile

    def static_threshold(self, statistic: str) -> float:
        return float(self.static.get(statistic, REGISTRY[statistic].default_threshold))


@dataclasses.dataclass(frozen=True)
class Threshold:
    """The threshold applied to one (feature, statistic) in one hour.

    Attributes:
        value: Threshold value.
        source: ``"dynamic"`` (history quantile) or ``"static"`` (fallback).
        n_history: Hourly values in the look-back window.
        quantile: Quantile used (0.95 / 0.05) when dynamic, else ``None``.
    """

    value: float
    source: str
    n_history: int
    quantile: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def resolve_thresholds(
    history: HistoryStore,
    model: str,
    hour: dt.datetime,
    series: Iterable[tuple[str, str]],
    policy: ThresholdPolicy | None = None,
) -> dict[tuple[str, str], Threshold]:
    """Threshold of every (feature, statistic) for the window starting at ``hour``.

    Args:
        history: The statistics store.
        model: Model name.
        hour: Start of the current window (timezone-aware); its own values are excluded.
        series: (feature, statistic) pairs to resolve.
        policy: Threshold policy (default :class:`ThresholdPolicy`).

    Returns:
        ``{(feature, statistic): Threshold}``.
    """
    policy = policy or ThresholdPolicy()
    wanted = {(f, s): policy.tail_quantile(s) for f, s in series}
    found = history.quantiles(model, hour, policy.window_days, wanted)
    out = {}
    for key, q in wanted.items():
        value, n = found.get(key, (math.nan, 0))
        if n >= policy.min_history and math.isfinite(value):
            out[key] = Threshold(value, "dynamic", n, q)
        else:
            out[key] = Threshold(policy.static_threshold(key[1]), "static", n, None)
    return out


def weighted_score(flags: Mapping[str, bool], weights: Mapping[str, float] | None = None) -> float:
    """Weighted share of flagged features: ``sum(w_i * flagged_i) / sum(w_i)``.

    Args:
        flags: ``{feature: flagged}`` of the features that could be scored.
        weights: ``{feature: weight >= 0}``; missing features weigh 1.

    Returns:
        Score in [0, 1]; 0.0 when no feature (or only zero weights) was scored.

    Raises:
        SettingsError: A weight is negative or not finite.
    """
    weights = weights or {}
    total = hit = 0.0
    for f, flagged in flags.items():
        w = float(weights.get(f, 1.0))
        if not math.isfinite(w) or w < 0:
            raise SettingsError(f"weight of feature {f!r} is {w!r}; expected a finite number >= 0")
        total += w
        hit += w if flagged else 0.0
    return hit / total if total > 0 else 0.0
