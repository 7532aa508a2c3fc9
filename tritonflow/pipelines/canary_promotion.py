"""Canary promotion: the step loop through the gateway, then the promotion or the rollback.

Step 4 of a promotion (:mod:`tritonflow.pipelines.canary` describes the sequence):
:func:`run_promotion` holds the model's promotion lock for the whole canary, drives
:func:`repository_sync.canary.run_canary` step by step (analyses recorded on the challenger's
MLflow model version and in one MLflow run through
:class:`~tritonflow.pipelines.canary_observe.CanaryRecord`), and at 100 % moves the ``champion``
alias, sets Triton's version policy, writes the serving config and garbage-collects old version
folders of the repository (:func:`garbage_collect_repository`). A failed step rolls back
automatically (gateway to 100 % champion first, then the challenger unloaded); when that step
measured the challenger and judged it bad, the challenger is tagged rejected (stage ``canary``) so
no later shadow evaluation or canary promotes it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

from model_registry.registry_entities import CHAMPION_ALIAS, PREVIOUS_CHAMPION_ALIAS
from tritonflow.pipelines.canary import (
    CANARY_TAG_PREFIX,
    DEFAULT_LIVE_TIMEOUT_S,
    CanaryEnvironment,
    default_holder,
    environment_or_default,
    live_applier,
    record_tags,
    resolve,
)
from tritonflow.pipelines.canary_loading import ensure_loaded, preflight, unload_version

#: Seconds a fixed overhead of one promotion may take on top of the bakes (loads, MLflow, GC);
#: used by :func:`canary_time_budget_s`.
PROMOTION_OVERHEAD_S = 600.0


def canary_time_budget_s(steps: Sequence[int], bake_s: float, max_extensions: int) -> float:
    """Longest a canary may take: every step baked ``1 + max_extensions`` times plus overhead.

    Used by the DAG to refuse parameters its promotion task's ``execution_timeout`` cannot hold.
    """
    return len(steps) * float(bake_s) * (1 + int(max_extensions)) + PROMOTION_OVERHEAD_S


# ----------------------------------------------------------------------------------- repository GC
def _repository_versions(storage: Any, name: str) -> list[int]:
    out = set()
    for path in storage.list_paths():
        parts = path.split("/")
        if len(parts) >= 3 and parts[0] == name and parts[1].isdigit():
            out.add(int(parts[1]))
    return sorted(out)


def garbage_collect_repository(model: str, *, champion: int, rollback_target: int | None,
                               triton_model: str | None = None, env: CanaryEnvironment | None = None,
                               registry: Any = None) -> dict[str, Any]:
    """Delete old version folders of ``model`` from the Triton repository.

    Kept: the champion, the rollback target, every version READY in Triton, every version holding
    an MLflow alias or a Production/Staging stage (``RegistryClient.plan_garbage_collection``), and
    every version newer than the champion (a challenger may be waiting). Deleted: the rest.

    Returns:
        ``{"deleted": [...], "kept": {version: reason}}``.
    """
    env = environment_or_default(env)
    name = triton_model or model
    registry = registry or env.registry()
    storage = env.storage()
    from repository_sync.layout import plan_version
    from repository_sync.model_control import desired_versions

    with env.triton() as tc:  # READY or meant to be loaded (e.g. by an evaluation starting now)
        on_any = getattr(tc, "ready_versions_any", tc.ready_versions)  # READY on any replica counts
        ready = set(on_any(name)) | set(desired_versions(tc.coordination, tc.coordination_key(name)))
    protected = {int(champion)} | ({int(rollback_target)} if rollback_target else set()) | ready
    plan = registry.plan_garbage_collection(model, deployed_versions=protected, keep_latest=0)
    registered = set(plan.delete) | set(plan.keep)
    kept: dict[str, str] = {}
    deleted: list[int] = []
    for v in _repository_versions(storage, name):
        if v == int(champion):
            kept[str(v)] = "champion"
        elif rollback_target and v == int(rollback_target):
            kept[str(v)] = "rollback target"
        elif v in ready:
            kept[str(v)] = "READY in Triton"
        elif v > int(champion):
            kept[str(v)] = "newer than the champion"
        elif v in plan.keep:
            kept[str(v)] = plan.keep[v]
        elif v in plan.delete or v not in registered:
            storage.delete_version(plan_version(name, v))
            deleted.append(v)
    return {"deleted": deleted, "kept": kept}


# ----------------------------------------------------------------------------------- gateway statuses
def gateway_statuses(env: Any, triton_model: str) -> Callable[[float, float], Mapping[int, Any]]:
    """``(start, end) -> {version: StatusCounts}`` of ``triton_model`` from the gateway's status log.

    Without a status log (``env.gateway_status_log`` is ``None``) the callable raises, naming why,
    so every analysis records that its error rate came from Triton's metrics alone.

    Raises:
        MetricsUnavailableError: (from the returned callable) no status log, or not readable here.
    """
    from ground.exceptions import MetricsUnavailableError
    from repository_sync.gateway_status import GatewayStatusLog

    path = getattr(env, "gateway_status_log", None)
    if not path:
        note = getattr(env, "gateway_status_note", "") or "no gateway status log configured"

        def unavailable(start: float, end: float) -> Mapping[int, Any]:
            raise MetricsUnavailableError(f"not counted at the gateway: {note}")
        return unavailable
    log = GatewayStatusLog(path)
    return lambda start, end: log.counts(triton_model, start, end)


# ----------------------------------------------------------------------------------- promotion
def _now_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:4]


def run_promotion(
    model: str,
    champion: int | None,
    challenger: Any,
    *,
    steps: Sequence[int] | str | None = None,
    bake_s: float | None = None,
    min_requests: int | None = None,
    use_stages: bool = False,
    dry_run: bool = False,
    holder: str = "",
    prediction_columns: Sequence[str] | None = None,
    check_predictions: bool = True,
    expected_predictions: str | None = None,
    label_column: str | None = None,
    policy_overrides: Mapping[str, Any] | None = None,
    garbage_collect: bool = True,
    env: CanaryEnvironment | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Canary ``challenger`` against ``champion`` step by step; promote or roll back.

    Holds the model's promotion lease (``repository_sync.locks.promotion_lock`` in the shared
    coordination database, waiting ``settings.promotion_lock_timeout_s``) from the resolution to the
    end. See the module docstring for the sequence.

    Args:
        model: Registered model name.
        champion: Champion version (``None``: the version the gateway serves, else the alias).
        challenger: Version number or alias of the challenger.
        steps: Traffic percents (default ``settings.canary_steps``), increasing, ending at 100.
        bake_s: Seconds per step (default ``settings.canary_bake_s``).
        min_requests: Fewest challenger requests per step (default ``settings.canary_min_requests``);
            also the fewest challenger predictions the distribution check needs (when smaller than
            the policy's default).
        use_stages: Also move the legacy stages (Production/Archived).
        dry_run: Resolve, check pre-flight and validate the schedule; touch nothing.
        holder: Who promotes, written in the lock (e.g. ``dag_id/run_id/task_id``).
        prediction_columns: The challenger's output columns in the inference log (default:
            columns named ``prediction*``/``probabilit*``/``score*``).
        check_predictions: Read the inference log for the output checks (non-finite/constant
            outputs, expected behaviour, quality with labels, feature-space coverage).
        expected_predictions: URI of the challenger's expected predictions (the shadow
            evaluation's ``canary_conf``); default: the challenger version's
            ``tritonflow.shadow.expected_uri`` tag, else the prediction check is not evaluated.
        label_column: Label column of the inference-log labels (default: their only one).
        policy_overrides: Other :class:`~repository_sync.canary.CanaryPolicy` fields.
        garbage_collect: Delete old repository versions after a promotion.
        env: Where the systems are (default: from settings).
        sleep: Waits (``time.sleep``; injected by tests and benchmarks).
        clock: Unix time now (``time.time``; injected by tests and benchmarks).

    Returns:
        ``{"outcome": "promoted" | "rolled_back" | "rollback_failed" | "noop" | "routed" |
        "dry_run", "model", "champion", "challenger", "reason", "canary_id", "steps": [verdict
        summaries], "rollback": {...} | None, "promotion": {...} | None, "gc": {...} | None,
        "canary_run": {"run_id", "analyses", "analyses_uri", "plot"} | None}``, plus ``rejected``
        after a rollback (the rejection tagged, ``''`` when none: :func:`_reject_judged_challenger`);
        the MLflow run (experiment ``tritonflow-canary``) holds every analysis and the plot over time.

    Raises:
        ConcurrencyError: Another promotion of the model holds the lock (names the holder).
        DataError: Bad parameters (schedule, versions), pre-flight refused, signature invalid.
    """
    from repository_sync.canary import CanaryPolicy, metrics_scraper, run_canary
    from repository_sync.locks import promotion_lock
    from repository_sync.router import TrafficPlan

    env = environment_or_default(env)
    settings = env.settings
    overrides: dict[str, Any] = dict(policy_overrides or {})
    if steps is not None:
        overrides["steps"] = steps
    if bake_s is not None:
        overrides["bake_s"] = float(bake_s)
    if min_requests is not None:
        overrides["min_requests"] = int(min_requests)
        from repository_sync.canary import DEFAULT_MIN_PREDICTIONS

        overrides.setdefault("min_predictions", min(DEFAULT_MIN_PREDICTIONS, int(min_requests)))
    policy = CanaryPolicy.from_settings(settings, **overrides)  # SettingsError: nothing touched
    holder = holder or default_holder()

    with promotion_lock(model, settings=settings, holder=holder,
                        timeout_s=settings.promotion_lock_timeout_s):
        res = resolve(model, challenger, champion, env=env)
        name, champ, chal = res["triton_model"], res["champion"], res["challenger"]
        base = {"model": model, "triton_model": name, "champion": champ, "challenger": chal,
                "canary_id": None, "steps": [], "rollback": None, "promotion": None, "gc": None,
                "canary_run": None, "policy": policy.thresholds()}
        if res["noop"]:
            return {**base, "outcome": "noop", "reason": res["reason"]}
        router = env.router()
        apply_live = live_applier(router, env.gateway_url, DEFAULT_LIVE_TIMEOUT_S)
        registry = env.registry()
        if champ == chal:
            if dry_run:
                return {**base, "outcome": "dry_run", "reason": res["reason"]}
            ensure_loaded(model, [chal], triton_model=name, env=env)
            apply_live(TrafficPlan.single(name, chal, name=f"{name}:route"))
            promo = registry.promote(model, chal, use_stages=use_stages, reason="routed without canary")
            return {**base, "outcome": "routed", "reason": res["reason"],
                    "promotion": dataclasses.asdict(promo)}

        pre = preflight(model, champ, chal, triton_model=name, env=env)
        if dry_run:
            plans = [TrafficPlan.canary(name, champ, chal, p).weights for p in policy.steps]
            return {**base, "outcome": "dry_run", "reason": res["reason"], "preflight": pre,
                    "plans": [{str(k): v for k, v in w.items()} for w in plans]}
        loaded = ensure_loaded(model, [champ, chal], triton_model=name, env=env)

        from tritonflow.pipelines import shared_work
        from tritonflow.pipelines.canary_observe import (
            CanaryRecord,
            coverage_reference_for,
            expected_for,
            observer,
        )

        expected, expected_note = expected_for(registry, model, chal, expected_predictions,
                                               tracking_uri=env.tracking_uri,
                                               fetch=lambda path: shared_work.fetch(settings, path))
        coverage_ref, coverage_note = coverage_reference_for(
            env.inference_log_root, model, chal, policy.coverage_features, endpoint_url=env.endpoint_url)
        canary_id = _now_id()
        prefix = f"{CANARY_TAG_PREFIX}{canary_id}."
        record = CanaryRecord(env.tracking_uri, model=model, triton_model=name, champion=champ,
                              challenger=chal, canary_id=canary_id, thresholds=policy.thresholds(),
                              extra_tags={"tritonflow.holder": holder})
        record_tags(registry, model, chal, {
            f"{CANARY_TAG_PREFIX}latest": canary_id,
            prefix + "started": {"champion": champ, "challenger": chal, "holder": holder,
                                 "policy": policy.thresholds(), "preflight": pre,
                                 "signatures": loaded["signatures"], "run_id": record.run_id,
                                 "expected": expected_note, "coverage": coverage_note,
                                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        })

        def on_step(analysis) -> None:
            record_tags(registry, model, chal, {
                f"{prefix}step.{analysis.step:02d}.{analysis.attempt}": analysis.to_json(),
            })

        def unload_challenger() -> None:
            unload_version(env, name, chal, keep_config_of=champ)

        observe = (observer(env.inference_log_root, name, prediction_columns=prediction_columns,
                            label_column=label_column, endpoint_url=env.endpoint_url)
                   if check_predictions else None)
        try:
            result = run_canary(
                model=name, champion=champ, challenger=chal, policy=policy, apply_plan=apply_live,
                scrape_metrics=metrics_scraper(env.metrics_url), unload_challenger=unload_challenger,
                observe=observe, expected=expected, coverage_reference=coverage_ref, sleep=sleep,
                clock=clock, on_step=on_step, on_analysis=record.add,
                gateway_statuses=gateway_statuses(env, name),
            )
        except BaseException as exc:
            # Anything unexpected (MLflow down while recording a step, interrupt): traffic back to
            # the champion first, then the challenger unloaded, then the error propagates.
            from repository_sync.canary import rollback

            rec = rollback(model=name, champion=champ, apply_plan=apply_live,
                           unload_challenger=unload_challenger, reason=f"canary aborted: {exc}")
            with contextlib.suppress(Exception):
                record.finish("aborted", str(exc))
            with contextlib.suppress(Exception):
                record_tags(registry, model, chal, {prefix + "outcome": "aborted",
                                                prefix + "rollback": dataclasses.asdict(rec)})
            raise

        canary_run = record.finish(result.outcome, result.reason)
        summary = [{"step": s.step, "percent": s.percent, "attempt": s.attempt, "verdict": s.verdict,
                    "reason": s.reasons[0] if s.reasons else "",
                    "canary_requests": s.canary_requests} for s in result.steps]
        out = {**base, "canary_id": canary_id, "outcome": result.outcome, "reason": result.reason,
               "steps": summary, "preflight": pre, "canary_run": canary_run,
               "rollback": dataclasses.asdict(result.rollback) if result.rollback else None}
        record_tags(registry, model, chal, {prefix + "run": canary_run})
        if not result.promoted:
            if res["registry_champion"] == chal:
                # The alias was moved to the challenger by hand (the event that started this run):
                # it goes back to the version that serves, so MLflow says what serves.
                registry.client.set_registered_model_alias(model, CHAMPION_ALIAS, str(champ))
                out["alias_restored_to"] = champ
            record_tags(registry, model, chal, {prefix + "outcome": result.outcome,
                                            prefix + "reason": result.reason,
                                            prefix + "rollback": out["rollback"]})
            out["rejected"] = _reject_judged_challenger(registry, model, chal, canary_id, result)
            return out

        # ---- promotion at 100 %
        if res["registry_champion"] == chal:
            # alias set by hand before the canary: keep the serving champion as rollback target
            from model_registry.registry import PREVIOUS_CHAMPION_TAG

            registry.client.set_registered_model_alias(model, PREVIOUS_CHAMPION_ALIAS, str(champ))
            registry.client.set_registered_model_tag(model, PREVIOUS_CHAMPION_TAG, str(champ))
        promo = registry.promote(model, chal, expected_champion=res["registry_champion"],
                                 use_stages=use_stages, reason=f"canary {canary_id} passed")
        target = promo.previous_champion or champ
        apply_live(TrafficPlan.single(name, chal, name=f"{name}:champion"))  # live plan names it
        with env.triton() as tc:
            from repository_sync.model_control import reconcile_model

            versions = reconcile_model(tc, registry, model, triton_model=name,
                                       keep=[chal, int(target)])["versions"]
            _, serving_config = tc.verify(name, chal)
        env.storage().write_serving_config(name, serving_config)
        gc = (garbage_collect_repository(model, champion=chal, rollback_target=int(target),
                                         triton_model=name, env=env, registry=registry)
              if garbage_collect else None)
        out.update(promotion=dataclasses.asdict(promo), loaded_versions=versions, gc=gc,
                   rollback_target=int(target))
        record_tags(registry, model, chal, {prefix + "outcome": "promoted",
                                        prefix + "reason": result.reason,
                                        prefix + "loaded_versions": versions,
                                        prefix + "gc": gc or {}})
        return out


def _reject_judged_challenger(registry: Any, model: str, challenger: int, canary_id: str, result: Any) -> str:
    """Tag ``challenger`` rejected at stage ``canary`` when its failed step judged it bad.

    Only a step that measured the challenger and failed it (error rate, latency, outputs, expected
    behaviour, quality) rejects; a rollback for what could not be measured (metrics or inference
    log unavailable, a plan not applied, a step still inconclusive: ``StepAnalysis.unjudged``)
    rejects nothing. The rule of :func:`~tritonflow.pipelines.loop_context.lasting_rejection`
    holds: no publish lifts it, a person does by deleting the version's tag ``tritonflow.status``.

    Returns:
        The rejection reason tagged (``''``: none, or tagging failed, logged as an error).
    """
    from tritonflow.pipelines.loop_context import CANARY_STAGE

    last = result.steps[-1] if result.steps else None
    if last is None or last.verdict != "fail" or last.unjudged:
        return ""
    from tritonflow.pipelines.loop_context import reject_after_rollback

    return reject_after_rollback(registry, model, challenger, CANARY_STAGE,
                                 why=f"canary {canary_id} rolled version {challenger} back: {result.reason}")


__all__ = ["canary_time_budget_s", "garbage_collect_repository", "run_promotion"]
