"""Benchmark: the p99 regression gate's cost and its verdicts, at several measurement windows.

The gate (:func:`model_registry.profiling.perf.perf_regression_gate`) starts a scratch Triton 2.51
with champion and challenger and runs ``TRITONFLOW_PERF_GATE_PASSES`` (3) perf_analyzer passes per
model, interleaved, each stabilised over at least three windows of
``TRITONFLOW_PERF_GATE_MEASUREMENT_MS`` (1,000 ms). With profile reuse the gate is most of a
challenger's publish (``publish_latency --champion``), so a shorter window is the obvious saving;
this benchmark measures what a shorter window costs in verdicts before any default moves.

Models (scikit-learn, 8 features, converted with skl2onnx, ONNX Runtime on the CPU, the champion's
config with ``max_batch_size`` 8): the champion is a logistic regression (p99 about 2 ms at
concurrency 4 on this machine class); the *identical* challenger is the same model again (any
rejection is a false one); the *slower* challenger is a random forest of ``--slower-trees`` (2,500)
unpruned trees, 1-3 ms slower at p99 (+50-150 %), above the gate's 1 ms floor
(``TRITONFLOW_MIN_P99_REGRESSION_MS``) and its 10 % allowance, so the gate should reject it.

For each of ``--reps`` rounds, every window of ``--windows`` (the setting's default first) gates the
identical and then the slower challenger, so the windows share the machine's drift. Reported per
window: the gate's seconds (median and max), false rejections of the identical challenger,
detections of the slower one, and the noise bands and p99s behind each verdict.

Goals, judged at the setting's window (not measured when ``--windows`` leaves it out): 0 false
rejections, and the slower challenger rejected in every round. The shorter windows are figures
beside it, no goal: a default moves only when its column shows both at once. The reuse publish's
goal (<= 20 s, ``publish_latency``) leaves the gate about 18 s after conversion, push, load and
record.

Usage::

    .venv/bin/python benchmarks/perf_gate.py [--windows 1000,500,250] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

N_FEATURES = 8
CONCURRENCY = 4

def model_folder(root: Path, name: str, clf, X, y) -> Path:
    """``root/name`` with ``1/model.onnx`` of ``clf`` fitted on ``X, y`` and the config a publish
    generates for it (:func:`model_registry.triton_config.build_config`: one CPU instance,
    ``max_batch_size`` 8)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    from model_registry.triton_config import InstanceGroupSpec, build_config, to_pbtxt

    clf.fit(X, y)
    onx = convert_sklearn(clf, initial_types=[("float_input", FloatTensorType([None, N_FEATURES]))],
                          options={id(clf): {"zipmap": False}}, target_opset=17)
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(onx.SerializeToString())
    config = build_config(name, onx, max_batch_size=8, instance_groups=[InstanceGroupSpec("KIND_CPU", 1)])
    (folder / "config.pbtxt").write_text(to_pbtxt(config))
    return folder


def gate_once(champion: Path, challenger: Path, window_ms: int, sample, settings, tools) -> dict:
    """One gate run: its seconds, verdict and figures."""
    from model_registry.profiling.perf import perf_regression_gate

    t = time.perf_counter()
    result = perf_regression_gate(champion, challenger, concurrency=CONCURRENCY,
                                  passes=max(3, settings.perf_gate_passes), measurement_ms=window_ms,
                                  samples={"champion": sample, "challenger": sample}, tools=tools,
                                  settings=settings)
    v = result.verdict
    return {"seconds": round(time.perf_counter() - t, 2), "rejected": v.rejected,
            "champion_p99_ms": round(v.champion_p99_ms, 3), "challenger_p99_ms": round(v.challenger_p99_ms, 3),
            "noise_band": round(v.noise_band, 3), "regression_ms": round(v.regression_ms, 3)}


