"""Plot a canary over time in one picture.

A canary over time, in one picture: error rate, latency and the prediction statistic of every
analysis, with their thresholds and the step boundaries (matplotlib, Agg backend).

:func:`plot_canary` takes the analyses a canary recorded (``StepAnalysis.to_dict()`` of every
analysis, intermediate ones included, as :func:`tritonflow.pipelines.canary_promotion.run_promotion` logs
them to MLflow as ``canary/analyses.json``) and writes a PNG with three panels sharing the time
axis (seconds since the canary's first step started):

1. the challenger's error rate over the step (and its lower confidence bound) against
   ``max_error_rate``;
2. the challenger's and the champion's mean latency (ms) against ``max_mean_latency_ms``, and the
   latency ratio against ``max_latency_ratio`` on a second axis;
3. the prediction KS against the challenger's expected behaviour, with ``max_prediction_ks`` and
   the threshold plus the sampling margin the verdict used (statistical checks run at the end of a
   bake, so this panel has one point per bake).

Vertical lines mark where each step (and each extension) started, labelled with its percent;
failed analyses are red crosses. :func:`load_canary_analyses` reads the analyses back from MLflow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

#: Artifact path of the analyses a canary run logs to MLflow.
ANALYSES_ARTIFACT = "canary/analyses.json"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(analyses: Sequence[Mapping[str, Any]], key: str, t0: float):
    xs, ys = [], []
    for a in analyses:
        v = a.get(key)
        if v is not None:
            xs.append(float(a["window_end"]) - t0)
            ys.append(float(v))
    return xs, ys


def step_boundaries(analyses: Sequence[Mapping[str, Any]]) -> list[tuple[float, str]]:
    """``[(window start, label)]`` where a step or an extension of it starts (absolute seconds)."""
    out: list[tuple[float, str]] = []
    seen: set[tuple[int, int]] = set()
    for a in analyses:
        key = (int(a["step"]), int(a.get("attempt", 1)))
        if key in seen:
            continue
        seen.add(key)
        label = f"{a['percent']}%" + (f" (ext. {key[1] - 1})" if key[1] > 1 else "")
        start = float(a["window_start"])
        if key[1] > 1:  # an extension keeps the window start: mark where the previous bake ended
            prev = [b for b in analyses if (int(b["step"]), int(b.get("attempt", 1))) == (key[0], key[1] - 1)]
            start = float(prev[-1]["window_end"]) if prev else start
        out.append((start, label))
    return out


def _plot_error_panel(ax: Any, analyses: Sequence[Mapping[str, Any]], t0: float,
                      th: Mapping[str, Any]) -> None:
    """Panel 1: the challenger's error rate and its lower bound against ``max_error_rate``."""
    x, y = _series(analyses, "canary_error_rate", t0)
    ax.plot(x, y, "o-", ms=3, label="challenger error rate (step)")
    x, y = _series(analyses, "canary_error_rate_lower", t0)
    ax.plot(x, y, "--", lw=1, label="lower confidence bound")
    if th.get("max_error_rate") is not None:
        ax.axhline(th["max_error_rate"], color="red", lw=1, ls=":", label="max_error_rate")
    ax.set_ylabel("error rate")


def _plot_latency_panel(ax: Any, analyses: Sequence[Mapping[str, Any]], t0: float,
                        th: Mapping[str, Any]) -> Any:
    """Panel 2: both mean latencies against their limit, and the latency ratio on a second axis.

    Returns:
        The ratio's axis (its legend is placed apart).
    """
    x, y = _series(analyses, "canary_mean_latency_ms", t0)
    ax.plot(x, y, "o-", ms=3, label="challenger mean latency")
    x, y2 = _series(analyses, "champion_mean_latency_ms", t0)
    ax.plot(x, y2, "s-", ms=3, alpha=0.7, label="champion mean latency")
    limit = th.get("max_mean_latency_ms")
    if limit is not None and (not (y + y2) or limit <= 3 * max(y + y2)):
        ax.axhline(limit, color="red", lw=1, ls=":", label="max_mean_latency_ms")
    elif limit is not None:  # far above the data: named, not drawn (it would flatten the curves)
        ax.plot([], [], " ", label=f"max_mean_latency_ms {limit:g} (off scale)")
    ax.set_ylabel("latency (ms)")
    ax_ratio = ax.twinx()
    x, y = _series(analyses, "latency_ratio", t0)
    ax_ratio.plot(x, y, "^", ms=3, color="tab:purple", label="latency ratio")
    if th.get("max_latency_ratio") is not None and y:
        ax_ratio.axhline(th["max_latency_ratio"], color="tab:purple", lw=1, ls=":", label="max_latency_ratio")
    ax_ratio.set_ylabel("ratio")
    return ax_ratio


