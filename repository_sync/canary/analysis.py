"""Canary step analysis: the judgement of one window of a canary step.

:func:`analyse_step` judges the window of a canary step (see :mod:`repository_sync.canary.runner`
for the rules and the driver) from two scrapes of Triton's Prometheus metrics, parsed by
:mod:`repository_sync.canary.metrics`, and from the logged requests, judged by
:mod:`repository_sync.canary.checks`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from ground.exceptions import DataError, MetricsUnavailableError
from repository_sync.canary.checks import (
    CoverageCheck,
    ExpectedBehaviour,
    Observations,
    binomial_lower_bound,
    coverage_check,
    expected_behaviour_checks,
    output_health,
    quality_check,
    scores_of,
)
from repository_sync.canary.class_shift import class_shift, class_shift_reason
from repository_sync.canary.metrics import VersionWindow, parse_triton_metrics, version_window
from repository_sync.canary.policy import CanaryPolicy

PASS = "pass"
FAIL = "fail"
INCONCLUSIVE = "inconclusive"
#: Verdict of an intermediate analysis that found no hard failure: the bake goes on.
CONTINUE = "continue"

#: Fewest champion requests in the window for the canary/champion latency ratio to be judged.
MIN_CHAMPION_REQUESTS_FOR_RATIO = 20


# ------------------------------------------------------------------------------------ analysis
@dataclasses.dataclass(frozen=True)
class CoverageReference:
    """What the coverage check measures against: the drift reference sample and the features.

    The features to check come most important first
    (:func:`repository_sync.canary.checks.important_features`).
    """

    frame: Any
    features: tuple[str, ...]


@dataclasses.dataclass
class StepAnalysis:
    """Figures and verdict of one analysis of a canary step (JSON-serialisable via :meth:`to_dict`).

    ``verdict`` is ``"pass"``, ``"fail"`` or ``"inconclusive"`` at the end of a bake (``final``),
    and ``"continue"`` or ``"fail"`` during it; ``reasons`` says why (every failed check, or what
    was not evaluated); ``hard`` marks a failure found by the hard checks; ``unjudged`` marks an
    analysis that could not measure the challenger (metrics or inference log unavailable, counters
    reset, challenger absent from the metrics, or a step still inconclusive after its extensions):
    its ``fail`` rolls back but says nothing of the challenger's quality. Figures are ``None``
    when not measurable. ``index`` numbers the analyses of the whole canary from 1.
    ``canary_requests``/``canary_failures`` are the larger of Triton's counts
    (``triton_requests``/``triton_failures``) and the gateway's (``gateway_requests``/
    ``gateway_failures``, ``None`` when its status log was not read); ``error_counts_source`` says
    which were used and, when the gateway's were not, why. ``prediction_classes`` is the per-class
    shift of a multi-class challenger from its expected predictions
    (:func:`repository_sync.canary.class_shift.class_shift`).
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
    final: bool = True
    hard: bool = False
    unjudged: bool = False
    index: int = 0
    canary_requests: float | None = None
    canary_failures: float | None = None
    canary_error_rate: float | None = None
    canary_error_rate_lower: float | None = None
    recent_requests: float | None = None
    recent_error_rate: float | None = None
    canary_mean_latency_ms: float | None = None
    triton_requests: float | None = None
    triton_failures: float | None = None
    gateway_requests: float | None = None
    gateway_failures: float | None = None
    error_counts_source: str | None = None
    champion_requests: float | None = None
    champion_mean_latency_ms: float | None = None
    latency_ratio: float | None = None
    predictions_canary_n: int | None = None
    predictions_nonfinite: int | None = None
    constant_outputs: list[str] | None = None
    predictions_expected_n: int | None = None
    prediction_source: str | None = None
    prediction_ks: float | None = None
    prediction_ks_pvalue: float | None = None
    prediction_ks_margin: float | None = None
    prediction_psi: float | None = None
    prediction_psi_margin: float | None = None
    prediction_checks: list[dict[str, Any]] | None = None
    prediction_classes: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None
    coverage_ratio: float | None = None
    coverage: dict[str, Any] | None = None
    thresholds: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (NaN and infinities become ``None`` so the JSON is strict)."""
        return _finite(dataclasses.asdict(self))

    def to_json(self) -> str:
        """Strict JSON of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return _finite(value.item())
    return value


