"""DAG ``registry_events``: MLflow registry changes -> the DAGs they start (watcher path).

Wiring only. The registry diff, restart-safe dedup and the trigger are
:mod:`tritonflow_plugin.registry_watcher`; the mapping is :mod:`tritonflow_plugin.event_mapping`.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import Param, get_current_context

from tritonflow_plugin import params as form
from tritonflow_plugin.dag_defaults import TIMEOUTS
from tritonflow_plugin.event_mapping import CHANGE_KINDS
from tritonflow_plugin.registry_watcher import BATCH_KEY, registry_asset
from tritonflow_plugin.wiring import data_task, fire_and_forget_mapped, tritonflow_dag

DAG_ID = "registry_events"
#: Watcher mapping that routes *every* registry change to this DAG, so the watcher's seen-state
#: (consumer ``registry_events``) records each transition once and this DAG applies the real
#: mapping itself. A data file beside this one (not a DAG file).
WATCH_ALL_MAPPING = Path(__file__).with_name("registry_events_watch_all.json")

DESCRIPTION = "Start the DAGs a change in the MLflow model registry calls for (new version, alias, tag, stage)."

DOC_MD = """
### Registry events

Turns changes in the MLflow model registry into runs of the other DAGs, following one mapping
(`TRITONFLOW_EVENT_MAPPING_PATH`). By default:

| Change in MLflow | Starts |
|---|---|
| new version, or alias `challenger` set | `model_publish`, then `shadow_evaluation` |
| alias `champion` set, or stage `Production` | `canary_promotion` |
| alias `champion` moved by hand (not by a promotion) | put back; `model_publish`, then `canary_promotion` |
| stage `Archived`, or an alias removed | `canary_rollback` |

It runs by itself: Airflow's triggerer polls the registry and each change starts its DAGs once,
even across restarts: a change whose DAGs this DAG has not started within
`TRITONFLOW_REGISTRY_RESEND_AFTER_S` (Airflow can hold an event back while the scheduler is down
or busy) is sent again, and a change already started is left out. When MLflow sends webhooks
those changes start the DAGs directly; this DAG then starts only what the webhook missed (stage
transitions, lost deliveries): both record each change once in the shared database, so nothing
starts twice.
The DAGs it starts run on their own (it does not wait for them).

**Delivery status.** `GET /tritonflow/webhooks/status` on the Airflow api-server (your Airflow
login; any user who may see this DAG's runs) shows the last webhook deliveries (received,
duplicate, started), the changes acted on and the reconciler's findings: the changes it saw
before any webhook did, and when each consumer last polled. The **Registry deliveries** button of
each run's `map_changes` task opens it; the task's log starts with the same summary.

