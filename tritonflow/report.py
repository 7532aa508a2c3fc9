"""The demo's HTML report with PNG plots (matplotlib, Agg backend).

:func:`write_report` takes the demo's summary (hours, events, DAG runs, closed loops), the
per-request traffic records of the logical replay and the drift history store, and writes
``<folder>/index.html`` plus:

* ``drift_<feature>.png`` -- each feature's drift statistic per logical hour against its dynamic
  threshold (P95 of the statistic over the look-back, recomputed from the history store with
  :meth:`drift_checks.history.HistoryStore.quantiles`, the same query the drift check uses; hours
  before enough history show no dynamic threshold), with drift alerts and retraining points;
* ``served.png`` -- which model version served each logical hour (share of requests);
* ``performance.png`` -- rolling AUC and accuracy of what was served against the never-retrained
  champion scored offline on the same rows;
* ``timings.png`` -- publish, canary and rollback durations.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

#: Statistics plotted per feature, first found wins (distances: higher means more drift).
PREFERRED_STATISTICS = ("psi", "wasserstein_normed", "ks", "ks_statistic")
#: Logical hours in the rolling performance window.
ROLLING_HOURS = 4


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _hour_index(summary: Mapping[str, Any]) -> dict[pd.Timestamp, int]:
    return {pd.Timestamp(h["start"]).tz_convert("UTC").tz_localize(None): h["hour"]
            for h in summary.get("hours", [])}


def _events(summary: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in summary.get("events", []) if e.get("kind") == kind]


def drift_series(history_url: str, model: str, summary: Mapping[str, Any],
                 days: float = 30.0, quantile: float = 0.95, min_windows: int = 48
                 ) -> dict[str, pd.DataFrame]:
    """Per feature: ``hour``, ``statistic``, ``value`` and ``threshold`` (NaN before enough history).

    Only the statistics of each hour against its own reference (not those against its season, kept
    for the season-matched run rule). The threshold of hour ``h`` is the ``quantile`` of the taught
    values against that reference over ``[h - days, h)`` from the history store, as the drift check
    computes it.
    """
    from drift_checks.history import HistoryStore

    if not history_url:
        return {}
    store = HistoryStore(history_url, create=True)
    import sqlalchemy as sa

    t, w = store.stats, store.windows
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.feature, t.c.statistic, t.c.hour, t.c.value, t.c.reference_id)
                            .join(w, sa.and_(w.c.model == t.c.model, w.c.hour == t.c.hour,
                                             w.c.reference_id == t.c.reference_id))
                            .where(t.c.model == model)).all()
    if not rows:
        return {}
    frame = pd.DataFrame(rows, columns=["feature", "statistic", "hour", "value", "reference_id"])
    index = _hour_index(summary)
    frame["logical_hour"] = frame["hour"].map(lambda h: index.get(pd.Timestamp(h)))
    frame = frame.dropna(subset=["logical_hour"])
    out: dict[str, pd.DataFrame] = {}
    for feature, part in frame.groupby("feature"):
        stats = list(part["statistic"].unique())
        stat = next((s for s in PREFERRED_STATISTICS if s in stats), sorted(stats)[0])
        series = part[part["statistic"] == stat].sort_values("hour").reset_index(drop=True)
        thresholds = []
        for h, ref in zip(series["hour"], series["reference_id"], strict=True):
            q = store.quantiles(model, pd.Timestamp(h).tz_localize("UTC").to_pydatetime(), days,
                                {(feature, stat): quantile}, reference_id=ref, taught_only=True)
            value, n = q.get((feature, stat), (np.nan, 0))
            thresholds.append(value if n >= min_windows else np.nan)
        series["threshold"] = thresholds
        out[str(feature)] = series
    return out


def _mark_events(ax, summary: Mapping[str, Any]) -> None:
    for i, e in enumerate(_events(summary, "alert")):
        ax.axvline(e["hour"], color="red", lw=1.2, alpha=0.8, label="drift alert" if i == 0 else None)
    for i, e in enumerate(_events(summary, "promoted")):
        ax.axvline(e["hour"] + 0.5, color="green", lw=1.5, ls="--",
                   label="retrained challenger promoted" if i == 0 else None)
    for i, e in enumerate(_events(summary, "retrain")):
        if e.get("hour") is not None:
            ax.axvline(e["hour"] + 0.25, color="purple", lw=1, ls=":",
                       label="retraining" if i == 0 else None)


def plot_drift(folder: Path, series: Mapping[str, pd.DataFrame], summary: Mapping[str, Any]) -> list[str]:
    """Plot each feature's drift statistic per logical hour vs its dynamic P95 threshold; return file names."""
    plt = _plt()
    files = []
    for feature, s in sorted(series.items()):
        fig, ax = plt.subplots(figsize=(9, 2.8))
        ax.plot(s["logical_hour"], s["value"], lw=1.2, color="tab:blue",
                label=f"{s['statistic'].iloc[0]} statistic")
        ax.plot(s["logical_hour"], s["threshold"], lw=1.2, color="tab:orange", ls="-",
                label="dynamic threshold (P95 of history)")
        _mark_events(ax, summary)
        ax.set_title(f"{feature}: drift statistic per logical hour vs its dynamic P95 threshold")
        ax.set_xlabel("logical hour")
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        name = f"drift_{feature}.png"
        fig.savefig(folder / name, dpi=90)
        plt.close(fig)
        files.append(name)
    return files


