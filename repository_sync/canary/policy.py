"""The canary's schedule and thresholds: :class:`CanaryPolicy`, built from the settings.

The canary's code takes a policy, never the settings: the pipelines build it with
:meth:`CanaryPolicy.from_settings` (DAG params as overrides) and pass it to
:func:`repository_sync.canary.runner.run_canary`, which hands it to every analysis
(:func:`repository_sync.canary.analysis.analyse_step`). Each field's default is the setting's
(:data:`ground.settings.DEFAULTS`), declared once in :class:`ground.settings.Settings`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ground.exceptions import SettingsError
from ground.settings import DEFAULTS, Settings
from ground.values import parse_steps

#: Fewest challenger predictions for the expected-behaviour comparison to be judged.
DEFAULT_MIN_PREDICTIONS = 30


@dataclasses.dataclass(frozen=True)
class CanaryPolicy:
    """Schedule and thresholds of a canary (see the settings of the same names for units).

    Attributes:
        steps, bake_s, min_requests, max_extensions: Schedule (``canary_*`` settings).
        analysis_interval_s: Seconds between analyses during a bake.
        hard_check_interval_s: Seconds between looks of the hard checks inside an analysis
            interval (0: only at the analyses).
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

    steps: tuple[int, ...] = parse_steps(DEFAULTS.canary_steps)
    bake_s: float = DEFAULTS.canary_bake_s
    min_requests: int = DEFAULTS.canary_min_requests
    max_extensions: int = DEFAULTS.canary_max_extensions
    max_error_rate: float = DEFAULTS.canary_max_error_rate
    max_mean_latency_ms: float = DEFAULTS.canary_max_mean_latency_ms
    max_latency_ratio: float = DEFAULTS.canary_max_latency_ratio
    min_latency_delta_ms: float = DEFAULTS.canary_min_latency_delta_ms
    max_prediction_ks: float = DEFAULTS.canary_max_prediction_ks
    max_prediction_psi: float = DEFAULTS.canary_max_prediction_psi
    min_predictions: int = DEFAULT_MIN_PREDICTIONS
    analysis_interval_s: float = DEFAULTS.canary_analysis_interval_s
    hard_check_interval_s: float = DEFAULTS.canary_hard_check_interval_s
    hard_min_requests: int = DEFAULTS.canary_hard_min_requests
    confidence: float = DEFAULTS.canary_confidence
    min_labels: int = DEFAULTS.canary_min_labels
    quality_metric: str = DEFAULTS.canary_quality_metric
    max_quality_drop: float = DEFAULTS.canary_max_quality_drop
    coverage_min_requests: int = DEFAULTS.canary_coverage_min_requests
    coverage_features: int = DEFAULTS.canary_coverage_features

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
            "hard_check_interval_s": math.isfinite(self.hard_check_interval_s) and self.hard_check_interval_s >= 0,
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
            hard_check_interval_s=settings.canary_hard_check_interval_s,
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
        split over the looks of one bake (Bonferroni), since every look is another test of the
        same step: ``1 - (1 - confidence) / ceil(bake_s / interval)``, where ``interval`` is the
        shorter of ``analysis_interval_s`` and a non-zero ``hard_check_interval_s``.
        """
        interval = self.analysis_interval_s
        if 0 < self.hard_check_interval_s < interval:
            interval = self.hard_check_interval_s
        looks = max(1, math.ceil(self.bake_s / interval)) if self.bake_s > 0 else 1
        return 1.0 - (1.0 - self.confidence) / looks

    def thresholds(self) -> dict[str, Any]:
        """The thresholds as a JSON-serialisable dict (recorded with every verdict)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}
