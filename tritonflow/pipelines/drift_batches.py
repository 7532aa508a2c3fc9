"""Several models per task instance: the batch form of the hourly drift stages (plain Python).

``dags/drift_monitor.py`` maps each stage over *batches* of ``TRITONFLOW_DRIFT_MODELS_PER_TASK``
models instead of one task instance per model: on a small Airflow deployment a task instance
costs seconds of process start-up, more than a small window's check. Each batch stage runs the
per-model function of :mod:`tritonflow.pipelines.drift` for every model of its batch and never
lets one model's failure stop the others: a failing model gets a *failure entry*
``{"model", "model_version", "status": "failed", "stage", "error", "data_error"}`` in place of its
result, and the others go on. After every stage, :func:`problems` lists each model that failed
somewhere (a failure entry, a broken data contract, or no result at all because its task failed)
and :func:`raise_problems` fails the run naming each one and why.

Every function returns JSON-serialisable lists (XCom). Check summaries are capped per model
(:func:`per_model_settings`) so a batch's list stays under ``Settings.max_xcom_bytes``; the full
summaries stay on disk (``artefacts.summary_json``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

from ground.exceptions import ContractViolation, DataError, SettingsError
from ground.settings import Settings, get_settings

log = logging.getLogger(__name__)

#: Status of a failure entry (a model whose stage raised).
FAILED = "failed"
#: Longest error message kept in a failure entry (characters).
ERROR_MAX_CHARS = 600
#: Share of ``max_xcom_bytes`` the per-model summaries of a batch may fill together (the rest is
#: headroom for the list and the failure entries).
XCOM_SHARE = 0.9
#: Smallest per-model summary budget (bytes): the capped summary's smallest form fits it.
MIN_SUMMARY_BYTES = 2048
#: Most models a failure message names one by one (the rest are counted).
MAX_NAMED_FAILURES = 50
#: XCom key under which the ``decide`` task keeps :func:`outcomes` for the gate (its return value
#: is the hour's drift events, which ``drift_event`` maps over).
OUTCOMES_KEY = "decide_outcomes"


class ModelsFailedError(DataError):
    """One or more models of the hour failed (a stage raised or the data contract broke)."""


class BatchRetryError(Exception):
    """Some models of a batch hit errors that may pass (not bad data); the batch is retried."""


def _settings(settings: Settings | None) -> Settings:
    return settings if settings is not None else get_settings()


def batch_models(targets: Sequence[Mapping[str, Any]], per_task: int | None = None,
                 settings: Settings | None = None) -> list[list[dict[str, Any]]]:
    """Split the monitored models into the batches of one task instance each.

    Args:
        targets: ``[{"model", "version"}]`` of :func:`tritonflow.pipelines.drift.monitored_models`
            (sorted by name, so a model stays in the same batch from hour to hour).
        per_task: Models per batch (default ``TRITONFLOW_DRIFT_MODELS_PER_TASK``).
        settings: Settings (default: from the environment).

    Returns:
        Consecutive batches of at most ``per_task`` targets; ``[]`` when there is no model.

    Raises:
        SettingsError: ``per_task`` is below 1.
    """
    n = _settings(settings).drift_models_per_task if per_task is None else per_task
    if int(n) < 1:
        raise SettingsError(f"TRITONFLOW_DRIFT_MODELS_PER_TASK={n!r}: expected an integer >= 1 "
                            "(models checked by one task instance)")
    items = [dict(t) for t in targets]
    return [items[i:i + int(n)] for i in range(0, len(items), int(n))]


def per_model_settings(settings: Settings, n_models: int) -> Settings:
    """Settings whose ``max_xcom_bytes`` is one model's share of a batch's XCom budget.

    ``check_window`` caps the summary it returns at that size (the full one stays on disk),
    so the batch's list of ``n_models`` summaries fits ``settings.max_xcom_bytes``.
    """
    if n_models <= 1:
        return settings
    share = max(MIN_SUMMARY_BYTES, int(settings.max_xcom_bytes * XCOM_SHARE) // n_models)
    return dataclasses.replace(settings, max_xcom_bytes=share)


def failure(model: Any, version: Any, stage: str, exc: BaseException) -> dict[str, Any]:
    """The failure entry standing for ``model``'s result when ``stage`` raised ``exc``."""
    return {"model": model, "model_version": version, "status": FAILED, "stage": stage,
            "error": f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS], "data_error": isinstance(exc, DataError)}