def _with_gateway(w: VersionWindow, counts: Mapping[int, Any] | None, version: int) -> VersionWindow:
    """``w`` with requests and failures the larger of Triton's and the gateway's for ``version``.

    The gateway counts what clients got (:mod:`repository_sync.routing.gateway_status`): error responses
    a model returned, which Triton 2.51 counts as successes, and requests for a version Triton does
    not serve, which are in no version's counters. Taking the larger of each never hides a failure
    either source saw.
    """
    if counts is None:
        return w
    g = counts.get(int(version))
    if g is None:
        return w
    requests = max(w.requests, float(g.requests))
    failures = max(w.failures, float(g.failures))
    return dataclasses.replace(w, requests=requests, failures=failures,
                               error_rate=(failures / requests) if requests > 0 else None)


@dataclasses.dataclass
class _Findings:
    """The reasons one analysis collects, by weight, in the order they were found.

    ``hard`` fails at once (at any analysis), ``fails`` fails at the end of the bake, ``unsure``
    makes it inconclusive, ``notes`` only inform; ``blind`` repeats the failures of measurement
    (not of the challenger), so a verdict resting on them alone is marked unjudged.
    """

    hard: list[str] = dataclasses.field(default_factory=list)
    fails: list[str] = dataclasses.field(default_factory=list)
    unsure: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    blind: list[str] = dataclasses.field(default_factory=list)

    def unmeasurable(self, reason: str) -> None:
        """A hard failure of measurement: it fails the step but says nothing of the challenger."""
        self.blind.append(reason)
        self.hard.append(reason)


def _error_rate_failure(policy: CanaryPolicy, failures: float, requests: float, what: str) -> str | None:
    """A hard error-rate failure: enough requests and the rate's lower bound above the limit."""
    if requests < policy.hard_min_requests or failures <= 0:
        return None
    rate = failures / requests
    lower = binomial_lower_bound(failures, requests, policy.hard_confidence)
    if rate > policy.max_error_rate and lower > policy.max_error_rate:
        return (f"{what} {rate:.4f} ({failures:g}/{requests:g}) > max_error_rate "
                f"{policy.max_error_rate:g} (lower {policy.hard_confidence:.2%} bound {lower:.4f})")
    return None


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
    recent_before_text: str | None = None,
    final: bool = True,
    observations: Observations | None = None,
    observations_error: str | None = None,
    expected: ExpectedBehaviour | None = None,
    coverage_reference: CoverageReference | None = None,
    gateway_counts: Mapping[int, Any] | None = None,
    gateway_recent: Mapping[int, Any] | None = None,
    gateway_error: str | None = None,
    recent_start: float | None = None,
    look: bool = False,
) -> StepAnalysis:
    """Judge a step's window from two metrics scrapes, the gateway's statuses and the logged requests.

    Requests and failures of a version are the larger of Triton's counter deltas and the
    gateway's counts (``gateway_counts`` for the step's window, ``gateway_recent`` for the last
    interval: ``{version: StatusCounts}`` from
    :meth:`repository_sync.routing.gateway_status.GatewayStatusLog.counts`); without them (``None``, with
    ``gateway_error`` saying why) Triton's alone are used, and the record says so.

    Hard rules, at every analysis (any one fails the step at once):

    * metrics not scraped (``metrics_error`` or a text missing/unparsable), challenger absent from
      the last scrape, or a counter reset;
    * error rate above ``max_error_rate`` with its lower ``hard_confidence`` bound above it too,
      over at least ``hard_min_requests`` requests: over the step, or over the last interval
      (``recent_before_text`` -> ``after_text``);
    * with at least ``hard_min_requests`` and ``MIN_CHAMPION_REQUESTS_FOR_RATIO`` challenger
      requests: mean latency > ``max_mean_latency_ms``, or latency ratio to the champion >
      ``max_latency_ratio`` with a difference above ``min_latency_delta_ms`` (judged when the champion served at least
      ``MIN_CHAMPION_REQUESTS_FOR_RATIO`` requests too; a mean over fewer is noise);
    * non-finite logged outputs (same rule as errors: over the step, or over the logged requests
      since ``recent_start``, unix seconds, when the log has their ``timestamp``) or constant
      float outputs.

    Statistical rules, only when ``final`` (the end of the bake):

    * fewer than ``min_requests`` challenger requests -> inconclusive, unless the failures already
      seen exceed ``max_error_rate * min_requests`` -> fail; error rate > ``max_error_rate`` -> fail;
    * the challenger's predictions against ``expected`` (its own expected behaviour): fewer than
      ``min_predictions`` -> inconclusive; KS or PSI beyond threshold plus margin -> fail; no
      ``expected`` -> not evaluated (noted);
    * labels in ``observations``: quality against the champion; worse beyond
      ``max_quality_drop`` with confidence -> fail;
    * ``coverage_reference`` given: reference decile bins not covered -> inconclusive;
    * ``observations_error`` (the log could not be read) -> fail.

    Any ``fail`` wins over ``inconclusive``, which wins over ``pass``; during the bake the verdict
    is ``continue`` unless a hard rule failed.

    ``look`` (a hard-check look between two analyses, never ``final``) leaves the latency rules
    out: a mean over the first second or two of a freshly loaded version is its warm-up on a busy
    host, not its latency (a challenger measured 10.96 ms against the champion's 2.80 ms two
    seconds into a step, on a host at load 8, with nothing wrong); the analyses judge it over the
    longer window. Errors, non-finite and constant outputs and the measurement rules are judged
    at every look.

    Returns:
        The :class:`StepAnalysis` with figures, verdict and reasons.
    """
    a = StepAnalysis(
        model=model, champion_version=int(champion), challenger_version=int(challenger),
        step=step, percent=percent, attempt=attempt, window_start=window_start,
        window_end=window_end, verdict=PASS, reasons=[], final=final, thresholds=policy.thresholds(),
    )
    found = _Findings()
    before, after, recent, metrics_error = _parse_scrapes(
        before_text, after_text, recent_before_text, metrics_error)
    if metrics_error is not None:
        found.unmeasurable(f"metrics unavailable, analysis impossible: {metrics_error}")
    else:
        assert before is not None and after is not None  # else metrics_error is set
        _judge_traffic(a, policy, found, model=model, champion=champion, challenger=challenger,
                       scrapes=(before, after, recent), final=final, gateway_counts=gateway_counts,
                       gateway_recent=gateway_recent, gateway_error=gateway_error, look=look)
    if observations_error is not None:
        (found.fails if final else found.notes).append(
            f"inference log unavailable, output checks impossible: {observations_error}")
        found.blind.append((found.fails if final else found.notes)[-1])
    elif observations is not None:
        _observed(a, policy, observations, expected, coverage_reference, final, challenger, champion,
                  found, recent_start)
    elif final:
        found.notes.append("outputs not checked (no inference log)")
    _decide(a, found, final)
    return a


