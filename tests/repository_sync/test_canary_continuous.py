"""The canary driver's continuous analysis: analyses every interval during a bake, hard failures
roll back at once, statistical checks and "pass" wait for the full bake.

The driver's interface is callables (gateway, Triton metrics, unload, sleep, the logged
requests); they are scripted here so the timing logic is tested without services. The same driver
runs against a real Triton and NGINX in ``test_canary.py`` and in
``tests/pipelines/test_canary_analysis_pipeline.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import SettingsError
from repository_sync.canary.analysis import CONTINUE, FAIL, PASS
from repository_sync.canary.checks import Observations
from repository_sync.canary.policy import CanaryPolicy
from repository_sync.canary.runner import run_canary
from tests.repository_sync.test_canary import MODEL, triton_metrics_text

POLICY = CanaryPolicy(steps=(25, 100), bake_s=300, min_requests=100, max_extensions=1,
                      max_mean_latency_ms=5000, max_latency_ratio=100, analysis_interval_s=5,
                      hard_check_interval_s=0)  # analyses only; the looks between them are tested below
LOOKING = dataclasses.replace(POLICY, hard_check_interval_s=1.0)


class Clocked:
    """Scripted Triton counters and inference log driven by a virtual clock (seconds slept).

    ``challenger_rps`` requests per second reach the challenger; from ``bad_from`` seconds on,
    they fail (``mode="error"``) or answer NaN (``mode="nan"``).
    """

    def __init__(self, challenger_rps=20.0, bad_from=None, mode="error"):
        self.t = 0.0
        self.rps, self.bad_from, self.mode = challenger_rps, bad_from, mode
        self.ok = self.failed = 0.0
        self.rows: list[dict] = []
        self.events: list[tuple] = []

    def sleep(self, seconds):
        self.events.append(("sleep", seconds))
        for _ in range(int(round(seconds * self.rps))):
            self.t += 1.0 / self.rps
            bad = self.bad_from is not None and self.t >= self.bad_from
            if bad and self.mode == "error":
                self.failed += 1
                continue
            self.ok += 1
            self.rows.append({"model_version": 7, "probability": np.nan if bad else 0.3 + 0.4 * (self.t % 1),
                              "timestamp": pd.Timestamp(self.t, unit="s", tz="UTC")})
        self.t = max(self.t, sum(e[1] for e in self.events if e[0] == "sleep"))

    def clock(self):
        return self.t

    def scrape(self):
        return triton_metrics_text({"6": {"success": 100 * self.t},
                                    "7": {"success": self.ok, "failure": self.failed,
                                          "duration_us": self.ok * 1000}})

    def observe(self, start, end):
        return Observations(pd.DataFrame(self.rows or {"model_version": [], "probability": [], "timestamp": []}),
                            ("probability",))

    def apply(self, plan):
        self.events.append(("apply", plan.weights))

    def unload(self):
        self.events.append(("unload",))


def drive(c: Clocked, policy=POLICY, **kw):
    analyses = []
    result = run_canary(model=MODEL, champion=6, challenger=7, policy=policy, apply_plan=c.apply,
                        scrape_metrics=c.scrape, unload_challenger=c.unload, observe=c.observe,
                        sleep=c.sleep, clock=c.clock, on_analysis=analyses.append, **kw)
    return result, analyses


def slept_before_rollback(c: Clocked) -> float:
    first = c.events.index(("apply", {6: 100}))
    return sum(e[1] for e in c.events[:first] if e[0] == "sleep")


def test_failing_challenger_is_rolled_back_at_the_first_analysis_not_at_the_end_of_the_bake():
    c = Clocked(challenger_rps=20, bad_from=62.0, mode="error")  # starts failing mid-step
    result, analyses = drive(c)
    assert result.outcome == "rolled_back"
    assert slept_before_rollback(c) == 65  # the analysis 3 s after the first error, not at 300 s
    assert [a.verdict for a in analyses[:-1]] == [CONTINUE] * 12
    assert analyses[-1].verdict == FAIL and analyses[-1].hard and not analyses[-1].final
    assert "after 65 s of its bake" in result.reason
    assert c.events[-2:] == [("apply", {6: 100}), ("unload",)]


def test_nan_answering_challenger_is_rolled_back_within_one_interval():
    c = Clocked(challenger_rps=20, bad_from=121.0, mode="nan")
    result, analyses = drive(c)
    assert result.outcome == "rolled_back"
    assert slept_before_rollback(c) == 125
    assert "non-finite" in result.reason


def test_pass_needs_the_full_bake_even_when_traffic_is_enough_early():
    c = Clocked(challenger_rps=50)  # min_requests reached within the first interval
    result, analyses = drive(c)
    assert result.outcome == "promoted", result.reason
    per_step = 300 / 5
    assert len(analyses) == 2 * per_step
    assert [a.verdict for a in result.steps] == [PASS, PASS]
    assert all(a.verdict == CONTINUE for a in analyses if not a.final)
    assert [a.index for a in analyses] == list(range(1, len(analyses) + 1))
    assert sum(e[1] for e in c.events if e[0] == "sleep") == 600


def test_a_bake_shorter_than_the_interval_is_analysed_once_at_its_end():
    c = Clocked(challenger_rps=400)
    result, analyses = drive(c, policy=CanaryPolicy(steps=(50, 100), bake_s=2, min_requests=100,
                                                    max_mean_latency_ms=5000, max_latency_ratio=100,
                                                    analysis_interval_s=5, hard_check_interval_s=1))
    assert result.outcome == "promoted"
    assert [e for e in c.events if e[0] == "sleep"] == [("sleep", 1)] * 4  # a look mid-bake each step
    assert len(analyses) == 2 and all(a.final for a in analyses)


def test_inconclusive_step_is_extended_with_continuous_analysis_in_the_extension():
    c = Clocked(challenger_rps=0.25)  # 25 requests per 100 s bake, 100 needed
    result, analyses = drive(c, policy=CanaryPolicy(steps=(50, 100), bake_s=100, min_requests=100,
                                                    max_extensions=1, analysis_interval_s=20,
                                                    max_mean_latency_ms=5000, max_latency_ratio=100))
    assert result.outcome == "rolled_back"
    assert [(a.attempt, a.verdict) for a in result.steps] == [(1, "inconclusive"), (2, FAIL)]
    assert len(analyses) == 10  # 5 per bake, the extension analysed as continuously


def test_hard_checks_between_analyses_roll_a_failing_challenger_back_within_a_second():
    c = Clocked(challenger_rps=20, bad_from=61.2, mode="error")  # early in the 60-65 s interval
    result, analyses = drive(c, policy=LOOKING)
    assert result.outcome == "rolled_back"
    assert slept_before_rollback(c) == 62  # the look after the fault, not the analysis at 65 s
    assert analyses[-1].verdict == FAIL and analyses[-1].hard and not analyses[-1].final
    assert "after 62 s of its bake" in result.reason


def test_hard_checks_between_analyses_catch_nan_answers_at_the_next_look():
    c = Clocked(challenger_rps=20, bad_from=121.0, mode="nan")
    result, _ = drive(c, policy=LOOKING)
    assert result.outcome == "rolled_back"
    assert slept_before_rollback(c) == 122
    assert "non-finite" in result.reason


def test_nan_answers_late_in_a_long_step_are_judged_over_the_last_interval_not_diluted_by_the_step():
    c = Clocked(challenger_rps=20, bad_from=291.0, mode="nan")  # 5,800 good rows before: 1.4 % NaN
    result, _ = drive(c)
    assert result.outcome == "rolled_back"
    assert slept_before_rollback(c) == 295  # the first analysis after the fault
    assert "non-finite challenger outputs since the last analysis" in result.reason


def test_looks_that_pass_are_not_recorded_and_do_not_change_the_bake():
    c = Clocked(challenger_rps=50)
    result, analyses = drive(c, policy=LOOKING)
    assert result.outcome == "promoted", result.reason
    assert len(analyses) == 2 * 300 / 5  # only the analyses, as without the looks
    sleeps = [e[1] for e in c.events if e[0] == "sleep"]
    assert set(sleeps) == {1.0} and sum(sleeps) == 600
    scrapes_per_interval = 5  # four looks and the analysis
    assert len(sleeps) == 2 * 300 / 5 * scrapes_per_interval


def test_the_hard_error_bound_splits_its_confidence_over_every_look():
    assert POLICY.hard_confidence == 1 - 0.05 / 60
    assert LOOKING.hard_confidence == 1 - 0.05 / 300
    assert dataclasses.replace(LOOKING, hard_check_interval_s=10).hard_confidence == 1 - 0.05 / 60


def test_a_hard_check_interval_that_is_not_a_number_is_refused_by_name():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(SettingsError, match="hard_check_interval_s"):
            dataclasses.replace(POLICY, hard_check_interval_s=bad)


class ColdStart(Clocked):
    """The challenger's first ``cold`` requests take 30 ms (a fresh version warming up), then 1 ms;
    the champion's take 1 ms."""

    def __init__(self, cold, **kw):
        super().__init__(**kw)
        self.cold, self.duration_us = cold, 0.0

    def sleep(self, seconds):
        before = self.ok
        super().sleep(seconds)
        for i in range(int(before), int(self.ok)):
            self.duration_us += 30_000 if i < self.cold else 1_000

    def scrape(self):
        return triton_metrics_text({"6": {"success": 100 * self.t, "duration_us": 100 * self.t * 1000},
                                    "7": {"success": self.ok, "failure": self.failed,
                                          "duration_us": self.duration_us}})


LATENCY = dataclasses.replace(LOOKING, max_latency_ratio=1.5, min_latency_delta_ms=5, max_mean_latency_ms=50)


def test_a_look_leaves_latency_to_the_analyses_so_a_fresh_versions_warm_up_is_not_a_rollback():
    c = ColdStart(cold=10, challenger_rps=20)  # 15.5 ms mean at the 1 s look, 3.9 ms at the 5 s analysis
    result, analyses = drive(c, policy=LATENCY)
    assert result.outcome == "promoted", result.reason
    assert analyses[0].latency_ratio is not None and analyses[0].latency_ratio < 5


def test_the_analysis_still_rolls_a_slow_challenger_back_on_latency():
    c = ColdStart(cold=10_000, challenger_rps=20)  # 30 ms throughout
    result, analyses = drive(c, policy=LATENCY)
    assert result.outcome == "rolled_back"
    assert slept_before_rollback(c) == 5  # the first analysis, not a look before it
    assert "latency ratio" in result.reason
