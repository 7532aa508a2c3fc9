"""Drift decision quality on NOAA: false alarms in quiet stretches and delay after known shifts.

Usage::

    .venv/bin/python benchmarks/drift_quality.py                   # all policies (~5-10 min)
    .venv/bin/python benchmarks/drift_quality.py --skip-evidently  # without Evidently (~2 min)
    .venv/bin/python benchmarks/drift_quality.py --demo            # also the demo's replays

Data: the NOAA series (``model_registry.datasets``), 48 consecutive days per window (the demo's
mapping: one logical hour). The known shifts are DESIGN.md §4's (``KNOWN_SHIFTS``): days 3,000
(wind speeds drop), 8,000 (visibility jumps; the step lands around day 8,064-8,112), 12,000
(concept drift: pressure, dew point and the wind columns change) and 16,000 (pressure falls).

Each shift is one scenario, as a model retrained on the data just before it would face it: the
reference is the 2,000 days before the replay (the model's training data; for the logistic
regression fitted on them, each input's permutation importance is computed the way the publish
step does), then ``Q`` quiet windows (no known shift), then the shift and 10 more windows. The
replay starts ``48 * Q`` days before the shift, so a window starts exactly on the shift day.

* ``alarms_per_100_quiet``: alarms in the quiet windows of all scenarios, per 100 quiet windows.
* ``delays``: per shift, windows from the window starting on the shift day to the first alarm at
  or after it (``null``: no alarm within the 10 windows).

Policies, side by side on the same windows:

* ``tritonflow``: ``tritonflow drift backtest`` (:func:`drift_checks.backtest.run_backtest`) with
  the default settings; an alarm is a drift alert (the asset event the DAG emits). The period is
  undeclared, so the season-matched run rule (:mod:`drift_checks.policy`) takes the one the
  reference's times give (:func:`drift_checks.season_match.choose_period`): NOAA's days are mapped
  to timestamps one day apart and a 2,000-day reference covers a year twice, so a year.
* ``tritonflow_no_season``: the same without the season-matched run rule
  (``TRITONFLOW_DRIFT_SEASONAL_RUN_WINDOWS=0``): the policy before it.
* ``tritonflow_no_run_rule``: without either run rule (``TRITONFLOW_DRIFT_SUSTAINED_WINDOWS=0``,
  ``TRITONFLOW_DRIFT_SEASONAL_RUN_WINDOWS=0``): the policy before them.
* ``tritonflow_training_seasonal``: the default policy with the seasonally matched reference
  (``TRITONFLOW_DRIFT_REFERENCE_STRATEGY=training_seasonal``, the period from the times as above,
  a year: :mod:`drift_checks.season_match`), scored out of sample as well; a comparison, not the goal's
  policy (the goals are judged on the defaults).
* ``today``: the product's earlier drift policy, re-implemented here on the same registry statistics:
  static thresholds (K-S p 0.05, PSI 0.1, Wasserstein 0.1, inclusive) until 48 windows of history,
  then the P95 (P5 for p-values) of every past value; a feature flagged when 2 of its 3 statistics
  cross; "drift" when flagged in 2 consecutive windows; an alarm when the uniform share of drift
  features reaches 0.5 (the old event rule).
* ``evidently``: Evidently 0.7 ``DataDriftPreset`` defaults on each window (dataset drift when half
  of the columns drift, per-column tests chosen by Evidently).

These are the windows the run rule was tuned on: the figures above are **in-sample**. The
default policy (with and without the season-matched run rule) is then scored **out of sample**, on windows
it never saw (``--skip-out-of-sample`` leaves them out):

* ``noaa_quiet``: the other NOAA stretches, away from the known shifts and from the tuned windows
  (:data:`OTHER_STRETCHES`: reference, then quiet windows); every alert is a false one.
* ``shuffled``: shuffled controls (:data:`SHUFFLED`): a NOAA stretch whose days are shuffled
  (seeded) before it is cut into a 2,000-day reference and one model-week of 168 windows, so
  nothing drifts and every alert is false.
* ``offset_shifts``: the four known shifts with another reference (the 2,000 days ending
  :data:`OFFSET_QUIET` windows before the shift) and windows cut half a window later, so the shift
  day falls inside a window the tuning never cut; the delay counts from that window.

False alerts are given per 100 windows and per model-week (168 windows) with the exact 95 %
Clopper-Pearson upper bound (:func:`drift_checks.budget.realised_rate`), beside the policy's
budget (``TRITONFLOW_DRIFT_FALSE_ALARM_BUDGET_PER_WEEK``).

The last printed line is the standard JSON object (:mod:`benchmarks.report`) with the figures of
every policy; the goals are judged on ``tritonflow``: in sample, every delay <= 2 windows and
``alarms_per_100_quiet`` <= 1; out of sample, at most 1 false alert per model-week on the shuffled
controls and every offset shift caught within 2 windows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

DAYS_PER_WINDOW = 48
REFERENCE_DAYS = 2000
AFTER = 10
#: shift day -> quiet windows before it
SCENARIOS = {3000: 20, 8000: 20, 12000: 38, 16000: 40}
#: Out of sample: (reference start, reference end = replay start, replay end) in days, away from the
#: known shifts and from the tuned windows (days 2,040-3,480, 7,040-8,480, 10,176-12,480, 14,080-16,480).
OTHER_STRETCHES = ((3480, 5480, 7040), (8200, 9700, 10176), (12480, 13520, 14080), (16480, 17500, 18159))
#: Out of sample: (first day, seed) of each shuffled control (2,000 reference days + 168 windows).
SHUFFLED = ((0, 1), (8000, 2))
#: Out of sample: quiet windows before each known shift when the windows are cut half a window later.
OFFSET_QUIET = 6
#: The default policy without the season-matched run rule (:mod:`drift_checks.policy`).
NO_SEASON_ENV = {"TRITONFLOW_DRIFT_SEASONAL_RUN_WINDOWS": "0"}
#: The default policy with the seasonally matched reference (``training_seasonal``; its period, a
#: year, from the reference's times: the days are mapped to timestamps one day apart).
SEASONAL_ENV = {"TRITONFLOW_DRIFT_REFERENCE_STRATEGY": "training_seasonal"}


def _champion_importance(frame: pd.DataFrame, features: list[str]) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression

    from drift_checks.importance import permutation_importances

    model = LogisticRegression(max_iter=1000).fit(frame[features], frame["rain"])
    return permutation_importances(model.predict_proba, frame[features])


def _ts(day: int) -> pd.Timestamp:
    return pd.Timestamp(day, unit="D", tz="UTC")


def replay(table, features, ref_start, start, end, env=None) -> list[bool]:
    """Alerts of ``tritonflow drift backtest`` on ``table``: reference days [ref_start, start), windows to ``end``."""
    from drift_checks.backtest import run_backtest
    from drift_checks.strategies import ReferenceStrategy
    from drift_checks.verdict import CheckConfig
    from ground.settings import Settings

    end = start + (end - start) // DAYS_PER_WINDOW * DAYS_PER_WINDOW  # whole windows only
    ref = table[(table["day"] >= ref_start) & (table["day"] < start)]
    settings = Settings.from_env(env or {})
    with tempfile.TemporaryDirectory() as tmp:
        doc = run_backtest(table[["day", *features]], time_column="day", time_unit="D", out_dir=tmp,
                           reference_range=(_ts(ref_start), _ts(start)), window=str(DAYS_PER_WINDOW),
                           importance=_champion_importance(ref, features),
                           config=CheckConfig.from_settings(settings),
                           strategy=ReferenceStrategy.from_settings(settings),
                           replay_end=_ts(end), html_report=False)
    return [w["alert"] for w in doc["windows"]]


def run_tritonflow(noaa, features, shift, quiet, env=None) -> list[bool]:
    start = shift - quiet * DAYS_PER_WINDOW
    return replay(noaa, features, start - REFERENCE_DAYS, start, shift + AFTER * DAYS_PER_WINDOW, env)


def out_of_sample(noaa, features, budget: float, env=None) -> dict:
    """A policy (default: the default one) on windows the tuning never saw (module docstring)."""
    from drift_checks.budget import realised_rate

    stretches = [replay(noaa, features, a, b, c, env) for a, b, c in OTHER_STRETCHES]
    controls = []
    for first, seed in SHUFFLED:
        rows = noaa.iloc[first:first + REFERENCE_DAYS + 168 * DAYS_PER_WINDOW]
        shuffled = rows.sample(frac=1.0, random_state=seed).reset_index(drop=True)
        shuffled["day"] = np.arange(len(shuffled))
        controls.append(replay(shuffled, features, 0, REFERENCE_DAYS, len(shuffled), env))
    delays = []
    for shift in SCENARIOS:
        start = shift - OFFSET_QUIET * DAYS_PER_WINDOW + DAYS_PER_WINDOW // 2
        alarms = replay(noaa, features, start - REFERENCE_DAYS, start, shift + AFTER * DAYS_PER_WINDOW, env)
        hit = [i - (OFFSET_QUIET - 1) for i, a in enumerate(alarms) if a and i >= OFFSET_QUIET - 1]
        delays.append(hit[0] if hit else None)  # window OFFSET_QUIET - 1 holds the shift day
    return {"noaa_quiet": realised_rate(sum(map(sum, stretches)), sum(map(len, stretches)), budget),
            "noaa_quiet_alert_windows": [[i for i, a in enumerate(s) if a] for s in stretches],
            "shuffled": realised_rate(sum(map(sum, controls)), sum(map(len, controls)), budget),
            "shuffled_alert_windows": [[i for i, a in enumerate(c) if a] for c in controls],
            "offset_shift_delays": delays}


def run_today(noaa, features, shift, quiet) -> list[bool]:
    """The pre-issue-12 decision rule on the registry's statistics (see the module docstring)."""
    from drift_checks import statistics as st

    start = shift - quiet * DAYS_PER_WINDOW
    ref = {c: st.prepare_numeric(noaa[c].iloc[start - REFERENCE_DAYS:start]) for c in features}
    names = ("ks_p_value", "psi", "wasserstein_normed")
    static = {"ks_p_value": 0.05, "psi": 0.1, "wasserstein_normed": 0.1}
    past: dict[tuple[str, str], list[float]] = {}
    prev_flag = {c: False for c in features}
    alarms = []
    for w in range(quiet + AFTER):
        a = start + w * DAYS_PER_WINDOW
        flags = {}
        for c in features:
            res = st.score_numeric(ref[c], st.prepare_numeric(noaa[c].iloc[a:a + DAYS_PER_WINDOW]), names)
            n_flag = 0
            for n in names:
                hist = past.setdefault((c, n), [])
                if len(hist) >= 48:
                    thr = float(np.quantile(hist, 0.05 if n == "ks_p_value" else 0.95))
                else:
                    thr = static[n]
                v = res[n].value
                n_flag += (v <= thr) if n == "ks_p_value" else (v >= thr)
                hist.append(v)
            flags[c] = n_flag >= 2
        drift = [c for c in features if flags[c] and prev_flag[c]]
        alarms.append(len(drift) / len(features) >= 0.5)
        prev_flag = flags
    return alarms