def _parse_scrapes(
    before_text: str | None, after_text: str | None, recent_before_text: str | None,
    metrics_error: str | None,
) -> tuple[Any, Any, Any, str | None]:
    """The parsed scrapes (before, after, recent) and why the metrics are unavailable, if they are."""
    before = after = recent = None
    if metrics_error is None:
        try:
            before = parse_triton_metrics(before_text) if before_text is not None else None
            after = parse_triton_metrics(after_text) if after_text is not None else None
            recent = parse_triton_metrics(recent_before_text) if recent_before_text is not None else None
        except MetricsUnavailableError as exc:
            metrics_error = str(exc)
        if metrics_error is None and (before is None or after is None):
            metrics_error = "a metrics scrape is missing"
    return before, after, recent, metrics_error


def _judge_traffic(
    a: StepAnalysis, policy: CanaryPolicy, found: _Findings, *, model: str, champion: int,
    challenger: int, scrapes: tuple[Any, Any, Any], final: bool,
    gateway_counts: Mapping[int, Any] | None, gateway_recent: Mapping[int, Any] | None,
    gateway_error: str | None, look: bool = False,
) -> None:
    """The checks on the counters: presence, resets, error rates, latency (not at a look) and volume."""
    before, after, recent = scrapes
    cw = version_window(before, after, model, challenger)
    hw = version_window(before, after, model, champion)
    a.triton_requests, a.triton_failures = cw.requests, cw.failures
    _record_gateway_counts(a, gateway_counts, gateway_error, challenger)
    cw = _with_gateway(cw, gateway_counts, challenger)
    hw = _with_gateway(hw, gateway_counts, champion)
    a.canary_requests, a.canary_failures = cw.requests, cw.failures
    a.canary_error_rate, a.canary_mean_latency_ms = cw.error_rate, cw.mean_latency_ms
    a.canary_error_rate_lower = binomial_lower_bound(cw.failures, cw.requests, policy.hard_confidence)
    a.champion_requests, a.champion_mean_latency_ms = hw.requests, hw.mean_latency_ms
    if not cw.present_after:
        found.unmeasurable(
            f"challenger {model!r} version {challenger} is not in Triton's metrics at the end of "
            "the window (unloaded, failed, or Triton restarted)"
        )
        return
    if cw.reset:
        found.unmeasurable(
            f"challenger {model!r} version {challenger} counters went backwards during the step "
            "(Triton restarted or the version was reloaded)"
        )
        return
    msg = _error_rate_failure(policy, cw.failures, cw.requests, "challenger error rate")
    if msg:
        found.hard.append(msg)
    if recent is not None:
        rw = _with_gateway(version_window(recent, after, model, challenger), gateway_recent, challenger)
        a.recent_requests, a.recent_error_rate = rw.requests, rw.error_rate
        msg = None if rw.reset else _error_rate_failure(
            policy, rw.failures, rw.requests, "challenger error rate over the last interval")
        if msg and not found.hard:
            found.hard.append(msg)
    if not look:
        _judge_latency(a, policy, found, cw, hw, final)
    if final and not found.hard:
        _judge_volume(policy, found, cw)