def _plot_prediction_panel(ax: Any, analyses: Sequence[Mapping[str, Any]], t0: float,
                           th: Mapping[str, Any]) -> None:
    """Panel 3: prediction KS against its threshold (plus sampling margin) and feature coverage."""
    x, y = _series(analyses, "prediction_ks", t0)
    ax.plot(x, y, "o", ms=5, label="prediction KS vs expected behaviour")
    if th.get("max_prediction_ks") is not None:
        ax.axhline(th["max_prediction_ks"], color="red", lw=1, ls=":", label="max_prediction_ks")
        xm, margins = _series(analyses, "prediction_ks_margin", t0)
        if margins:
            ax.plot(xm, [th["max_prediction_ks"] + m for m in margins], "_", ms=14, color="red",
                    label="threshold + sampling margin")
    x, y = _series(analyses, "coverage_ratio", t0)
    if y:
        ax.plot(x, y, "d", ms=4, color="tab:green", label="feature-space coverage")
    ax.set_ylabel("statistic")
    ax.set_xlabel("seconds since the canary started")


def _mark_steps_and_failures(axes: Sequence[Any], analyses: Sequence[Mapping[str, Any]], t0: float,
                             failed: Sequence[Mapping[str, Any]]) -> None:
    """Grey dashed lines where each step starts (labelled on the first panel), red ones at failures."""
    for ax in axes:
        for start, _label in step_boundaries(analyses):
            ax.axvline(start - t0, color="grey", lw=0.8, ls="--")
        for a in failed:
            ax.axvline(float(a["window_end"]) - t0, color="red", lw=1.2)
    for start, label in step_boundaries(analyses):
        axes[0].annotate(label, (start - t0, 1.0), xycoords=("data", "axes fraction"),
                         xytext=(2, -10), textcoords="offset points", fontsize=8)


def plot_canary(analyses: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Write the canary's plot over time to ``path`` (PNG).

    Args:
        analyses: Every analysis of one canary, in order (dicts of ``StepAnalysis.to_dict()``).
        path: Output file.
        title: Figure title (default: model, versions and outcome of the last analysis).

    Returns:
        ``path``.

    Raises:
        ValueError: ``analyses`` is empty.
    """
    if not analyses:
        raise ValueError("plot_canary: no analysis to plot")
    plt = _plt()
    t0 = min(float(a["window_start"]) for a in analyses)
    th = dict(analyses[-1].get("thresholds") or {})
    last = analyses[-1]
    fig, (ax_err, ax_lat, ax_pred) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)

    _plot_error_panel(ax_err, analyses, t0, th)
    ax_ratio = _plot_latency_panel(ax_lat, analyses, t0, th)
    _plot_prediction_panel(ax_pred, analyses, t0, th)
    failed = [a for a in analyses if a.get("verdict") == "fail"]
    _mark_steps_and_failures((ax_err, ax_lat, ax_pred), analyses, t0, failed)
    for ax in (ax_err, ax_lat, ax_pred):
        ax.legend(loc="upper left", fontsize=7)
    ax_ratio.legend(loc="upper right", fontsize=7)
    outcome = "failed: " + failed[-1]["reasons"][0][:80] if failed else str(last.get("verdict"))
    fig.suptitle(title or f"canary of {last.get('model')} v{last.get('challenger_version')} "
                          f"vs v{last.get('champion_version')}: {outcome}", fontsize=10)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def load_canary_analyses(tracking_uri: str, run_id: str) -> list[dict[str, Any]]:
    """The analyses a canary logged to its MLflow run (:data:`ANALYSES_ARTIFACT`).

    Raises:
        FileNotFoundError: The run has no such artifact.
    """
    import mlflow

    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=ANALYSES_ARTIFACT,
                                                tracking_uri=tracking_uri)
    return list(json.loads(Path(local).read_text())["analyses"])


__all__ = ["ANALYSES_ARTIFACT", "load_canary_analyses", "plot_canary", "step_boundaries"]
