"""whylogs profiles per hourly window: built once and stored, for inspection; they decide nothing.

Layout under a folder or S3 prefix::

    <root>/<model>/profiles/date=YYYY-MM-DD/hour=HH/profile.bin

whylogs' KLL sketches compact randomly, so profiling the same data twice gives different
sketches and different KS p-values (whylogs#684). Hence each hour is profiled ONCE
(:func:`profile_hour` returns the stored profile when it exists): whoever reads or merges the
stored views gets the same sketches on every rerun. The drift decision never reads them
(:mod:`drift_checks.verdict` computes its statistics exactly, or from its own sketches).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

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


def merge_profiles(views: Sequence[Any]):
    """Merge profile views (the views of a streamed window's record batches into the hour's one).

    Args:
        views: ``DatasetProfileView`` objects, at least one.

    Returns:
        The merged view.

    Raises:
        ValueError: ``views`` is empty.
    """
    if not views:
        raise ValueError("no profiles to merge; expected at least one profile view")
    out = views[0]
    for v in views[1:]:
        out = out.merge(v)
    return out