def plot_served(folder: Path, traffic: pd.DataFrame, summary: Mapping[str, Any]) -> str | None:
    """Plot the share of traffic each model version served per hour; return the file name."""
    if traffic.empty:
        return None
    plt = _plt()
    share = pd.crosstab(traffic["hour"], traffic["model_version"], normalize="index") * 100
    fig, ax = plt.subplots(figsize=(9, 2.8))
    bottom = np.zeros(len(share))
    for v in share.columns:
        ax.bar(share.index, share[v], bottom=bottom, width=1.0, label=f"version {v}")
        bottom += share[v].to_numpy()
    _mark_events(ax, summary)
    ax.set_ylabel("% of requests")
    ax.set_xlabel("logical hour")
    ax.set_title("Which model version served each logical hour (X-Tritonflow-Version)")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(folder / "served.png", dpi=90)
    plt.close(fig)
    return "served.png"


def rolling_performance(traffic: pd.DataFrame, hours: int = ROLLING_HOURS) -> pd.DataFrame:
    """Per logical hour: AUC/accuracy over the last ``hours`` hours, served vs never-retrained."""
    from sklearn.metrics import roc_auc_score

    rows = []
    for h in sorted(traffic["hour"].unique()):
        w = traffic[(traffic["hour"] > h - hours) & (traffic["hour"] <= h)]
        y = w["label"].to_numpy()
        row = {"hour": h}
        for name, col in (("served", "probability_rain"), ("baseline", "baseline_score")):
            s = w[col].to_numpy()
            row[f"{name}_auc"] = roc_auc_score(y, s) if len(np.unique(y)) == 2 else np.nan
            row[f"{name}_accuracy"] = float(((s >= 0.5).astype(int) == y).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def plot_performance(folder: Path, perf: pd.DataFrame, summary: Mapping[str, Any]) -> str | None:
    """Plot AUC and accuracy per hour of what served; return the file name."""
    if perf.empty:
        return None
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    for ax, metric in zip(axes, ("auc", "accuracy"), strict=True):
        ax.plot(perf["hour"], perf[f"served_{metric}"], color="tab:green", label="served (tritonflow loop)")
        ax.plot(perf["hour"], perf[f"baseline_{metric}"], color="tab:gray", ls="--",
                label="never-retrained champion (offline)")
        _mark_events(ax, summary)
        ax.set_ylabel(f"rolling {metric.upper() if metric == 'auc' else metric}")
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_title(f"Rolling ({ROLLING_HOURS} logical hours) quality of what was served")
    axes[1].set_xlabel("logical hour")
    fig.tight_layout()
    fig.savefig(folder / "performance.png", dpi=90)
    plt.close(fig)
    return "performance.png"


def timing_rows(summary: Mapping[str, Any]) -> list[tuple[str, float]]:
    """Timings of the run's publishes, canaries, rollbacks and closed loops, as ``(label, seconds)``."""
    rows = []
    for e in _events(summary, "publish"):
        rows.append((f"publish v{e.get('version') or '?'}", float(e["seconds"])))
    for e in _events(summary, "canary"):
        rows.append((f"canary v{e.get('challenger') or '?'} ({e.get('outcome')})", float(e["seconds"])))
        rb = e.get("rollback") or {}
        if isinstance(rb, Mapping) and isinstance(rb.get("decided_at"), (int, float)):
            # repository_sync.canary.runner.RollbackRecord: actions are [name, unix time, detail]
            for name, at, *_ in rb.get("actions") or []:
                if name == "gateway_to_champion":
                    rows.append((f"rollback: decision -> gateway 100 % champion (v{e.get('challenger')} out)",
                                 float(at) - float(rb["decided_at"])))
    for loop in summary.get("closed_loops", []):
        rows.append((f"closed loop alert -> v{loop['to']} promoted", float(loop["seconds"])))
    return rows


def plot_timings(folder: Path, rows: Sequence[tuple[str, float]]) -> str | None:
    """Plot the timings as horizontal bars; return the file name."""
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    labels, values = zip(*rows, strict=True)
    ax.barh(range(len(rows)), values, color="tab:blue")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (wall clock)")
    ax.set_title("Publish, canary, rollback and closed-loop timings")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.1f} s", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "timings.png", dpi=90)
    plt.close(fig)
    return "timings.png"


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)[:200]
    return str(v)