def _record_gateway_counts(a: StepAnalysis, gateway_counts: Mapping[int, Any] | None,
                           gateway_error: str | None, challenger: int) -> None:
    """Record the gateway's counts for the challenger and which counts the error rate uses."""
    if gateway_counts is not None:
        g = gateway_counts.get(int(challenger))
        a.gateway_requests = float(g.requests) if g is not None else 0.0
        a.gateway_failures = float(g.failures) if g is not None else 0.0
        a.error_counts_source = "max(triton, gateway)"
    else:
        a.error_counts_source = "triton only" + (f": {gateway_error}" if gateway_error else "")


def _judge_latency(a: StepAnalysis, policy: CanaryPolicy, found: _Findings, cw: VersionWindow,
                   hw: VersionWindow, final: bool) -> None:
    """The hard latency checks: the challenger's mean, and its ratio to the champion's."""
    latency_min = max(policy.hard_min_requests, MIN_CHAMPION_REQUESTS_FOR_RATIO)
    if cw.requests < latency_min or cw.mean_latency_ms is None:
        return
    if cw.mean_latency_ms > policy.max_mean_latency_ms:
        found.hard.append(
            f"challenger mean latency {cw.mean_latency_ms:.2f} ms > max_mean_latency_ms "
            f"{policy.max_mean_latency_ms:g}"
        )
    if hw.mean_latency_ms and hw.requests >= MIN_CHAMPION_REQUESTS_FOR_RATIO:
        a.latency_ratio = cw.mean_latency_ms / hw.mean_latency_ms
        delta_ms = cw.mean_latency_ms - hw.mean_latency_ms
        if a.latency_ratio > policy.max_latency_ratio and delta_ms > policy.min_latency_delta_ms:
            found.hard.append(
                f"challenger/champion mean latency ratio {a.latency_ratio:.2f} "
                f"({cw.mean_latency_ms:.2f}/{hw.mean_latency_ms:.2f} ms) > "
                f"max_latency_ratio {policy.max_latency_ratio:g} and {delta_ms:.2f} ms > "
                f"min_latency_delta_ms {policy.min_latency_delta_ms:g}"
            )
        elif a.latency_ratio > policy.max_latency_ratio and final:
            found.notes.append(f"latency ratio {a.latency_ratio:.2f} above {policy.max_latency_ratio:g} but "
                               f"only {delta_ms:+.2f} ms (<= min_latency_delta_ms "
                               f"{policy.min_latency_delta_ms:g}): not a regression")
    elif final:
        found.notes.append("latency ratio not evaluated (too few champion requests in the window)")


def _judge_volume(policy: CanaryPolicy, found: _Findings, cw: VersionWindow) -> None:
    """The end-of-bake traffic checks: enough challenger requests, and its error rate."""
    if cw.requests < policy.min_requests:
        if cw.failures > policy.max_error_rate * policy.min_requests:
            found.fails.append(
                f"{cw.failures:g} failed of {cw.requests:g} challenger requests: the error "
                f"rate cannot stay under {policy.max_error_rate:g} over "
                f"{policy.min_requests} requests"
            )
        else:
            found.unsure.append(
                f"only {cw.requests:g} challenger requests, fewer than min_requests="
                f"{policy.min_requests}: too little traffic to judge"
            )
    elif cw.error_rate is not None and cw.error_rate > policy.max_error_rate:
        found.fails.append(
            f"challenger error rate {cw.error_rate:.4f} ({cw.failures:g}/{cw.requests:g}) "
            f"> max_error_rate {policy.max_error_rate:g}"
        )


