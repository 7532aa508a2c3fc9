"""The demo's deliberately bad challenger, requested the way a data scientist would.

After the loop, the driver (playing a data scientist) trains a model on the replay's last
logical hours with **flipped labels** (a label-encoding bug: its scores are confidently wrong),
registers it in MLflow and sets the registry alias :data:`CANARY_ALIAS` on it. It creates no DAG
run. The demo's event mapping (:data:`MAPPING_PATH`, ``TRITONFLOW_EVENT_MAPPING_PATH``) maps that
alias to ``model_publish`` then ``canary_promotion``: the registry watcher of ``registry_events``
sees the alias, ``registry_events`` starts ``model_publish``, which starts ``canary_promotion``
when it succeeds. While the canary runs the driver's canary traffic goes on, and the labels of
those requests arrive at once, so the canary's quality check with labels (challenger AUC against
the champion's, bootstrap interval; :func:`repository_sync.canary.checks.quality_check`) can
judge it under the default thresholds.

What the record says (outcome, reason, step verdicts) is read back from the scheduler's runs:
the ``canary`` task's ``canary_steps`` XCom (:mod:`tritonflow_plugin.canary_grid`) and the canary's
tags on the challenger's model version, never from what the driver expected.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from tritonflow.demo.driver import Demo

#: Registry alias that requests a canary of a version in the demo (see :data:`MAPPING_PATH`).
CANARY_ALIAS = "canary"
#: The demo's event mapping: alias ``canary`` set -> ``model_publish``, then ``canary_promotion``.
#: The only rule, so the other registry changes of the loop (the driver's initial champion,
#: ``retrain``'s versions, the canary's alias moves) start nothing.
MAPPING_PATH = Path(__file__).with_name("registry_mapping.json")
#: Lineage reason recorded on the bad version.
BAD_REASON = "demo_bad_challenger"
#: XCom key and task of the canary's step verdicts (``tritonflow_plugin.canary_grid``).
STEPS_XCOM_KEY, CANARY_TASK_ID = "canary_steps", "canary"
#: Model-version tag prefix of the canary's records (``tritonflow.pipelines.canary``).
CANARY_TAG_PREFIX = "tritonflow.canary."
#: Seconds between two looks at the runs while waiting.
POLL_S = 3.0


def run_version(conf: Mapping[str, Any]) -> str | None:
    """The model version a ``model_publish`` / ``canary_promotion`` run is about, from its conf.

    Conf shapes: a registry event (``model_version``), the loop context (``loop.version``) or the
    trigger form (``challenger`` / ``version_or_alias``).
    """
    raw = conf.get("loop")
    loop: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    for value in (conf.get("model_version"), loop.get("version"), conf.get("challenger"),
                  conf.get("version_or_alias")):
        if value not in (None, ""):
            return str(value)
    return None


def train_and_request(demo: Demo) -> dict[str, Any]:
    """Train on flipped labels, register, set alias :data:`CANARY_ALIAS`; returns the request record."""
    from model_registry.datasets import LABEL_COLUMN
    from model_registry.training import Lineage, log_and_register, train_noaa

    cfg = demo.cfg
    m = cfg.mapping
    b = m.first_day + m.n_hours * m.days_per_hour
    a = max(m.first_day, b - cfg.retrain_hours * m.days_per_hour)
    window = demo.data.iloc[a:b].copy()
    window[LABEL_COLUMN] = 1 - window[LABEL_COLUMN].to_numpy()
    model = train_noaa(window)
    champion = demo.aliases().get("champion")
    reg = log_and_register(model, window, tracking_uri=demo.settings.resolved_mlflow_tracking_uri,
                           name=cfg.model, alias=CANARY_ALIAS,
                           lineage=Lineage(reason=BAD_REASON, extra={"labels": "flipped"}))
    auc = model.metrics.get("validation_auc", float("nan"))
    demo.progress.step(f"BAD CHALLENGER: version {reg.version} trained on days {a}..{b - 1} with flipped labels "
                       f"(hold-out AUC {auc:.3f}), registered with alias {CANARY_ALIAS!r}: the registry "
                       f"watcher -> registry_events -> model_publish -> canary_promotion (champion {champion})")
    demo.event("bad_challenger_registered", version=int(reg.version), days=[a, b - 1], alias=CANARY_ALIAS)
    return {"version": int(reg.version), "days": [a, b - 1], "alias": CANARY_ALIAS,
            "hold_out_auc_on_flipped_labels": auc, "champion_before": champion,
            "registered_at": time.time()}


def _runs_about(demo: Demo, dag_id: str, version: str) -> list[dict[str, Any]]:
    doc = demo._api.get(f"/dags/{dag_id}/dagRuns?limit=20&order_by=-id")
    return [r for r in doc.get("dag_runs") or [] if run_version(r.get("conf") or {}) == version]


def wait_for_canary(demo: Demo, version: int, timeout_s: float) -> tuple[dict | None, dict | None, str]:
    """The ``model_publish`` and ``canary_promotion`` runs of ``version`` once final (or why not).

    Returns:
        ``(publish_run, canary_run, note)``; a run is ``None`` when none was seen, ``note`` says
        where it stopped (empty when the canary run ended).
    """
    deadline = time.monotonic() + timeout_s
    publish = canary = None
    while time.monotonic() < deadline:
        publish = next(iter(_runs_about(demo, "model_publish", str(version))), publish)
        canary = next(iter(_runs_about(demo, "canary_promotion", str(version))), canary)
        if canary is not None and canary.get("state") in ("success", "failed"):
            return publish, canary, ""
        if publish is not None and publish.get("state") == "failed":
            return publish, canary, "model_publish failed: no canary"
        time.sleep(POLL_S)
    where = ("no model_publish run (registry_events did not map the alias?)" if publish is None
             else "no canary_promotion run" if canary is None else f"canary run still {canary.get('state')}")
    return publish, canary, f"not finished after {timeout_s:.0f} s: {where}"


def read_outcome(demo: Demo, version: int, canary: Mapping[str, Any] | None) -> dict[str, Any]:
    """Outcome, reason and step verdicts of the canary, from its XCom and its model-version tags."""
    from tritonflow.demo.runs import xcom_values

    out: dict[str, Any] = {"outcome": None, "reason": None, "steps": [], "source": None}
    if canary is not None:
        values = xcom_values(demo._api, "canary_promotion", canary["dag_run_id"], STEPS_XCOM_KEY,
                             [CANARY_TASK_ID])
        pushed = next((v for _t, _mi, v in values if isinstance(v, Mapping)), None)
        if pushed:
            out.update(outcome=pushed.get("outcome"), reason=pushed.get("reason"),
                       steps=list(pushed.get("steps") or []), source=f"xcom:{CANARY_TASK_ID}.{STEPS_XCOM_KEY}")
    try:
        mv = demo.mlflow_client().get_model_version(demo.cfg.model, str(version))
        tags = dict(mv.tags or {})
    except Exception:  # noqa: BLE001 - the XCom is the record; the tags only complete it
        tags = {}
    cid = tags.get(f"{CANARY_TAG_PREFIX}latest")
    if cid:
        out["canary_id"] = cid
        out["tag_outcome"] = tags.get(f"{CANARY_TAG_PREFIX}{cid}.outcome")
        try:  # the policy the canary ran with (its thresholds), as it recorded them
            out["thresholds"] = json.loads(tags.get(f"{CANARY_TAG_PREFIX}{cid}.started") or "{}").get("policy")
        except (ValueError, AttributeError):
            out["thresholds"] = None
        if out["outcome"] is None:
            out.update(outcome=out["tag_outcome"], reason=tags.get(f"{CANARY_TAG_PREFIX}{cid}.reason"),
                       source="mlflow:model_version_tags")
    return out


def offer(demo: Demo, timeout_s: float) -> dict[str, Any]:
    """Request the bad challenger's canary through the registry and read back what happened.

    Returns:
        ``{"version", "alias", "champion_before", "champion_after", "publish_run", "canary_run",
        "canary_state", "outcome", "reason", "steps", "rolled_back", "seconds", "note"}``;
        ``rolled_back`` is True when the canary run failed with outcome ``rolled_back`` and the
        champion alias did not move.
    """
    rec = train_and_request(demo)
    publish, canary, note = wait_for_canary(demo, rec["version"], timeout_s)
    outcome = read_outcome(demo, rec["version"], canary)
    after = demo.aliases().get("champion")
    rolled_back = bool(canary and canary.get("state") == "failed" and outcome.get("outcome") == "rolled_back"
                       and after == rec["champion_before"])
    rec.update(champion_after=after, note=note,
               publish_run=publish and publish["dag_run_id"], publish_state=publish and publish.get("state"),
               canary_run=canary and canary["dag_run_id"], canary_state=canary and canary.get("state"),
               rolled_back=rolled_back, seconds=round(time.time() - rec["registered_at"], 1), **outcome)
    demo.event("bad_challenger", version=rec["version"], state=rec["canary_state"], outcome=rec["outcome"],
               rolled_back=rolled_back, seconds=rec["seconds"])
    demo.progress.step(f"bad challenger version {rec['version']}: "
                       + ("ROLLED BACK by the canary analysis" if rolled_back else "NOT rolled back")
                       + f" (canary run {rec['canary_run']} {rec['canary_state']}, outcome {rec['outcome']}: "
                       f"{rec['reason'] or note}) after {rec['seconds']:.0f} s")
    return rec
