"""Reference strategies: what a window is compared with.

* ``training`` (default): the model version's reference, a sample of the data it was trained or
  validated on (recorded at publish time). Drift means "unlike what the model learned from".
  Seasons the reference covers are calibrated away (:mod:`drift_checks.thresholds`).
* ``trailing``: the last ``trailing`` span (default 7 days) of served traffic before the window.
  Drift means "unlike the recent past": sudden changes alarm, slow ones are followed. Useful
  when the training data is old or the input moves by design.
* ``seasonal``: the same window one ``period`` earlier (undeclared: one week, 168 hours): "this
  hour compared with the same hour last week" (the practitioners' rule in ``../shared/references``).
  Recurring daily and weekly patterns stop alarming; a change from last week's pattern does.
* ``training_seasonal``: the model version's reference rows at the window's phase of the same
  ``period`` (a year for daily data, a day or a week for hourly traffic; undeclared, the longest
  of those the reference's times cover, :func:`drift_checks.season_match.choose_period`), from
  every cycle the reference covers, with thresholds calibrated the same way
  (:mod:`drift_checks.season_match`).
  A shift smaller than the seasons' swing shows in the season it happens in. It needs each
  reference row's time: the backtest has it, a stored reference has it when its source had a
  ``timestamp`` column (:mod:`drift_checks.reference`); without it the whole training reference
  applies and the note says so.

A served reference (trailing, seasonal) is read from the inference log; an empty one (the first
days of a model) falls back to the training reference, and the summary says so. Importance
weights always come from the model version's training reference. Thresholds are keyed by the
strategy's reference id (``v<version>:trailing:168h``...), so switching strategy starts new
thresholds and never reuses another strategy's history.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any, Mapping

import pandas as pd

from drift_checks.declared_schema import apply_schema
from ground.exceptions import SettingsError

if TYPE_CHECKING:
    from ground.settings import Settings

#: Reference strategies.
STRATEGIES = ("training", "trailing", "seasonal", "training_seasonal")
#: Default span of a trailing reference (days).
DEFAULT_TRAILING_DAYS = 7.0
#: Period of a ``seasonal`` reference when none is declared (hours): one week.
DEFAULT_SEASONAL_PERIOD_HOURS = 168.0
#: Fewest served rows a trailing/seasonal reference needs (fewer: the training reference).
MIN_SERVED_REFERENCE_ROWS = 30
#: Most served rows kept in a reference (a seeded, time-ordered sample beyond that).
MAX_SERVED_REFERENCE_ROWS = 100_000


@dataclasses.dataclass(frozen=True)
class ReferenceStrategy:
    """One reference strategy.

    Attributes:
        name: One of :data:`STRATEGIES`.
        trailing: Span of a trailing reference (> 0).
        period: Declared period of a seasonal or seasonally matched reference (> 0); ``None``:
            undeclared, a week for ``seasonal`` (:attr:`served_period`) and, for the training
            reference's season, chosen from its row times
            (:func:`drift_checks.season_match.choose_period`).
    """

    name: str = "training"
    trailing: dt.timedelta = dt.timedelta(days=DEFAULT_TRAILING_DAYS)
    period: dt.timedelta | None = None

    def __post_init__(self) -> None:
        if self.name not in STRATEGIES:
            raise SettingsError(f"reference strategy {self.name!r}; expected one of {STRATEGIES}")
        if self.trailing <= dt.timedelta(0) or (self.period is not None and self.period <= dt.timedelta(0)):
            raise SettingsError(f"reference strategy spans trailing={self.trailing}, period={self.period}; "
                                "expected positive durations")

    @classmethod
    def from_settings(cls, settings: Settings, name: str | None = None) -> "ReferenceStrategy":
        """Reference strategy from the settings.

        Args:
            settings: The settings in effect, read by the caller; ``drift_reference_strategy``,
                ``drift_trailing_days`` and ``drift_seasonal_period_hours`` are used.
            name: Strategy that overrides the setting (e.g. a DAG param; ``None``: the setting).

        Returns:
            The strategy.

        Raises:
            SettingsError: Unknown strategy name or a non-positive span.
        """
        s = settings
        hours = float(getattr(s, "drift_seasonal_period_hours", 0.0))
        return cls(name=str(name or getattr(s, "drift_reference_strategy", "training")),
                   trailing=dt.timedelta(days=getattr(s, "drift_trailing_days", DEFAULT_TRAILING_DAYS)),
                   period=dt.timedelta(hours=hours) if hours > 0 else None)

    @property
    def served_period(self) -> dt.timedelta:
        """How far back a ``seasonal`` reference looks: the declared period, else a week."""
        return self.period if self.period is not None else dt.timedelta(hours=DEFAULT_SEASONAL_PERIOD_HOURS)

    def served_range(self, start: Any, end: Any) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        """The span of served traffic the window is compared with (``None``: training)."""
        t0, t1 = pd.Timestamp(start), pd.Timestamp(end)
        if self.name == "trailing":
            return t0 - pd.Timedelta(self.trailing), t0
        if self.name == "seasonal":
            return t0 - pd.Timedelta(self.served_period), t1 - pd.Timedelta(self.served_period)
        return None

    def reference_id(self, training_id: str, version: int | None) -> str:
        """The id thresholds are keyed by under this strategy."""
        if self.name in ("training", "training_seasonal"):
            return training_id if self.name == "training" else f"{training_id}:seasonal"
        span = self.trailing if self.name == "trailing" else self.served_period
        hours = span.total_seconds() / 3600
        return f"v{version}:{self.name}:{hours:g}h"

    def describe(self) -> str:
        """One line saying which rows the strategy compares against (for reports and alerts)."""
        if self.name == "trailing":
            return f"trailing: the last {self.trailing} of served traffic"
        if self.name == "seasonal":
            return f"seasonal: the same window {self.served_period} earlier"
        if self.name == "training_seasonal":
            period = self.period if self.period is not None else (
                "its season (a year, a week or a day: the reference's times)")
            return f"training_seasonal: the model version's reference rows at the window's phase of {period}"
        return "training: the model version's reference"


def served_reference(frame: pd.DataFrame, columns, *, seed: int = 0,
                     max_rows: int = MAX_SERVED_REFERENCE_ROWS,
                     kinds: Mapping[str, str] | None = None) -> pd.DataFrame | None:
    """The served rows as a reference, or ``None`` when there are too few.

    The feature columns in time order, at most ``max_rows`` (seeded sample, order kept); ``None`` when
    fewer than :data:`MIN_SERVED_REFERENCE_ROWS`.

    Args:
        frame: The served rows (the inference log of the span, or the backtest's table rows).
        columns: The feature columns.
        seed: Seed of the sample.
        max_rows: Most rows kept.
        kinds: The declared ``{column: kind}``: the rows are read as it
            (:func:`drift_checks.declared_schema.apply_schema`), and a served value that cannot
            be read as its kind is left out (null). It failed its own window's contract, and a
            reference that refused it would fail every later window of the span.
    """
    if frame is None or len(frame) < MIN_SERVED_REFERENCE_ROWS:
        return None
    cols = [c for c in columns if c in frame.columns]
    out = frame
    if "timestamp" in out.columns:
        out = out.sort_values("timestamp", kind="stable")
    if len(out) > max_rows:
        out = out.sample(n=max_rows, random_state=seed).sort_index()
    out = out[cols].reset_index(drop=True)
    return apply_schema(out, kinds).frame if kinds is not None else out