def _decide(a: StepAnalysis, found: _Findings, final: bool) -> None:
    """Set the verdict and reasons: hard, then fail, then continue, inconclusive, pass."""
    hard, fails, unsure, notes = found.hard, found.fails, found.unsure, found.notes
    # a fail only from what could not be measured says nothing of the challenger (no rejection)
    a.unjudged = bool(hard or fails) and all(r in found.blind for r in hard + fails)
    if hard:
        a.verdict, a.hard, a.reasons = FAIL, True, hard + fails + unsure + notes
    elif fails:
        a.verdict, a.reasons = FAIL, fails + unsure + notes
    elif not final:
        a.verdict, a.reasons = CONTINUE, ["no hard failure so far"] + notes
    elif unsure:
        a.verdict, a.reasons = INCONCLUSIVE, unsure + notes
    else:
        a.verdict, a.reasons = PASS, ["all checks within thresholds"] + notes


def _observed(a: StepAnalysis, policy: CanaryPolicy, obs: Observations,
              expected: ExpectedBehaviour | None, coverage_reference: CoverageReference | None,
              final: bool, challenger: int, champion: int, found: _Findings,
              recent_start: float | None = None) -> None:
    """The output, expected-behaviour, quality and coverage checks of :func:`analyse_step`."""
    rows = obs.rows_of(challenger)
    champ_rows = obs.rows_of(champion)
    cols = list(obs.prediction_columns)
    _judge_output_health(a, policy, found, rows, cols, _comparison_outputs(expected, cols, champ_rows),
                         recent_start)
    if not final or found.hard:
        return
    _judge_expected_behaviour(a, policy, found, obs, _finite_rows(rows, cols), cols, expected)
    _judge_quality(a, policy, found, obs, rows, champ_rows, cols)
    _judge_coverage(a, policy, found, obs, coverage_reference, challenger)


def _comparison_outputs(expected: ExpectedBehaviour | None, cols: list[str], champ_rows: Any) -> Any:
    """What the challenger's outputs should vary like: its expected outputs, else the champion's."""
    import numpy as np
    import pandas as pd

    if expected is not None and expected.columns:
        return pd.DataFrame({k: np.asarray(v, dtype=float) for k, v in expected.columns.items()})
    if expected is not None and len(cols) in (1, 2):
        return pd.DataFrame({cols[-1]: expected.scores})
    if len(champ_rows):
        return champ_rows
    return None


def _judge_output_health(a: StepAnalysis, policy: CanaryPolicy, found: _Findings, rows: Any,
                         cols: list[str], comparison: Any, recent_start: float | None = None) -> None:
    """The hard output checks: non-finite outputs (step, then recent rows), constant outputs."""
    health = output_health(rows, cols, comparison, policy.hard_min_requests)
    a.predictions_canary_n, a.predictions_nonfinite = health.n, health.nonfinite
    a.constant_outputs = health.constant_columns
    msg = _error_rate_failure(policy, health.nonfinite, health.n, "share of non-finite challenger outputs")
    recent = _rows_since(rows, recent_start)
    if msg is None and recent is not None and len(recent) < len(rows):
        late = output_health(recent, cols, None, policy.hard_min_requests)
        msg = _error_rate_failure(policy, late.nonfinite, late.n,
                                  "share of non-finite challenger outputs since the last analysis")
    if msg:
        found.hard.append(msg)
    if health.constant_columns:
        found.hard.append(f"challenger outputs {health.constant_columns} are constant over {health.n} "
                          f"predictions while its expected/champion outputs vary")


def _rows_since(rows: Any, start: float | None) -> Any:
    """The rows logged at or after ``start`` (unix s), or ``None`` (no start, or no timestamps)."""
    import pandas as pd

    if start is None or "timestamp" not in rows.columns or not len(rows):
        return None
    return rows[pd.to_datetime(rows["timestamp"], utc=True) >= pd.Timestamp(start, unit="s", tz="UTC")]


def _finite_rows(rows: Any, cols: list[str]) -> Any:
    """The challenger's rows whose prediction columns are all finite."""
    import numpy as np
    import pandas as pd

    if cols and len(rows):
        values = rows[[c for c in cols if c in rows.columns]].apply(pd.to_numeric, errors="coerce")
        return rows[np.isfinite(values.to_numpy(dtype=float)).all(axis=1)]
    return rows


