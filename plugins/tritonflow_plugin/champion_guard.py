"""``@champion`` moves only through the gates: a move tritonflow did not make is put back.

Open-source MLflow cannot restrict who moves an alias, so anyone with edit rights on a model can
move ``champion`` and change what the registry says serves. Both paths that see registry changes
-- the webhook receiver (:mod:`.webhook`) and the ``registry_events`` DAG fed by the reconciler
(:mod:`.registry_watcher`) -- map an ``alias_set`` of ``champion`` through
:meth:`ChampionGuard.actions` instead of the plain mapping.

**Whose move.** tritonflow records its own moves in the model's promotion audit trail
(:meth:`model_registry.registry.RegistryClient.audit_log`): every promotion and rollback writes a
``pending`` record naming the version it moves ``champion`` to *before* it moves the alias, then
its outcome and the resulting champion. :func:`champion_of_record` reads the champion tritonflow
made last (the version that serves) and the versions a promotion or rollback still in progress
may set. A ``champion`` move to any other version is out of band. A model tritonflow never
promoted has no champion of record: its first ``champion`` is taken as set (the plain mapping).

**What happens to an out-of-band move** (setting ``TRITONFLOW_CHAMPION_MOVE_POLICY``):

* ``request`` (default): the alias is put back on the version of record, and the new holder goes
  through ``model_publish`` and then ``canary_promotion`` (:data:`REQUEST_DAGS`), which moves the
  alias itself if every step passes;
* ``refuse``: the alias is put back, the alert is sent (``TRITONFLOW_ALERT_WEBHOOK_URL``, and the
  log), nothing starts.

Either way both versions get tags (:data:`MOVE_TAG`, :data:`RESTORED_TAG` and their ``_at``/
``_serving``/``_from`` companions) saying what happened, and the put-back is recorded in the
change ledger as tritonflow's own change before the alias moves, so the event it causes starts
nothing. The put-back holds the model's alias lock and re-reads the record under it, so it never
undoes a promotion that finished meanwhile.

**One answer per move.** The webhook and the reconciler may both see one hand move (the change
ledger compares with the last value acted on, and the put-back is a newer one). The decision is
taken under the lock against the registry as it is: a move the alias no longer shows (put back by
the other path, or undone by hand) needs nothing, so a move is put back and requested once. Such a
late event has moved the ledger's slot to the version it reports; when the alias is back on the
version of record, that is recorded again as tritonflow's own change, so the put-back's event,
arriving after it, starts nothing either.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

from ground.exceptions import SettingsError
from tritonflow.registry_events import ALIAS_SET
from tritonflow_plugin.change_ledger import ChangeLedger
from tritonflow_plugin.event_mapping import Action, RegistryChange, Rule, actions_for, parse_rules

log = logging.getLogger(__name__)

CHAMPION = "champion"
#: Values of ``TRITONFLOW_CHAMPION_MOVE_POLICY``.
REQUEST, REFUSE = "request", "refuse"
POLICIES = (REQUEST, REFUSE)
#: The path an out-of-band ``champion`` holder takes under ``request``.
REQUEST_DAGS = ("model_publish", "canary_promotion")
REQUEST_RULES: tuple[Rule, ...] = parse_rules([{"on": ALIAS_SET, "alias": CHAMPION, "dags": list(REQUEST_DAGS)}],
                                              source="champion request")
#: Tag on the out-of-band holder: ``requested`` (it goes through the gates) or ``refused``.
MOVE_TAG = "tritonflow.champion_move"
#: Tag on the version of record: the version ``champion`` was moved to and taken back from.
RESTORED_TAG = "tritonflow.champion_restored_from"
#: Outcomes of an attempt that may have moved the alias (in progress, or failed after moving it).
_MAY_HAVE_MOVED = ("pending", "failed")
_DONE = ("promoted", "unchanged", "rolled_back")


@dataclasses.dataclass(frozen=True)
class Record:
    """The ``champion`` tritonflow made last, and the versions a move in progress may set.

    Attributes:
        champion: The version tritonflow's last finished promotion or rollback left as champion
            (``None``: tritonflow never moved it).
        in_flight: Versions a newer promotion or rollback, not finished, may have set.
    """

    champion: int | None
    in_flight: frozenset[int]

    def owns(self, version: int) -> bool:
        """Whether a ``champion`` move to ``version`` is tritonflow's (or needs no gate)."""
        return self.champion is None or version == self.champion or version in self.in_flight


def champion_of_record(audit: Iterable[Any]) -> Record:
    """Read :class:`Record` from a promotion audit trail (oldest first, as ``audit_log`` returns it).

    A pending or failed rollback names no version before it ends; it may set the version the last
    finished promotion kept as ``previous_champion``, so that one counts as in flight.
    """
    in_flight: set[int] = set()
    rollback_open = False
    for entry in reversed(list(audit)):
        rec: Mapping[str, Any] = entry.record
        if entry.action not in ("promote", "rollback"):
            continue
        if entry.outcome in _DONE and rec.get("champion") is not None:
            if rollback_open and rec.get("previous_champion") is not None:
                in_flight.add(int(rec["previous_champion"]))
            return Record(int(rec["champion"]), frozenset(in_flight))
        if entry.outcome in _MAY_HAVE_MOVED:
            if rec.get("requested_version") is not None:
                in_flight.add(int(rec["requested_version"]))
            elif entry.action == "rollback":
                rollback_open = True
    return Record(None, frozenset(in_flight))


def check_policy(value: str) -> str:
    """Validate a ``TRITONFLOW_CHAMPION_MOVE_POLICY`` value.

    Raises:
        SettingsError: naming the value and the accepted ones.
    """
    if value not in POLICIES:
        raise SettingsError(f"TRITONFLOW_CHAMPION_MOVE_POLICY={value!r} is invalid: expected one of {POLICIES}")
    return value


