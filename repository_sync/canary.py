"""Canary promotion: step schedule, continuous analysis, automatic rollback, pre-flight.

A canary moves a model's traffic to the challenger version in steps (default 5 -> 25 -> 50 ->
100 %, ``settings.canary_steps``). Each step bakes ``settings.canary_bake_s`` seconds. During the
bake :func:`analyse_step` runs every ``settings.canary_analysis_interval_s`` seconds (default 5 s)
on the window from the step's start:

(a) **hard checks, at every analysis** -- a failure rolls back at once, mid-bake:

    * the challenger's error rate above ``max_error_rate`` with confidence (one-sided
      Clopper-Pearson lower bound above the limit, at :attr:`CanaryPolicy.hard_confidence`: the
      error level split over the bake's analyses) over at least ``hard_min_requests`` requests,
      from the deltas of Triton's per-version Prometheus counters over the step and over the last
      interval (``nv_inference_request_success``, ``nv_inference_request_failure`` summed over
      ``reason``, ``nv_inference_request_duration_us``; see Triton's metrics documentation,
      https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html);
    * non-finite outputs (the same rule, on the challenger's logged predictions) or constant
      outputs (:func:`repository_sync.canary_checks.output_health`);
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

    The checks live in :mod:`repository_sync.canary_checks`. An inconclusive step is extended (baked
    again, the window growing) up to ``max_extensions`` times, then it fails.

A failed analysis rolls back automatically through :func:`rollback` (the one rollback used by the
canary, the manual rollback and any other caller): the router goes to 100 % champion FIRST, then
the challenger is unloaded (never the reverse, so no request is routed to an unloaded version; if
the router cannot be rolled back, the challenger is left loaded). :func:`run_canary` drives it all
through callables, so it runs the same in a DAG task, a test or a benchmark; every
:class:`StepAnalysis` (intermediate ones included) is JSON-serialisable for the MLflow record.

Thresholds come from :class:`CanaryPolicy` (built from settings with
:meth:`CanaryPolicy.from_settings`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ground.exceptions import PreflightError, SettingsError
from ground.settings import Settings
from ground.settings_defaults import (
    DEFAULT_CANARY_ANALYSIS_INTERVAL_S,
    DEFAULT_CANARY_BAKE_S,
    DEFAULT_CANARY_CONFIDENCE,
    DEFAULT_CANARY_COVERAGE_FEATURES,
    DEFAULT_CANARY_COVERAGE_MIN_REQUESTS,
    DEFAULT_CANARY_HARD_MIN_REQUESTS,
    DEFAULT_CANARY_MAX_ERROR_RATE,
    DEFAULT_CANARY_MAX_EXTENSIONS,
    DEFAULT_CANARY_MAX_LATENCY_RATIO,
    DEFAULT_CANARY_MAX_MEAN_LATENCY_MS,
    DEFAULT_CANARY_MAX_PREDICTION_KS,
    DEFAULT_CANARY_MAX_PREDICTION_PSI,
    DEFAULT_CANARY_MAX_QUALITY_DROP,
    DEFAULT_CANARY_MIN_LABELS,
    DEFAULT_CANARY_MIN_LATENCY_DELTA_MS,
    DEFAULT_CANARY_MIN_REQUESTS,
    DEFAULT_CANARY_QUALITY_METRIC,
    DEFAULT_CANARY_STEPS,
    DEFAULT_PREFLIGHT_MEMORY_FACTOR,
    DEFAULT_PREFLIGHT_MEMORY_MARGIN_MIB,
)
from ground.values import parse_steps
from repository_sync.canary_analysis import (  # noqa: F401 -- re-exported, the canary's public API
    CONTINUE,
    COUNT_METRIC,
    DEFAULT_MIN_PREDICTIONS,
    DEFAULT_SCRAPE_TIMEOUT_S,
    DURATION_METRIC,
    FAIL,
    FAILURE_METRIC,
    INCONCLUSIVE,
    MIN_CHAMPION_REQUESTS_FOR_RATIO,
    PASS,
    QUEUE_METRIC,
    SUCCESS_METRIC,
    CoverageReference,
    StepAnalysis,
    VersionCounters,
    VersionWindow,
    analyse_step,
    fetch_metrics_text,
    metrics_scraper,
    parse_triton_metrics,
    version_window,
)
from repository_sync.canary_checks import ExpectedBehaviour, Observations
from repository_sync.traffic_plan import TrafficPlan


# ------------------------------------------------------------------------------------ policy
@dataclasses.dataclass(frozen=True)
class CanaryPolicy:
    """Schedule and thresholds of a canary (see the settings of the same names for units).

    Attributes:
        steps, bake_s, min_requests, max_extensions: Schedule (``canary_*`` settings).
        analysis_interval_s: Seconds between analyses during a bake.
        hard_min_requests: Fewest challenger requests/predictions for a mid-bake rollback on
            errors, non-finite or constant outputs, or latency.
        max_error_rate, max_mean_latency_ms, max_latency_ratio: Hard limits.
        min_latency_delta_ms: The latency ratio fails a step only when the challenger's mean is
            also this many milliseconds above the champion's (scheduling noise on fast models).
        max_prediction_ks, max_prediction_psi: Expected-behaviour limits (with sampling margins).
        confidence: Confidence of the error-rate bound, the KS/PSI margins and the quality interval.
        min_predictions: Fewest challenger predictions for the expected-behaviour comparison.
        min_labels, quality_metric, max_quality_drop: The quality comparison with labels.
        coverage_min_requests, coverage_features: Feature-space coverage (``m`` and top features).

    Raises:
        SettingsError: A field is out of range; the message names it.
    """

    steps: tuple[int, ...] = parse_steps(DEFAULT_CANARY_STEPS)
    bake_s: float = DEFAULT_CANARY_BAKE_S
    min_requests: int = DEFAULT_CANARY_MIN_REQUESTS
    max_extensions: int = DEFAULT_CANARY_MAX_EXTENSIONS
    max_error_rate: float = DEFAULT_CANARY_MAX_ERROR_RATE
    max_mean_latency_ms: float = DEFAULT_CANARY_MAX_MEAN_LATENCY_MS
    max_latency_ratio: float = DEFAULT_CANARY_MAX_LATENCY_RATIO
    min_latency_delta_ms: float = DEFAULT_CANARY_MIN_LATENCY_DELTA_MS
    max_prediction_ks: float = DEFAULT_CANARY_MAX_PREDICTION_KS
    max_prediction_psi: float = DEFAULT_CANARY_MAX_PREDICTION_PSI
    min_predictions: int = DEFAULT_MIN_PREDICTIONS
    analysis_interval_s: float = DEFAULT_CANARY_ANALYSIS_INTERVAL_S
    hard_min_requests: int = DEFAULT_CANARY_HARD_MIN_REQUESTS
    confidence: float = DEFAULT_CANARY_CONFIDENCE
    min_labels: int = DEFAULT_CANARY_MIN_LABELS
    quality_metric: str = DEFAULT_CANARY_QUALITY_METRIC
    max_quality_drop: float = DEFAULT_CANARY_MAX_QUALITY_DROP
    coverage_min_requests: int = DEFAULT_CANARY_COVERAGE_MIN_REQUESTS
    coverage_features: int = DEFAULT_CANARY_COVERAGE_FEATURES

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", parse_steps(self.steps, "steps"))
        checks = {
            "bake_s": self.bake_s >= 0,
            "min_requests": self.min_requests >= 1,
            "max_extensions": self.max_extensions >= 0,
            "max_error_rate": 0 <= self.max_error_rate <= 1,
            "max_mean_latency_ms": self.max_mean_latency_ms > 0,
            "max_latency_ratio": self.max_latency_ratio > 0,
            "min_latency_delta_ms": self.min_latency_delta_ms >= 0,
            "max_prediction_ks": 0 <= self.max_prediction_ks <= 1,
            "max_prediction_psi": self.max_prediction_psi >= 0,
            "min_predictions": self.min_predictions >= 1,
            "analysis_interval_s": self.analysis_interval_s > 0,
            "hard_min_requests": self.hard_min_requests >= 1,
            "confidence": 0 < self.confidence < 1,
            "min_labels": self.min_labels >= 2,
            "quality_metric": self.quality_metric in ("auc", "accuracy"),
            "max_quality_drop": self.max_quality_drop >= 0,
            "coverage_min_requests": self.coverage_min_requests >= 0,
            "coverage_features": self.coverage_features >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise SettingsError(f"canary policy: {name}={getattr(self, name)!r} is out of range")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> "CanaryPolicy":
        """Policy from ``settings.canary_*`` fields, with keyword overrides (e.g. DAG params)."""
        values: dict[str, Any] = dict(
            steps=parse_steps(settings.canary_steps),
            bake_s=settings.canary_bake_s,
            min_requests=settings.canary_min_requests,
            max_extensions=settings.canary_max_extensions,
            max_error_rate=settings.canary_max_error_rate,
            max_mean_latency_ms=settings.canary_max_mean_latency_ms,
            max_latency_ratio=settings.canary_max_latency_ratio,
            min_latency_delta_ms=settings.canary_min_latency_delta_ms,
            max_prediction_ks=settings.canary_max_prediction_ks,
            max_prediction_psi=settings.canary_max_prediction_psi,
            analysis_interval_s=settings.canary_analysis_interval_s,
            hard_min_requests=settings.canary_hard_min_requests,
            confidence=settings.canary_confidence,
            min_labels=settings.canary_min_labels,
            quality_metric=settings.canary_quality_metric,
            max_quality_drop=settings.canary_max_quality_drop,
            coverage_min_requests=settings.canary_coverage_min_requests,
            coverage_features=settings.canary_coverage_features,
        )
        values.update(overrides)
        return cls(**values)

    @property
    def hard_confidence(self) -> float:
        """Per-analysis confidence of the hard checks (Bonferroni over one bake).

        Confidence of the hard checks' error-rate bound: ``confidence`` with its error level
        split over the analyses of one bake (Bonferroni), since every analysis is another look at
        the same step: ``1 - (1 - confidence) / ceil(bake_s / analysis_interval_s)``.
        """
        looks = max(1, math.ceil(self.bake_s / self.analysis_interval_s)) if self.bake_s > 0 else 1
        return 1.0 - (1.0 - self.confidence) / looks

    def thresholds(self) -> dict[str, Any]:
        """The thresholds as a JSON-serialisable dict (recorded with every verdict)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

