"""What the scheduler did, read back through Airflow's REST API (``/api/v2``).

The demo's driver creates only ``drift_monitor`` runs; every other run comes from the
scheduler (asset events, ``TriggerDagRunOperator``). This module rebuilds, after the fact:

* :func:`dag_runs` -- one entry per DAG run: ``dag_id``, ``run_id``, ``run_type`` (as Airflow
  records it), ``triggered_by`` (``driver``, ``asset:<name>`` or ``dag:<dag_id>/<run_id>`` of the
  triggering run), ``state``, ``start``, ``end`` (plus ``queued``, ``source`` and ``conf``);
* :func:`alerts` -- one entry per drift alert: ``hour``, ``features``, ``decision``, ``reason``
  from the ``alert_decision`` XCom of the ``drift_monitor`` runs, or, when a run has none, from
  its task states (``source`` says which);
* :func:`closed_loops` and :func:`scheduling_latency_s` -- the benchmarks.

:class:`HourRecord` is the report's entry of one replayed logical hour: the driver fills in the
traffic it sent, then its ``drift_monitor`` run as read back here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
import urllib.parse
from typing import Any, Iterable, Mapping

from tritonflow.runtime.airflow_api import AirflowApi, AirflowApiError, xcom_value

#: XCom key a ``TriggerDagRunOperator`` task pushes with the run id it created.
TRIGGER_RUN_ID_KEY = "trigger_run_id"
#: XCom key of the DAGs' alert decision ({hour, features, decision, reason}).
ALERT_DECISION_KEY = "alert_decision"
#: Alert decisions that mean nothing was started for the alert.
NOT_ACTED = frozenset({"ignore", "ignored", "suppress", "suppressed", "skip", "skipped", "none",
                       "no_action", "cooldown", "in_flight", "deferred", "not_acted"})


@dataclasses.dataclass
class HourRecord:
    """One replayed logical hour (kept for the report)."""

    hour: int
    start: str
    first_day: int
    last_day: int
    rows: int
    failed_requests: int
    versions: dict[str, int]
    run_id: str | None = None
    run_state: str | None = None
    drift: bool | None = None
    drift_features: list[str] = dataclasses.field(default_factory=list)
    threshold_source: str | None = None
    dag_seconds: float | None = None
    acted: bool = False
    status: str | None = None
    invalid_features: list[str] = dataclasses.field(default_factory=list)


def parse_time(value: Any) -> dt.datetime | None:
    """An ISO 8601 timestamp of the API as an aware datetime (``None`` passes through)."""
    if not value:
        return None
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _q(text: str) -> str:
    return urllib.parse.quote(str(text), safe="")


def list_runs(api: AirflowApi, dag_id: str) -> list[dict[str, Any]]:
    """Every run of ``dag_id`` (paged), oldest first."""
    out: list[dict[str, Any]] = []
    while True:
        doc = api.get(f"/dags/{_q(dag_id)}/dagRuns?limit=100&offset={len(out)}&order_by=id")
        out.extend(doc.get("dag_runs") or [])
        if not doc.get("dag_runs") or len(out) >= int(doc.get("total_entries") or 0):
            return out


def task_instances(api: AirflowApi, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's task instances (mapped ones once per map index)."""
    doc = api.get(f"/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances?limit=500")
    return doc.get("task_instances") or []


def xcom_values(api: AirflowApi, dag_id: str, run_id: str, key: str,
                task_ids: Iterable[str] | None = None) -> list[tuple[str, int, Any]]:
    """``[(task_id, map_index, value)]`` of XCom ``key`` in a run (every task unless ``task_ids``)."""
    base = f"/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances"
    entries: list[dict[str, Any]] = []
    for task_id in (task_ids or ["~"]):
        try:
            doc = api.get(f"{base}/{_q(task_id) if task_id != '~' else '~'}/xcomEntries"
                          f"?xcom_key={_q(key)}&limit=100")
        except AirflowApiError as exc:
            if exc.status == 404:
                continue
            raise
        entries.extend(doc.get("xcom_entries") or [])
    out = []
    for e in entries:
        if e.get("key") != key:
            continue
        mi = int(e.get("map_index", -1))
        doc = api.get(f"{base}/{_q(e['task_id'])}/xcomEntries/{_q(key)}?map_index={mi}")
        out.append((e["task_id"], mi, xcom_value(doc.get("value"))))
    return out


def _triggered_map(api: AirflowApi, runs: Mapping[str, list[dict[str, Any]]]) -> dict[str, str]:
    """``{triggered run_id: "dag:<dag_id>/<run_id>"}`` from the trigger tasks' ``trigger_run_id``."""
    out: dict[str, str] = {}
    for dag_id, items in runs.items():
        for run in items:
            for _task, _mi, value in xcom_values(api, dag_id, run["dag_run_id"], TRIGGER_RUN_ID_KEY):
                for rid in (value if isinstance(value, list) else [value]):
                    if rid:
                        out[str(rid)] = f"dag:{dag_id}/{run['dag_run_id']}"
    return out