**To replay a change by hand** (for example one missed while the triggerer was down), fill in
**Model**, the **Kind of change** and the version, alias or stage it concerns, then click
*Trigger*. Tick **Dry run** to only log which DAGs would start.
"""

PARAMS = {
    "model_name": form.text("Model", "Replay: registered MLflow model the change is about. Empty: only act "
                            "on the registry changes that started this run.",
                            max_length=256),
    "kind": form.choice("Kind of change", "Replay: what changed in the registry.", list(CHANGE_KINDS),
                        default="stage_changed",
                        labels={"version_created": "New version", "alias_set": "Alias set",
                                "alias_deleted": "Alias removed", "tag_set": "Tag set",
                                "stage_changed": "Stage changed"}),
    "model_version": form.text("Version", "Replay: the version number concerned (empty for an alias removal).",
                               rule=form.VERSION_NUMBER, max_length=16),
    "alias": form.text("Alias", "Replay: the alias set or removed.", rule=form.ALIAS_NAME, max_length=128),
    "stage": form.optional_choice("Stage", "Replay: the version's new legacy stage (stage changes only).",
                                  form.LEGACY_STAGES),
    "dry_run": Param(False, type="boolean", title="Dry run",
                     description="Only log the DAGs that would start."),
}


def _run_id(dag_id: str, change: dict, stamp: str) -> str:
    """Deterministic, allowed run id (``^[A-Za-z0-9_.~:+-]+$``) for one change and target.

    A change decided in the change ledger gets its change's run id, the one the webhook receiver
    gives it too (one run whichever path started it).
    """
    import hashlib
    import json

    from tritonflow_plugin.change_ledger import change_run_id

    if change.get("change_key"):
        return change_run_id(str(change["change_key"]), dag_id, str(change.get("kind", "change")))
    digest = hashlib.sha256(json.dumps([dag_id, change, stamp], sort_keys=True, default=str)
                            .encode()).hexdigest()[:16]
    return f"registry__{change.get('kind', 'change')}__{digest}"


def _log_delivery_status(ledger, log) -> None:
    """Log the receiver's last deliveries and the reconciler's findings (the status endpoint's view)."""
    from tritonflow_plugin.webhook import delivery_status

    try:
        status = delivery_status(ledger, limit=10)
    except Exception as exc:  # a summary for the log: never the reason a run fails
        log.warning("delivery status not available: %s", exc)
        return
    log.info("webhook deliveries: %s stored; last: %s", status["deliveries"]["total"],
             [(d["event"], d["outcome"] or d["status"], d["change_key"]) for d in status["deliveries"]["last"]])
    log.info("reconciler: last polls %s; changes it found first: %s; decided but not started: %s",
             status["reconciler"]["polled_at"], [c["change_key"] for c in status["reconciler"]["found"]],
             status["reconciler"]["unstarted"])


def _to_start(found: list[tuple[dict, str]], ledger) -> list[tuple[dict, str]]:
    """The changes of ``found`` whose runs may not exist yet, each once.

    A change the reconciler sent again (its first event was left for a later run) can reach a run
    twice, or after an earlier run (or the webhook) started it; both are left out.
    """
    from tritonflow_plugin.change_ledger import STARTED

    seen: set[str] = set()
    out = []
    for raw, stamp in found:
        key = str(raw.get("change_key") or "")  # "": a replay typed in the form
        if key and (key in seen or (ledger.change(key) or {}).get("status") == STARTED):
            continue
        seen.add(key)
        out.append((raw, stamp))
    return out


def _confirm(fired: list[dict], ledger) -> None:
    """Mark the changes of ``fired`` started with their run ids: the reconciler stops sending them."""
    from tritonflow_plugin.registry_watcher import change_key_of

    runs: dict[str, list[str]] = {}
    for item in fired:
        key = change_key_of(item["conf"])
        if key:
            runs.setdefault(key, []).append(item["trigger_run_id"])
    for key, run_ids in runs.items():
        ledger.mark_started(key, run_ids)


def _prune_ledger(ledger, log) -> None:
    """Drop started changes and finished deliveries past TRITONFLOW_REGISTRY_LEDGER_RETENTION_DAYS.

    Never sooner than twice the webhook timestamp tolerance, so a replayed delivery is refused by its
    timestamp before its id could have been forgotten.
    """
    from ground.settings import get_settings

    s = get_settings()
    days = s.registry_ledger_retention_days
    pruned = ledger.prune(max(days * 86400.0, 2.0 * s.webhook_tolerance_s))
    if any(pruned.values()):
        log.info("change ledger: %s older than %g days pruned", pruned, days)


# batch=True: one asset event per poll holding every change it found (several events written at
# once would be split across runs, the last ones waiting for the next change; see the trigger).
# await_confirmation=True: a change is started once `confirm` ran, else the watcher sends it again.
@tritonflow_dag(DAG_ID, schedule=registry_asset(DAG_ID, watch=True, mapping_path=str(WATCH_ALL_MAPPING),
                                                batch=True, await_confirmation=True),
                topics=["registry"], description=DESCRIPTION, doc_md=DOC_MD, params=PARAMS)
def registry_events():
    """Map MLflow registry changes to the DAGs they call for and trigger them."""
    @data_task(links=True, execution_timeout=TIMEOUTS.event_mapping, retries=0)
    def map_changes(params=None) -> list[dict]:
        """Registry changes of this run -> ``[{trigger_dag_id, trigger_run_id, conf}]``."""
        import logging

        from airflow.sdk import conf

        from ground.exceptions import DataError
        from tritonflow_plugin.champion_guard import ChampionGuard
        from tritonflow_plugin.change_ledger import ChangeLedger
        from tritonflow_plugin.event_mapping import RegistryChange, actions_for, load_mapping
        from tritonflow_plugin.links import delivery_status_url, record_link_info

        log = logging.getLogger("tritonflow.registry_events")
        context = get_current_context()
        form.refuse_unknown_conf_keys(context)
        p = params or {}
        found: list[tuple[dict, str]] = []
        if p.get("model_name"):
            change = {"kind": p["kind"], "model": p["model_name"],
                      "version": p.get("model_version") or None, "alias": p.get("alias") or None,
                      "stage": p.get("stage") or None, "source": "manual"}
            found.append((change, context["run_id"]))
        events = context.get("triggering_asset_events") or {}
        for _asset, evs in events.items():
            for ev in evs:
                extra = dict(getattr(ev, "extra", None) or {})
                payload = extra.get("payload", extra)
                items = payload.get(BATCH_KEY) if isinstance(payload, dict) else None
                for item in items if isinstance(items, list) else [payload]:
                    if isinstance(item, dict) and isinstance(item.get("registry_event"), dict):
                        found.append((item["registry_event"], str(getattr(ev, "timestamp", ""))))
        # the "Registry deliveries" button: the receiver's status page on this api-server
        record_link_info(delivery_status_url=delivery_status_url(conf.get("api", "base_url", fallback="") or ""))
        rules, guard, ledger = load_mapping(), ChampionGuard(), ChangeLedger()
        _log_delivery_status(ledger, log)
        _prune_ledger(ledger, log)
        fired = []
        for raw, stamp in _to_start(found, ledger):
            try:
                change = RegistryChange(**raw)
            except TypeError as exc:
                raise DataError(f"registry_event={raw!r} is invalid ({exc}): expected the fields of "
                                "RegistryChange") from None
            # an out-of-band champion move goes through the gates (not on a dry run: that changes nothing)
            mapped = actions_for(change, rules) if p.get("dry_run") else guard.actions(change, rules, ledger)
            if not mapped and change.change_key and not p.get("dry_run"):  # nothing to start: done
                ledger.mark_started(change.change_key, [])
            for action in mapped:
                fired.append({"trigger_dag_id": action.dag_id,
                              "trigger_run_id": _run_id(action.dag_id, raw, stamp),
                              "conf": action.conf})
        log.info("registry changes %s -> %s", [c for c, _ in found],
                 [(f["trigger_dag_id"], f["trigger_run_id"]) for f in fired])
        return [] if p.get("dry_run") else fired

    @data_task(execution_timeout=TIMEOUTS.event_mapping, trigger_rule="none_failed")
    def confirm(fired: list[dict]) -> None:
        """Mark the changes whose runs ``fire`` created (or found) started (not when a ``fire`` failed)."""
        from tritonflow_plugin.change_ledger import ChangeLedger

        _confirm(fired, ChangeLedger())

    fired = map_changes()
    fire_and_forget_mapped(
        "fire", skip_when_already_exists=True, openlineage_inject_parent_info=False,
        execution_timeout=TIMEOUTS.event_fire, retries=1,
    ).expand_kwargs(fired) >> confirm(fired)


registry_events()