def is_failure(entry: Any) -> bool:
    """Whether ``entry`` is a failure entry (see :func:`failure`)."""
    return isinstance(entry, Mapping) and entry.get("status") == FAILED and "stage" in entry


def for_each(stage: str, items: Iterable[Mapping[str, Any]], run: Callable[[Mapping[str, Any]], dict[str, Any]],
             ) -> list[dict[str, Any]]:
    """Run ``run`` on every item; a raising item becomes a failure entry, the others go on.

    Args:
        stage: Stage name put in the failure entries (``check``, ``record``, ...).
        items: Targets ``{"model", "version"}`` or summaries ``{"model", "model_version"}``.
        run: The per-model function.

    Returns:
        One entry per item, in order: ``run``'s result (a dict) or a failure entry.
    """
    out = []
    for item in items:
        model = item.get("model")
        version = item.get("version", item.get("model_version"))
        try:
            out.append(run(item))
        except Exception as exc:  # noqa: BLE001 - one model's error must not stop the batch
            log.error("drift %s of %s v%s failed: %s: %s", stage, model, version, type(exc).__name__, exc,
                      exc_info=not isinstance(exc, DataError))
            out.append(failure(model, version, stage, exc))
    return out


def retry_if_transient(entries: Sequence[Mapping[str, Any]], stage: str, last_try: bool) -> None:
    """Raise so Airflow retries the batch when some model failed for a reason that may pass.

    Bad data (``DataError``) never retries: its failure entry stays and the run fails at the
    end naming it. Other errors (a service down) retry the whole batch (every stage is
    idempotent per hour) while retries are left; on the last try they stay as failure entries,
    so the other models' results still go downstream.

    Raises:
        BatchRetryError: Some entry failed without a data error and ``last_try`` is false.
    """
    passing = [e for e in entries if is_failure(e) and not e.get("data_error")]
    if passing and not last_try:
        raise BatchRetryError(f"drift {stage}: {len(passing)} model(s) failed for a reason that may pass, "
                              f"retrying the batch: " + "; ".join(f"{e['model']}: {e['error']}" for e in passing))


def check_batch(targets: Sequence[Mapping[str, Any]], start: Any, end: Any, settings: Settings | None = None,
                reference_strategy: str | None = None) -> list[dict[str, Any]]:
    """:func:`tritonflow.pipelines.drift.check_model_hour` of every model of a batch.

    Returns:
        One summary or failure entry per target, in order; each summary capped at the model's
        share of ``max_xcom_bytes`` (:func:`per_model_settings`).
    """
    from tritonflow.pipelines.drift import check_model_hour

    s = per_model_settings(_settings(settings), len(targets))
    return for_each("check", targets, lambda t: check_model_hour(
        t["model"], t["version"], start, end, settings=s, reference_strategy=reference_strategy))


def evidently_batch(targets: Sequence[Mapping[str, Any]], start: Any, end: Any, settings: Settings | None = None,
                    sample_rows: int | None = None) -> list[dict[str, Any]]:
    """:func:`tritonflow.pipelines.drift.evidently_for_hour` of every model of a batch."""
    from tritonflow.pipelines.drift import evidently_for_hour

    s = per_model_settings(_settings(settings), len(targets))
    return for_each("evidently", targets, lambda t: evidently_for_hour(
        t["model"], t["version"], start, end, settings=s, sample_rows=sample_rows))


def profile_batch(targets: Sequence[Mapping[str, Any]], start: Any, end: Any,
                  settings: Settings | None = None) -> list[dict[str, Any]]:
    """:func:`tritonflow.pipelines.drift.profile_for_hour` of every model of a batch."""
    from tritonflow.pipelines.drift import profile_for_hour

    s = _settings(settings)
    return for_each("profile", targets, lambda t: profile_for_hour(t["model"], t["version"], start, end, settings=s))


def summaries(checked: Iterable[Any]) -> list[dict[str, Any]]:
    """The check results of a batch or of several (lists of entries), flattened, failures left out."""
    return [dict(e) for e in flatten(checked) if isinstance(e, Mapping) and not is_failure(e)]