def summarise(runs: list[dict], slower: bool) -> dict:
    """Per window and challenger: seconds, verdict counts, noise bands and p99 differences."""
    secs = [r["seconds"] for r in runs]
    key = "detected" if slower else "false_rejections"
    return {key: sum(r["rejected"] for r in runs), "runs": len(runs),
            "gate_s_median": round(statistics.median(secs), 2), "gate_s_max": max(secs),
            "noise_bands": [r["noise_band"] for r in runs], "regression_ms": [r["regression_ms"] for r in runs]}


def main() -> int:
    from ground.settings import get_settings

    s = get_settings()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", default=f"{s.perf_gate_measurement_ms},500,250",
                    help="measurement windows (ms), comma-separated; the first is judged (default: the setting's)")
    ap.add_argument("--reps", type=int, default=5, help="rounds; each gates both challengers at every window")
    ap.add_argument("--slower-trees", type=int, default=2500, help="trees of the slower challenger's forest")
    args = ap.parse_args()
    windows = [int(w) for w in args.windows.split(",") if w]
    figures = measure(windows, args.reps, args.slower_trees, s)
    _finish(windows, args, figures, s)
    return 0


def measure(windows: list[int], reps: int, trees: int, s) -> dict:
    """Every round's gates, summarised per window (see the module docstring)."""
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    from tritonflow.pipelines.publish_profile import profiling_unavailable_reason
    from tritonflow.runtime.triton_tools import triton_tools

    missing = profiling_unavailable_reason(s)
    if missing:
        raise SystemExit(f"perf_analyzer/Triton cannot run here: {missing}")
    X, y = make_classification(2000, N_FEATURES, random_state=0)
    X = X.astype(np.float32)
    root = Path(tempfile.mkdtemp(prefix="perf-gate-bench-"))
    folders = {"champion": model_folder(root, "champion", LogisticRegression(), X, y),
               "identical": model_folder(root, "identical", LogisticRegression(), X, y),
               "slower": model_folder(root, "slower", RandomForestClassifier(trees, random_state=0), X, y)}
    tools, sample = triton_tools(s), {"float_input": X[:64]}
    runs: dict[tuple[int, str], list[dict]] = {}
    for rep in range(reps):
        for ms in windows:
            for which in ("identical", "slower"):
                r = gate_once(folders["champion"], folders[which], ms, sample, s, tools)
                runs.setdefault((ms, which), []).append(r)
                print(f"round {rep + 1} window {ms} ms {which}: {json.dumps(r)}", flush=True)
    return {str(ms): {which: summarise(runs[(ms, which)], which == "slower") for which in ("identical", "slower")}
            for ms in windows}


def _finish(windows: list[int], args, figures: dict, s) -> None:
    """The standard last line: the default window's verdicts judged, every window's figures beside."""
    from report import equals, finish, not_measured

    default_ms = s.perf_gate_measurement_ms
    default = figures.get(str(default_ms))
    goals = {
        "false_rejections_at_default": (equals(default["identical"]["false_rejections"], 0) if default
                                        else not_measured("== 0")),
        "slower_detected_at_default": (equals(default["slower"]["detected"], args.reps, f"of {args.reps}")
                                       if default else not_measured(f"== {args.reps} of {args.reps}")),
    }
    finish("perf_gate",
           f"The p99 gate (scratch Triton, {max(3, s.perf_gate_passes)} interleaved perf_analyzer passes per model "
           f"at concurrency {CONCURRENCY}) on a ~2 ms ONNX champion against an identical challenger and a "
           f"{args.slower_trees}-tree forest 1-3 ms slower; rounds: {args.reps}, each at windows of "
           f"{', '.join(map(str, windows))} ms side by side; judged at the default {default_ms} ms.",
           goals, windows_ms=windows, default_window_ms=default_ms, reps=args.reps, concurrency=CONCURRENCY,
           per_window=figures,
           gate_s_median={w: figures[str(w)]["identical"]["gate_s_median"] for w in windows})


if __name__ == "__main__":
    raise SystemExit(main())