def _judge_expected_behaviour(a: StepAnalysis, policy: CanaryPolicy, found: _Findings,
                              obs: Observations, finite: Any, cols: list[str],
                              expected: ExpectedBehaviour | None) -> None:
    """The challenger's predictions against its own expected behaviour (KS, PSI, class shift)."""
    if expected is None:
        found.notes.append("prediction check not evaluated: no expected behaviour of the challenger "
                           "(no shadow-evaluation predictions nor mirrored outputs given)")
        return
    if len(finite) < policy.min_predictions:
        found.unsure.append(f"only {len(finite)} challenger predictions, fewer than min_predictions="
                            f"{policy.min_predictions}")
        return
    try:
        checks = expected_behaviour_checks(
            finite, cols, obs.feature_columns, expected, confidence=policy.confidence,
            max_ks=policy.max_prediction_ks, max_psi=policy.max_prediction_psi)
    except DataError as exc:
        found.fails.append(f"prediction check impossible: {exc}")
        checks = []
    if not checks:
        return
    worst = max(checks, key=lambda c: (c.ks or 0.0) - (c.ks_margin or 0.0))
    a.prediction_source, a.predictions_expected_n = worst.source, worst.n_expected
    a.prediction_ks, a.prediction_ks_pvalue = worst.ks, worst.ks_pvalue
    a.prediction_ks_margin = worst.ks_margin
    a.prediction_psi, a.prediction_psi_margin = worst.psi, worst.psi_margin
    a.prediction_checks = [dataclasses.asdict(c) for c in checks]
    for c in checks:
        found.fails.extend(c.failed)
    try:  # a multi-class challenger: the classes together (repository_sync.canary.class_shift)
        a.prediction_classes = class_shift(finite, cols, obs.feature_columns, expected)
    except DataError as exc:
        found.notes.append(f"per-class prediction shift not computed: {exc}")
    if a.prediction_classes is not None and any(c.failed for c in checks):
        found.fails.append(class_shift_reason(a.prediction_classes))


def _judge_quality(a: StepAnalysis, policy: CanaryPolicy, found: _Findings, obs: Observations,
                   rows: Any, champ_rows: Any, cols: list[str]) -> None:
    """The challenger's quality against the champion's, where labels arrived."""
    import numpy as np
    import pandas as pd

    if not (obs.label_column and obs.label_column in obs.frame.columns):
        found.notes.append("quality not compared (no label arrived for the window's requests)")
        return

    def labelled(frame):
        score = scores_of(frame, cols)
        y = pd.to_numeric(frame[obs.label_column], errors="coerce").to_numpy(dtype=float)
        if score is None:
            return np.empty(0), np.empty(0)
        return y, score

    yc, sc = labelled(rows)
    yh, sh = labelled(champ_rows)
    try:
        q = quality_check(yc, sc, yh, sh, metric=policy.quality_metric,
                          min_labels=policy.min_labels, confidence=policy.confidence,
                          max_drop=policy.max_quality_drop)
    except DataError as exc:  # e.g. multi-class labels: noted, not a verdict on the model
        found.notes.append(f"quality not compared: {exc}")
        return
    a.quality = dataclasses.asdict(q)
    if q.failed:
        found.fails.append(f"quality: {q.note}")
    elif not q.evaluated:
        found.notes.append(q.note)


def _judge_coverage(a: StepAnalysis, policy: CanaryPolicy, found: _Findings, obs: Observations,
                    coverage_reference: CoverageReference | None, challenger: int) -> None:
    """The feature-space coverage of the reference's decile bins by the challenger's requests."""
    if coverage_reference is not None and policy.coverage_min_requests > 0 and len(obs.frame):
        mask = (obs.frame["model_version"].astype("int64") == int(challenger)).to_numpy()
        cov: CoverageCheck = coverage_check(coverage_reference.frame, coverage_reference.features,
                                            obs.frame, mask, min_requests=policy.coverage_min_requests)
        a.coverage, a.coverage_ratio = cov.to_dict(), cov.ratio
        if not cov.covered:
            found.unsure.append(cov.note)
        elif cov.note:
            found.notes.append(cov.note)
    elif coverage_reference is None:
        found.notes.append("feature-space coverage not evaluated (no drift reference)")