def flatten(values: Iterable[Any]) -> list[Any]:
    """One list from batch results (lists) and single results (anything else), ``None`` dropped."""
    out: list[Any] = []
    for v in values or []:
        if isinstance(v, (list, tuple)):
            out.extend(x for x in v if x is not None)
        elif v is not None:
            out.append(v)
    return out


def record_batch(checked: Sequence[Mapping[str, Any]], evidently_results: Iterable[Any] = (),
                 settings: Settings | None = None) -> list[dict[str, Any]]:
    """:func:`tritonflow.pipelines.drift.record_in_mlflow` of every checked model of a batch.

    Args:
        checked: The batch's :func:`check_batch` entries (failure entries are not recorded).
        evidently_results: Evidently results of any batches (matched by model).
        settings: Settings (default: from the environment).

    Returns:
        ``{"model", **record_in_mlflow(...)}`` or a failure entry per checked model.
    """
    from tritonflow.pipelines.drift import record_in_mlflow

    s = _settings(settings)
    ev = {e.get("model"): e for e in flatten(evidently_results) if isinstance(e, Mapping) and not is_failure(e)}
    return for_each("record", summaries([list(checked)]), lambda summary: {
        "model": summary.get("model"), **record_in_mlflow(summary, settings=s, evidently=ev.get(summary.get("model")))})


def decide_batch(checked: Sequence[Mapping[str, Any]], settings: Settings | None = None) -> list[dict[str, Any]]:
    """Notify (log, webhook) and decide every checked model's hour of a batch.

    :func:`tritonflow.pipelines.drift.alert`, then
    :func:`tritonflow.pipelines.alert_decision.drift_hour_decision` (recorded in MLflow unless
    ``no_alert``: a quiet hour costs no MLflow round-trip).

    Returns:
        ``{"model", "notified", "decision"}`` or a failure entry per checked model.
    """
    return decide_hour([list(checked)], settings)


def decide_hour(checked: Iterable[Any], settings: Settings | None = None) -> list[dict[str, Any]]:
    """:func:`decide_batch` of every checked model of the hour, whatever its batch.

    Args:
        checked: :func:`check_batch` results of every batch (a list per batch).
        settings: Settings (default: from the environment).

    Returns:
        ``{"model", "notified", "decision"}`` or a failure entry per checked model, in check order.
    """
    from tritonflow.pipelines.alert_decision import drift_hour_decision, record_decision
    from tritonflow.pipelines.drift import alert

    s = _settings(settings)

    def one(summary: Mapping[str, Any]) -> dict[str, Any]:
        notified = alert(summary, settings=s)
        made = drift_hour_decision(summary)
        if made["decision"] != "no_alert":
            record_decision(made, settings=s)
        return {"model": summary.get("model"), "notified": notified, "decision": made}

    return for_each("decide", summaries(checked), one)


