"""With the default canary thresholds, on the real NOAA weather series: challengers retrained
after the concept drift pass the canary, a challenger trained on flipped labels is rolled back.

Real data (``model_registry.datasets.load_noaa``), real models (``model_registry.training.train_noaa``)
and the real analysis (:func:`repository_sync.canary.runner.run_canary` with the default
:class:`~repository_sync.canary.policy.CanaryPolicy`: steps 5/25/50/100 %, 300 s bakes analysed every
5 s, KS 0.2, PSI 0.25). The traffic is simulated on a virtual clock (what the gateway and Triton
would count, what clients would log, labels that arrive within the step), so a 20-minute canary
runs in seconds; the same driver runs against a real Triton and NGINX in the integration tests.

The champion is trained on the years before the concept drift at day 12,000; the challengers on
the 480 days (10 logical hours of the demo) before the canary, after the drift. The challenger's
expected behaviour is its own predictions on that shadow window (what a shadow replay records);
the canary traffic is the 192 days after it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repository_sync.canary.analysis import CoverageReference
from repository_sync.canary.checks import EXPECTED_SCORE_COLUMN, ExpectedBehaviour, Observations
from repository_sync.canary.policy import CanaryPolicy
from repository_sync.canary.runner import run_canary
from tests.repository_sync.test_canary import triton_metrics_text

DAYS_PER_HOUR = 48
SHADOW_DAYS = 10 * DAYS_PER_HOUR
CANARY_DAYS = 4 * DAYS_PER_HOUR
RPS = 20


@pytest.fixture(scope="module")
def noaa():
    from model_registry.datasets import load_noaa

    return load_noaa()


@pytest.fixture(scope="module")
def champion(noaa):
    from model_registry.noaa_model import train_noaa

    return train_noaa(noaa.iloc[: 12_000 - 14 * DAYS_PER_HOUR])


class Traffic:
    """A virtual-clock gateway, Triton and client log for one canary.

    Every virtual second ``RPS`` requests (days of the canary window, drawn at random) are routed
    by the live plan's weights; each version answers with its model's probability of rain; the
    client logs features, prediction and version; each day's label arrives with its request.
    """

    def __init__(self, rows: pd.DataFrame, models: dict[int, object], seed: int):
        from model_registry.datasets import FEATURE_COLUMNS

        self.rows = rows.reset_index(drop=True)
        self.features = list(FEATURE_COLUMNS)
        self.scores = {v: m.predict_scores(self.rows) for v, m in models.items()}
        self.rng = np.random.default_rng(seed)
        self.t = 0.0
        self.weights: dict[int, int] = {}
        self.counts = {v: 0 for v in models}
        self.log: list[pd.DataFrame] = []
        self.unloaded = False

    def apply(self, plan):
        self.weights = plan.weights

    def sleep(self, seconds):
        n = int(round(seconds * RPS))
        if not n:
            return
        idx = self.rng.integers(0, len(self.rows), n)
        versions = np.array(list(self.weights))
        p = np.array([self.weights[v] for v in versions], dtype=float) / 100.0
        served = self.rng.choice(versions, size=n, p=p)
        frame = self.rows.loc[idx, self.features].reset_index(drop=True)
        frame["model_version"] = served
        frame["probability_rain"] = [self.scores[v][i] for v, i in zip(served, idx, strict=True)]
        frame["rain"] = self.rows.loc[idx, "rain"].to_numpy(dtype=float)
        frame["t"] = self.t + np.linspace(0, seconds, n, endpoint=False)
        self.log.append(frame)
        for v in versions:
            self.counts[int(v)] += int((served == v).sum())
        self.t += seconds

    def clock(self):
        return self.t

    def scrape(self):
        return triton_metrics_text({str(v): {"success": c, "duration_us": c * 2000}
                                    for v, c in self.counts.items()}, model="noaa_rain")

    def observe(self, start, end):
        frame = pd.concat(self.log, ignore_index=True)
        frame = frame[(frame["t"] >= start) & (frame["t"] < end)]
        return Observations(frame.drop(columns="t"), ("probability_rain",), tuple(self.features), "rain")

    def unload(self):
        self.unloaded = True


def canary(noaa, champion_model, challenger_model, canary_start: int, *, expected=True, seed=0):
    from drift_checks.reference import DEFAULT_REFERENCE_ROWS  # noqa: F401 -- the reference's sample rule
    from model_registry.datasets import FEATURE_COLUMNS

    shadow = noaa.iloc[canary_start - SHADOW_DAYS:canary_start]
    behaviour = None
    if expected:
        frame = shadow[list(FEATURE_COLUMNS)].reset_index(drop=True)
        frame[EXPECTED_SCORE_COLUMN] = challenger_model.predict_scores(shadow)
        behaviour = ExpectedBehaviour.from_frame(frame, source="shadow_replay")
    traffic = Traffic(noaa.iloc[canary_start:canary_start + CANARY_DAYS],
                      {1: champion_model, 2: challenger_model}, seed)
    reference = CoverageReference(shadow[list(FEATURE_COLUMNS)].reset_index(drop=True), tuple(FEATURE_COLUMNS))
    result = run_canary(model="noaa_rain", champion=1, challenger=2, policy=CanaryPolicy(),
                        apply_plan=traffic.apply, scrape_metrics=traffic.scrape,
                        unload_challenger=traffic.unload, observe=traffic.observe,
                        expected=behaviour, coverage_reference=reference, sleep=traffic.sleep,
                        clock=traffic.clock)
    return result, traffic


@pytest.mark.parametrize("hours_after_drift", [2, 5, 8, 12])
def test_good_challenger_after_the_concept_drift_passes_with_default_thresholds(noaa, champion, hours_after_drift):
    from model_registry.noaa_model import train_noaa

    start = 12_000 + hours_after_drift * DAYS_PER_HOUR
    good = train_noaa(noaa.iloc[start - SHADOW_DAYS:start])
    result, traffic = canary(noaa, champion, good, start, seed=hours_after_drift)
    assert result.outcome == "promoted", (result.reason, [s.reasons for s in result.steps])
    assert traffic.weights == {1: 0, 2: 100}
    judged = [s for s in result.steps if s.prediction_ks is not None]
    assert judged and all(s.prediction_source == "shadow_replay" for s in judged)
    # the stale champion predicts very differently: comparing with it would have failed the step
    assert any(s.quality and s.quality["evaluated"] and s.quality["difference"] > 0 for s in result.steps)
    assert all(s.coverage is not None for s in result.steps if s.verdict == "pass")


def test_flipped_label_challenger_is_rolled_back_against_a_good_champion(noaa):
    """As in the demo: after a promotion, a challenger trained on flipped labels is offered
    (without a shadow evaluation, so without expected predictions): the labels that arrive
    during its first step roll it back."""
    from model_registry.noaa_model import train_noaa

    start = 12_000 + 6 * DAYS_PER_HOUR
    window = noaa.iloc[start - SHADOW_DAYS:start]
    good = train_noaa(window)
    flipped = window.copy()
    flipped["rain"] = 1 - flipped["rain"].to_numpy()
    bad = train_noaa(flipped)
    result, traffic = canary(noaa, good, bad, start, expected=False)
    assert result.outcome == "rolled_back", result.reason
    assert traffic.weights == {1: 100} and traffic.unloaded
    failed = result.steps[-1]
    assert failed.verdict == "fail" and failed.percent == 5 and "quality" in result.reason
    assert failed.quality["ci_high"] < -CanaryPolicy().max_quality_drop