def run_evidently(noaa, features, shift, quiet) -> list[bool]:
    import warnings

    from evidently import DataDefinition, Dataset, Report
    from evidently.presets import DataDriftPreset

    warnings.filterwarnings("ignore")
    start = shift - quiet * DAYS_PER_WINDOW
    dd = DataDefinition(numerical_columns=features)
    ref = Dataset.from_pandas(noaa[features].iloc[start - REFERENCE_DAYS:start].reset_index(drop=True),
                              data_definition=dd)
    alarms = []
    for w in range(quiet + AFTER):
        a = start + w * DAYS_PER_WINDOW
        cur = Dataset.from_pandas(noaa[features].iloc[a:a + DAYS_PER_WINDOW].reset_index(drop=True),
                                  data_definition=dd)
        snap = Report([DataDriftPreset()]).run(cur, ref)
        share = next(m["value"]["share"] for m in snap.dict()["metrics"]
                     if m["config"].get("type", "").endswith("DriftedColumnsCount"))
        alarms.append(share >= 0.5)
    return alarms


def score(runs: dict[int, list[bool]], budget: float) -> dict:
    from drift_checks.budget import realised_rate

    quiet_alarms = quiet_windows = 0
    delays = []
    for shift, quiet in SCENARIOS.items():
        alarms = runs[shift]
        quiet_alarms += sum(alarms[:quiet])
        quiet_windows += quiet
        after = [i - quiet for i, a in enumerate(alarms) if a and i >= quiet]
        delays.append(after[0] if after else None)
    return {"alarms_per_100_quiet": round(100 * quiet_alarms / quiet_windows, 2), "quiet_alarms": quiet_alarms,
            "quiet_windows": quiet_windows, "false_alarms": realised_rate(quiet_alarms, quiet_windows, budget),
            "delays": delays}


