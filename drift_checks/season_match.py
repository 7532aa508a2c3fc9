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

**Thresholds** (:meth:`SeasonalReference.calibration`). For phases of the period a window of
the same duration can start at, the reference rows of that season are cut, in time order, into
chunks of the window's size, and each chunk is scored against the season's other rows (left in,
a chunk would be compared with a set holding its own rows, and every threshold would be too low).
The quantile over those chunks is the ``reference`` threshold, as for the ``training`` strategy;
the dynamic thresholds, the false-alarm budget and the alert policy then apply unchanged. Every
matched window is keyed ``<training id>:seasonal``, so the history learns one series per
(feature, statistic): "distance from the same season". A season must hold at least twice the
window's rows to be cut so; with fewer than 10 chunks in all, the static thresholds apply.

The window's data contract is still derived from the whole reference: a season's rows would
narrow it (a column with nulls elsewhere and none in one season would fail that season's hours).

**The period.** Declared (``period``), or chosen per window duration from the reference's times
(:func:`choose_period`): the longest of a year, a week and a day that the times cover twice and
whose season holds enough rows for a window, as Prophet turns its yearly, weekly and daily
seasonalities on from the history's span. NOAA's daily rows over eight years get a year; a few
weeks of rows every ten minutes get a day.

**Fallback.** A window whose matched rows come from fewer than :data:`MIN_CYCLES` cycles (the
reference spans less than ``MIN_CYCLES`` periods, or the window is longer than the period) or
number fewer than :data:`~drift_checks.strategies.MIN_SERVED_REFERENCE_ROWS` is compared with the
whole reference, under the whole reference's id and thresholds; the note on the window says so.

The rows' times are needed: the backtest has them (its time column); a stored model-version
reference has them when its source had a ``timestamp`` column (:mod:`drift_checks.reference`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from drift_checks import statistics as st
from drift_checks.strategies import MIN_SERVED_REFERENCE_ROWS
from drift_checks.thresholds import (
    MAX_REFERENCE_CHUNKS,
    MIN_REFERENCE_CHUNKS,
    Calibration,
    chunk_quantiles,
    chunk_rows_for,
)
from drift_checks.verdict import PreparedReference, prepare_reference

#: Fewest cycles of the period the matched rows must hold (fewer: the whole reference).
MIN_CYCLES = 2
#: Most phases of the period whose seasons calibrate the thresholds (spread evenly).
MAX_PHASES = 48
#: Periods a season is looked for in when none is declared, longest first: a year, a week, a day.
SEASON_CANDIDATES = (pd.Timedelta(days=365.25), pd.Timedelta(days=7), pd.Timedelta(days=1))


def choose_period(times: np.ndarray, duration: pd.Timedelta,
                  candidates: tuple[pd.Timedelta, ...] = SEASON_CANDIDATES) -> pd.Timedelta | None:
    """The longest candidate period whose seasons a window of ``duration`` can be matched in.

    A candidate qualifies when it is longer than the window, the times span at least
    :data:`MIN_CYCLES` of it, the rows come closer together than one period, and a window's
    season would hold on average :data:`~drift_checks.strategies.MIN_SERVED_REFERENCE_ROWS` rows
    (``rows x duration / period``). The span and spacing tests are Prophet's automatic
    seasonalities (``Prophet.set_auto_seasonalities``: yearly with two years of history, weekly
    with two weeks and rows under a week apart, daily with two days and rows under a day apart;
    Taylor & Letham, "Forecasting at scale", 2018). Prophet fits each that qualifies; a season
    here is one period, so the longest is taken (the same hour of the same day of earlier years
    holds the shorter ones' phase where the data has it).

    Args:
        times: Reference row times (``datetime64[ns]``, any order).
        duration: The window's duration (> 0).
        candidates: Periods to try, longest first.

    Returns:
        The chosen period, or ``None`` when none qualifies (the whole reference then applies).
    """
    steps = np.diff(np.unique(times)).astype("int64")
    if steps.size == 0:
        return None
    span, spacing = pd.Timedelta(int(steps.sum())), pd.Timedelta(int(steps.min()))
    for period in candidates:
        rows = len(times) * (duration / period)
        if (duration < period and span >= MIN_CYCLES * period and spacing < period
                and rows >= MIN_SERVED_REFERENCE_ROWS):
            return period
    return None


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
    """A training reference with row times that yields, per window, the rows of its season.

    Attributes:
        training: The whole reference, prepared (any row order: the times say where each row is).
        times: Each reference row's time (UTC-naive ``datetime64[ns]``, the rows' order).
        period: The declared seasonal period (any timedelta, kept as a ``pd.Timedelta``); ``None``:
            chosen per window duration (:func:`choose_period`).
        calibrations: Seasonal calibrations by (window duration, chunk rows, quantile, statistics),
            filled lazily.
        chosen: Periods chosen from the times, by window duration (ns), filled lazily.
        budgets: Quantiles calibrated to the false-alarm budget, shared by every window's matched
            reference (:meth:`drift_checks.verdict.PreparedReference.budget`).
        store: ``store(period, duration)`` gives where the calibrations of windows of that duration
            in that period outlive the process (``load(key)`` / ``save(key, calibration)``, as
            :attr:`drift_checks.verdict.PreparedReference.calibration_store`, keyed apart from the
            whole reference's); ``None``: this object only.
    """

    training: PreparedReference
    times: np.ndarray
    period: pd.Timedelta | None
    calibrations: dict[tuple, Calibration | None] = dataclasses.field(default_factory=dict)
    budgets: dict[tuple, Any] = dataclasses.field(default_factory=dict)
    store: Callable[[pd.Timedelta, pd.Timedelta], Any] | None = None
    chosen: dict[int, pd.Timedelta | None] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.period is not None:
            self.period = pd.Timedelta(self.period)

    def period_for(self, duration: pd.Timedelta) -> pd.Timedelta | None:
        """The period windows of ``duration`` are matched in: the declared one, else :func:`choose_period`."""
        if self.period is not None:
            return self.period
        if duration.value not in self.chosen:
            self.chosen[duration.value] = choose_period(self.times, duration)
        return self.chosen[duration.value]

    def for_window(self, start: Any, end: Any) -> tuple[PreparedReference, str]:
        """The window's reference and a note saying which rows it holds.

        Returns:
            ``(prepared reference, note)``: the matched rows, keyed ``<training id>:seasonal`` and
            calibrated by :meth:`calibration`; or the whole reference (its own id and calibration)
            when the match holds fewer than :data:`MIN_CYCLES` cycles or
            :data:`~drift_checks.strategies.MIN_SERVED_REFERENCE_ROWS` rows (module docstring).
        """
        a, b = _naive(start), _naive(end)
        period = self.period_for(b - a)
        if period is None:
            return self.training, (f"training (no season: the reference's times give no year, week or day "
                                   f"covered {MIN_CYCLES} times with {MIN_SERVED_REFERENCE_ROWS} rows per window)")
        if b - a >= period:
            return self.training, "training (the window is not shorter than the seasonal period)"
        mask = season_mask(self.times, a, b, period)
        cycles = int(np.unique(_cycle(self.times[mask], a, period)).size)
        rows = int(mask.sum())
        if cycles < MIN_CYCLES or rows < MIN_SERVED_REFERENCE_ROWS:
            return self.training, (f"training (the season matches {rows} rows from {cycles} cycle(s) of the "
                                   f"reference; {MIN_CYCLES} cycles and {MIN_SERVED_REFERENCE_ROWS} rows needed)")
        ref = self.training
        matched = prepare_reference(ref.frame[mask].reset_index(drop=True), ref.schema,
                                    reference_id=f"{ref.reference_id}:seasonal", importance=ref.importance,
                                    time_ordered=True)
        fields = {f.name: getattr(matched, f.name) for f in dataclasses.fields(PreparedReference)}
        chosen = "" if self.period is not None else f" of {period / pd.Timedelta(hours=1):g} h, from its times"
        note = f"training_seasonal ({rows} rows from {cycles} cycles{chosen})"
        return _Matched(**{**fields, "budgets": self.budgets}, source=self, duration=b - a), note

    def calibration(self, window_rows: int, quantile: float, names=None, *,
                    duration: pd.Timedelta) -> Calibration | None:
        """Season-matched chunks of the reference, each scored against its season without itself (cached).

        For each phase of the period a window of ``duration`` can start at (one per ``duration``,
        at most :data:`MAX_PHASES`), the reference rows of that season are taken in time order and
        cut into chunks of the window's size; each chunk is scored against the season's other rows.
        A chunk whose season holds no row of another cycle, or fewer rows than the chunk, is not
        scored.

        Args:
            window_rows: Rows of the window being judged (sets the chunk size,
                :func:`~drift_checks.thresholds.chunk_rows_for`).
            quantile: Quantile of distances (p-values: ``1 - quantile``).
            names: Statistics to compute (default: every registered one).
            duration: The window's duration (the span of a season).

        Returns:
            A :class:`~drift_checks.thresholds.Calibration`, or ``None`` when fewer than
            :data:`~drift_checks.thresholds.MIN_REFERENCE_CHUNKS` chunks can be scored (the
            static thresholds then apply, as for any reference too small to calibrate).
        """
        size = chunk_rows_for(window_rows, len(self.training.frame))
        if size == 0:
            return None
        period = self.period_for(duration)
        if period is None:
            return None
        key = (size, quantile, tuple(names) if names is not None else None)
        if (duration.value, *key) not in self.calibrations:
            store = self.store(period, duration) if self.store is not None else None
            found = store.load(key) if store is not None else None
            if found is None:
                found = self._calibrate(size, period, duration, quantile, names)
                if store is not None and found is not None:
                    store.save(key, found)
            self.calibrations[(duration.value, *key)] = found
        return self.calibrations[(duration.value, *key)]

    def _season_chunks(self, size: int, period: pd.Timedelta,
                       duration: pd.Timedelta) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(chunk rows, rest of its season)`` pairs, at most :data:`MAX_REFERENCE_CHUNKS`."""
        times = self.times
        t0 = pd.Timestamp(times.min())
        phases = np.arange(0, period.value, duration.value)
        phases = phases[np.unique(np.linspace(0, len(phases) - 1, min(len(phases), MAX_PHASES)).round().astype(int))]
        pairs = []
        for phase in phases:
            start = t0 + pd.Timedelta(int(phase))
            season = np.flatnonzero(season_mask(times, start, start + duration, period))
            season = season[np.argsort(times[season], kind="stable")]
            cycle = _cycle(times[season], start, period)
            for i in range(len(season) // size):
                inside = np.zeros(len(season), bool)
                inside[i * size:(i + 1) * size] = True
                rest = season[~inside]
                if len(rest) >= size and np.setdiff1d(cycle[~inside], cycle[inside]).size:
                    pairs.append((season[inside], rest))
        picks = np.unique(np.linspace(0, len(pairs) - 1, min(len(pairs), MAX_REFERENCE_CHUNKS)).round().astype(int))
        return [pairs[i] for i in picks] if pairs else []

    def _calibrate(self, size: int, period: pd.Timedelta, duration: pd.Timedelta, quantile: float,
                   names) -> Calibration | None:
        ref = self.training
        pairs = self._season_chunks(size, period, duration)
        if len(pairs) < MIN_REFERENCE_CHUNKS:
            return None
        wanted = list(names) if names is not None else None
        chunks = []
        for inside, rest in pairs:
            chunk, others = ref.frame.iloc[inside], ref.frame.iloc[rest]
            results: dict[str, Mapping[str, Any]] = {}
            for col in ref.numeric:
                results[col] = st.score_numeric(st.prepare_numeric(others[col]), st.prepare_numeric(chunk[col]), wanted)
            for col in ref.categorical:
                results[col] = st.score_categorical(st.category_counts(others[col]), st.category_counts(chunk[col]),
                                                    reference_rows=len(others), current_rows=len(chunk), names=wanted)
            chunks.append(results)
        return Calibration(size, len(chunks), chunk_quantiles(chunks, quantile), quantile, tuple(chunks))


@dataclasses.dataclass
class _Matched(PreparedReference):
    """The matched rows of one window, calibrated by their :class:`SeasonalReference`."""

    source: SeasonalReference | None = None
    duration: pd.Timedelta = pd.Timedelta(0)

    def calibration(self, window_rows: int, quantile: float, names=None) -> Calibration | None:
        assert self.source is not None
        return self.source.calibration(window_rows, quantile, names, duration=self.duration)

    def contract_rows(self) -> pd.DataFrame:
        """The whole reference: a season's rows would narrow the contract (a null share, a range)."""
        assert self.source is not None
        return self.source.training.contract_rows()


def _cycle(times: np.ndarray, start: pd.Timestamp, period: pd.Timedelta) -> np.ndarray:
    """Which cycle of ``period`` counted from ``start`` each time falls in."""
    return np.floor_divide((times - np.datetime64(_naive(start), "ns")).astype("int64"), period.value)


def _naive(t: Any) -> pd.Timestamp:
    ts = pd.Timestamp(t)
    return ts.tz_convert(None) if ts.tzinfo is not None else ts
