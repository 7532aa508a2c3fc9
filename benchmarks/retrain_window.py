"""The retraining window after NOAA's concept shift: the policy's span against the evidence rule.

Usage::

    .venv/bin/python benchmarks/retrain_window.py                  # ~1 min: serving delays 4, 10, 2 h
    .venv/bin/python benchmarks/retrain_window.py --serve-delays 10  # one delay

Tables go to stderr; the last stdout line is the standard JSON object (:mod:`benchmarks.report`),
judged at the first delay (4 h, the full replay's).

A cheap offline stand-in for the full replay's question: within 12 logical hours of the first alert
after the day-12,000 concept shift, is the served rolling AUC within 0.05 of a model retrained on the
rows since the shift?

Replay (the demo's mapping, :class:`tritonflow.demo.config.DemoConfig`): 48 NOAA days per logical
hour from day 8,000; the champion is trained on days 0-7,999 (:func:`model_registry.noaa_model.train_noaa`).
Each hour's rows are scored by the model serving then, and labelled at the hour's end. At the first
alert's hour (``--alert-hour``, 84 in the full replay of 2026-12-05) a retraining is decided on
the rows up to the end of that hour; its challenger serves ``--serve-delay`` hours after the next
(4 in that replay, which waits for the loop: version 2 served from hour 89; 10 before it waited,
when version 2 served from hour 96 after an alert at hour 86): the hours the drift checks trail
the replay, and the loop's publish, shadow evaluation and canary. Two rules choose its rows:

* ``span``: the policy's span, the last ``--span-hours`` (10, ``TRITONFLOW_RETRAIN_WINDOW_DAYS``
  in the demo) of labelled rows: mostly rows before the shift;
* ``evidence``: :func:`model_registry.evidence_window.choose_window` on ``lookback_factor`` spans
  of labelled rows with the served model's scores (the change point of its loss, the floor
  ``min_post_shift_rows``); a window short of post-shift rows is followed by a follow-up retraining
  ``followup_hours`` after its end (and not before that version serves: only the champion's
  follow-up is started), on the rows since the recorded change point, serving ``--serve-delay``
  hours after that, until a window holds enough post-shift rows.

The reference (``oracle``) is retrained each hour on every row from day 12,000 to that hour's start.
Rolling AUC: the scores of the last ``--rolling-hours`` hours (4 = 192 rows), each row scored by
the model that served (or the oracle of) its hour, pooled.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from report import at_most, finish  # noqa: E402

from model_registry import datasets as ds  # noqa: E402
from model_registry.evidence_window import EvidenceWindowPolicy, choose_window  # noqa: E402
from model_registry.noaa_model import train_noaa  # noqa: E402

#: The demo's mapping: days per logical hour and the first replayed day.
DAYS_PER_HOUR = 48
FIRST_DAY = 8_000
#: Logical spacing of days in the synthetic log (one hour holds DAYS_PER_HOUR days).
START = pd.Timestamp("2025-01-01", tz="UTC")
SCORE = "probability_rain"
#: Goal of the issue: within this AUC of the oracle, within GOAL_HOURS of the first alert.
GOAL_GAP = 0.05
GOAL_HOURS = 12


def _hour_of(day: int) -> int:
    return (day - FIRST_DAY) // DAYS_PER_HOUR


def _stamp(days: np.ndarray) -> pd.DatetimeIndex:
    return START + pd.to_timedelta((days - FIRST_DAY) / DAYS_PER_HOUR, unit="h")


def _auc(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else float("nan")


def _train(rows: pd.DataFrame) -> Any:
    return train_noaa(rows.reset_index(drop=True))


def _hours(data: pd.DataFrame, a: int, b: int) -> pd.DataFrame:
    lo, hi = FIRST_DAY + a * DAYS_PER_HOUR, FIRST_DAY + b * DAYS_PER_HOUR
    return data[(data[ds.DAY_COLUMN] >= lo) & (data[ds.DAY_COLUMN] < hi)]


def _evidence_window(log: pd.DataFrame, end_hour: int, policy: EvidenceWindowPolicy, span_hours: int,
                     change_point: Any) -> tuple[pd.DataFrame, Any]:
    """The evidence rule's rows for a retraining decided at the end of ``end_hour`` and its choice."""
    lookback = int(round(policy.lookback_factor * span_hours))
    rows = log[(log["hour"] > end_hour - lookback) & (log["hour"] <= end_hour)]
    end = START + pd.Timedelta(hours=end_hour + 1)
    choice = choose_window(rows, label_column=ds.LABEL_COLUMN, policy=policy,
                           span_start=end - pd.Timedelta(hours=span_hours), end=end,
                           recorded_change_point=change_point)
    return rows[rows["timestamp"] >= choice.start], choice


