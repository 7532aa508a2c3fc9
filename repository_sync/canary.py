"""Canary promotion: step schedule, per-step analysis, automatic rollback, pre-flight.

A canary moves a model's traffic to the challenger version in steps (default 5 -> 25 -> 50 ->
100 %, ``settings.canary_steps``). Each step bakes ``settings.canary_bake_s`` seconds and is then
judged by :func:`analyse_step` on

(a) the challenger's errors and latency, from the deltas of Triton's per-version Prometheus
    counters between a scrape at the start of the step and one at its end
    (``nv_inference_request_success``, ``nv_inference_request_failure`` summed over ``reason``,
    ``nv_inference_request_duration_us``; see Triton's metrics documentation,
    https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html);
(b) the challenger's prediction distribution against the champion's over the same period (two
    arrays in, e.g. from the inference log): two-sample Kolmogorov-Smirnov (scipy) and PSI;
(c) a minimum number of challenger requests: too little traffic is ``inconclusive``, never a pass.
    An inconclusive step is extended (baked again, the window growing) up to
    ``settings.canary_max_extensions`` times, then it fails.

An unreachable metrics endpoint, a challenger that disappears from Triton's metrics (unloaded,
Triton restarted) or counters that went backwards (restart mid-step) fail the step. A failed step
rolls back automatically in this order: the router goes to 100 % champion FIRST, then the
challenger is unloaded (never the reverse, so no request is routed to an unloaded version; if the
router cannot be rolled back, the challenger is left loaded). :func:`run_canary` drives it all
through callables, so it runs the same in a DAG task, a test or a benchmark; every
:class:`StepAnalysis` is JSON-serialisable for the record on the MLflow model version.

Thresholds come from :class:`CanaryPolicy` (built from settings with
:meth:`CanaryPolicy.from_settings`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from repository_sync.router import TrafficPlan
from tritonflow.exceptions import MetricsUnavailableError, PreflightError, SettingsError
from tritonflow.settings import (
    DEFAULT_CANARY_BAKE_S,
    DEFAULT_CANARY_MAX_ERROR_RATE,
    DEFAULT_CANARY_MAX_EXTENSIONS,
    DEFAULT_CANARY_MAX_LATENCY_RATIO,
    DEFAULT_CANARY_MAX_MEAN_LATENCY_MS,
    DEFAULT_CANARY_MAX_PREDICTION_KS,
    DEFAULT_CANARY_MAX_PREDICTION_PSI,
    DEFAULT_CANARY_MIN_REQUESTS,
    DEFAULT_CANARY_STEPS,
    DEFAULT_PREFLIGHT_MEMORY_FACTOR,
    DEFAULT_PREFLIGHT_MEMORY_MARGIN_MIB,
    Settings,
)

PASS = "pass"
FAIL = "fail"
INCONCLUSIVE = "inconclusive"

#: Significance level of the KS test: a prediction shift fails a step only when it is both
#: material (statistic above the threshold) and significant (p-value below this).
DEFAULT_KS_ALPHA = 0.05
#: Fewest predictions per side for the distribution comparison to be judged.
DEFAULT_MIN_PREDICTIONS = 30
#: Fewest champion requests in the window for the canary/champion latency ratio to be judged.
MIN_CHAMPION_REQUESTS_FOR_RATIO = 20
#: Number of PSI bins (deciles of the champion's predictions, the usual choice).
DEFAULT_PSI_BINS = 10
#: Floor of a bin share in PSI so empty bins give a finite value.
PSI_EPSILON = 1e-4
#: Seconds a metrics scrape may take.
DEFAULT_SCRAPE_TIMEOUT_S = 5.0

SUCCESS_METRIC = "nv_inference_request_success"
FAILURE_METRIC = "nv_inference_request_failure"
COUNT_METRIC = "nv_inference_count"
DURATION_METRIC = "nv_inference_request_duration_us"
QUEUE_METRIC = "nv_inference_queue_duration_us"


# ------------------------------------------------------------------------------------ policy
def parse_steps(value: str | Sequence[int], field: str = "canary_steps") -> tuple[int, ...]:
    """Parse and check a step schedule: integer percents, strictly increasing, ending at 100.

    Args:
        value: ``"5,25,50,100"`` or a sequence of ints.
        field: Name used in error messages.

    Raises:
        SettingsError: Not integers 1-100, not increasing, or the last step is not 100.
    """
    raw = value.split(",") if isinstance(value, str) else list(value)
    steps: list[int] = []
    for item in raw:
        text = str(item).strip()
        if isinstance(item, bool) or isinstance(item, float) or not text.lstrip("-").isdigit():
            raise SettingsError(f"{field}={value!r}: step {item!r} is not an integer percent")
        steps.append(int(text))
    if not steps or any(not 1 <= s <= 100 for s in steps):
        raise SettingsError(f"{field}={value!r}: expected percents between 1 and 100")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise SettingsError(f"{field}={value!r}: steps must increase strictly")
    if steps[-1] != 100:
        raise SettingsError(f"{field}={value!r}: the last step must be 100 (full promotion)")
    return tuple(steps)


@dataclasses.dataclass(frozen=True)
class CanaryPolicy:
    """Schedule and thresholds of a canary (see the settings of the same names for units).

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
    max_prediction_ks: float = DEFAULT_CANARY_MAX_PREDICTION_KS
    max_prediction_psi: float = DEFAULT_CANARY_MAX_PREDICTION_PSI
    ks_alpha: float = DEFAULT_KS_ALPHA
    min_predictions: int = DEFAULT_MIN_PREDICTIONS

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", parse_steps(self.steps, "steps"))
        checks = {
            "bake_s": self.bake_s >= 0,
            "min_requests": self.min_requests >= 1,
            "max_extensions": self.max_extensions >= 0,
            "max_error_rate": 0 <= self.max_error_rate <= 1,
            "max_mean_latency_ms": self.max_mean_latency_ms > 0,
            "max_latency_ratio": self.max_latency_ratio > 0,
            "max_prediction_ks": 0 <= self.max_prediction_ks <= 1,
            "max_prediction_psi": self.max_prediction_psi >= 0,
            "ks_alpha": 0 < self.ks_alpha < 1,
            "min_predictions": self.min_predictions >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise SettingsError(f"canary policy: {name}={getattr(self, name)!r} is out of range")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> "CanaryPolicy":
        """Policy from ``settings.canary_*`` fields, with keyword overrides (e.g. DAG params)."""
        values = dict(
            steps=parse_steps(settings.canary_steps),
            bake_s=settings.canary_bake_s,
            min_requests=settings.canary_min_requests,
            max_extensions=settings.canary_max_extensions,
            max_error_rate=settings.canary_max_error_rate,
            max_mean_latency_ms=settings.canary_max_mean_latency_ms,
            max_latency_ratio=settings.canary_max_latency_ratio,
            max_prediction_ks=settings.canary_max_prediction_ks,
            max_prediction_psi=settings.canary_max_prediction_psi,
        )
        values.update(overrides)
        return cls(**values)

    def thresholds(self) -> dict[str, Any]:
        """The thresholds as a JSON-serialisable dict (recorded with every verdict)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}


# ------------------------------------------------------------------------------------ metrics
@dataclasses.dataclass(frozen=True)
class VersionCounters:
    """Triton's cumulative per-version counters at one scrape.

    Attributes:
        success, failure: Request counts (failure summed over every ``reason`` label).
        inference_count: Inferences performed (a batched request counts its batch size).
        request_duration_us, queue_duration_us: Cumulative microseconds.
    """

    success: float = 0.0
    failure: float = 0.0
    inference_count: float = 0.0
    request_duration_us: float = 0.0
    queue_duration_us: float = 0.0


_FIELD_OF = {
    SUCCESS_METRIC: "success",
    FAILURE_METRIC: "failure",
    COUNT_METRIC: "inference_count",
    DURATION_METRIC: "request_duration_us",
    QUEUE_METRIC: "queue_duration_us",
}


def parse_triton_metrics(text: str) -> dict[tuple[str, str], VersionCounters]:
    """Parse Triton's Prometheus exposition text into per-(model, version) counters.

    Args:
        text: Body of ``GET http://<triton>:8002/metrics``.

    Returns:
        ``{(model, version): VersionCounters}`` for every model version Triton reports.

    Raises:
        MetricsUnavailableError: The text is not valid Prometheus exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    acc: dict[tuple[str, str], dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            # prometheus_client names a counter family without "_total" and its samples with it
            field = _FIELD_OF.get(family.name) or _FIELD_OF.get(family.name.removesuffix("_total"))
            if field is None:
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = (sample.labels.get("model", ""), sample.labels.get("version", ""))
                slot = acc.setdefault(key, {})
                slot[field] = slot.get(field, 0.0) + float(sample.value)
    except (ValueError, TypeError) as exc:
        raise MetricsUnavailableError(f"Triton metrics text is not Prometheus exposition format: {exc}") from exc
    return {key: VersionCounters(**fields) for key, fields in acc.items()}


def fetch_metrics_text(url: str, timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S) -> str:
    """``GET`` Triton's metrics endpoint.

    Raises:
        MetricsUnavailableError: No answer, a non-200 status, or a timeout; the message names the URL.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            if resp.status != 200:
                raise MetricsUnavailableError(f"metrics endpoint {url} answered HTTP {resp.status}")
            return resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise MetricsUnavailableError(f"metrics endpoint {url} answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise MetricsUnavailableError(f"metrics endpoint {url} unreachable: {exc}") from exc


def metrics_scraper(url: str, timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S) -> Callable[[], str]:
    """A ``scrape_metrics`` callable for :func:`run_canary` reading ``url``."""
    return lambda: fetch_metrics_text(url, timeout_s)


@dataclasses.dataclass(frozen=True)
class VersionWindow:
    """One version's traffic between two scrapes (counter deltas).

    Attributes:
        requests: Successful plus failed requests in the window.
        failures: Failed requests.
        error_rate: ``failures / requests`` (``None`` without requests).
        mean_latency_ms: Mean request duration of successful requests, ms (``None`` without any);
            Triton accumulates ``nv_inference_request_duration_us`` for successful requests.
        present_before, present_after: Whether Triton reported the version in each scrape.
        reset: A counter went backwards (Triton restarted or the version was reloaded).
    """

    requests: float
    failures: float
    error_rate: float | None
    mean_latency_ms: float | None
    present_before: bool
    present_after: bool
    reset: bool


def version_window(
    before: Mapping[tuple[str, str], VersionCounters],
    after: Mapping[tuple[str, str], VersionCounters],
    model: str,
    version: int | str,
) -> VersionWindow:
    """Deltas of one version's counters between two parsed scrapes.

    A version absent from ``before`` counts from zero (it was just loaded). When a counter went
    backwards the window is taken from zero (Prometheus ``increase`` semantics) and ``reset`` is set.
    """
    key = (model, str(version))
    b = before.get(key)
    a = after.get(key)
    if a is None:
        return VersionWindow(0.0, 0.0, None, None, b is not None, False, False)
    b0 = b or VersionCounters()
    reset = any(getattr(a, f) < getattr(b0, f) for f in _FIELD_OF.values())
    if reset:
        b0 = VersionCounters()
    succ = a.success - b0.success
    fail = a.failure - b0.failure
    dur = a.request_duration_us - b0.request_duration_us
    reqs = succ + fail
    return VersionWindow(
        requests=reqs,
        failures=fail,
        error_rate=(fail / reqs) if reqs > 0 else None,
        mean_latency_ms=(dur / succ / 1000.0) if succ > 0 else None,
        present_before=b is not None,
        present_after=True,
        reset=reset,
    )


# ------------------------------------------------------------------------------------ predictions
@dataclasses.dataclass(frozen=True)
class PredictionComparison:
    """Canary predictions against the champion's over the same period.

    Attributes:
        n_canary, n_champion: Number of predictions (rows) per side.
        ks_statistic, ks_pvalue: Two-sample KS (scipy.stats.ks_2samp); worst output column.
        psi: Population stability index with the champion as reference; worst output column.
    """

    n_canary: int
    n_champion: int
    ks_statistic: float
    ks_pvalue: float
    psi: float


def population_stability_index(reference: Any, current: Any, bins: int = DEFAULT_PSI_BINS) -> float:
    """PSI = sum((c_i - r_i) * ln(c_i / r_i)) over bins (Siddiqi, *Credit Risk Scorecards*, 2006).

    Bins are the deciles (``bins`` quantiles) of ``reference``; with at most ``bins`` distinct
    reference values (labels, rounded scores) each distinct value is its own bin. Bin shares are
    floored at ``PSI_EPSILON`` so empty bins give a finite value.

    Args:
        reference, current: 1-D arrays of numbers (NaNs dropped).

    Raises:
        ValueError: A side has no finite value.
    """
    import numpy as np

    ref = np.asarray(reference, dtype=float).ravel()
    cur = np.asarray(current, dtype=float).ravel()
    ref, cur = ref[np.isfinite(ref)], cur[np.isfinite(cur)]
    if ref.size == 0 or cur.size == 0:
        raise ValueError("population_stability_index: both sides need at least one finite value")
    uniq = np.unique(ref)
    if uniq.size <= bins:
        cats = np.unique(np.concatenate([uniq, np.unique(cur)]))
        r = np.array([(ref == v).mean() for v in cats])
        c = np.array([(cur == v).mean() for v in cats])
    else:
        edges = np.unique(np.quantile(ref, np.linspace(0, 1, bins + 1)[1:-1]))
        r = np.bincount(np.searchsorted(edges, ref, side="right"), minlength=edges.size + 1) / ref.size
        c = np.bincount(np.searchsorted(edges, cur, side="right"), minlength=edges.size + 1) / cur.size
    r = np.maximum(r, PSI_EPSILON)
    c = np.maximum(c, PSI_EPSILON)
    return float(np.sum((c - r) * np.log(c / r)))


def compare_predictions(canary: Any, champion: Any, bins: int = DEFAULT_PSI_BINS) -> PredictionComparison:
    """Compare prediction distributions: KS and PSI per output column, worst column reported.

    Args:
        canary: Predictions of the challenger, shape ``[n]`` or ``[n, k]`` (e.g. class probabilities).
        champion: Predictions of the champion over the same period, same number of columns.

    Raises:
        ValueError: Column counts differ or a side is empty.
    """
    import numpy as np
    from scipy.stats import ks_2samp

    a = np.asarray(canary, dtype=float)
    b = np.asarray(champion, dtype=float)
    a = a.reshape(len(a), -1) if a.ndim != 1 else a[:, None]
    b = b.reshape(len(b), -1) if b.ndim != 1 else b[:, None]
    if a.shape[0] == 0 or b.shape[0] == 0:
        raise ValueError(f"compare_predictions: empty side (canary {a.shape[0]}, champion {b.shape[0]} rows)")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"compare_predictions: canary has {a.shape[1]} output columns, champion {b.shape[1]}"
        )
    ks, pv, psi = 0.0, 1.0, 0.0
    for j in range(a.shape[1]):
        res = ks_2samp(a[:, j], b[:, j])
        if res.statistic >= ks:
            ks, pv = float(res.statistic), float(res.pvalue)
        psi = max(psi, population_stability_index(b[:, j], a[:, j], bins))
    return PredictionComparison(int(a.shape[0]), int(b.shape[0]), ks, pv, psi)


# ------------------------------------------------------------------------------------ analysis
@dataclasses.dataclass
class StepAnalysis:
    """Figures and verdict of one canary step (JSON-serialisable via :meth:`to_dict`).

    ``verdict`` is ``"pass"``, ``"fail"`` or ``"inconclusive"``; ``reasons`` says why (every
    failed check, or what was not evaluated). Figures are ``None`` when not measurable.
    """

    model: str
    champion_version: int
    challenger_version: int
    step: int
    percent: int
    attempt: int
    window_start: float
    window_end: float
    verdict: str
    reasons: list[str]
    canary_requests: float | None = None
    canary_failures: float | None = None
    canary_error_rate: float | None = None
    canary_mean_latency_ms: float | None = None
    champion_requests: float | None = None
    champion_mean_latency_ms: float | None = None
    latency_ratio: float | None = None
    predictions_canary_n: int | None = None
    predictions_champion_n: int | None = None
    prediction_ks: float | None = None
    prediction_ks_pvalue: float | None = None
    prediction_psi: float | None = None
    thresholds: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (NaN and infinities become ``None`` so the JSON is strict)."""
        out = dataclasses.asdict(self)
        for k, v in out.items():
            if isinstance(v, float) and not math.isfinite(v):
                out[k] = None
        return out

    def to_json(self) -> str:
        """Strict JSON of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)


def analyse_step(
    *,
    policy: CanaryPolicy,
    model: str,
    champion: int,
    challenger: int,
    step: int,
    percent: int,
    attempt: int,
    window_start: float,
    window_end: float,
    before_text: str | None,
    after_text: str | None,
    metrics_error: str | None = None,
    predictions: tuple[Any, Any] | None = None,
    predictions_error: str | None = None,
) -> StepAnalysis:
    """Judge one step from two metrics scrapes and (optionally) the two prediction samples.

    Rules, in order (any ``fail`` wins over ``inconclusive``, which wins over ``pass``):

    * metrics not scraped (``metrics_error`` or a text missing/unparsable) -> fail;
    * challenger absent from the end scrape (unloaded, Triton restarted) or a counter reset -> fail;
    * fewer than ``min_requests`` challenger requests -> inconclusive, unless the failures already
      seen exceed ``max_error_rate * min_requests`` (the rate could not come back under) -> fail;
    * error rate > ``max_error_rate``, mean latency > ``max_mean_latency_ms``, or latency ratio to
      the champion > ``max_latency_ratio`` (judged when the champion served at least
      ``MIN_CHAMPION_REQUESTS_FOR_RATIO`` requests) -> fail;
    * predictions given: fewer than ``min_predictions`` challenger predictions -> inconclusive;
      champion side too small (e.g. at 100 %) -> not evaluated (noted); KS statistic >
      ``max_prediction_ks`` with p < ``ks_alpha``, or PSI > ``max_prediction_psi`` -> fail.
      ``predictions_error`` (the log could not be read) -> fail.

    Returns:
        The :class:`StepAnalysis` with figures, verdict and reasons.
    """
    a = StepAnalysis(
        model=model, champion_version=int(champion), challenger_version=int(challenger),
        step=step, percent=percent, attempt=attempt, window_start=window_start,
        window_end=window_end, verdict=PASS, reasons=[], thresholds=policy.thresholds(),
    )
    fails: list[str] = []
    unsure: list[str] = []
    notes: list[str] = []

    before = after = None
    if metrics_error is None:
        try:
            before = parse_triton_metrics(before_text) if before_text is not None else None
            after = parse_triton_metrics(after_text) if after_text is not None else None
        except MetricsUnavailableError as exc:
            metrics_error = str(exc)
        if metrics_error is None and (before is None or after is None):
            metrics_error = "a metrics scrape is missing"
    if metrics_error is not None:
        fails.append(f"metrics unavailable, analysis impossible: {metrics_error}")
    else:
        cw = version_window(before, after, model, challenger)
        hw = version_window(before, after, model, champion)
        a.canary_requests, a.canary_failures = cw.requests, cw.failures
        a.canary_error_rate, a.canary_mean_latency_ms = cw.error_rate, cw.mean_latency_ms
        a.champion_requests, a.champion_mean_latency_ms = hw.requests, hw.mean_latency_ms
        if not cw.present_after:
            fails.append(
                f"challenger {model!r} version {challenger} is not in Triton's metrics at the end of "
                "the step (unloaded, failed, or Triton restarted)"
            )
        elif cw.reset:
            fails.append(
                f"challenger {model!r} version {challenger} counters went backwards during the step "
                "(Triton restarted or the version was reloaded)"
            )
        elif cw.requests < policy.min_requests:
            if cw.failures > policy.max_error_rate * policy.min_requests:
                fails.append(
                    f"{cw.failures:g} failed of {cw.requests:g} challenger requests: the error rate "
                    f"cannot stay under {policy.max_error_rate:g} over {policy.min_requests} requests"
                )
            else:
                unsure.append(
                    f"only {cw.requests:g} challenger requests, fewer than min_requests="
                    f"{policy.min_requests}: too little traffic to judge"
                )
        else:
            if cw.error_rate is not None and cw.error_rate > policy.max_error_rate:
                fails.append(
                    f"challenger error rate {cw.error_rate:.4f} ({cw.failures:g}/{cw.requests:g}) "
                    f"> max_error_rate {policy.max_error_rate:g}"
                )
            if cw.mean_latency_ms is not None and cw.mean_latency_ms > policy.max_mean_latency_ms:
                fails.append(
                    f"challenger mean latency {cw.mean_latency_ms:.2f} ms > max_mean_latency_ms "
                    f"{policy.max_mean_latency_ms:g}"
                )
            if (
                cw.mean_latency_ms is not None
                and hw.mean_latency_ms
                and hw.requests >= MIN_CHAMPION_REQUESTS_FOR_RATIO
            ):
                a.latency_ratio = cw.mean_latency_ms / hw.mean_latency_ms
                if a.latency_ratio > policy.max_latency_ratio:
                    fails.append(
                        f"challenger/champion mean latency ratio {a.latency_ratio:.2f} "
                        f"({cw.mean_latency_ms:.2f}/{hw.mean_latency_ms:.2f} ms) > max_latency_ratio "
                        f"{policy.max_latency_ratio:g}"
                    )
            else:
                notes.append("latency ratio not evaluated (too few champion requests in the window)")

    if predictions_error is not None:
        fails.append(f"prediction log unavailable, distribution check impossible: {predictions_error}")
    elif predictions is None:
        notes.append("prediction distribution not evaluated (no prediction source)")
    else:
        import numpy as np

        can, champ = (np.asarray(p, dtype=float) for p in predictions)
        a.predictions_canary_n, a.predictions_champion_n = int(len(can)), int(len(champ))
        if len(can) < policy.min_predictions:
            unsure.append(
                f"only {len(can)} challenger predictions, fewer than min_predictions={policy.min_predictions}"
            )
        elif len(champ) < policy.min_predictions:
            notes.append(
                f"prediction distribution not evaluated: only {len(champ)} champion predictions "
                "in the window"
            )
        else:
            cmp = compare_predictions(can, champ)
            a.prediction_ks, a.prediction_ks_pvalue, a.prediction_psi = (
                cmp.ks_statistic, cmp.ks_pvalue, cmp.psi
            )
            if cmp.ks_statistic > policy.max_prediction_ks and cmp.ks_pvalue < policy.ks_alpha:
                fails.append(
                    f"prediction KS {cmp.ks_statistic:.3f} (p={cmp.ks_pvalue:.2g}) > max_prediction_ks "
                    f"{policy.max_prediction_ks:g}"
                )
            if cmp.psi > policy.max_prediction_psi:
                fails.append(f"prediction PSI {cmp.psi:.3f} > max_prediction_psi {policy.max_prediction_psi:g}")

    if fails:
        a.verdict, a.reasons = FAIL, fails + unsure + notes
    elif unsure:
        a.verdict, a.reasons = INCONCLUSIVE, unsure + notes
    else:
        a.verdict, a.reasons = PASS, ["all checks within thresholds"] + notes
    return a


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
        steps: Every step analysis, extensions included, in order.
    """

    model: str
    champion_version: int
    challenger_version: int
    outcome: str
    reason: str
    steps: list[StepAnalysis]
    rollback: RollbackRecord | None = None

    @property
    def promoted(self) -> bool:
        """True when every step passed."""
        return self.outcome == "promoted"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict."""
        return {
            "model": self.model,
            "champion_version": self.champion_version,
            "challenger_version": self.challenger_version,
            "outcome": self.outcome,
            "reason": self.reason,
            "steps": [s.to_dict() for s in self.steps],
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

    Used automatically by :func:`run_canary` and manually (Airflow UI) by the DAG. If the gateway
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
    fetch_predictions: Callable[[float, float], tuple[Any, Any]] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.time,
    on_step: Callable[[StepAnalysis], Any] | None = None,
    sticky_header: str | None = None,
) -> CanaryResult:
    """Drive a canary through ``policy.steps``; roll back automatically on a failed step.

    Args:
        model, champion, challenger: Model name and the two Triton versions (both loaded).
        policy: Steps, bake time and thresholds.
        apply_plan: Makes a :class:`TrafficPlan` live (e.g. ``NginxRouter.apply``).
        scrape_metrics: Returns Triton's metrics text (e.g. :func:`metrics_scraper`); raising
            :class:`MetricsUnavailableError` (or anything) fails the step.
        unload_challenger: Unloads the challenger version (called only after the gateway rollback).
        fetch_predictions: ``(start, end) -> (challenger predictions, champion predictions)`` over
            that unix-time window (e.g. from the inference log); ``None`` skips check (b).
        sleep, clock: Injected for tests (``time.sleep``, ``time.time``).
        on_step: Called with each :class:`StepAnalysis` as soon as it is made (record to MLflow).
        sticky_header: Passed to every plan (same key, same version).

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

    def fail(reason: str) -> CanaryResult:
        rec = rollback(
            model=model, champion=champion, apply_plan=apply_plan,
            unload_challenger=unload_challenger, reason=reason, clock=clock,
        )
        outcome = "rolled_back" if rec.gateway_ok else "rollback_failed"
        return CanaryResult(model, champion, challenger, outcome, reason, steps, rec)

    for index, (percent, plan) in enumerate(zip(policy.steps, plans), start=1):
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
        attempt = 0
        while True:
            attempt += 1
            after_text = None
            if metrics_error is None:
                sleep(policy.bake_s)
                try:
                    after_text = scrape_metrics()
                except Exception as exc:  # noqa: BLE001
                    metrics_error = str(exc)
            end = clock()
            predictions = predictions_error = None
            if fetch_predictions is not None and metrics_error is None:
                try:
                    predictions = fetch_predictions(start, end)
                except Exception as exc:  # noqa: BLE001
                    predictions_error = str(exc)
            analysis = analyse_step(
                policy=policy, model=model, champion=champion, challenger=challenger,
                step=index, percent=percent, attempt=attempt, window_start=start, window_end=end,
                before_text=before_text, after_text=after_text, metrics_error=metrics_error,
                predictions=predictions, predictions_error=predictions_error,
            )
            if analysis.verdict == INCONCLUSIVE and attempt > policy.max_extensions:
                analysis.verdict = FAIL
                analysis.reasons.insert(
                    0, f"still inconclusive after {policy.max_extensions} extension(s) of the step"
                )
            steps.append(analysis)
            if on_step is not None:
                on_step(analysis)
            if analysis.verdict == PASS:
                break
            if analysis.verdict == FAIL:
                return fail(f"step {index} ({percent}%) failed: {analysis.reasons[0]}")
            # inconclusive: extend the step (same window start, one more bake)
    return CanaryResult(model, champion, challenger, "promoted", "every step passed", steps)


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
    """``MemAvailable`` from ``/proc/meminfo`` in bytes (the kernel's estimate of memory that can
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
    "CanaryPolicy", "CanaryResult", "PreflightReport", "PredictionComparison", "RollbackRecord",
    "StepAnalysis", "VersionCounters", "VersionWindow", "analyse_step", "compare_predictions",
    "fetch_metrics_text", "host_available_bytes", "metrics_scraper", "model_files_bytes",
    "parse_steps", "parse_triton_metrics", "population_stability_index", "preflight_from_settings",
    "preflight_memory", "rollback", "run_canary", "version_window",
]
