"""DAG ``registry_events``: MLflow registry changes -> the DAGs they start (watcher path).

Wiring only. The registry diff, restart-safe dedup and the trigger are
:mod:`tritonflow_plugin.registry_watcher`; the mapping is :mod:`tritonflow_plugin.event_mapping`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, get_current_context, task

from tritonflow_plugin.dag_defaults import DEFAULT_ARGS, START_DATE, TAG
from tritonflow_plugin.errors import fail_fast_on_bad_data
from tritonflow_plugin.event_mapping import CHANGE_KINDS
from tritonflow_plugin.registry_watcher import registry_asset

DAG_ID = "registry_events"
#: Watcher mapping that routes *every* registry change to this DAG, so the watcher's seen-state
#: (consumer ``registry_events``) records each transition once and this DAG applies the real
#: mapping itself. A data file beside this one (not a DAG file).
WATCH_ALL_MAPPING = Path(__file__).with_name("registry_events_watch_all.json")
#: Change kinds the MLflow webhook delivers; with a webhook secret configured the webhook path
#: handles them and this DAG only acts on the rest (stage transitions).
WEBHOOK_KINDS = ("version_created", "alias_set", "alias_deleted", "tag_set")
#: Timeout of the mapping task (reads the mapping file, no network).
MAP_TIMEOUT = timedelta(minutes=2)
#: Timeout of one fire-and-forget trigger (creates a DAG run, never waits for it).
FIRE_TIMEOUT = timedelta(minutes=5)

DOC_MD = """
### Registry events (MLflow registry -> tritonflow DAGs)

Starts the DAGs that a change in the MLflow model registry calls for, using **one mapping** for
both ways a change can arrive:

- **webhook** (`POST /tritonflow/webhooks/mlflow` on the API server).
  *Used when* MLflow has a webhook with `TRITONFLOW_WEBHOOK_SECRET` (SQL-backed MLflow; new
  versions, aliases, tags). *How the mapped DAG starts:* the receiver maps the change and emits an
  asset event on `tritonflow_registry__<dag_id>`; the mapped DAG is scheduled on that asset and
  reads the conf from the event's `extra`.
- **watcher** (this DAG).
  *Used when* there is no webhook, and always for **stage transitions** (MLflow sends no webhook
  for them). *How the mapped DAG starts:* an `AssetWatcher` on
  `tritonflow_registry__registry_events` runs `RegistryEventTrigger` in the triggerer; each change
  becomes an asset event that runs this DAG, which maps it and **triggers** the mapped DAGs
  fire-and-forget with the same conf in `dag_run.conf`.

Both paths call `event_mapping.actions_for(change, load_mapping())`, so the mapping file
(`TRITONFLOW_EVENT_MAPPING_PATH`, default: new version or alias `challenger` -> `model_publish`
then `shadow_evaluation`; alias `champion` or stage `Production` -> `canary_promotion`; stage
`Archived` or alias removed -> `canary_rollback`) and the conf
(`model_name`, `model_version`, `alias`, `stage`, `registry_event`, `then`) are the same either
way; a mapped DAG reads it with `registry_watcher.registry_conf_from_context`.

**No double start.** When a webhook secret is configured the webhook owns the kinds it delivers
(`version_created`, `alias_set`, `alias_deleted`, `tag_set`) and this DAG only acts on
`stage_changed`; without a secret it acts on everything. The watcher records each transition
before it fires (restart-safe, never twice), and the trigger run id is derived from the change,
so a retried run does not start a DAG twice (`skip_when_already_exists`).

**Fire-and-forget.** Triggers use `wait_for_completion=False` with `deferrable=False` (a
deferrable fire-and-forget trigger can stay DEFERRED forever).

**Manual replay.** Trigger this DAG with `model_name` set to replay one change by hand (for
example a stage transition the watcher missed while the triggerer was down); `dry_run` only
logs what would start.
"""

PARAMS = {
    "model_name": Param("", type="string", maxLength=256,
                        description="Manual replay: registered model name. Empty: only act on the "
                                    "registry events that triggered the run."),
    "kind": Param("stage_changed", type="string", enum=list(CHANGE_KINDS),
                  description="Manual replay: kind of registry change."),
    "model_version": Param("", type="string", pattern=r"^[0-9]*$",
                           description="Manual replay: model version number (digits; empty for an "
                                       "alias deletion)."),
    "alias": Param("", type="string", pattern=r"^[A-Za-z0-9_-]*$",
                   description="Manual replay: alias set or deleted (alias_set / alias_deleted)."),
    "stage": Param("", type="string", enum=["", "Staging", "Production", "Archived", "None"],
                   description="Manual replay: new legacy stage (stage_changed)."),
    "dry_run": Param(False, type="boolean",
                     description="Map and log the DAGs that would start, without starting them."),
}


def _run_id(dag_id: str, change: dict, stamp: str) -> str:
    """Deterministic, allowed run id (``^[A-Za-z0-9_.~:+-]+$``) for one change and target."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps([dag_id, change, stamp], sort_keys=True, default=str)
                            .encode()).hexdigest()[:16]
    return f"registry__{change.get('kind', 'change')}__{digest}"


@dag(
    dag_id=DAG_ID,
    schedule=registry_asset(DAG_ID, watch=True, mapping_path=str(WATCH_ALL_MAPPING)),
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[TAG, "registry"],
    doc_md=DOC_MD,
    params=PARAMS,
)
def registry_events():
    """Map MLflow registry changes to the DAGs they call for and trigger them."""
    @task(execution_timeout=MAP_TIMEOUT, retries=0)
    @fail_fast_on_bad_data
    def map_changes(params=None) -> list[dict]:
        """Registry changes of this run -> ``[{trigger_dag_id, trigger_run_id, conf}]``."""
        import logging

        from tritonflow.exceptions import DataError
        from tritonflow.settings import get_settings
        from tritonflow_plugin.event_mapping import RegistryChange, actions_for, load_mapping

        log = logging.getLogger("tritonflow.registry_events")
        context = get_current_context()
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
                if isinstance(payload, dict) and isinstance(payload.get("registry_event"), dict):
                    found.append((payload["registry_event"], str(getattr(ev, "timestamp", ""))))
        webhook_owned = WEBHOOK_KINDS if get_settings().webhook_secret else ()
        rules = load_mapping()
        fired = []
        for raw, stamp in found:
            try:
                change = RegistryChange(**raw)
            except TypeError as exc:
                raise DataError(f"registry_event={raw!r} is invalid ({exc}): expected the fields of "
                                "RegistryChange") from None
            if change.source == "watcher" and change.kind in webhook_owned:
                log.info("%s: delivered by the MLflow webhook (secret configured); not fired twice", raw)
                continue
            for action in actions_for(change, rules):
                fired.append({"trigger_dag_id": action.dag_id,
                              "trigger_run_id": _run_id(action.dag_id, raw, stamp),
                              "conf": action.conf})
        log.info("registry changes %s -> %s", [c for c, _ in found],
                 [(f["trigger_dag_id"], f["trigger_run_id"]) for f in fired])
        return [] if p.get("dry_run") else fired

    TriggerDagRunOperator.partial(
        task_id="fire",
        wait_for_completion=False,
        deferrable=False,
        skip_when_already_exists=True,
        openlineage_inject_parent_info=False,
        execution_timeout=FIRE_TIMEOUT,
        retries=1,
    ).expand_kwargs(map_changes())


registry_events()
