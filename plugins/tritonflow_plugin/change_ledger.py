"""The registry changes tritonflow acted on, and the webhook deliveries it stored, in the shared DB.

Both paths that see a registry change -- the MLflow webhook receiver (:mod:`.webhook`) and the
registry watcher, which is the reconciler (:mod:`.registry_watcher`) -- decide to act through
:meth:`ChangeLedger.record`, so every change yields one DAG run whichever path saw it first.

**The change key.** A registry change moves one *slot* to a new value:

==================  ==========================================  ====================
change kind         slot                                        value
==================  ==========================================  ====================
``version_created`` ``(model, "version", version@created)``     ``"created"``
``alias_set``       ``(model, "alias", alias)``                 ``version@created``
``alias_deleted``   ``(model, "alias", alias)``                 none
``stage_changed``   ``(model, "stage", version@created)``       the stage
``tag_set``         ``(model, "tag", version@created, key)``    the tag's value
==================  ==========================================  ====================

``version@created`` is the version number and its ``creation_timestamp`` (Unix ms,
:attr:`~tritonflow_plugin.event_mapping.RegistryChange.version_ref`): a registered model deleted
and registered again numbers its versions from 1 again, and its version 1 is another object than
the old version 1, whose changes tritonflow acted on. Both paths read the creation time from
MLflow (the receiver with one ``get_model_version`` per delivery, since MLflow's payloads do not
carry it; the reconciler from the versions it lists), so both give a change the same slot.

tritonflow keeps, per slot, the value it last acted on and a **move sequence** (1 for the first
change it acted on, +1 for each later one). The change key (:func:`change_key`) is
``model|kind|version@created|alias, stage or tag|move sequence``. Why the sequence, and why tritonflow's:
``champion`` moved 1 -> 2 -> 1 is three changes, and the last is the same
``(model, alias_set, 1, champion)`` as the first; MLflow's alias payload carries no timestamp and the
version's ``last_updated_timestamp`` does not move when an alias does, so no registry fact tells
them apart -- the sequence tritonflow records does. Both paths see the same sequence: the first to
see a slot's new value increments it in the same transaction that decides to act (the slot's row
locked: ``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR UPDATE`` on PostgreSQL), the second finds
the slot already at that value and gets the same key back (a duplicate). The same key gives the
same DAG run id (:func:`change_run_id`), so even two paths that both start the runs of one change
(one after the other's failure) find one run.

What this cannot see: a value the registry held only between two observations (an alias moved
away and back before the webhook arrived and between two polls, with the webhook lost) is one
change, not three -- there is nothing left in the registry to reconcile. Re-setting a slot to the
value it already has (a tag set again to the same value) is no change.

**Previous holder.** :meth:`ChangeLedger.record` returns the slot's value before the move from this
record (``previous_version`` of an alias move): the version ``champion`` replaced, as tritonflow
acted on it, never a payload's claim.

**Deliveries.** A webhook delivery is stored (:meth:`ChangeLedger.store_delivery`: id, body, time)
before the receiver acknowledges; it is ``done`` once its change's runs exist. A delivery id seen
``done`` again is a replay (409); one not ``done`` (the receiver failed after storing) is processed
again on MLflow's retry. A change recorded but whose runs were never started (``claimed``) is
sent by the reconciler (:meth:`ChangeLedger.unstarted`) at its next poll, and again each time
``TRITONFLOW_REGISTRY_RESEND_AFTER_S`` has passed since it last sent it (:meth:`ChangeLedger.mark_sent`).
A change is ``started`` when the path that started its runs says so -- the receiver after
creating them, ``registry_events`` after its ``fire`` task did -- not when the reconciler's asset
event reached Airflow, which may leave that event for a later run (see :mod:`.registry_watcher`).

Tables: ``tritonflow_state`` of :mod:`ground.coordination`, scopes :data:`SLOTS`, :data:`CHANGES`,
:data:`DELIVERIES`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Iterable

import sqlalchemy as sa

from ground.coordination import CoordinationStore, coordination_store, state
from tritonflow.registry_events import ALIAS_DELETED, ALIAS_SET, STAGE_CHANGED, TAG_SET, VERSION_CREATED
from tritonflow_plugin.event_mapping import RegistryChange, split_version_ref

#: State scopes: the last value acted on per slot, each change acted on, webhook deliveries.
SLOTS, CHANGES, DELIVERIES = "registry-slot", "registry-change", "webhook-delivery"
#: Change status: decided (runs not yet known to exist) / its runs exist.
CLAIMED, STARTED = "claimed", "started"


def slot_of(change: RegistryChange) -> tuple[str, str | None]:
    """``(slot key, new value)`` of a change (see the module docstring)."""
    m, ref = change.model, change.version_ref
    if change.kind in (ALIAS_SET, ALIAS_DELETED):
        return f"{m}|alias|{change.alias}", (ref if change.kind == ALIAS_SET else None)
    if change.kind == STAGE_CHANGED:
        return f"{m}|stage|{ref}", change.stage
    if change.kind == TAG_SET:
        return f"{m}|tag|{ref}|{change.tag_key}", change.tag_value
    if change.kind == VERSION_CREATED:
        return f"{m}|version|{ref}", "created"
    raise ValueError(f"kind={change.kind!r}: expected a registry change kind")


def change_key(change: RegistryChange, seq: int) -> str:
    """The key of ``change`` as its slot's ``seq``-th move: ``model|kind|version@created|detail|seq``."""
    return "|".join([change.model, change.kind, change.version_ref, change.detail, str(seq)])


