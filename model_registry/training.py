"""Retraining: the NOAA training function, MLflow logging/registration, entry points and the guard.

Plain Python (no Airflow). The ``retrain`` DAG calls :func:`retrain` with the model's configured
:class:`EntryPoint`, the training window (inference log joined with labels) and a
:class:`Lineage` naming why it runs; the result is a new registered model version carrying the
alias ``challenger``.

Guarantees:

* **A failed training run leaves the registry unchanged.** The model is logged inside an MLflow
  run first; the model version is registered only after training and logging succeeded, and if
  setting the alias or tags fails, the new version (and a registered model created for it) is
  deleted again. A failing training run is marked ``FAILED`` in MLflow for the record.
* **At most one retraining in flight per model, with a cooldown** (:class:`RetrainGuard`): a
  row per model in the shared coordination database (``ground.coordination``)
  updated with the row locked, so two processes (Airflow workers on one or several hosts) cannot
  both start. A lock older than ``stale_after_s`` counts as abandoned (a
  crashed worker). The cooldown runs from the last *successful* retraining; failures do not start it.

Layout: the NOAA model is in :mod:`model_registry.noaa_model`, lineage and MLflow
logging/registration in :mod:`model_registry.training_registration`, entry points in
:mod:`model_registry.entry_points`; this module holds the guard and :func:`retrain`, and
re-exports the public names of the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pandas as pd

from ground.exceptions import ConcurrencyError, DataError, RetrainCooldownError
from model_registry.entry_points import EntryPoint, resolve_callable, run_entry_point
from model_registry.noaa_model import MIN_TRAINING_ROWS, NoaaTrainingParams, TrainedModel, train_noaa
from model_registry.registry.entities import CHALLENGER_ALIAS, TAG_PREFIX
from model_registry.training_registration import (
    DEFAULT_EXPERIMENT,
    INPUT_EXAMPLE_ROWS,
    MODEL_ARTIFACT_NAME,
    Lineage,
    RegisteredVersion,
    data_sha256,
    log_and_register,
    sklearn_requirements,
    window_lineage,
)

__all__ = [
    "CHALLENGER_ALIAS",
    "DEFAULT_EXPERIMENT",
    "EntryPoint",
    "INPUT_EXAMPLE_ROWS",
    "Lease",
    "Lineage",
    "MIN_TRAINING_ROWS",
    "MODEL_ARTIFACT_NAME",
    "NoaaTrainingParams",
    "RegisteredVersion",
    "RetrainGuard",
    "TAG_PREFIX",
    "TrainedModel",
    "data_sha256",
    "lineage_json",
    "log_and_register",
    "resolve_callable",
    "retrain",
    "run_entry_point",
    "sklearn_requirements",
    "train_noaa",
    "window_lineage",
]


# ----------------------------------------------------------------------------- the guard
@dataclasses.dataclass(frozen=True)
class Lease:
    """A held retraining lock: ``model`` by ``holder`` since ``started_at`` (epoch seconds)."""

    model: str
    holder: str
    started_at: float


class RetrainGuard:
    """At most one retraining in flight per model, and a cooldown after a successful one.

    State lives in the shared coordination database (:mod:`ground.coordination`, scope
    ``retrain-guard``, one JSON row per model: ``holder, status, started_at, finished_at,
    last_success_at``), so retrainings are serialised across processes and hosts when that
    database is PostgreSQL. Every check-and-set is one transaction holding the row locked
    (``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR UPDATE`` on PostgreSQL). Times are epoch seconds
    from ``clock`` (``time.time`` by default; injectable for tests).

    Args:
        path: SQLAlchemy URL of the coordination database, or a SQLite file path.
        cooldown_s: Seconds after a successful retraining before the next may start (>= 0).
        stale_after_s: Age in seconds after which a held lock counts as abandoned (> 0).
        clock: Source of the current time.
    """

    SCOPE = "retrain-guard"

    def __init__(self, path: str | Path, *, cooldown_s: float, stale_after_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        from ground.coordination import CoordinationStore

        if cooldown_s < 0:
            raise DataError(f"cooldown_s={cooldown_s!r} must be >= 0 seconds")
        if stale_after_s <= 0:
            raise DataError(f"stale_after_s={stale_after_s!r} must be > 0 seconds")
        text = str(path)
        self.url = text if "://" in text else f"sqlite:///{Path(text).resolve()}"
        self.path = None if "://" in text else Path(text)
        self.cooldown_s = float(cooldown_s)
        self.stale_after_s = float(stale_after_s)
        self._clock = clock
        self.store = CoordinationStore(self.url)

    @classmethod
    def from_settings(cls, settings: Any) -> "RetrainGuard":
        """Guard in the shared coordination database of ``settings`` with the ``retrain_*`` settings."""
        from ground.coordination import database_url

        return cls(database_url(settings), cooldown_s=settings.retrain_cooldown_s,
                   stale_after_s=settings.retrain_stale_after_s)

    def status(self, model: str) -> dict[str, Any] | None:
        """The model's row (``holder``, ``status``, times) or None if it never retrained."""
        return self.store.get_state(self.SCOPE, model)

    def acquire(self, model: str, *, holder: str | None = None,
                ignore_cooldown: bool = False) -> Lease:
        """Take the model's retraining lock.

        Args:
            model: Registered model name.
            holder: Who holds it (e.g. the DAG run id); a random id by default.
            ignore_cooldown: Start even within the cooldown (a manual retraining); never bypasses
                a retraining in flight.

        Raises:
            ConcurrencyError: Another retraining of ``model`` is in flight (not stale).
            RetrainCooldownError: The last successful retraining ended less than ``cooldown_s`` ago.
        """
        holder = holder or uuid.uuid4().hex
        now = self._clock()
        with self.store.locked_state(self.SCOPE, model) as (conn, row):
            row = dict(row or {})
            if row:
                other, status = row.get("holder"), row.get("status")
                started: Any = row.get("started_at")  # unix time; set whenever status is "running"
                last_ok = row.get("last_success_at")
                if status == "running" and now - started < self.stale_after_s:
                    raise ConcurrencyError(
                        f"retraining of model {model!r} is already in flight (holder "
                        f"{other!r}, started {now - started:.0f} s ago); at most one per model"
                    )
                if (not ignore_cooldown and last_ok is not None
                        and now - last_ok < self.cooldown_s):
                    raise RetrainCooldownError(
                        f"model {model!r} was retrained {now - last_ok:.0f} s ago; cooldown is "
                        f"{self.cooldown_s:.0f} s (retrain_cooldown_s)"
                    )
            row.update(holder=holder, status="running", started_at=now)
            row.setdefault("finished_at", None)
            row.setdefault("last_success_at", None)
            self.store.set_state(self.SCOPE, model, row, conn=conn)
        return Lease(model=model, holder=holder, started_at=now)

    def release(self, lease: Lease, *, succeeded: bool) -> None:
        """Release a lease; a success starts the cooldown. A lease taken over (stale) is ignored."""
        now = self._clock()
        with self.store.locked_state(self.SCOPE, lease.model) as (conn, row):
            if not row or row.get("holder") != lease.holder:
                return
            row = dict(row, status="succeeded" if succeeded else "failed", finished_at=now)
            if succeeded:
                row["last_success_at"] = now
            self.store.set_state(self.SCOPE, lease.model, row, conn=conn)

    @contextlib.contextmanager
    def hold(self, model: str, *, holder: str | None = None,
             ignore_cooldown: bool = False) -> Iterator[Lease]:
        """Context manager: :meth:`acquire`, run the block, :meth:`release` (success = no error)."""
        lease = self.acquire(model, holder=holder, ignore_cooldown=ignore_cooldown)
        try:
            yield lease
        except BaseException:
            self.release(lease, succeeded=False)
            raise
        self.release(lease, succeeded=True)


def retrain(entry: EntryPoint | str | Mapping[str, Any], window: pd.DataFrame, *,
            name: str, tracking_uri: str, lineage: Lineage, guard: RetrainGuard,
            params: Mapping[str, Any] | None = None, alias: str = CHALLENGER_ALIAS,
            holder: str | None = None, ignore_cooldown: bool = False,
            experiment: str = DEFAULT_EXPERIMENT) -> RegisteredVersion:
    """Retrain ``name`` under the guard: one in flight per model, cooldown after success.

    Returns:
        The registered challenger version (publish it next).

    Raises:
        ConcurrencyError: Another retraining of the model is in flight.
        RetrainCooldownError: Within the cooldown (and not ``ignore_cooldown``).
        TrainingError: The entry point failed; the registry is unchanged.
        RegistryError: Registration failed; nothing was left registered.
    """
    with guard.hold(name, holder=holder, ignore_cooldown=ignore_cooldown):
        return run_entry_point(entry, window, tracking_uri=tracking_uri, name=name,
                               lineage=lineage, params=params, alias=alias, experiment=experiment)


def lineage_json(result: RegisteredVersion) -> str:
    """Compact JSON of a registered version (for XCom and logs)."""
    return json.dumps(result.as_dict(), sort_keys=True)