# ------------------------------------------------------------------------------------ driver
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
    """

    model: str
    champion_version: int
    challenger_version: int
    outcome: str
    reason: str
    steps: list[StepAnalysis]
    rollback: RollbackRecord | None = None
    analyses: list[StepAnalysis] = dataclasses.field(default_factory=list)

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

    Returns:
        :class:`CanaryResult`; at ``"promoted"`` the gateway sends 100 % to the challenger.

    Raises:
        TrafficPlanError: A step's plan is invalid (before any traffic moves).
    """
    plans = [
        TrafficPlan.canary(model, champion, challenger, p, sticky_header=sticky_header)
        for p in policy.steps
    ]  # validated up front: a bad schedule moves no traffic
    steps: list[StepAnalysis] = []
    analyses: list[StepAnalysis] = []

    def fail(reason: str) -> CanaryResult:
        rec = rollback(
            model=model, champion=champion, apply_plan=apply_plan,
            unload_challenger=unload_challenger, reason=reason, clock=clock,
        )
        outcome = "rolled_back" if rec.gateway_ok else "rollback_failed"
        return CanaryResult(model, champion, challenger, outcome, reason, steps, rec, analyses)

    for index, (percent, plan) in enumerate(zip(policy.steps, plans, strict=True), start=1):
        try:
            apply_plan(plan)
        except Exception as exc:  # noqa: BLE001 -- the gateway kept the previous step; roll back
            return fail(f"step {index} ({percent}%): applying the traffic plan failed: {exc}")
        start = clock()
        before_text: str | None = None
        metrics_error: str | None = None
        try:
            before_text = scrape_metrics()
        except Exception as exc:  # noqa: BLE001
            metrics_error = str(exc)
        recent_text, recent_start = before_text, start
        attempt = 1
        baked = 0.0
        bake_until = float(policy.bake_s)
        while True:
            after_text = None
            if metrics_error is None:
                nap = max(0.0, min(policy.analysis_interval_s, bake_until - baked))
                sleep(nap)
                baked += nap
                try:
                    after_text = scrape_metrics()
                except Exception as exc:  # noqa: BLE001
                    metrics_error = str(exc)
            final = baked >= bake_until - 1e-9
            end = clock()
            gateway_counts = gateway_recent = None
            gateway_error = None if gateway_statuses is not None else "no gateway status log given"
            if gateway_statuses is not None and metrics_error is None:
                try:
                    gateway_counts = gateway_statuses(start, end)
                    gateway_recent = gateway_statuses(recent_start, end)
                except Exception as exc:  # noqa: BLE001 -- Triton's counters still judge
                    gateway_counts = gateway_recent = None
                    gateway_error = f"gateway status log unavailable: {exc}"
            observations = observations_error = None
            if observe is not None and metrics_error is None:
                try:
                    observations = observe(start, end)
                except Exception as exc:  # noqa: BLE001
                    observations_error = str(exc)
            analysis = analyse_step(
                policy=policy, model=model, champion=champion, challenger=challenger,
                step=index, percent=percent, attempt=attempt, window_start=start, window_end=end,
                before_text=before_text, after_text=after_text, metrics_error=metrics_error,
                recent_before_text=recent_text, final=final, observations=observations,
                observations_error=observations_error, expected=expected,
                coverage_reference=coverage_reference, gateway_counts=gateway_counts,
                gateway_recent=gateway_recent, gateway_error=gateway_error,
            )
            recent_text, recent_start = after_text, end
            analysis.index = len(analyses) + 1
            if analysis.verdict == INCONCLUSIVE and attempt > policy.max_extensions:
                analysis.verdict, analysis.unjudged = FAIL, True
                analysis.reasons.insert(
                    0, f"still inconclusive after {policy.max_extensions} extension(s) of the step"
                )
            analyses.append(analysis)
            if on_analysis is not None:
                on_analysis(analysis)
            if analysis.verdict != CONTINUE:
                steps.append(analysis)
                if on_step is not None:
                    on_step(analysis)
            if analysis.verdict == PASS:
                break
            if analysis.verdict == FAIL:
                when = "" if analysis.final else f" after {baked:g} s of its bake"
                return fail(f"step {index} ({percent}%) failed{when}: {analysis.reasons[0]}")
            if analysis.verdict == INCONCLUSIVE:
                attempt += 1  # extend the step: same window start, one more bake
                bake_until += float(policy.bake_s)
    return CanaryResult(model, champion, challenger, "promoted", "every step passed", steps,
                        analyses=analyses)