def dag_runs(api: AirflowApi, dag_ids: Iterable[str], driver_run_ids: set[str]) -> list[dict[str, Any]]:
    """One entry per DAG run of ``dag_ids`` (see the module docstring), in start order.

    Args:
        api: REST client of the deployment.
        dag_ids: The DAGs to report.
        driver_run_ids: Run ids the driver created through the REST API.
    """
    runs = {d: list_runs(api, d) for d in dag_ids}
    triggered = _triggered_map(api, runs)
    out = []
    for dag_id, items in runs.items():
        for r in items:
            rid = r["dag_run_id"]
            source: dict[str, list[Any]] | None = None
            if rid in driver_run_ids:
                by = "driver"
            elif rid in triggered:
                by = triggered[rid]
            elif "asset" in str(r.get("run_type", "")):
                events = api.get(f"/dags/{_q(dag_id)}/dagRuns/{_q(rid)}/upstreamAssetEvents").get(
                    "asset_events") or []
                names = sorted({e.get("name") or e.get("uri") or str(e.get("asset_id")) for e in events})
                by = "asset:" + ",".join(names) if names else "asset:?"
                sources = [f"dag:{e.get('source_dag_id')}/{e.get('source_run_id')}" for e in events
                           if e.get("source_dag_id")]
                source = {"events": sources, "timestamps": [e.get("timestamp") for e in events]}
            else:
                by = str(r.get("triggered_by") or r.get("run_type"))
            out.append({"dag_id": dag_id, "run_id": rid, "run_type": r.get("run_type"),
                        "triggered_by": by, "state": r.get("state"), "queued": r.get("queued_at"),
                        "start": r.get("start_date"), "end": r.get("end_date"),
                        "logical_date": r.get("logical_date"), "source": source,
                        "conf": r.get("conf") or {}})
    out.sort(key=lambda e: e["queued"] or e["start"] or "")
    return out


def alerts(api: AirflowApi, runs: list[dict[str, Any]], hour_of: Mapping[str, int]) -> list[dict[str, Any]]:
    """One entry per drift alert of the ``drift_monitor`` runs in ``runs``.

    The DAGs' ``alert_decision`` XCom is the source; a run without one falls back to its task
    states: an alert is a successful ``drift_event`` task (it emitted the asset event), decided
    ``acted`` when a ``shadow_evaluation`` run consumed that event and ``emitted`` otherwise.

    Args:
        api: REST client.
        runs: :func:`dag_runs` output.
        hour_of: ``{drift_monitor run_id: logical hour}`` of the driver's runs.
    """
    consumed = {ev for r in runs if r["dag_id"] == "shadow_evaluation" and r["source"]
                for ev in r["source"]["events"]}
    out = []
    for r in runs:
        if r["dag_id"] != "drift_monitor":
            continue
        rid = r["run_id"]
        decisions = xcom_values(api, "drift_monitor", rid, ALERT_DECISION_KEY)
        if decisions:
            for _task, _mi, value in decisions:
                for d in (value if isinstance(value, list) else [value]):
                    if not isinstance(d, Mapping) or d.get("decision") == "no_alert":
                        continue  # an hour without an alert is not an alert
                    out.append({"hour": hour_of.get(rid, d.get("hour")), "logical_hour": d.get("hour"),
                                "features": d.get("features"),
                                "decision": d.get("decision"), "reason": d.get("reason"),
                                "run_id": rid, "source": "xcom:alert_decision"})
            continue
        for ti in task_instances(api, "drift_monitor", rid):
            if ti.get("task_id") != "drift_event" or ti.get("state") != "success":
                continue
            vals = xcom_values(api, "drift_monitor", rid, "return_value", ["drift_event"])
            event: dict[str, Any] = next((v for _t, mi, v in vals if mi == ti.get("map_index", -1)), {}) or {}
            acted = f"dag:drift_monitor/{rid}" in consumed
            out.append({"hour": hour_of.get(rid), "features": event.get("features"),
                        "decision": "acted" if acted else "emitted",
                        "reason": ("drift asset event consumed by shadow_evaluation" if acted else
                                   "drift asset event emitted, no shadow_evaluation run consumed it"),
                        "run_id": rid, "alert_at": ti.get("end_date"),
                        "source": "task_states (no alert_decision XCom)"})
    return out


def acted_count(alert_list: Iterable[Mapping[str, Any]]) -> int:
    """Alerts whose decision started something (see :data:`NOT_ACTED`)."""
    return sum(1 for a in alert_list if str(a.get("decision") or "").lower() not in NOT_ACTED)


