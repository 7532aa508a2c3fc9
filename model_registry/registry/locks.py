"""Locks that serialise registry changes (promotion, rollback, deletion) of one registered model.

:class:`DatabaseLock` is a lease in the shared coordination database (:mod:`ground.coordination`),
like every other lock that guards what serves, so promotions of one model are serialised across
processes and hosts.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from typing import Any, Iterator, Protocol

#: Seconds a promotion waits for another promotion of the same model before failing.
DEFAULT_LOCK_TIMEOUT_S = 60.0
#: Seconds between two attempts to take a busy lock.
LOCK_POLL_INTERVAL_S = 0.1


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