# ------------------------------------------------------------------------------------ pre-flight
@dataclasses.dataclass(frozen=True)
class PreflightReport:
    """Memory pre-flight figures (bytes). ``source`` is ``"gpu"`` or ``"host"``."""

    model_bytes: int
    required_bytes: int
    available_bytes: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict."""
        return dataclasses.asdict(self)


def model_files_bytes(path: Path | str) -> int:
    """Total size in bytes of the files under ``path`` (a model version folder) or of one file.

    Raises:
        PreflightError: ``path`` does not exist.
    """
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    if not p.is_dir():
        raise PreflightError(f"pre-flight: model path {str(p)!r} does not exist")
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def host_available_bytes(meminfo_path: Path | str = "/proc/meminfo") -> int:
    """Read ``MemAvailable`` from ``/proc/meminfo``, in bytes.

    ``MemAvailable`` from ``/proc/meminfo`` in bytes (the kernel's estimate of memory that can
    be allocated without swapping, see proc(5)).

    Raises:
        PreflightError: The file has no ``MemAvailable`` line.
    """
    for line in Path(meminfo_path).read_text().splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            factor = 1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1
            return int(parts[1]) * factor
    raise PreflightError(f"pre-flight: no MemAvailable line in {meminfo_path}")


def preflight_memory(
    model_bytes: int,
    *,
    factor: float = DEFAULT_PREFLIGHT_MEMORY_FACTOR,
    margin_bytes: int = DEFAULT_PREFLIGHT_MEMORY_MARGIN_MIB * 1024 * 1024,
    gpu_free_bytes: Callable[[], int | None] | None = None,
    meminfo_path: Path | str = "/proc/meminfo",
    model: str = "",
) -> PreflightReport:
    """Refuse a canary when the challenger cannot be loaded beside the (loaded) champion.

    The challenger needs about ``factor * model_bytes + margin_bytes`` (weights plus runtime
    buffers; a rule of thumb, tune ``settings.preflight_memory_factor``). It is compared with the
    free memory of the GPU (``gpu_free_bytes()``, e.g. from pynvml via ``model_registry.hardware``;
    ``None`` means no GPU) or, without a GPU, with the host's ``MemAvailable``.

    Raises:
        PreflightError: Not enough memory; the message names the model and the figures. Raised
            before any traffic is touched.
    """
    if model_bytes < 0:
        raise PreflightError(f"pre-flight: model_bytes={model_bytes} is negative")
    required = int(math.ceil(factor * model_bytes)) + int(margin_bytes)
    free = gpu_free_bytes() if gpu_free_bytes is not None else None
    source = "gpu"
    if free is None:
        free, source = host_available_bytes(meminfo_path), "host"
    report = PreflightReport(int(model_bytes), required, int(free), source)
    if free < required:
        mib = 1024 * 1024
        raise PreflightError(
            f"pre-flight refused the canary of model {model!r}: loading the challenger beside the "
            f"champion needs about {required / mib:.0f} MiB ({factor:g} x {model_bytes / mib:.1f} MiB "
            f"of model files + {margin_bytes / mib:.0f} MiB margin) but only {free / mib:.0f} MiB of "
            f"{source} memory is free; traffic was not touched"
        )
    return report


def preflight_from_settings(
    settings: Settings, model_path: Path | str, *, model: str = "",
    gpu_free_bytes: Callable[[], int | None] | None = None,
) -> PreflightReport:
    """:func:`preflight_memory` for the files under ``model_path`` with the settings' factor/margin."""
    return preflight_memory(
        model_files_bytes(model_path),
        factor=settings.preflight_memory_factor,
        margin_bytes=settings.preflight_memory_margin_mib * 1024 * 1024,
        gpu_free_bytes=gpu_free_bytes,
        model=model,
    )


__all__ = [
    "CONTINUE", "FAIL", "INCONCLUSIVE", "PASS", "CanaryPolicy", "CanaryResult", "CoverageReference",
    "PreflightReport", "RollbackRecord", "StepAnalysis", "VersionCounters", "VersionWindow",
    "analyse_step", "fetch_metrics_text", "host_available_bytes", "metrics_scraper",
    "model_files_bytes", "parse_triton_metrics", "preflight_from_settings",
    "preflight_memory", "rollback", "run_canary", "version_window",
]
