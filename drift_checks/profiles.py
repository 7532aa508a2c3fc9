"""whylogs profiles per hourly window: built once, stored, merged into daily profiles, scored.

Layout under a folder or S3 prefix::

    <root>/<model>/profiles/date=YYYY-MM-DD/hour=HH/profile.bin
    <root>/<model>/profiles/date=YYYY-MM-DD/daily.bin

whylogs' KLL sketches compact randomly, so profiling the same data twice gives different
sketches and different KS p-values (whylogs#684). Hence each hour is profiled ONCE
(:func:`profile_hour` returns the stored profile when it exists) and drift is always recomputed
from the STORED views (:func:`score_profiles`), which gives identical scores on every rerun.
A POSSIBLE_DRIFT category alone never raises an alert: see :func:`hysteresis_alert`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, Sequence

import pandas as pd

from drift_checks.inference_log import partition_prefix
from drift_checks.storage import Store

PROFILE_NAME = "profile.bin"


def _quiet():
    import logging
    import warnings

    warnings.filterwarnings("ignore", module="whylogs")
    logging.getLogger("whylogs").setLevel(logging.ERROR)


def profile_frame(frame: pd.DataFrame):
    """Whylogs ``DatasetProfileView`` of a frame (all columns)."""
    _quiet()
    import whylogs as why

    return why.log(frame).view()


def profile_key(model: str, hour: dt.datetime) -> str:
    """Key of the hourly profile, relative to the store root."""
    return partition_prefix(model, hour).replace(f"{model}/", f"{model}/profiles/", 1) + "/" + PROFILE_NAME


def write_profile(store: Store, key: str, view) -> str:
    """Serialise and store a profile view atomically; return its URI."""
    return store.put_bytes(key, view.serialize())


def read_profile(store: Store, key: str):
    """Load a stored profile view.

    Raises:
        FileNotFoundError: No profile at ``key``.
    """
    _quiet()
    from whylogs.core import DatasetProfileView

    return DatasetProfileView.deserialize(store.get_bytes(key))


def profile_hour(root: str, model: str, hour: dt.datetime, frame: pd.DataFrame,
                 endpoint_url: str | None = None, overwrite: bool = False) -> tuple[str, bool]:
    """Profile one hourly window once and store it.

    Args:
        root: Folder or ``s3://bucket/prefix``.
        model: Model name.
        hour: Window start (timezone-aware).
        frame: The window's records, or the merged profile view of its record batches.
        endpoint_url: S3-compatible endpoint.
        overwrite: Re-profile even if a profile is stored (only when the raw data changed).

    Returns:
        (URI of the stored profile, whether it was created now). A rerun returns the stored one.
    """
    store = Store(root, endpoint_url)
    key = profile_key(model, hour)
    if not overwrite and store.exists(key):
        return store.uri(key), False
    view = frame if hasattr(frame, "serialize") else profile_frame(frame)  # a merged view of a streamed window
    return write_profile(store, key, view), True


def load_hour_profile(root: str, model: str, hour: dt.datetime, endpoint_url: str | None = None):
    """The stored profile of one hour (raises FileNotFoundError when absent)."""
    return read_profile(Store(root, endpoint_url), profile_key(model, hour))


def merge_profiles(views: Sequence[Any]):
    """Merge profile views (e.g. 24 hourly views into a daily one).

    Raises:
        ValueError: ``views`` is empty.
    """
    if not views:
        raise ValueError("no profiles to merge; expected at least one hourly profile")
    out = views[0]
    for v in views[1:]:
        out = out.merge(v)
    return out


def merge_day(root: str, model: str, day: dt.date, endpoint_url: str | None = None) -> str | None:
    """Merge the stored hourly profiles of one UTC day into ``daily.bin``.

    Returns ``None`` if no hour was profiled.
    """
    store = Store(root, endpoint_url)
    prefix = f"{model}/profiles/date={day:%Y-%m-%d}"
    keys = [k for k in store.list(prefix) if k.endswith("/" + PROFILE_NAME)]
    if not keys:
        return None
    merged = merge_profiles([read_profile(store, k) for k in keys])
    return write_profile(store, f"{prefix}/daily.bin", merged)


def score_profiles(reference_view, current_view) -> dict[str, dict[str, Any]]:
    """Whylogs drift scores between two (stored) profile views.

    Returns:
        ``{column: {"algorithm", "pvalue", "statistic", "drift_category"}}``; deterministic for
        the same pair of views (the sketches are fixed once stored).
    """
    _quiet()
    from whylogs.viz.drift.column_drift_algorithms import calculate_drift_scores

    scores = calculate_drift_scores(target_view=current_view, reference_view=reference_view,
                                    with_thresholds=True)
    out = {}
    for col, s in scores.items():
        if s is None:
            continue
        out[col] = {k: s.get(k) for k in ("algorithm", "pvalue", "statistic", "drift_category")}
    return out


def hysteresis_alert(categories: Iterable[str], consecutive: int = 2) -> bool:
    """Whether a series of whylogs drift categories (oldest first, current last) raises an alert.

    Rule: ``DRIFT`` in the current window alerts; ``POSSIBLE_DRIFT`` alerts only when the last
    ``consecutive`` windows were all ``POSSIBLE_DRIFT`` or ``DRIFT``. A single POSSIBLE_DRIFT
    never alerts.
    """
    cats = list(categories)
    if not cats:
        return False
    if cats[-1] == "DRIFT":
        return True
    tail = cats[-consecutive:]
    return len(tail) >= consecutive and all(c in ("DRIFT", "POSSIBLE_DRIFT") for c in tail)