def side_by_side(in_sample: dict, oos: dict) -> list[dict]:
    """In-sample and out-of-sample rows of one table: false alerts per 100 windows and per week, delays."""
    keys = ("windows", "alerts", "per_100_windows", "per_100_windows_upper", "per_week", "per_week_upper")
    rows = [("in sample: tuned NOAA windows", in_sample["false_alarms"], in_sample["delays"]),
            ("out of sample: other NOAA stretches", oos["noaa_quiet"], None),
            ("out of sample: shuffled controls", oos["shuffled"], None),
            ("out of sample: offset shifts", None, oos["offset_shift_delays"])]
    return [{"set": name, **{k: (rate or {}).get(k) for k in keys}, "delays": delays}
            for name, rate, delays in rows]


def demo_replays(noaa, features) -> dict:
    """The demo's mapping (48 days per logical hour) with default settings: which windows alert."""
    from drift_checks.backtest import run_backtest
    from drift_checks.verdict import CheckConfig
    from ground.settings import Settings

    out = {}
    for name, (champion_end, last_day) in {"full": (8000, 18128), "quick": (11328, 12480)}.items():
        ref = noaa.iloc[0:champion_end]
        with tempfile.TemporaryDirectory() as tmp:
            doc = run_backtest(noaa[["day", *features]], time_column="day", time_unit="D", out_dir=tmp,
                               reference_range=(_ts(0), _ts(champion_end)), window=str(DAYS_PER_WINDOW),
                               importance=_champion_importance(ref, features),
                               config=CheckConfig.from_settings(Settings.from_env({})),
                               replay_end=_ts(last_day), html_report=False)
        out[name] = {"windows": doc["summary"]["windows"], "alert_windows": doc["summary"]["alert_windows"],
                     "alert_days": [champion_end + w * DAYS_PER_WINDOW for w in doc["summary"]["alert_windows"]],
                     "alert_features": {w["window"]: w["alert_features"] for w in doc["windows"] if w["alert"]}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-evidently", action="store_true")
    ap.add_argument("--demo", action="store_true", help="also replay the demo's full and quick mappings")
    ap.add_argument("--skip-out-of-sample", action="store_true", help="only the tuned (in-sample) windows")
    args = ap.parse_args()
    from ground.settings import DEFAULTS
    from model_registry.datasets import FEATURE_COLUMNS, load_noaa

    noaa = load_noaa()
    features = list(FEATURE_COLUMNS)
    budget = DEFAULTS.drift_false_alarm_budget_per_week
    results, timings = {}, {}
    no_run_rule = {"TRITONFLOW_DRIFT_SUSTAINED_WINDOWS": "0", "TRITONFLOW_DRIFT_SEASONAL_RUN_WINDOWS": "0"}
    policies: dict = {"tritonflow": {}, "tritonflow_no_season": NO_SEASON_ENV, "tritonflow_no_run_rule": no_run_rule,
                      "tritonflow_training_seasonal": SEASONAL_ENV, "today": run_today}
    if not args.skip_evidently:
        policies["evidently"] = run_evidently
    for name, fn in policies.items():
        t0 = time.perf_counter()
        runs = {}
        for shift, quiet in SCENARIOS.items():
            if isinstance(fn, dict):
                runs[shift] = run_tritonflow(noaa, features, shift, quiet, env=fn)
            else:
                runs[shift] = fn(noaa, features, shift, quiet)
        results[name] = score(runs, budget)
        timings[name] = round(time.perf_counter() - t0, 1)
        print(f"{name:22s} alarms/100 quiet windows {results[name]['alarms_per_100_quiet']:6.2f} "
              f"({results[name]['quiet_alarms']}/{results[name]['quiet_windows']}); delays after shifts "
              f"{dict(zip(SCENARIOS, results[name]['delays'], strict=True))}; {timings[name]} s", flush=True)
    doc = {"shifts": list(SCENARIOS), "days_per_window": DAYS_PER_WINDOW,
           "reference_days": REFERENCE_DAYS, "false_alarm_budget_per_week": budget, "policies": results,
           "seconds": timings}
    if not args.skip_out_of_sample:
        t0 = time.perf_counter()
        doc["out_of_sample"] = out_of_sample(noaa, features, budget)
        print("out of sample:", json.dumps(doc["out_of_sample"]), flush=True)
        doc["in_vs_out_of_sample"] = side_by_side(results["tritonflow"], doc["out_of_sample"])
        doc["out_of_sample_no_season"] = out_of_sample(noaa, features, budget, NO_SEASON_ENV)
        doc["in_vs_out_of_sample_no_season"] = side_by_side(results["tritonflow_no_season"],
                                                            doc["out_of_sample_no_season"])
        doc["out_of_sample_training_seasonal"] = out_of_sample(noaa, features, budget, SEASONAL_ENV)
        timings["out_of_sample"] = round(time.perf_counter() - t0, 1)
        doc["in_vs_out_of_sample_training_seasonal"] = side_by_side(
            results["tritonflow_training_seasonal"], doc["out_of_sample_training_seasonal"])
        rows = [("default", r) for r in doc["in_vs_out_of_sample"]]
        rows += [("no season run rule", r) for r in doc["in_vs_out_of_sample_no_season"]]
        rows += [("training_seasonal", r) for r in doc["in_vs_out_of_sample_training_seasonal"]]
        for label, row in rows:
            print(f"{label}: {row['set']:34s} false alerts/100 windows {row['per_100_windows']} (<= "
                  f"{row['per_100_windows_upper']}, {row['alerts']}/{row['windows']}); per week {row['per_week']} "
                  f"(<= {row['per_week_upper']}); delays {row['delays']}", flush=True)
    if args.demo:
        doc["demo"] = demo_replays(noaa, features)
        print("demo replays:", json.dumps(doc["demo"]), flush=True)
    _finish(doc)


def _finish(doc: dict) -> None:
    """The standard last line: tritonflow's policy against both goals, every policy's figures beside it."""
    from report import at_most, finish, not_measured

    ours = doc["policies"]["tritonflow"]
    delays = ours["delays"]
    worst = None if any(d is None for d in delays) else max(delays)  # a missed shift misses the goal
    oos = doc.get("out_of_sample")
    if oos:
        oos_delays = oos["offset_shift_delays"]
        oos_worst = None if any(d is None for d in oos_delays) else max(oos_delays)
        shuffled = oos["shuffled"]
        oos_goals = {
            "oos_false_alerts_per_week_shuffled": at_most(
                shuffled["per_week"], 1, "false alerts per model-week (168 windows), shuffled controls",
                measured_as={"per_week": shuffled["per_week"], "upper_95": shuffled["per_week_upper"],
                             "alerts": shuffled["alerts"], "windows": shuffled["windows"]}),
            "oos_max_delay_windows": at_most(oos_worst, 2, "windows after every offset shift",
                                             measured_as={"max": oos_worst, "per_shift": oos_delays})}
    else:
        oos_goals = {"oos_false_alerts_per_week_shuffled": not_measured("<= 1 false alerts per model-week"),
                     "oos_max_delay_windows": not_measured("<= 2 windows after every offset shift")}
    names = {"tritonflow_no_season": "the same without the season-matched run rule",
             "tritonflow_no_run_rule": "the same without the run rules",
             "tritonflow_training_seasonal": "the same with the seasonally matched reference",
             "today": "the earlier policy (re-implemented in this benchmark)",
             "evidently": "Evidently DataDriftPreset defaults"}
    baselines = ", ".join(names.get(n, n) for n in doc["policies"] if n != "tritonflow")
    finish("drift_quality",
           f"Drift alarms of the default policy on NOAA (its season, a year, read from the reference's "
           f"times; {doc['days_per_window']}-day windows, "
           f"{len(doc['shifts'])} known shifts, {ours['quiet_windows']} quiet windows; in-sample: the windows "
           f"the run rules were tuned on) against {baselines} on the same windows; out of sample: other NOAA "
           f"stretches, shuffled controls and the shifts cut at an offset, against a budget of "
           f"{doc['false_alarm_budget_per_week']:g} false alert per model-week.",
           {"alarms_per_100_quiet": at_most(ours["alarms_per_100_quiet"], 1, "per 100 quiet windows"),
            "max_delay_windows": at_most(worst, 2, "windows after every shift",
                                         measured_as={"max": worst, "per_shift": delays}),
            **oos_goals},
           **doc)


if __name__ == "__main__":
    main()