def _previous(change: RegistryChange, held_value: str | None) -> str | None:
    """What the slot held before, as a change reports it: an alias's version number, else the value."""
    if held_value and change.kind in (ALIAS_SET, ALIAS_DELETED):
        return split_version_ref(held_value)[0]
    return held_value


def change_run_id(change_key: str, dag_id: str, kind: str) -> str:
    """The one DAG run id of ``dag_id`` for a change (allowed characters ``[A-Za-z0-9_.~:+-]``)."""
    digest = hashlib.sha256(f"{dag_id}\n{change_key}".encode()).hexdigest()[:20]
    return f"registry__{kind}__{digest}"


@dataclasses.dataclass(frozen=True)
class Recorded:
    """The outcome of :meth:`ChangeLedger.record`.

    Attributes:
        key: The change key.
        new: This call decided the change (``False``: another path or an earlier delivery did).
        status: :data:`CLAIMED` or :data:`STARTED`.
        previous: The slot's value tritonflow acted on before this change (an alias: the version
            it replaced), ``None`` when none.
        change: The change as recorded, with ``change_key`` and ``previous_version`` set.
    """

    key: str
    new: bool
    status: str
    previous: str | None
    change: RegistryChange


class ChangeLedger:
    """Registry changes acted on and webhook deliveries, in the shared coordination database.

    Args:
        store: A :class:`CoordinationStore`, a SQLAlchemy URL or a SQLite file path (default: the
            shared store of the settings, :func:`ground.coordination.coordination_store`).
    """

    def __init__(self, store: CoordinationStore | str | Path | None = None) -> None:
        if store is None:
            store = coordination_store()
        elif not isinstance(store, CoordinationStore):
            text = str(store)
            store = CoordinationStore(text if "://" in text else f"sqlite:///{Path(text).resolve()}")
        self.store = store

    # ------------------------------------------------------------------ changes
    def record(self, change: RegistryChange, *, delivery_id: str | None = None) -> Recorded:
        """Decide whether ``change`` is new, in one transaction holding its slot locked."""
        slot, value = slot_of(change)
        with self.store.locked_state(SLOTS, slot) as (conn, held):
            held = held or {}
            if held and held.get("value") == value:
                entry = self.store.get_state(CHANGES, held["key"]) or {}
                return Recorded(held["key"], False, entry.get("status", STARTED), entry.get("previous"),
                                RegistryChange(**entry["change"]) if entry.get("change") else change)
            seq = int(held.get("seq", 0)) + 1
            previous = _previous(change, held.get("value"))
            key = change_key(change, seq)
            recorded = dataclasses.replace(change, change_key=key, previous_version=previous)
            self.store.set_state(SLOTS, slot, {"value": value, "seq": seq, "key": key}, conn=conn)
            self.store.set_state(CHANGES, key, {"change": recorded.to_dict(), "previous": previous,
                                                "status": CLAIMED, "delivery_id": delivery_id,
                                                "at": time.time()}, conn=conn)
        return Recorded(key, True, CLAIMED, previous, recorded)

    def mark_started(self, key: str, runs: list[str]) -> None:
        """The runs of change ``key`` exist (no path needs to start them again).

        Args:
            key: The change key.
            runs: The run ids started (or found) for it, added to those recorded before.
        """
        with self.store.locked_state(CHANGES, key) as (conn, entry):
            entry = entry or {}
            known = list(entry.get("runs") or [])
            self.store.set_state(CHANGES, key, {**entry, "status": STARTED,
                                                "runs": known + [r for r in runs if r not in known],
                                                "started_at": time.time()}, conn=conn)

    def mark_sent(self, keys: Iterable[str], now: float | None = None) -> None:
        """The reconciler handed changes ``keys`` to Airflow at ``now`` (Unix s; default: the current time).

        Their runs are not known to exist yet: :meth:`unstarted` returns a change again once
        ``resend_after_s`` has passed since this send. A change already started is left as it is.
        """
        now = time.time() if now is None else now
        for key in keys:
            with self.store.locked_state(CHANGES, key) as (conn, entry):
                if entry and entry.get("status") == CLAIMED:
                    self.store.set_state(CHANGES, key, {**entry, "sent_at": now}, conn=conn)

    def change(self, key: str) -> dict[str, Any] | None:
        """The stored record of change ``key``."""
        return self.store.get_state(CHANGES, key)

    def unstarted(self, resend_after_s: float, now: float | None = None) -> list[RegistryChange]:
        """Changes whose runs were never confirmed, and that the reconciler may send (again) now.

        A change the reconciler never sent (the receiver failed after deciding it, or a trigger
        stopped before it recorded the send) is returned at once; one it sent (:meth:`mark_sent`)
        once ``resend_after_s`` has passed since.

        Args:
            resend_after_s: Seconds after a send before the change is returned again (0: always).
            now: Unix seconds (default: the current time).
        """
        now = time.time() if now is None else now
        out = []
        with self.store.engine.connect() as conn:
            rows = conn.execute(sa.select(state.c.value).where(state.c.scope == CHANGES)).scalars()
            for raw in rows:
                entry = json.loads(raw)
                sent = entry.get("sent_at")
                if entry.get("status") == CLAIMED and (sent is None or sent <= now - resend_after_s):
                    out.append(RegistryChange(**entry["change"]))
        return out

    # ------------------------------------------------------------------ deliveries
    def store_delivery(self, delivery_id: str, body: str, now: float | None = None) -> str | None:
        """Store a delivery; its earlier status when it was stored before (``None``: first time)."""
        now = time.time() if now is None else now
        with self.store.locked_state(DELIVERIES, delivery_id) as (conn, entry):
            if entry:
                return str(entry.get("status"))
            self.store.set_state(DELIVERIES, delivery_id, {"body": body, "received_at": now,
                                                           "status": "received"}, conn=conn)
        return None

    def finish_delivery(self, delivery_id: str, status: str, change_key: str | None = None,
                        outcome: str | None = None) -> None:
        """Set a stored delivery's status (``done``: its change's runs exist or it maps to none).

        ``outcome`` says what it came to: ``started``, ``duplicate`` (another path or delivery had
        acted on its change), ``gone`` (its version no longer exists) or ``ignored`` (an event
        tritonflow does not map).
        """
        with self.store.locked_state(DELIVERIES, delivery_id) as (conn, entry):
            self.store.set_state(DELIVERIES, delivery_id, {**(entry or {}), "status": status,
                                                           "change_key": change_key, "outcome": outcome},
                                 conn=conn)

    def delivery(self, delivery_id: str) -> dict[str, Any] | None:
        """The stored delivery (``body``, ``received_at``, ``status``, ``change_key``, ``outcome``)."""
        return self.store.get_state(DELIVERIES, delivery_id)

    # ------------------------------------------------------------------ retention
    def prune(self, retain_s: float, now: float | None = None) -> dict[str, int]:
        """Delete what no path needs any more: started changes and finished deliveries older than ``retain_s``.

        A change still ``claimed`` (its runs not known to exist) and a delivery not ``done`` are kept
        whatever their age, since the reconciler or MLflow's retry may still need them; so is every
        slot, whose move sequence numbers the slot's next change. A delivery older than the
        receiver's timestamp tolerance is refused before its id is looked up, so dropping its id
        cannot admit a replay while ``retain_s`` exceeds that tolerance.

        Args:
            retain_s: Seconds an entry is kept after it was last written (> 0).
            now: Unix seconds (default: the current time).

        Returns:
            ``{"changes": n, "deliveries": n}``: how many entries were deleted.

        Raises:
            ValueError: ``retain_s`` is not a positive number.
        """
        if not retain_s > 0:
            raise ValueError(f"retain_s={retain_s!r}; expected a positive number of seconds")
        cutoff = (time.time() if now is None else now) - retain_s
        done = {CHANGES: STARTED, DELIVERIES: "done"}
        deleted = {"changes": 0, "deliveries": 0}
        with self.store.engine.begin() as conn:
            for scope, status in done.items():
                old = conn.execute(sa.select(state.c.key, state.c.value).where(
                    state.c.scope == scope, state.c.updated_at < cutoff)).all()
                keys = [k for k, v in old if json.loads(v).get("status") == status]
                for chunk in (keys[i:i + 500] for i in range(0, len(keys), 500)):
                    conn.execute(sa.delete(state).where(state.c.scope == scope, state.c.key.in_(chunk)))
                deleted["changes" if scope == CHANGES else "deliveries"] = len(keys)
        return deleted

    # ------------------------------------------------------------------ status
    def latest(self, scope: str, limit: int) -> list[tuple[str, dict[str, Any], float]]:
        """The ``limit`` entries of ``scope`` written last: ``(key, value, updated_at)``, newest first."""
        query = (sa.select(state.c.key, state.c.value, state.c.updated_at).where(state.c.scope == scope)
                 .order_by(state.c.updated_at.desc()).limit(int(limit)))
        with self.store.engine.connect() as conn:
            return [(k, json.loads(v), float(t)) for k, v, t in conn.execute(query)]

    def count(self, scope: str) -> int:
        """How many entries ``scope`` holds."""
        query = sa.select(sa.func.count()).select_from(state).where(state.c.scope == scope)
        with self.store.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())