def replay(rule: str, policy: EvidenceWindowPolicy, *, alert_hour: int, serve_delay: int, span_hours: int,
           last_hour: int, data: pd.DataFrame) -> dict[str, Any]:
    """Replay hours 0..``last_hour`` with one rule; returns per-hour served scores and the retrainings."""
    served = {0: _train(data[data[ds.DAY_COLUMN] < FIRST_DAY])}  # from hour -> model
    log_parts, retrains = [], []
    pending: dict[int, tuple[str, Any]] = {alert_hour: ("champion_degraded", None)}
    for h in range(last_hour + 1):
        model = served[max(k for k in served if k <= h)]
        rows = _hours(data, h, h + 1).copy()
        rows["hour"] = h
        rows["timestamp"] = _stamp(rows[ds.DAY_COLUMN].to_numpy())
        rows[SCORE] = model.predict_scores(rows)
        log_parts.append(rows)
        if h not in pending:
            continue
        reason, cp = pending.pop(h)
        log = pd.concat(log_parts, ignore_index=True)
        if rule == "span":
            window, choice = log[log["hour"] > h - span_hours], None
        else:
            window, choice = _evidence_window(log, h, policy, span_hours, cp)
        served[h + 1 + serve_delay] = _train(window)
        post = int((window[ds.DAY_COLUMN] >= ds.CONCEPT_DRIFT_DAY).sum())
        retrains.append({"decided_hour": h, "reason": reason, "serves_from": h + 1 + serve_delay,
                         "rows": int(len(window)), "post_shift_rows": post,
                         "rule": choice.rule if choice else "span",
                         "change_point_day": None if not choice or choice.change_point is None else
                         int(window[window["timestamp"] >= choice.change_point][ds.DAY_COLUMN].min())})
        if choice is not None and choice.followup_at is not None:
            # due at the hour whose end reaches followup_at, once the version serves (it must be the champion)
            due = int((choice.followup_at - START) / pd.Timedelta(hours=1)) - 1
            pending[max(due, h + 1 + serve_delay)] = ("retrain_followup", choice.change_point)
    return {"log": pd.concat(log_parts, ignore_index=True), "retrains": retrains}


def oracle_scores(data: pd.DataFrame, first: int, last: int) -> pd.DataFrame:
    """Each hour's rows scored by a model trained on every row from day 12,000 to the hour's start."""
    shift_hour = _hour_of(ds.CONCEPT_DRIFT_DAY)
    parts = []
    for h in range(first, last + 1):
        train = data[(data[ds.DAY_COLUMN] >= ds.CONCEPT_DRIFT_DAY)
                     & (data[ds.DAY_COLUMN] < FIRST_DAY + h * DAYS_PER_HOUR)]
        if h <= shift_hour or len(train) < 100:
            continue
        rows = _hours(data, h, h + 1).copy()
        rows["hour"] = h
        rows[SCORE] = _train(train).predict_scores(rows)
        parts.append(rows)
    return pd.concat(parts, ignore_index=True)


def rolling_auc(log: pd.DataFrame, hours: range, width: int) -> dict[int, float]:
    """AUC of the pooled scores of hours ``(h - width, h]`` for each ``h``."""
    out = {}
    for h in hours:
        rows = log[(log["hour"] > h - width) & (log["hour"] <= h)]
        out[h] = _auc(rows[ds.LABEL_COLUMN].to_numpy(), rows[SCORE].to_numpy())
    return out


