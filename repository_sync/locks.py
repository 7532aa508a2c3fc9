"""Per-model promotion locks: one promotion per model at a time.

A promotion lock is a lease of purpose ``promotion`` in the shared coordination database
(:mod:`ground.coordination`): PostgreSQL in production, so promotions are serialised
across Airflow workers on several hosts; SQLite at ``<home>/drift/history.db`` locally. The holder
is described (free text such as an Airflow ``dag_id/run_id/task_id``, plus pid, host and since
when), so a refused second promotion names it. A crashed holder stops heartbeating and its lease
expires after ``settings.lease_ttl_s`` (at once if it ran on this host and its pid is gone).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ground.coordination import PROMOTION, CoordinationStore, Lease, database_url
from ground.exceptions import DataError


def store_for(*, settings: Any = None, url: str | None = None, ttl_s: float | None = None) -> CoordinationStore:
    """The coordination store named by ``url``, else by ``settings``.

    Args:
        settings: Settings naming the coordination database (``coordination_db_url``, else
            ``drift_history_db_url``, else SQLite at ``<home>/drift/history.db``) and the lease
            time-to-live (``lease_ttl_s``).
        url: Coordination database URL (wins over ``settings``).
        ttl_s: Lease time-to-live in seconds without heartbeat (default ``settings.lease_ttl_s``,
            else the store's default).

    Returns:
        The :class:`~ground.coordination.CoordinationStore`.

    Raises:
        DataError: Neither ``url`` nor ``settings`` is given.
    """
    if url is None:
        if settings is None:
            raise DataError("promotion lock: pass settings= or url= (where the shared coordination "
                            "database is)")
        url = database_url(settings)
        ttl_s = ttl_s or getattr(settings, "lease_ttl_s", None)
    return CoordinationStore(url, **({"ttl_s": ttl_s} if ttl_s else {}))


@contextlib.contextmanager
def promotion_lock(
    model: str, *, settings: Any = None, url: str | None = None,
    holder: str = "", timeout_s: float = 0.0, ttl_s: float | None = None,
) -> Iterator[Lease]:
    """Hold the promotion lease of ``model``: one canary/promotion/rollback per model at a time.

    Args:
        model: Registered model name.
        settings: Settings naming the coordination database (see :func:`store_for`).
        url: Coordination database URL (wins over ``settings``).
        holder: Who is promoting, e.g. ``"canary_promotion/manual__2024-01-01/analyse"``.
        timeout_s: Seconds to wait for another promotion to finish (``settings.promotion_lock_timeout_s``);
            ``0`` fails at once.
        ttl_s: Lease time-to-live without heartbeat (default ``settings.lease_ttl_s``).

    Example::

        with promotion_lock("churn_model", settings=settings, holder=run_id):
            run_canary(...)

    Raises:
        LeaseBusyError: (a ConcurrencyError) Another promotion of ``model`` holds the lease; the
            message names the model and the holder, its pid, host and since when.
        DataError: ``model`` is empty, or neither ``settings`` nor ``url`` is given.
    """
    if not model:
        raise DataError("promotion lock: model='' is empty; expected a model name")
    store = store_for(settings=settings, url=url, ttl_s=ttl_s)
    with store.hold(PROMOTION, model, holder=holder, timeout_s=timeout_s,
                    what=f"promotion of model {model!r}") as lease:
        yield lease
