"""Canary promotion: the step loop through the gateway, then the promotion or the rollback.

Step 4 of a promotion (:mod:`tritonflow.pipelines.canary` describes the sequence):
:func:`run_promotion` holds the model's promotion lock for the whole canary, drives
:func:`repository_sync.canary.runner.run_canary` step by step (analyses recorded on the challenger's
MLflow model version and in one MLflow run through
:class:`~tritonflow.pipelines.canary_observe.CanaryRecord`), and at 100 % moves the ``champion``
alias, sets Triton's version policy, writes the serving config and garbage-collects old version
folders of the repository (:func:`garbage_collect_repository`). A failed step rolls back
automatically (gateway to 100 % champion first, then the challenger unloaded); when that step
measured the challenger and judged it bad, the challenger is tagged rejected (stage ``canary``) so
no later shadow evaluation or canary promotes it again.

Under the model's promotion policy ``approve-steps``, with a ``pause_key`` (the DAG run's), each
step whose bake ends passed or inconclusive pauses for a person's decision (continue, hold, roll
back) through :class:`~tritonflow.pipelines.canary_pauses.PauseBoard`, still under the lease and
with the checks running; each decision is tagged on the challenger's version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

from model_registry.registry.entities import CHAMPION_ALIAS, PREVIOUS_CHAMPION_ALIAS
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
from tritonflow.pipelines.promotion_policy import promotion_policy
from tritonflow.pipelines.run_deadlines import canary_time_budget_s


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
    from repository_sync.triton.model_control import desired_versions

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
    from repository_sync.routing.gateway_status import GatewayStatusLog

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


@dataclasses.dataclass(frozen=True)
class PromotionRequest:
    """What one canary promotion is asked to do: the versions, the schedule and the checks.

    Attributes:
        model: Registered model name.
        challenger: Version number or alias of the challenger.
        champion: Champion version (``None``: the version the gateway serves, else the alias).
        steps: Traffic percents (default ``settings.canary_steps``), increasing, ending at 100.
        bake_s: Seconds per step (default ``settings.canary_bake_s``).
        min_requests: Fewest challenger requests per step (default ``settings.canary_min_requests``);
            also the fewest challenger predictions the distribution check needs (when smaller than
            the policy's default).
        use_stages: Also move the legacy stages (Production/Archived).
        dry_run: Resolve, check pre-flight and validate the schedule; touch nothing.
        holder: Who promotes, written in the lock (e.g. ``dag_id/run_id/task_id``; empty: host and
            pid, :func:`~tritonflow.pipelines.canary.default_holder`).
        prediction_columns: The challenger's output columns in the inference log (default:
            columns named ``prediction*``/``probabilit*``/``score*``).
        check_predictions: Read the inference log for the output checks (non-finite/constant
            outputs, expected behaviour, quality with labels, feature-space coverage).
        expected_predictions: URI of the challenger's expected predictions (the shadow
            evaluation's ``canary_conf``); default: the challenger version's
            ``tritonflow.shadow.expected_uri`` tag, else the prediction check is not evaluated.
        label_column: Label column of the inference-log labels (default: their only one).
        policy_overrides: Other :class:`~repository_sync.canary.policy.CanaryPolicy` fields.
        garbage_collect: Delete old repository versions after a promotion.
        pause_key: Where the pauses of a canary under promotion policy ``approve-steps`` are asked
            (:func:`~tritonflow.pipelines.canary_pauses.pause_key` of the DAG run, whose
            ``step_decision`` tasks ask a person); ``None``: no pauses, whatever the policy.
    """

    model: str
    challenger: Any
    champion: int | None = None
    steps: Sequence[int] | str | None = None
    bake_s: float | None = None
    min_requests: int | None = None
    use_stages: bool = False
    dry_run: bool = False
    holder: str = ""
    prediction_columns: Sequence[str] | None = None
    check_predictions: bool = True
    expected_predictions: str | None = None
    label_column: str | None = None
    policy_overrides: Mapping[str, Any] | None = None
    garbage_collect: bool = True
    pause_key: str | None = None

    def policy(self, settings: Any) -> Any:
        """The :class:`~repository_sync.canary.policy.CanaryPolicy`: the settings, then this request's values.

        Raises:
            SettingsError: A bad schedule or threshold (nothing has been touched).
        """
        from repository_sync.canary.policy import CanaryPolicy

        overrides: dict[str, Any] = dict(self.policy_overrides or {})
        if self.steps is not None:
            overrides["steps"] = self.steps
        if self.bake_s is not None:
            overrides["bake_s"] = float(self.bake_s)
        if self.min_requests is not None:
            overrides["min_requests"] = int(self.min_requests)
            from repository_sync.canary.policy import DEFAULT_MIN_PREDICTIONS

            overrides.setdefault("min_predictions", min(DEFAULT_MIN_PREDICTIONS, int(self.min_requests)))
        return CanaryPolicy.from_settings(settings, **overrides)


@dataclasses.dataclass
class _Promotion:
    """One promotion in progress: the request, where things are, and what was resolved so far."""

    request: PromotionRequest
    env: CanaryEnvironment
    policy: Any
    holder: str
    resolved: dict[str, Any]
    registry: Any
    apply_live: Callable[[Any], Any]
    base: dict[str, Any]
    canary_id: str = ""
    record: Any = None
    #: The model's promotion policy in force, written beside every outcome (read at the start).
    promotion_policy: str = ""

    @property
    def name(self) -> str:
        return self.resolved["triton_model"]

    @property
    def champion(self) -> int:
        return self.resolved["champion"]

    @property
    def challenger(self) -> int:
        return self.resolved["challenger"]

    @property
    def prefix(self) -> str:
        return f"{CANARY_TAG_PREFIX}{self.canary_id}."

    def tag(self, tags: Mapping[str, Any]) -> None:
        tags = dict(tags)
        if self.prefix + "outcome" in tags or self.prefix + "started" in tags:  # a decision: its policy too
            tags[self.prefix + "promotion_policy"] = self.promotion_policy
        record_tags(self.registry, self.request.model, self.challenger, tags)

    def unload_challenger(self) -> None:
        unload_version(self.env, self.name, self.challenger, keep_config_of=self.champion)

    def pause_board(self) -> Any:
        """The :class:`~tritonflow.pipelines.canary_pauses.PauseBoard` of this canary, or ``None``.

        ``None`` unless the promotion policy in force is ``approve-steps`` and the request names a
        ``pause_key``; opened (:meth:`PauseBoard.start`) when returned.
        """
        if self.promotion_policy != "approve-steps" or not self.request.pause_key:
            return None
        from ground.coordination import coordination_store
        from tritonflow.pipelines.canary_pauses import PauseBoard, pause_slots

        settings = self.env.settings
        board = PauseBoard(coordination_store(settings), self.request.pause_key,
                           slots=pause_slots(len(self.policy.steps), self.policy.max_extensions),
                           timeout_s=settings.canary_pause_timeout_s, record=self.tag, tag_prefix=self.prefix,
                           policy=self.promotion_policy)
        board.start(model=self.request.model, challenger=self.challenger, champion=self.champion,
                    canary_id=self.canary_id, triton_model=self.name)
        return board


def run_promotion(
    request: PromotionRequest,
    *,
    env: CanaryEnvironment | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Canary the request's challenger against its champion step by step; promote or roll back.

    Holds the model's promotion lease (``repository_sync.locks.promotion_lock`` in the shared
    coordination database, waiting ``settings.promotion_lock_timeout_s``) from the resolution to the
    end. See the module docstring for the sequence.

    Args:
        request: The versions, the schedule and the checks (:class:`PromotionRequest`).
        env: Where the systems are (default: from settings).
        sleep: Waits (``time.sleep``; injected by tests and benchmarks).
        clock: Unix time now (``time.time``; injected by tests and benchmarks).

    Returns:
        ``{"outcome": "promoted" | "rolled_back" | "rollback_failed" | "noop" | "routed" |
        "dry_run", "model", "champion", "challenger", "reason", "canary_id", "steps": [verdict
        summaries], "decisions": [the decision at each pause, under approve-steps],
        "rollback": {...} | None, "promotion": {...} | None, "gc": {...} | None,
        "canary_run": {"run_id", "analyses", "analyses_uri", "plot"} | None}``, plus ``rejected``
        after a rollback (the rejection tagged, ``''`` when none: :func:`_reject_judged_challenger`);
        the MLflow run (experiment ``tritonflow-canary``) holds every analysis and the plot over time.

    Raises:
        ConcurrencyError: Another promotion of the model holds the lock (names the holder).
        DataError: Bad parameters (schedule, versions), pre-flight refused, signature invalid.
    """
    from repository_sync.locks import promotion_lock
    from repository_sync.routing.traffic_plan import TrafficPlan

    env = environment_or_default(env)
    settings = env.settings
    policy = request.policy(settings)  # SettingsError: nothing touched
    holder = request.holder or default_holder()

    with promotion_lock(request.model, settings=settings, holder=holder,
                        timeout_s=settings.promotion_lock_timeout_s):
        res = resolve(request.model, request.challenger, request.champion, env=env)
        base = _base(request, res, policy)
        if res["noop"]:
            return {**base, "outcome": "noop", "reason": res["reason"]}
        router = env.router()
        run = _Promotion(request=request, env=env, policy=policy, holder=holder, resolved=res, base=base,
                         apply_live=live_applier(router, env.gateway_url, DEFAULT_LIVE_TIMEOUT_S),
                         registry=env.registry())
        if run.champion == run.challenger:
            return _route_without_canary(run)
        pre = preflight(request.model, run.champion, run.challenger, triton_model=run.name, env=env)
        if request.dry_run:
            plans = [TrafficPlan.canary(run.name, run.champion, run.challenger, p).weights for p in policy.steps]
            return {**base, "outcome": "dry_run", "reason": res["reason"], "preflight": pre,
                    "plans": [{str(k): v for k, v in w.items()} for w in plans]}
        loaded = ensure_loaded(request.model, [run.champion, run.challenger], triton_model=run.name, env=env)
        result = _drive_canary(run, pre, loaded, sleep=sleep, clock=clock)
        out = _canary_outcome(run, result, pre)
        if not result.promoted:
            return _after_rollback(run, result, out)
        return _promote(run, result, out)