def alert(message: Mapping[str, Any]) -> None:
    """Log ``message["text"]`` as an error and POST ``message`` to ``TRITONFLOW_ALERT_WEBHOOK_URL`` if set."""
    from ground.settings import get_settings
    from tritonflow_plugin.notifications import post_json

    log.error("%s", message["text"])
    settings = get_settings()
    if settings.alert_webhook_url:
        try:
            post_json(settings.alert_webhook_url, message, settings.alert_timeout_s)
        except Exception as exc:  # the alert must not stop the put-back being recorded
            log.error("alert to %s failed: %s", settings.alert_webhook_url, exc)


class ChampionGuard:
    """Map registry changes, sending out-of-band ``champion`` moves through the gates.

    Args:
        tracking_uri: MLflow URI (default ``Settings.resolved_mlflow_tracking_uri``).
        policy: :data:`REQUEST` or :data:`REFUSE` (default ``Settings.champion_move_policy``).
        notify: Called with the alert message of a refused move (default :func:`alert`).
        registry: A :class:`model_registry.registry.RegistryClient` (default: one on ``tracking_uri``
            whose alias lock is in the ledger's database).
    """

    def __init__(self, tracking_uri: str | None = None, policy: str | None = None,
                 notify: Callable[[dict[str, Any]], None] | None = None, registry: Any = None) -> None:
        self.tracking_uri = tracking_uri
        self.policy = check_policy(policy) if policy is not None else None
        self.notify = notify or alert
        self.registry = registry

    def _registry(self, ledger: ChangeLedger) -> Any:
        if self.registry is None:
            from model_registry.registry import DatabaseLock, RegistryClient

            uri = self.tracking_uri
            if uri is None:
                from ground.settings import get_settings

                uri = get_settings().resolved_mlflow_tracking_uri
            self.registry = RegistryClient(uri, uri, lock=DatabaseLock(ledger.store), actor="champion-guard")
        return self.registry

    def _policy(self) -> str:
        if self.policy is None:
            from ground.settings import get_settings

            return check_policy(get_settings().champion_move_policy)
        return self.policy

    def actions(self, change: RegistryChange, rules: Sequence[Rule], ledger: ChangeLedger) -> list[Action]:
        """The actions of ``change``: the mapping's, or the gates' for an out-of-band ``champion`` move."""
        if change.kind != ALIAS_SET or change.alias != CHAMPION or not (change.version or "").isdigit():
            return actions_for(change, rules)
        registry = self._registry(ledger)
        version = int(str(change.version))
        if champion_of_record(registry.audit_log(change.model)).owns(version):
            return actions_for(change, rules)
        with registry.lock.hold(change.model, registry.lock_timeout_s):
            record = champion_of_record(registry.audit_log(change.model))  # re-read under the lock
            if record.owns(version):
                return actions_for(change, rules)
            current = registry.aliases(change.model).get(CHAMPION)
            if current != version:  # already undone (put back by the other path, or moved again)
                if current == record.champion:  # this late event moved the ledger's slot: back to the holder
                    self._record_own(registry, change.model, current, ledger)
                log.info("alias 'champion' of %s no longer names version %s (names %s): nothing to do for %s",
                         change.model, version, current, change.change_key)
                return []
            serving = int(record.champion)  # type: ignore[arg-type]  # owns() is True when None
            self._put_back(change, serving, ledger)
        policy = self._policy()
        self._tag(change.model, version, serving, "requested" if policy == REQUEST else "refused")
        if policy == REFUSE:
            self.notify({"text": f"tritonflow: alias 'champion' of model {change.model!r} was moved to version "
                                 f"{version} outside a promotion; refused (put back on version {serving}, "
                                 "TRITONFLOW_CHAMPION_MOVE_POLICY=refuse)",
                         "model": change.model, "version": str(version), "serving": str(serving),
                         "change_key": change.change_key})
            return []
        log.warning("alias 'champion' of %s moved to version %s outside a promotion: put back on %s, "
                    "version %s goes through %s", change.model, version, serving, version, REQUEST_DAGS)
        return actions_for(change, REQUEST_RULES)

    @staticmethod
    def _record_own(registry: Any, model: str, version: int, ledger: ChangeLedger) -> None:
        """Record ``champion`` -> ``version`` as tritonflow's own change, started: its event starts nothing.

        The version is named with its creation time, as both paths name the change the move causes
        (:mod:`.change_ledger`).
        """
        created = registry.client.get_model_version(model, str(version)).creation_timestamp
        back = RegistryChange(kind=ALIAS_SET, model=model, version=str(version), alias=CHAMPION,
                              source="champion-guard", version_created_ms=int(created or 0))
        recorded = ledger.record(back)
        ledger.mark_started(recorded.key, [])

    def _put_back(self, change: RegistryChange, serving: int, ledger: ChangeLedger) -> None:
        """Record the put-back as tritonflow's own change, then move the alias."""
        self._record_own(self.registry, change.model, serving, ledger)
        self.registry.client.set_registered_model_alias(change.model, CHAMPION, str(serving))

    def _tag(self, model: str, version: int, serving: int, outcome: str) -> None:
        from model_registry.registry.entities import now_iso

        at = now_iso()
        client = self.registry.client
        for key, value in {MOVE_TAG: outcome, f"{MOVE_TAG}_at": at, f"{MOVE_TAG}_serving": str(serving)}.items():
            client.set_model_version_tag(model, str(version), key, value)
        for key, value in {RESTORED_TAG: str(version), "tritonflow.champion_restored_at": at}.items():
            client.set_model_version_tag(model, str(serving), key, value)
