"""Locks that serialise registry changes (promotion, rollback, deletion) of one registered model.

:class:`DatabaseLock` (the default) is a lease in the shared coordination database
(:mod:`ground.coordination`). :class:`RegistryLock` needs no extra service: it uses a
registered model ``tritonflow-lock.<name>`` as a lock-table row, relying on MLflow refusing a second
``create_registered_model`` with ``RESOURCE_ALREADY_EXISTS``. See :mod:`model_registry.registry`
for when to use which.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from typing import Any, Iterator, Protocol

from ground.exceptions import ConcurrencyError
from model_registry.registry_entities import is_not_found, mlflow_error_code, now_iso, translate_mlflow_error

#: Seconds a promotion waits for another promotion of the same model before failing.
DEFAULT_LOCK_TIMEOUT_S = 60.0
#: Seconds between two attempts to take a busy lock.
LOCK_POLL_INTERVAL_S = 0.1
#: Name prefix of the registered models :class:`RegistryLock` uses as lock-table rows.
LOCK_MODEL_PREFIX = "tritonflow-lock."


class PromotionLock(Protocol):
    """Serialises registry changes (promotion, rollback, deletion) of one registered model."""

    def hold(self, name: str, timeout_s: float) -> contextlib.AbstractContextManager[None]:
        """Context manager holding the lock of model ``name``.

        Raises:
            ConcurrencyError: Not acquired within ``timeout_s`` seconds; names the holder.
        """
        ...


def _holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class DatabaseLock:
    """Lease of purpose ``alias`` in the shared coordination database (the default lock).

    Serialises alias moves of one model across processes and hosts (PostgreSQL in production); a
    crashed holder's lease expires after ``lease_ttl_s`` (see :mod:`ground.coordination`).
    Distinct from the ``promotion`` lease a canary holds around the whole promotion, so a canary
    may promote inside it.

    Args:
        store: A ``CoordinationStore``, its URL, or ``None`` for the one the settings name.
    """

    PURPOSE = "alias"

    def __init__(self, store: Any = None) -> None:
        self._store = store

    def store(self) -> Any:
        """The coordination store used."""
        from ground.coordination import CoordinationStore, coordination_store

        if self._store is None:
            self._store = coordination_store()
        elif not isinstance(self._store, CoordinationStore):
            self._store = CoordinationStore(str(self._store))
        return self._store

    @contextlib.contextmanager
    def hold(self, name: str, timeout_s: float) -> Iterator[None]:
        """Hold the lock of ``name``; see :meth:`PromotionLock.hold`."""
        with self.store().hold(self.PURPOSE, name, holder=_holder_id(), timeout_s=timeout_s,
                               what=f"alias move (promotion) of model {name!r}"):
            yield


class RegistryLock:
    """Lock-table lock kept in the MLflow registry itself (see the module docstring).

    Taking the lock creates registered model ``tritonflow-lock.<name>``; MLflow refuses a second
    creation with ``RESOURCE_ALREADY_EXISTS`` (unique key), which makes it an atomic test-and-set
    shared by every worker that reaches the tracking server. Releasing deletes it.

    Args:
        client: An ``mlflow.MlflowClient``.
    """

    def __init__(self, client: Any) -> None:
        self.client = client

    @staticmethod
    def lock_name(name: str) -> str:
        """Registered-model name used as the lock row of model ``name``."""
        return LOCK_MODEL_PREFIX + name

    def _holder(self, name: str) -> str:
        try:
            rm = self.client.get_registered_model(self.lock_name(name))
        except Exception:
            return "unknown (lock released meanwhile)"
        tags = dict(rm.tags or {})
        return f"{tags.get('tritonflow.lock.holder', 'unknown')} since {tags.get('tritonflow.lock.since', '?')}"

    @contextlib.contextmanager
    def hold(self, name: str, timeout_s: float) -> Iterator[None]:
        """Hold the lock of ``name``; see :meth:`PromotionLock.hold`."""
        lock = self.lock_name(name)
        holder = _holder_id()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.create_registered_model(
                    lock,
                    tags={"tritonflow.lock.holder": holder, "tritonflow.lock.since": now_iso()},
                    description=f"tritonflow promotion lock of {name!r}; deleted on release.",
                )
                break
            except Exception as exc:  # noqa: BLE001 - classify below
                if mlflow_error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise translate_mlflow_error(exc, f"taking promotion lock {lock!r}") from exc
                if time.monotonic() >= deadline:
                    raise ConcurrencyError(
                        f"model {name!r}: another promotion holds registry lock {lock!r} "
                        f"({self._holder(name)}); waited {timeout_s:.1f} s. If that holder "
                        f"crashed, release it with RegistryLock.force_release({name!r})"
                    ) from None
                time.sleep(LOCK_POLL_INTERVAL_S)
        try:
            yield
        finally:
            try:
                self.client.delete_registered_model(lock)
            except Exception as exc:  # noqa: BLE001
                raise translate_mlflow_error(exc, f"releasing promotion lock {lock!r}") from exc

    def force_release(self, name: str) -> bool:
        """Delete a stale lock of ``name`` (operator action). Returns True if one existed."""
        try:
            self.client.delete_registered_model(self.lock_name(name))
            return True
        except Exception as exc:  # noqa: BLE001
            if is_not_found(exc):
                return False
            raise translate_mlflow_error(exc, f"releasing promotion lock of {name!r}") from exc