def _chain_root(run: Mapping[str, Any], by_id: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The ``drift_monitor`` run at the start of ``run``'s trigger chain (``None`` if none)."""
    seen = set()
    cur: Mapping[str, Any] | None = run
    while cur is not None and cur["run_id"] not in seen:
        seen.add(cur["run_id"])
        if cur["dag_id"] == "drift_monitor":
            return cur
        by = cur["triggered_by"]
        if by.startswith("dag:"):
            cur = by_id.get(by.split("/", 1)[1])
        elif cur.get("source") and cur["source"]["events"]:
            cur = by_id.get(cur["source"]["events"][-1].split("/", 1)[1])
        else:
            return None
    return None


def closed_loops(runs: list[dict[str, Any]], promotions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drift alert -> promoted challenger, per promotion, measured on the scheduler's clock.

    A promotion is a successful ``canary_promotion`` run after which the champion alias moved
    (``promotions``: ``{"to", "from", "seen_at"}`` observed by the driver). The loop starts at the
    end of the ``drift_monitor`` run whose asset event started the chain and ends at the end of
    the canary run.
    """
    by_id = {r["run_id"]: r for r in runs}
    canaries = [r for r in runs if r["dag_id"] == "canary_promotion" and r["state"] == "success"]
    out = []
    for promo in promotions:
        seen = parse_time(promo["seen_at"])
        # The canary moves the alias before its run ends, so the driver may see the move first:
        # the promoting run is the latest successful canary that had started by then.
        started = [(c, st) for c in canaries if (st := parse_time(c["start"])) is not None]
        before = [(c, st) for c, st in started if seen is not None and st <= seen]
        latest = max(before, key=lambda pair: pair[1], default=None)
        run = latest[0] if latest is not None else None
        root = _chain_root(run, by_id) if run else None
        start = parse_time(root["end"]) if root is not None else None
        if run is None or root is None or start is None or latest is None:
            out.append({**promo, "seconds": None, "why": "no canary run / drift chain found"})
            continue
        end = parse_time(run["end"])
        if end is None:
            out.append({**promo, "seconds": None, "why": "the promoting canary run has not ended"})
            continue
        out.append({**promo, "alert_run": root["run_id"], "canary_run": run["run_id"],
                    "seconds": round((end - start).total_seconds(), 1)})
    return out


def sentinels(api: AirflowApi, runs: Iterable[Mapping[str, Any]],
              watch_task_id: str = "watch_champion") -> list[dict[str, Any]]:
    """One entry per ``champion_sentinel`` run: what started it and the state of its watches.

    Args:
        api: REST client.
        runs: :func:`dag_runs` entries of the sentinel DAG.
        watch_task_id: The deferrable task that holds one sentinel per model (mapped).

    Returns:
        ``[{"run_id", "triggered_by", "promoted_by": ["dag:canary_promotion/<run>", ...], "state",
        "watch": [{"map_index", "state"}], "armed"}]``; ``armed`` is True when a watch is
        deferred, i.e. its sentinel probes the champion in the triggerer.
    """
    out = []
    for r in runs:
        tis = [ti for ti in task_instances(api, r["dag_id"], r["run_id"]) if ti.get("task_id") == watch_task_id]
        watch = [{"map_index": ti.get("map_index"), "state": ti.get("state")} for ti in tis]
        events = (r.get("source") or {}).get("events") or []
        out.append({"run_id": r["run_id"], "triggered_by": r["triggered_by"], "state": r["state"],
                    "promoted_by": [e for e in events if e.startswith(("dag:canary_promotion/",
                                                                      "dag:canary_rollback/"))],
                    "queued": r.get("queued"), "watch": watch,
                    "armed": any(w["state"] == "deferred" for w in watch)})
    return out


def scheduling_latency_s(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median seconds from a run's cause to its start, for the scheduler-made runs.

    ``trigger_to_start``: ``start - queued_at`` of runs triggered by another DAG (the trigger
    task creates the run queued); ``asset_to_start``: ``start`` minus the consumed asset event's
    timestamp for asset-triggered runs (includes the wait for ``max_active_runs``).
    """
    trig, asset = [], []
    for r in runs:
        start = parse_time(r["start"])
        if start is None:
            continue
        queued = parse_time(r["queued"])  # None exactly when the run has no queued_at
        if r["triggered_by"].startswith("dag:") and queued is not None:
            trig.append((start - queued).total_seconds())
        elif r["triggered_by"].startswith("asset:") and r["source"] and r["source"]["timestamps"]:
            ts = max(t for t in map(parse_time, r["source"]["timestamps"]) if t is not None)
            asset.append((start - ts).total_seconds())
    med = lambda xs: round(statistics.median(xs), 2) if xs else None  # noqa: E731
    return {"trigger_to_start": med(trig), "asset_to_start": med(asset),
            "all": med(trig + asset), "n": len(trig) + len(asset)}
