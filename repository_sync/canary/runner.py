"""The canary step runner: step schedule, continuous analysis, automatic rollback.

A canary moves a model's traffic to the challenger version in steps (default 5 -> 25 -> 50 ->
100 %, ``settings.canary_steps``). Each step bakes ``settings.canary_bake_s`` seconds. During the
bake :func:`analyse_step` runs every ``settings.canary_analysis_interval_s`` seconds (default 5 s)
on the window from the step's start:

(a) **hard checks, at every analysis and every ``settings.canary_hard_check_interval_s`` seconds
    between two** (default 1 s; the looks between analyses leave latency out) -- a failure rolls
    back at once, mid-bake, so a broken challenger waits for the next hard check, not for the next
    analysis:

    * the challenger's error rate above ``max_error_rate`` with confidence (one-sided
      Clopper-Pearson lower bound above the limit, at :attr:`CanaryPolicy.hard_confidence`: the
      error level split over the bake's analyses) over at least ``hard_min_requests`` requests,
      from the deltas of Triton's per-version Prometheus counters over the step and over the last
      interval (``nv_inference_request_success``, ``nv_inference_request_failure`` summed over
      ``reason``, ``nv_inference_request_duration_us``; see Triton's metrics documentation,
      https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html);
    * non-finite outputs (the same rule, on the challenger's logged predictions) or constant
      outputs (:func:`repository_sync.canary.checks.output_health`);
    * mean latency above ``max_mean_latency_ms`` or the challenger/champion latency ratio above
      ``max_latency_ratio``;
    * metrics that cannot be scraped, a challenger missing from them or counters going backwards.

(b) **statistical checks, at the end of the bake only** (a "pass" needs them all):

    * at least ``min_requests`` challenger requests (fewer: ``inconclusive``, never a pass);
    * the challenger's predictions against its *own expected behaviour* (its shadow-evaluation
      predictions or its outputs on mirrored live requests, matched on inputs), never against the
      champion's: KS and PSI with sampling margins;
    * where labels arrived during the step, its quality against the champion's with an interval;
    * feature-space coverage of the reference's decile bins (not covered: ``inconclusive``).

    The checks live in :mod:`repository_sync.canary.checks`. An inconclusive step is extended (baked
    again, the window growing) up to ``max_extensions`` times, then it fails.

With a :class:`~repository_sync.canary.pauses.PauseControl` (promotion policy ``approve-steps``)
a step whose bake ends passed or inconclusive pauses for a person's decision (continue, hold or
roll back), the hard checks still running while it waits (:mod:`repository_sync.canary.pauses`).

A failed analysis rolls back automatically through :func:`rollback` (the one rollback used by the
canary, the manual rollback and any other caller): the router goes to 100 % champion FIRST, then
the challenger is unloaded (never the reverse, so no request is routed to an unloaded version; if
the router cannot be rolled back, the challenger is left loaded). :func:`run_canary` drives it all
through callables, so it runs the same in a DAG task, a test or a benchmark; every
:class:`StepAnalysis` (intermediate ones included) is JSON-serialisable for the MLflow record.

Thresholds come from :class:`~repository_sync.canary.policy.CanaryPolicy` (built from settings
with :meth:`~repository_sync.canary.policy.CanaryPolicy.from_settings`); the memory pre-flight that
runs before any traffic moves is :mod:`repository_sync.canary.preflight`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Mapping

from repository_sync.canary.analysis import (
    CONTINUE,
    FAIL,
    INCONCLUSIVE,
    PASS,
    CoverageReference,
    StepAnalysis,
    analyse_step,
)
from repository_sync.canary.checks import ExpectedBehaviour, Observations
from repository_sync.canary.pauses import (
    CONTINUE_DECISION,
    HOLD_DECISION,
    ROLLBACK_DECISION,
    PauseControl,
    PauseDecision,
    offered,
)
from repository_sync.canary.policy import CanaryPolicy
from repository_sync.routing.traffic_plan import TrafficPlan


@dataclasses.dataclass
class RollbackRecord:
    """What a rollback did, in order: ``actions`` is a list of ``[action, unix time, detail]``."""

    reason: str
    decided_at: float
    actions: list[list[Any]] = dataclasses.field(default_factory=list)
    gateway_ok: bool = False
    unloaded: bool = False
    error: str | None = None


@dataclasses.dataclass
class CanaryResult:
    """Outcome of :func:`run_canary`.

    Attributes:
        outcome: ``"promoted"`` (every step passed; the challenger takes 100 %; the registry
            promotion is the caller's next step), ``"rolled_back"`` (gateway at 100 % champion),
            or ``"rollback_failed"`` (the gateway could not be rolled back: the challenger was left
            loaded and an operator must act).
        steps: Every step's final analysis (extensions included) and the failing one, in order.
        analyses: Every analysis, intermediate ones included, in order.
        decisions: The decision taken at each pause (``step``, ``percent``, ``attempt``, ``pause``
            and :meth:`~repository_sync.canary.pauses.PauseDecision.to_dict`), in order; empty
            without pauses.
    """

    model: str
    champion_version: int
    challenger_version: int
    outcome: str
    reason: str
    steps: list[StepAnalysis]
    rollback: RollbackRecord | None = None
    analyses: list[StepAnalysis] = dataclasses.field(default_factory=list)
    decisions: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def promoted(self) -> bool:
        """True when every step passed."""
        return self.outcome == "promoted"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (the step analyses; :attr:`analyses` are recorded one by one)."""
        return {
            "model": self.model,
            "champion_version": self.champion_version,
            "challenger_version": self.challenger_version,
            "outcome": self.outcome,
            "reason": self.reason,
            "steps": [s.to_dict() for s in self.steps],
            "analyses": len(self.analyses),
            "decisions": list(self.decisions),
            "rollback": dataclasses.asdict(self.rollback) if self.rollback else None,
        }

    def to_json(self) -> str:
        """Strict JSON of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)


def rollback(
    *,
    model: str,
    champion: int,
    apply_plan: Callable[[TrafficPlan], Any],
    unload_challenger: Callable[[], Any],
    reason: str,
    clock: Callable[[], float] = time.time,
) -> RollbackRecord:
    """Roll back: gateway to 100 % ``champion`` FIRST, then unload the challenger.

    The one rollback of tritonflow: used automatically by :func:`run_canary`, by the pipelines'
    aborted canaries and by anything else that must put a model back on a known-good version
    (pass ``unload_challenger=lambda: None`` to keep the other version loaded). If the gateway
    cannot be rolled back, the challenger is NOT unloaded (it still receives traffic).

    Returns:
        The :class:`RollbackRecord` (``gateway_ok``/``unloaded``/``error`` say what happened).
    """
    rec = RollbackRecord(reason=reason, decided_at=clock())
    try:
        apply_plan(TrafficPlan.single(model, champion, name=f"{model}:rollback"))
    except Exception as exc:  # noqa: BLE001 -- recorded, and the unload is then refused
        rec.error = f"gateway rollback to version {champion} failed: {exc}; challenger left loaded"
        rec.actions.append(["gateway_to_champion_failed", clock(), str(exc)])
        return rec
    rec.gateway_ok = True
    rec.actions.append(["gateway_to_champion", clock(), f"100% to version {champion}"])
    try:
        unload_challenger()
    except Exception as exc:  # noqa: BLE001 -- traffic is safe; the unload can be retried
        rec.error = f"challenger unload failed (traffic already on the champion): {exc}"
        rec.actions.append(["challenger_unload_failed", clock(), str(exc)])
        return rec
    rec.unloaded = True
    rec.actions.append(["challenger_unloaded", clock(), ""])
    return rec


@dataclasses.dataclass
class _CanaryRun:
    """What every step of one :func:`run_canary` shares: its inputs and the analyses so far."""

    model: str
    champion: int
    challenger: int
    policy: CanaryPolicy
    apply_plan: Callable[[TrafficPlan], Any]
    scrape_metrics: Callable[[], str]
    unload_challenger: Callable[[], Any]
    observe: Callable[[float, float], Observations] | None
    expected: ExpectedBehaviour | None
    coverage_reference: CoverageReference | None
    sleep: Callable[[float], Any]
    clock: Callable[[], float]
    on_step: Callable[[StepAnalysis], Any] | None
    on_analysis: Callable[[StepAnalysis], Any] | None
    gateway_statuses: Callable[[float, float], Mapping[int, Any]] | None
    pauses: PauseControl | None = None
    steps: list[StepAnalysis] = dataclasses.field(default_factory=list)
    analyses: list[StepAnalysis] = dataclasses.field(default_factory=list)
    decisions: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _StepState:
    """One step's bake so far: its window, the last scrape, the attempt and the seconds baked."""

    index: int
    percent: int
    start: float
    before_text: str | None
    metrics_error: str | None
    recent_text: str | None
    recent_start: float
    bake_until: float
    attempt: int = 1
    baked: float = 0.0


def run_canary(
    *,
    model: str,
    champion: int,
    challenger: int,
    policy: CanaryPolicy,
    apply_plan: Callable[[TrafficPlan], Any],
    scrape_metrics: Callable[[], str],
    unload_challenger: Callable[[], Any],
    observe: Callable[[float, float], Observations] | None = None,
    expected: ExpectedBehaviour | None = None,
    coverage_reference: CoverageReference | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.time,
    on_step: Callable[[StepAnalysis], Any] | None = None,
    on_analysis: Callable[[StepAnalysis], Any] | None = None,
    sticky_header: str | None = None,
    gateway_statuses: Callable[[float, float], Mapping[int, Any]] | None = None,
    pauses: PauseControl | None = None,
) -> CanaryResult:
    """Drive a canary through ``policy.steps`` with continuous analysis; roll back on a failure.

    Each step: apply its plan, scrape, then until the bake is over: sleep
    ``min(analysis_interval_s, bake left)``, scrape, read the window's log and analyse. A hard
    failure rolls back at once; at the end of the bake the step passes, fails, or (inconclusive)
    bakes again with the window growing, up to ``max_extensions`` times. The bake time counts the
    seconds slept, so an analysis never shortens it.

    Args:
        model: Model name.
        champion: Champion's Triton version (loaded).
        challenger: Challenger's Triton version (loaded).
        policy: Steps, bake time, analysis interval and thresholds.
        apply_plan: Makes a :class:`TrafficPlan` live (e.g. ``NginxRouter.apply``).
        scrape_metrics: Returns Triton's metrics text (e.g. :func:`metrics_scraper`); raising
            :class:`MetricsUnavailableError` (or anything) fails the step.
        unload_challenger: Unloads the challenger version (called only after the gateway rollback).
        observe: ``(start, end) -> Observations``: the logged requests of that unix-time window
            (e.g. from the inference log); ``None`` skips the output checks.
        expected: The challenger's expected behaviour (shadow or mirrored predictions).
        coverage_reference: The drift reference for the feature-space coverage.
        sleep: Waits (``time.sleep``; injected for tests).
        clock: Unix time now (``time.time``; injected for tests).
        on_step: Called with each step-ending analysis (pass, fail, inconclusive) as it is made.
        on_analysis: Called with every analysis, intermediate ones included (record to MLflow).
        sticky_header: Passed to every plan (same key, same version).
        gateway_statuses: ``(start, end) -> {version: StatusCounts}``: the statuses the gateway
            answered per version in that unix-time window (e.g.
            ``GatewayStatusLog(path).counts`` bound to the model); its failures count when they
            exceed Triton's. ``None``, or raising, leaves Triton's counters alone (noted in the
            analysis).
        pauses: Where a person decides at the end of each step's bake
            (:mod:`repository_sync.canary.pauses`); ``None``: no pauses (the canary decides alone).

    Returns:
        :class:`CanaryResult`; at ``"promoted"`` the gateway sends 100 % to the challenger.

    Raises:
        TrafficPlanError: A step's plan is invalid (before any traffic moves).
    """
    plans = [
        TrafficPlan.canary(model, champion, challenger, p, sticky_header=sticky_header)
        for p in policy.steps
    ]  # validated up front: a bad schedule moves no traffic
    run = _CanaryRun(
        model=model, champion=champion, challenger=challenger, policy=policy,
        apply_plan=apply_plan, scrape_metrics=scrape_metrics, unload_challenger=unload_challenger,
        observe=observe, expected=expected, coverage_reference=coverage_reference, sleep=sleep,
        clock=clock, on_step=on_step, on_analysis=on_analysis, gateway_statuses=gateway_statuses,
        pauses=pauses,
    )
    for index, (percent, plan) in enumerate(zip(policy.steps, plans, strict=True), start=1):
        try:
            apply_plan(plan)
        except Exception as exc:  # noqa: BLE001 -- the gateway kept the previous step; roll back
            return _rolled_back(run, f"step {index} ({percent}%): applying the traffic plan failed: {exc}")
        failure = _bake_step(run, index, percent)
        if failure is not None:
            return _rolled_back(run, failure)
    return CanaryResult(model, champion, challenger, "promoted", "every step passed", run.steps,
                        analyses=run.analyses, decisions=run.decisions)


def _rolled_back(run: _CanaryRun, reason: str) -> CanaryResult:
    """Roll the canary back for ``reason`` and say how it ended."""
    rec = rollback(
        model=run.model, champion=run.champion, apply_plan=run.apply_plan,
        unload_challenger=run.unload_challenger, reason=reason, clock=run.clock,
    )
    outcome = "rolled_back" if rec.gateway_ok else "rollback_failed"
    return CanaryResult(run.model, run.champion, run.challenger, outcome, reason, run.steps, rec,
                        run.analyses, run.decisions)


def _bake_step(run: _CanaryRun, index: int, percent: int) -> str | None:
    """Bake one step (its plan already live), analysing as it goes, extended while inconclusive.

    At the end of each bake the step passes, fails, or is inconclusive; with pauses a passed or
    inconclusive step then waits for a person's decision (:func:`_decide`). A hold or an
    inconclusive verdict bakes the step again (same window start, one more ``bake_s``).

    Returns:
        ``None`` when the step passed, else why it failed (the canary then rolls back).
    """
    start = run.clock()
    before_text: str | None = None
    metrics_error: str | None = None
    try:
        before_text = run.scrape_metrics()
    except Exception as exc:  # noqa: BLE001
        metrics_error = str(exc)
    st = _StepState(index=index, percent=percent, start=start, before_text=before_text,
                    metrics_error=metrics_error, recent_text=before_text, recent_start=start,
                    bake_until=float(run.policy.bake_s))
    while True:
        nap = max(0.0, min(run.policy.analysis_interval_s, st.bake_until - st.baked))
        analysis = _analyse(run, st, nap, baking=True)
        if analysis.verdict == FAIL:
            when = "" if analysis.final else f" after {st.baked:g} s of its bake"
            return f"step {index} ({percent}%) failed{when}: {analysis.reasons[0]}"
        if analysis.verdict not in (PASS, INCONCLUSIVE):
            continue
        decision, failure = _decide(run, st, analysis)
        if failure is not None:
            return failure
        if decision == CONTINUE_DECISION:
            return None
        st.attempt += 1  # hold, or extend an inconclusive step: same window start, one more bake
        st.bake_until += float(run.policy.bake_s)


def _analyse(run: _CanaryRun, st: _StepState, nap: float, *, baking: bool) -> StepAnalysis:
    """Sleep ``nap`` seconds, scrape, and analyse the step's window so far (recorded).

    ``baking``: the seconds count towards the bake, and the analysis is final when the bake is
    over; otherwise (a pause waiting for a decision) it is never final: only the hard checks judge.
    The nap is slept in slices with the hard checks between them (:func:`_nap_with_hard_checks`);
    one that fails ends the nap early and is the analysis returned.
    """
    after_text = None
    if st.metrics_error is None:
        failed = _nap_with_hard_checks(run, st, nap, baking=baking)
        if failed is not None:
            return failed
        try:
            after_text = run.scrape_metrics()
        except Exception as exc:  # noqa: BLE001
            st.metrics_error = str(exc)
    final = baking and st.baked >= st.bake_until - 1e-9
    analysis = _evaluate(run, st, after_text, final=final)
    st.recent_text, st.recent_start = after_text, analysis.window_end
    _record_analysis(run, analysis, st.attempt)
    return analysis


def _nap_with_hard_checks(run: _CanaryRun, st: _StepState, nap: float, *, baking: bool) -> StepAnalysis | None:
    """Sleep ``nap`` seconds in slices of ``policy.hard_check_interval_s``, hard-checking between them.

    After each slice but the last (the analysis at the end of the nap is the last look) the step's
    window so far is analysed as an intermediate analysis, which judges only the hard checks, latency
    left to the analyses (a mean over a second or two of a fresh version is its warm-up). One
    that passes is not recorded (the next analysis covers the same window); one that fails is
    recorded and returned, and the canary rolls back without waiting for the end of the interval.
    A scrape that fails here is left to that analysis, which fails the step on it.

    Returns:
        The failing analysis, or ``None`` when the whole nap was slept.
    """
    step = run.policy.hard_check_interval_s
    left = nap
    while step > 0 and left > step + 1e-9:
        run.sleep(step)
        left -= step
        if baking:
            st.baked += step
        try:
            text = run.scrape_metrics()
        except Exception:  # noqa: BLE001 -- the interval's analysis scrapes again and judges
            continue
        check = _evaluate(run, st, text, final=False, look=True)
        if check.verdict == FAIL:
            _record_analysis(run, check, st.attempt)
            return check
    run.sleep(left)
    if baking:
        st.baked += left
    return None


def _evaluate(run: _CanaryRun, st: _StepState, after_text: str | None, *, final: bool,
              look: bool = False) -> StepAnalysis:
    """Analyse the step's window from its start to now, given the metrics scraped now.

    ``look``: a hard-check look, which leaves latency to the analyses (:func:`analyse_step`).
    """
    end = run.clock()
    gateway_counts, gateway_recent, gateway_error = _gateway_counts(
        run, st.start, st.recent_start, end, st.metrics_error)
    observations, observations_error = _observations(run, st.start, end, st.metrics_error)
    return analyse_step(
        policy=run.policy, model=run.model, champion=run.champion, challenger=run.challenger,
        step=st.index, percent=st.percent, attempt=st.attempt, window_start=st.start, window_end=end,
        before_text=st.before_text, after_text=after_text, metrics_error=st.metrics_error,
        recent_before_text=st.recent_text, final=final, observations=observations,
        observations_error=observations_error, expected=run.expected,
        coverage_reference=run.coverage_reference, gateway_counts=gateway_counts,
        gateway_recent=gateway_recent, gateway_error=gateway_error, recent_start=st.recent_start, look=look,
    )


def _decide(run: _CanaryRun, st: _StepState, analysis: StepAnalysis) -> tuple[str, str | None]:
    """What to do after a bake that ended passed or inconclusive: ``(decision, failure or None)``.

    Without pauses: continue after a pass, extend (``hold``) after an inconclusive verdict. With
    pauses: ask (:meth:`PauseControl.open`), then wait for the answer until the pause's timeout
    (its default then), analysing the step meanwhile: a hard failure while waiting rolls back at
    once. ``rollback`` returns the failure that rolls the canary back.
    """
    passed = analysis.verdict == PASS
    if run.pauses is None:
        return (CONTINUE_DECISION if passed else HOLD_DECISION), None
    options, default = offered(passed, extension_left=st.attempt <= run.policy.max_extensions)
    number = run.pauses.open(analysis, options, default)
    decision, failure = _wait_for_decision(run, st, number, default)
    run.pauses.close(number, decision, analysis)
    run.decisions.append({"step": st.index, "percent": st.percent, "attempt": st.attempt, "pause": number,
                          "verdict": analysis.verdict, **decision.to_dict()})
    if failure is None and decision.decision == ROLLBACK_DECISION:
        failure = (f"step {st.index} ({st.percent}%) rolled back at its pause by {decision.by or 'nobody'}"
                   + (f": {decision.note}" if decision.note else ""))
    return decision.decision, failure


def _wait_for_decision(run: _CanaryRun, st: _StepState, number: int | None,
                       default: str) -> tuple[PauseDecision, str | None]:
    """Wait at pause ``number`` for its answer, its timeout or a failed hard check."""
    assert run.pauses is not None
    if number is None:
        return PauseDecision(default, source="no pause left"), None
    deadline = run.clock() + float(run.pauses.timeout_s)
    while True:
        answer = run.pauses.answer(number)
        if answer is not None:
            return answer, None
        left = deadline - run.clock()
        if left <= 0:
            return PauseDecision(default, note=f"no answer within {run.pauses.timeout_s:g} s",
                                 source="timeout"), None
        check = _analyse(run, st, min(run.policy.analysis_interval_s, left), baking=False)
        if check.verdict == FAIL:
            why = f"step {st.index} ({st.percent}%) failed while waiting at its pause: {check.reasons[0]}"
            return PauseDecision(ROLLBACK_DECISION, note=check.reasons[0], source="check"), why


def _gateway_counts(
    run: _CanaryRun, start: float, recent_start: float, end: float, metrics_error: str | None,
) -> tuple[Mapping[int, Any] | None, Mapping[int, Any] | None, str | None]:
    """The gateway's per-version counts over the step and the last interval, or why there are none."""
    gateway_counts = gateway_recent = None
    gateway_error = None if run.gateway_statuses is not None else "no gateway status log given"
    if run.gateway_statuses is not None and metrics_error is None:
        try:
            gateway_counts = run.gateway_statuses(start, end)
            gateway_recent = run.gateway_statuses(recent_start, end)
        except Exception as exc:  # noqa: BLE001 -- Triton's counters still judge
            gateway_counts = gateway_recent = None
            gateway_error = f"gateway status log unavailable: {exc}"
    return gateway_counts, gateway_recent, gateway_error


def _observations(
    run: _CanaryRun, start: float, end: float, metrics_error: str | None,
) -> tuple[Observations | None, str | None]:
    """The window's logged requests, or why they could not be read."""
    if run.observe is None or metrics_error is not None:
        return None, None
    try:
        return run.observe(start, end), None
    except Exception as exc:  # noqa: BLE001
        return None, str(exc)


def _record_analysis(run: _CanaryRun, analysis: StepAnalysis, attempt: int) -> None:
    """Number the analysis, fail a step inconclusive past its extensions, and report it."""
    analysis.index = len(run.analyses) + 1
    if analysis.verdict == INCONCLUSIVE and attempt > run.policy.max_extensions:
        analysis.verdict, analysis.unjudged = FAIL, True
        analysis.reasons.insert(
            0, f"still inconclusive after {run.policy.max_extensions} extension(s) of the step"
        )
    run.analyses.append(analysis)
    if run.on_analysis is not None:
        run.on_analysis(analysis)
    if analysis.verdict != CONTINUE:
        run.steps.append(analysis)
        if run.on_step is not None:
            run.on_step(analysis)
