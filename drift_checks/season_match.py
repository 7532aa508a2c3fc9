"""A seasonally matched training reference: each window against the reference rows of its season.

With the ``training`` strategy a window is compared with the whole reference, so a season the
reference covers is part of what the thresholds must allow: the reference's own chunks
(:func:`drift_checks.thresholds.calibrate_from_reference`) include spring and summer, and a shift
smaller than the seasons' swing stays hidden where a season moves the other way. On NOAA, wind
speeds drop by about 0.8 standard deviations at day 3,000; in spring, windier than the reference's
average, the first window after the drop is as close to the whole reference as a quiet one.

The ``training_seasonal`` strategy (:mod:`drift_checks.strategies`) compares each window with the
reference rows at the same phase of the declared period instead (``period``: a year for daily
weather, a day or a week for hourly traffic): a row at time ``t`` matches the window ``[a, b)``
when ``(t - a) mod period < b - a``. Those rows come from every cycle the reference covers, so the
season is held fixed and the window's difference from its own season is what is scored.

**Thresholds** (:meth:`SeasonalReference.calibration`). The reference's time-ordered chunks of the
window's size are each scored against the rows of the reference that match the chunk's season,
the chunk itself left out (otherwise a chunk would be compared with a set holding its own rows,
and every threshold would be too low). The quantile over those chunks is the ``reference``
threshold, as for the ``training`` strategy; the dynamic thresholds, the false-alarm budget and
the alert policy then apply unchanged. Every window shares one reference id, so the history
learns one series per (feature, statistic): "distance from the same season".

**Fallback.** A window whose matched rows come from fewer than :data:`MIN_CYCLES` cycles (the
reference spans less than ``MIN_CYCLES`` periods, or the window is longer than the period) or
number fewer than :data:`~drift_checks.strategies.MIN_SERVED_REFERENCE_ROWS` is compared with the
whole reference; the note on the window says so.

The rows' times are needed: the backtest has them (its time column); a stored model-version
reference has them when its source had a ``timestamp`` column (:mod:`drift_checks.reference`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import pandas as pd

from drift_checks import statistics as st
from drift_checks.strategies import MIN_SERVED_REFERENCE_ROWS
from drift_checks.thresholds import MAX_REFERENCE_CHUNKS, Calibration, chunk_quantiles, chunk_rows_for
from drift_checks.verdict import PreparedReference, prepare_reference

#: Fewest cycles of the period the matched rows must hold (fewer: the whole reference).
MIN_CYCLES = 2


def season_mask(times: np.ndarray, start: pd.Timestamp, end: pd.Timestamp, period: pd.Timedelta) -> np.ndarray:
    """Rows whose time falls at the window's phase of the period.

    Args:
        times: Row times, UTC-naive ``datetime64[ns]``.
        start: The window's start (inclusive).
        end: The window's end (exclusive).
        period: The seasonal period (> 0).

    Returns:
        Boolean mask: ``(t - start) mod period < end - start``.
    """
    offset = (times - np.datetime64(_naive(start), "ns")).astype("int64")
    return np.mod(offset, period.value) < (end - start).value


@dataclasses.dataclass
class SeasonalReference:
    """A time-ordered training reference that yields, per window, the rows of its season.

    Attributes:
        training: The whole reference, prepared (rows in time order).
        times: Each reference row's time (UTC-naive ``datetime64[ns]``, same order).
        period: The seasonal period.
        calibrations: Seasonal calibrations by (chunk rows, quantile, statistics), filled lazily.
        budgets: Quantiles calibrated to the false-alarm budget, shared by every window's matched
            reference (:meth:`drift_checks.verdict.PreparedReference.budget`).
        store: Where the calibrations outlive the process (``load(key)`` / ``save(key,
            calibration)``, as :attr:`drift_checks.verdict.PreparedReference.calibration_store`,
            keyed apart from the whole reference's); ``None``: this object only.
    """

    training: PreparedReference
    times: np.ndarray
    period: pd.Timedelta
    calibrations: dict[tuple, Calibration] = dataclasses.field(default_factory=dict)
    budgets: dict[tuple, Any] = dataclasses.field(default_factory=dict)
    store: Any = None

    def for_window(self, start: Any, end: Any) -> tuple[PreparedReference, str]:
        """The window's reference and a note saying which rows it holds.

        Returns:
            ``(prepared reference, note)``: the matched rows, keyed by the training reference's
            id and calibrated by :meth:`calibration`; or the whole reference when the match holds
            fewer than :data:`MIN_CYCLES` cycles (module docstring).
        """
        a, b = _naive(start), _naive(end)
        if b - a >= self.period:
            return self.training, "training (the window is not shorter than the seasonal period)"
        mask = season_mask(self.times, a, b, self.period)
        cycles = int(np.unique(np.floor_divide((self.times[mask] - np.datetime64(a, "ns")).astype("int64"),
                                               self.period.value)).size)
        rows = int(mask.sum())
        if cycles < MIN_CYCLES or rows < MIN_SERVED_REFERENCE_ROWS:
            return self.training, (f"training (the season matches {rows} rows from {cycles} cycle(s) of the "
                                   f"reference; {MIN_CYCLES} cycles and {MIN_SERVED_REFERENCE_ROWS} rows needed)")
        ref = self.training
        matched = prepare_reference(ref.frame[mask].reset_index(drop=True), ref.schema,
                                    reference_id=f"{ref.reference_id}:seasonal", importance=ref.importance,
                                    time_ordered=True)
        fields = {f.name: getattr(matched, f.name) for f in dataclasses.fields(PreparedReference)}
        note = f"training_seasonal ({rows} rows from {cycles} cycles)"
        return _Matched(**{**fields, "budgets": self.budgets}, source=self), note

    def calibration(self, window_rows: int, quantile: float, names=None) -> Calibration | None:
        """Chunks of the reference, each scored against its season without itself (cached).

        Args:
            window_rows: Rows of the window being judged (sets the chunk size,
                :func:`~drift_checks.thresholds.chunk_rows_for`).
            quantile: Quantile of distances (p-values: ``1 - quantile``).
            names: Statistics to compute (default: every registered one).

        Returns:
            A :class:`~drift_checks.thresholds.Calibration`, or ``None`` when the reference holds
            too few chunks of that size.
        """
        ref = self.training
        size = chunk_rows_for(window_rows, len(ref.frame))
        if size == 0:
            return None
        key = (size, quantile, tuple(names) if names is not None else None)
        if key not in self.calibrations:
            stored = self.store.load(key) if self.store is not None else None
            if stored is None:
                stored = self._calibrate(size, quantile, names)
                if self.store is not None:
                    self.store.save(key, stored)
            self.calibrations[key] = stored
        return self.calibrations[key]

    def _calibrate(self, size: int, quantile: float, names) -> Calibration:
        ref, times = self.training, self.times
        n_total = len(ref.frame) // size
        picks = np.unique(np.linspace(0, n_total - 1, min(n_total, MAX_REFERENCE_CHUNKS)).round().astype(int))
        wanted = list(names) if names is not None else None
        span = pd.Timedelta(int((times[-1] - times[0]).astype("int64") / max(len(times) - 1, 1) * size))
        chunks = []
        for i in picks:
            rows = slice(i * size, (i + 1) * size)
            chunk = ref.frame.iloc[rows]
            start = pd.Timestamp(times[rows.start])
            mask = season_mask(times, start, start + span, self.period) if span < self.period else \
                np.ones(len(times), bool)
            mask[rows] = False
            rest = ref.frame[mask]
            results: dict[str, Mapping[str, Any]] = {}
            for col in ref.numeric:
                results[col] = st.score_numeric(st.prepare_numeric(rest[col]), st.prepare_numeric(chunk[col]), wanted)
            for col in ref.categorical:
                results[col] = st.score_categorical(st.category_counts(rest[col]), st.category_counts(chunk[col]),
                                                    reference_rows=len(rest), current_rows=len(chunk), names=wanted)
            chunks.append(results)
        return Calibration(size, int(picks.size), chunk_quantiles(chunks, quantile), quantile, tuple(chunks))


@dataclasses.dataclass
class _Matched(PreparedReference):
    """The matched rows of one window, calibrated by their :class:`SeasonalReference`."""

    source: SeasonalReference | None = None

    def calibration(self, window_rows: int, quantile: float, names=None) -> Calibration | None:
        assert self.source is not None
        return self.source.calibration(window_rows, quantile, names)


def _naive(t: Any) -> pd.Timestamp:
    ts = pd.Timestamp(t)
    return ts.tz_convert(None) if ts.tzinfo is not None else ts