def _bad_challenger_html(bad: Mapping[str, Any] | None) -> str:
    """The bad challenger's section: what the canary decided and why, as its run recorded it."""
    if not bad:
        return "<p>not offered in this run</p>"
    verdict = "rolled back" if bad.get("rolled_back") else "NOT rolled back"
    head = (f"<p>Version {bad.get('version')} (alias <code>{html.escape(str(bad.get('alias')))}</code>): "
            f"<b>{verdict}</b>; canary run {html.escape(str(bad.get('canary_run')))} "
            f"{html.escape(str(bad.get('canary_state')))}, outcome {html.escape(str(bad.get('outcome')))}, "
            f"{_fmt(bad.get('seconds'))} s from the alias to the end of the canary. Reason (from the run): "
            f"{html.escape(str(bad.get('reason') or bad.get('note') or ''))}</p>")
    return head + _table(bad.get("steps") or [], ["step", "percent", "attempt", "verdict", "canary_requests",
                                                   "reason"])


def write_report(folder: Path, summary: Mapping[str, Any], traffic: pd.DataFrame, *,
                 history_url: str, model: str, min_windows: int | None = None) -> Path:
    """Write ``folder/index.html`` and its PNGs; returns the HTML path."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = summary.get("config", {})
    mw = min_windows or int(cfg.get("min_history_windows") or 48)
    series = drift_series(history_url, model, summary, min_windows=mw)
    drift_files = plot_drift(folder, series, summary)
    served = plot_served(folder, traffic, summary)
    perf = rolling_performance(traffic) if not traffic.empty else pd.DataFrame()
    perf_file = plot_performance(folder, perf, summary)
    timings = timing_rows(summary)
    timing_file = plot_timings(folder, timings)
    if not traffic.empty:
        traffic.to_parquet(folder / "traffic.parquet", index=False)
    loops = summary.get("closed_loops", [])
    loop_html = ("".join(f"<li>drift alert at logical hour {loop['alert_hour']} &rarr; version {loop['to']} "
                         f"promoted (was {loop['from']}): <b>{loop['seconds']:.1f} s</b></li>" for loop in loops)
                 or "<li>no challenger was promoted in this run</li>")
    bad_html = _bad_challenger_html(summary.get("bad_challenger"))
    imgs = "".join(f'<img src="{f}" alt="{f}"><br>' for f in drift_files)
    events = [{k: v for k, v in e.items() if k not in ("wall", "steps", "conf")} for e in summary.get("events", [])]
    event_columns = ["kind", "t", "hour", "version", "state", "outcome", "seconds", "features", "rolled_back",
                     "closed_loop_s"]
    hour_columns = ["hour", "start", "first_day", "last_day", "rows", "versions", "drift", "drift_features", "acted"]
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>tritonflow demo report</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:auto}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px}} img{{max-width:100%}}</style></head><body>
<h1>tritonflow demo on NOAA weather data</h1>
<p>{html.escape(summary.get('mapping', ''))}. Wall time {summary.get('wall_s', 0):.0f} s.</p>
<h2>Closed loop: drift alert &rarr; promoted challenger</h2>
<ul>{loop_html}</ul>
<p>Benchmark: reference 23 minutes in a comparable production loop, goal under 5 minutes.</p>
<h2>Deliberately bad challenger (flipped labels, requested through the registry)</h2>{bad_html}
<h2>Which version served when</h2>{f'<img src="{served}">' if served else '<p>no traffic</p>'}
<h2>Quality of what was served vs a never-retrained champion</h2>{f'<img src="{perf_file}">' if perf_file else ''}
<h2>Drift statistics against their dynamic P95 thresholds</h2>{imgs or '<p>no drift history</p>'}
<h2>Timings</h2>{f'<img src="{timing_file}">' if timing_file else ''}
{_table([{'what': a, 'seconds': b} for a, b in timings], ['what', 'seconds'])}
<h2>Events</h2>{_table(events, event_columns)}
<h2>DAG runs</h2>{_table(summary.get('dag_runs', []), ['dag_id', 'state', 'seconds'])}
<h2>Logical hours</h2>{_table(summary.get('hours', []), hour_columns)}
</body></html>"""
    path = folder / "index.html"
    path.write_text(doc)
    return path