def outcomes(decided: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What :func:`problems` needs of :func:`decide_hour`'s entries: the failures, and ``{"model", "decision"}``."""
    return [dict(e) if is_failure(e) else
            {"model": e.get("model"), "decision": (e.get("decision") or {}).get("decision")} for e in decided]


def due_followups(recorded: Iterable[Any]) -> list[dict[str, Any]]:
    """The follow-up retrainings :func:`record_batch` found due (``followup`` of its entries), by model."""
    due = [dict(e["followup"]) for e in flatten(recorded)
           if isinstance(e, Mapping) and not is_failure(e) and isinstance(e.get("followup"), Mapping)]
    return sorted(due, key=lambda c: str(c.get("model")))


def alert_events(checked: Iterable[Any]) -> list[dict[str, Any]]:
    """The drift asset events' ``extra`` of the hour: one per model whose drift alert fired.

    Args:
        checked: :func:`check_batch` results of every batch.

    Returns:
        :func:`tritonflow.pipelines.drift.drift_event` of each alerting model, by model name;
        ``[]`` in a quiet hour.
    """
    from tritonflow.pipelines.drift import drift_event

    extras = [drift_event(s) for s in summaries(checked)]
    return sorted((e for e in extras if e is not None), key=lambda e: str(e.get("model")))


def _contract_problem(summary: Mapping[str, Any]) -> str | None:
    from tritonflow.pipelines.drift import data_quality_gate

    try:
        data_quality_gate(summary)
    except ContractViolation as exc:
        return f"data contract: {exc}"
    return None


def problems(batches: Iterable[Sequence[Mapping[str, Any]]], checked: Iterable[Any],
             stages: Mapping[str, Iterable[Any]], events: Iterable[Any] | None = None) -> list[dict[str, Any]]:
    """Every model of the hour that failed somewhere, and why.

    Args:
        batches: The run's batches of targets (:func:`batch_models`).
        checked: :func:`check_batch` results (a missing batch: its task failed).
        stages: ``{stage: results}`` of the other batch stages that ran (``record``,
            ``decide``, ``evidently``, ``profile``), each a list of the batches' entry lists.
        events: What the ``drift_event`` tasks returned; ``None``: not checked.

    Returns:
        ``[{"model", "version", "problems": [str], "data_error": bool}]`` by model name;
        ``data_error`` is true when every problem is bad data (a failed contract counts).
    """
    models = {str(t["model"]): t.get("version") for b in batches for t in b}
    found: dict[str, list[tuple[str, bool]]] = {}
    by_check = {e.get("model"): e for e in flatten(checked) if isinstance(e, Mapping)}
    for model in models:
        entry = by_check.get(model)
        if entry is None:
            found.setdefault(model, []).append(("check: no result (the check task of its batch failed; "
                                                "see its log)", False))
        elif is_failure(entry):
            found.setdefault(model, []).append((f"check: {entry.get('error')}", bool(entry.get("data_error"))))
        elif (why := _contract_problem(entry)) is not None:
            found.setdefault(model, []).append((why, True))
    checked_ok = [str(m) for m, e in by_check.items() if m in models and not is_failure(e)]
    for stage, results in stages.items():
        by_model = {e.get("model"): e for e in flatten(results) if isinstance(e, Mapping)}
        expected = checked_ok if stage in ("record", "decide") else list(models)
        for model in expected:
            entry = by_model.get(model)
            if entry is None:
                found.setdefault(model, []).append((f"{stage}: no result (the {stage} task of its batch "
                                                    "failed; see its log)", False))
            elif is_failure(entry):
                found.setdefault(model, []).append((f"{stage}: {entry.get('error')}", bool(entry.get("data_error"))))
    if events is not None:
        emitted = {e.get("model") for e in flatten(events) if isinstance(e, Mapping)}
        for extra in alert_events(checked):
            if extra.get("model") not in emitted:
                found.setdefault(str(extra.get("model")), []).append(
                    ("drift_event: the drift alert's asset event was not emitted (see the drift_event task)", False))
    return [{"model": m, "version": models.get(m), "problems": [p for p, _ in found[m]],
             "data_error": all(d for _, d in found[m])} for m in sorted(found)]


def raise_problems(found: Sequence[Mapping[str, Any]], n_models: int, start: Any = None,
                   end: Any = None) -> dict[str, Any]:
    """Fail the hour naming each failed model and why, or say that every model passed.

    Raises:
        ModelsFailedError: ``found`` is not empty (a ``DataError``: no retry; the results of
            the other models were recorded before).

    Returns:
        ``{"models": n_models, "failed": 0}`` when ``found`` is empty.
    """
    if not found:
        return {"models": n_models, "failed": 0}
    named = "; ".join(f"{f['model']} ({' | '.join(f['problems'])})" for f in found[:MAX_NAMED_FAILURES])
    more = f"; and {len(found) - MAX_NAMED_FAILURES} more" if len(found) > MAX_NAMED_FAILURES else ""
    raise ModelsFailedError(f"{len(found)} of {n_models} monitored model(s) failed in window [{start}, {end}): "
                            f"{named}{more}; the other models' results were recorded")


__all__ = [
    "FAILED", "OUTCOMES_KEY", "ModelsFailedError", "BatchRetryError", "batch_models", "per_model_settings", "failure",
    "is_failure", "for_each", "retry_if_transient", "check_batch", "evidently_batch", "profile_batch",
    "record_batch", "decide_batch", "decide_hour", "outcomes", "due_followups", "summaries", "flatten",
    "alert_events", "problems", "raise_problems",
]