def run(args: argparse.Namespace, serve_delay: int) -> dict[str, Any]:
    """Both rules and the oracle at one serving delay; the per-hour rolling AUCs and the goal's figures."""
    data = ds.load_noaa()
    policy = EvidenceWindowPolicy(min_post_shift_rows=args.floor, followup_factor=args.followup_factor,
                                  followup_hours=args.followup_hours, score_column=SCORE)
    last = args.alert_hour + args.horizon
    hours = range(args.alert_hour, last + 1)
    oracle = rolling_auc(oracle_scores(data, args.alert_hour - args.rolling_hours, last), hours,
                         args.rolling_hours)
    result: dict[str, Any] = {"serve_delay": serve_delay, "oracle": oracle, "rules": {}}
    for rule in ("span", "evidence"):
        rep = replay(rule, policy, alert_hour=args.alert_hour, serve_delay=serve_delay,
                     span_hours=args.span_hours, last_hour=last, data=data)
        served = rolling_auc(rep["log"], hours, args.rolling_hours)
        gap = {h: oracle[h] - served[h] for h in hours}
        within = [h for h in hours if all(gap[g] <= GOAL_GAP for g in hours if g >= h)]
        result["rules"][rule] = {
            "retrains": rep["retrains"], "served": served, "gap": gap,
            "gap_at_goal_hour": gap[args.alert_hour + GOAL_HOURS],
            "hours_to_within_goal": (within[0] - args.alert_hour) if within else None,
            "mean_served_auc": float(np.nanmean(list(served.values()))),
        }
    return result


def _table(result: dict[str, Any]) -> str:
    rules = result["rules"]
    lines = [f"serving delay {result['serve_delay']} h", "hour  oracle  " + "  ".join(f"{r:>8}" for r in rules)]
    for h, o in result["oracle"].items():
        lines.append(f"{h:4d}  {o:6.3f}  " + "  ".join(f"{rules[r]['served'][h]:8.3f}" for r in rules))
    for r, v in rules.items():
        lines.append(f"{r}: gap at alert+{GOAL_HOURS} h = {v['gap_at_goal_hour']:.3f}; within {GOAL_GAP} "
                     f"from alert+{v['hours_to_within_goal']} h; mean served AUC {v['mean_served_auc']:.3f}")
        lines += [f"  retrain {t}" for t in v["retrains"]]
    return "\n".join(lines)


def _figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per delay and rule: the gap at alert + 12 h, the hours until within the goal, the mean served AUC."""
    return {f"delay_{r['serve_delay']}h": {rule: {"gap_at_alert_plus_12h": round(v["gap_at_goal_hour"], 3),
                                                   "hours_to_within_0.05": v["hours_to_within_goal"],
                                                   "mean_served_auc": round(v["mean_served_auc"], 3),
                                                   "retrainings": len(v["retrains"])}
                                            for rule, v in r["rules"].items()}
            for r in results}


def main(argv: list[str] | None = None) -> int:
    """Run the comparison at each serving delay, print the tables and the standard JSON line."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--alert-hour", type=int, default=84, help="hour of the first alert after the shift")
    p.add_argument("--serve-delays", default="4,10,2",
                   help="hours from a retraining to its serving, comma-separated; the first is judged")
    p.add_argument("--span-hours", type=int, default=10, help="the policy's span, hours")
    p.add_argument("--rolling-hours", type=int, default=4, help="hours pooled in the rolling AUC")
    p.add_argument("--horizon", type=int, default=30, help="hours replayed after the alert")
    defaults = EvidenceWindowPolicy()
    p.add_argument("--floor", type=int, default=defaults.min_post_shift_rows)
    p.add_argument("--followup-factor", type=float, default=defaults.followup_factor)
    p.add_argument("--followup-hours", type=float, default=defaults.followup_hours)
    args = p.parse_args(argv)
    results = [run(args, int(d)) for d in args.serve_delays.split(",")]
    for r in results:
        print(_table(r), file=sys.stderr)
    judged = results[0]
    gap = judged["rules"]["evidence"]["gap_at_goal_hour"]
    finish("retrain_window",
           f"NOAA day-12,000 shift replayed offline (48 days/hour, first alert at hour {args.alert_hour}): "
           f"served rolling AUC vs a model retrained on the rows since the shift, span rule vs evidence rule",
           {"evidence_gap_at_alert_plus_12h": at_most(round(gap, 3), GOAL_GAP,
                                                      measured_as={"gap": round(gap, 3),
                                                                   "serve_delay_h": judged["serve_delay"]})},
           figures=_figures(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