def _base(request: PromotionRequest, res: Mapping[str, Any], policy: Any) -> dict[str, Any]:
    """The keys every outcome has, before the canary fills them."""
    return {"model": request.model, "triton_model": res["triton_model"], "champion": res["champion"],
            "challenger": res["challenger"], "canary_id": None, "steps": [], "rollback": None,
            "promotion": None, "gc": None, "canary_run": None, "decisions": [], "policy": policy.thresholds()}


def _route_without_canary(run: _Promotion) -> dict[str, Any]:
    """The challenger is the serving champion: route it 100 % and move the alias, without a canary."""
    from repository_sync.routing.traffic_plan import TrafficPlan

    request, res, name, chal = run.request, run.resolved, run.name, run.challenger
    if request.dry_run:
        return {**run.base, "outcome": "dry_run", "reason": res["reason"]}
    ensure_loaded(request.model, [chal], triton_model=name, env=run.env)
    run.apply_live(TrafficPlan.single(name, chal, name=f"{name}:route"))
    promo = run.registry.promote(request.model, chal, use_stages=request.use_stages, reason="routed without canary")
    return {**run.base, "outcome": "routed", "reason": res["reason"], "promotion": dataclasses.asdict(promo)}


def _start_record(run: _Promotion, pre: Mapping[str, Any], loaded: Mapping[str, Any]) -> tuple[Any, Any]:
    """Open the canary's MLflow record and tag its start; returns ``(expected, coverage reference)``."""
    from tritonflow.pipelines import shared_work
    from tritonflow.pipelines.canary_observe import CanaryRecord, coverage_reference_for, expected_for

    env, request, settings = run.env, run.request, run.env.settings
    model, chal = request.model, run.challenger
    expected, expected_note = expected_for(run.registry, model, chal, request.expected_predictions,
                                           tracking_uri=env.tracking_uri,
                                           fetch=lambda path: shared_work.fetch(settings, path))
    coverage_ref, coverage_note = coverage_reference_for(
        env.inference_log_root, model, chal, run.policy.coverage_features, endpoint_url=env.endpoint_url)
    run.canary_id = _now_id()
    run.promotion_policy = promotion_policy(model, settings=settings, registry=run.registry)
    run.record = CanaryRecord(env.tracking_uri, model=model, triton_model=run.name, champion=run.champion,
                              challenger=chal, canary_id=run.canary_id, thresholds=run.policy.thresholds(),
                              extra_tags={"tritonflow.holder": run.holder})
    run.tag({
        f"{CANARY_TAG_PREFIX}latest": run.canary_id,
        run.prefix + "started": {"champion": run.champion, "challenger": chal, "holder": run.holder,
                                 "policy": run.policy.thresholds(), "preflight": pre,
                                 "signatures": loaded["signatures"], "run_id": run.record.run_id,
                                 "expected": expected_note, "coverage": coverage_note,
                                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    })
    return expected, coverage_ref


def _drive_canary(run: _Promotion, pre: Mapping[str, Any], loaded: Mapping[str, Any], *,
                  sleep: Callable[[float], Any], clock: Callable[[], float]) -> Any:
    """Run the canary's steps (:func:`repository_sync.canary.runner.run_canary`), each analysis recorded.

    Anything unexpected (MLflow down while recording a step, an interrupt) sends the traffic back
    to the champion first, then unloads the challenger, records ``aborted``, and propagates.
    """
    from repository_sync.canary.metrics import metrics_scraper
    from repository_sync.canary.runner import run_canary
    from tritonflow.pipelines.canary_observe import observer

    env, request = run.env, run.request
    expected, coverage_ref = _start_record(run, pre, loaded)

    def on_step(analysis) -> None:
        run.tag({f"{run.prefix}step.{analysis.step:02d}.{analysis.attempt}": analysis.to_json()})

    observe = (observer(env.inference_log_root, run.name, prediction_columns=request.prediction_columns,
                        label_column=request.label_column, endpoint_url=env.endpoint_url)
               if request.check_predictions else None)
    board = run.pause_board()
    outcome = "aborted"
    try:
        result = run_canary(
            model=run.name, champion=run.champion, challenger=run.challenger, policy=run.policy,
            apply_plan=run.apply_live, scrape_metrics=metrics_scraper(env.metrics_url),
            unload_challenger=run.unload_challenger, observe=observe, expected=expected,
            coverage_reference=coverage_ref, sleep=sleep, clock=clock, on_step=on_step,
            on_analysis=run.record.add, gateway_statuses=gateway_statuses(env, run.name), pauses=board,
        )
        outcome = result.outcome
        return result
    except BaseException as exc:
        from repository_sync.canary.runner import rollback

        rec = rollback(model=run.name, champion=run.champion, apply_plan=run.apply_live,
                       unload_challenger=run.unload_challenger, reason=f"canary aborted: {exc}")
        with contextlib.suppress(Exception):
            run.record.finish("aborted", str(exc))
        with contextlib.suppress(Exception):
            run.tag({run.prefix + "outcome": "aborted", run.prefix + "rollback": dataclasses.asdict(rec)})
        raise
    finally:
        if board is not None:  # the tasks still waiting for a pause end
            with contextlib.suppress(Exception):
                board.end(outcome)


def _canary_outcome(run: _Promotion, result: Any, pre: Mapping[str, Any]) -> dict[str, Any]:
    """Close the canary's MLflow record; the outcome so far (steps summarised, rollback if any)."""
    canary_run = run.record.finish(result.outcome, result.reason)
    summary = [{"step": s.step, "percent": s.percent, "attempt": s.attempt, "verdict": s.verdict,
                "reason": s.reasons[0] if s.reasons else "",
                "canary_requests": s.canary_requests} for s in result.steps]
    run.tag({run.prefix + "run": canary_run})
    return {**run.base, "canary_id": run.canary_id, "outcome": result.outcome, "reason": result.reason,
            "steps": summary, "decisions": list(result.decisions), "preflight": pre, "canary_run": canary_run,
            "rollback": dataclasses.asdict(result.rollback) if result.rollback else None}


def _after_rollback(run: _Promotion, result: Any, out: dict[str, Any]) -> dict[str, Any]:
    """A rolled-back canary: the alias back to what serves, the outcome tagged, a judged challenger rejected."""
    model, chal = run.request.model, run.challenger
    if run.resolved["registry_champion"] == chal:
        # The alias was moved to the challenger by hand (the event that started this run):
        # it goes back to the version that serves, so MLflow says what serves.
        run.registry.client.set_registered_model_alias(model, CHAMPION_ALIAS, str(run.champion))
        out["alias_restored_to"] = run.champion
    run.tag({run.prefix + "outcome": result.outcome, run.prefix + "reason": result.reason,
             run.prefix + "rollback": out["rollback"]})
    out["rejected"] = _reject_judged_challenger(run.registry, model, chal, run.canary_id, result)
    return out


def _promote(run: _Promotion, result: Any, out: dict[str, Any]) -> dict[str, Any]:
    """At 100 %: move the aliases, route the champion, set Triton's versions, the serving config, GC."""
    from repository_sync.routing.traffic_plan import TrafficPlan

    model, name, chal, registry = run.request.model, run.name, run.challenger, run.registry
    if run.resolved["registry_champion"] == chal:
        # alias set by hand before the canary: keep the serving champion as rollback target
        from model_registry.registry import PREVIOUS_CHAMPION_TAG

        registry.client.set_registered_model_alias(model, PREVIOUS_CHAMPION_ALIAS, str(run.champion))
        registry.client.set_registered_model_tag(model, PREVIOUS_CHAMPION_TAG, str(run.champion))
    promo = registry.promote(model, chal, expected_champion=run.resolved["registry_champion"],
                             use_stages=run.request.use_stages, reason=f"canary {run.canary_id} passed")
    target = promo.previous_champion or run.champion
    run.apply_live(TrafficPlan.single(name, chal, name=f"{name}:champion"))  # live plan names it
    with run.env.triton() as tc:
        from repository_sync.triton.model_control import reconcile_model

        versions = reconcile_model(tc, registry, model, triton_model=name, keep=[chal, int(target)])["versions"]
        _, serving_config = tc.verify(name, chal)
    run.env.storage().write_serving_config(name, serving_config)
    gc = (garbage_collect_repository(model, champion=chal, rollback_target=int(target),
                                     triton_model=name, env=run.env, registry=registry)
          if run.request.garbage_collect else None)
    out.update(promotion=dataclasses.asdict(promo), loaded_versions=versions, gc=gc, rollback_target=int(target))
    run.tag({run.prefix + "outcome": "promoted", run.prefix + "reason": result.reason,
             run.prefix + "loaded_versions": versions, run.prefix + "gc": gc or {}})
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


__all__ = ["PromotionRequest", "canary_time_budget_s", "garbage_collect_repository", "run_promotion"]
