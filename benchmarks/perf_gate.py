"""Benchmark: the p99 regression gate's cost and its verdicts, at several passes and measurement windows.

The gate (:func:`model_registry.profiling.perf.perf_regression_gate`) starts a scratch Triton 2.51
with champion and challenger and runs ``TRITONFLOW_PERF_GATE_PASSES`` perf_analyzer passes per
model, interleaved, each stabilised over at least three windows of
``TRITONFLOW_PERF_GATE_MEASUREMENT_MS``. With profile reuse the gate is most of a challenger's
publish (``publish_latency --champion``), so its length is the saving; this benchmark measures what
fewer or shorter windows, or more passes, cost in verdicts before any default moves. From 5 passes
on the gate's noise band leaves out each end's extreme pass
(:func:`~model_registry.profiling.perf.noise_spread`); below, it is the range.

Models (scikit-learn, 8 features, converted with skl2onnx, ONNX Runtime on the CPU, the champion's
config with ``max_batch_size`` 8): the champion is a logistic regression (p99 about 2 ms at
concurrency 4 on this machine class); the *identical* challenger is the same model again (any
rejection is a false one); the *slower* challenger is a random forest of ``--slower-trees`` (2,500)
unpruned trees, 1-3 ms slower at p99 (+50-150 %), above the gate's 1 ms floor
(``TRITONFLOW_MIN_P99_REGRESSION_MS``) and its 10 % allowance, so the gate should reject it.

A configuration is ``PASSES@WINDOW_MS``. For each of ``--reps`` rounds, every configuration of
``--configs`` (the settings' first) gates the identical and then the slower challenger, so the
configurations share the machine's drift. Reported per configuration: the gate's seconds (median
and max), false rejections of the identical challenger, detections of the slower one, the noise
bands and p99 differences behind each verdict, and each pass's p99.

Goals, judged at the settings' configuration: 0 false rejections, and the slower challenger
rejected in every round. The other configurations are figures beside it, no goal: a default moves
only when its column shows both at once. The reuse publish's goal (<= 20 s, ``publish_latency``)
leaves the gate about 18 s after conversion, push, load and record.

Usage::

    .venv/bin/python benchmarks/perf_gate.py [--configs 5@250,3@1000,3@500,3@250] [--reps 5]
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


def gate_once(champion: Path, challenger: Path, config: tuple[int, int], sample, settings, tools) -> dict:
    """One gate run at ``config`` (passes, window ms): its seconds, verdict, figures and passes."""
    from model_registry.profiling.perf import perf_regression_gate

    passes, window_ms = config
    t = time.perf_counter()
    result = perf_regression_gate(champion, challenger, concurrency=CONCURRENCY, passes=passes,
                                  measurement_ms=window_ms, samples={"champion": sample, "challenger": sample},
                                  tools=tools, settings=settings)
    v = result.verdict
    return {"seconds": round(time.perf_counter() - t, 2), "rejected": v.rejected,
            "champion_p99_ms": round(v.champion_p99_ms, 3), "challenger_p99_ms": round(v.challenger_p99_ms, 3),
            "noise_band": round(v.noise_band, 3), "regression_ms": round(v.regression_ms, 3),
            "pass_p99_ms": {m: [round(p.p99_ms, 3) for p in ps] for m, ps in result.passes.items()}}


def parse_configs(text: str) -> list[tuple[int, int]]:
    """``"5@250,3@1000"`` -> ``[(5, 250), (3, 1000)]``; ValueError naming a bad item."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        passes, _, window = item.partition("@")
        if not (passes.isdigit() and window.isdigit() and int(passes) >= 3 and int(window) > 0):
            raise ValueError(f"--configs item {item!r} is invalid (expected PASSES@WINDOW_MS, passes >= 3)")
        out.append((int(passes), int(window)))
    return out


def label(config: tuple[int, int]) -> str:
    """``(5, 250)`` -> ``"5@250"``."""
    return f"{config[0]}@{config[1]}"


def summarise(runs: list[dict], slower: bool) -> dict:
    """Per window and challenger: seconds, verdict counts, noise bands and p99 differences."""
    secs = [r["seconds"] for r in runs]
    key = "detected" if slower else "false_rejections"
    return {key: sum(r["rejected"] for r in runs), "runs": len(runs),
            "gate_s_median": round(statistics.median(secs), 2), "gate_s_max": max(secs),
            "noise_bands": [r["noise_band"] for r in runs], "regression_ms": [r["regression_ms"] for r in runs],
            "pass_p99_ms": [r["pass_p99_ms"] for r in runs]}


def main() -> int:
    from ground.settings import get_settings

    s = get_settings()
    default = (s.perf_gate_passes, s.perf_gate_measurement_ms)
    others = [c for c in ((5, 250), (3, 1000), (3, 500), (3, 250)) if c != default]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(map(label, [default, *others])),
                    help="PASSES@WINDOW_MS, comma-separated (default: the settings' first, then the others)")
    ap.add_argument("--reps", type=int, default=5, help="rounds; each gates both challengers in every configuration")
    ap.add_argument("--slower-trees", type=int, default=2500, help="trees of the slower challenger's forest")
    args = ap.parse_args()
    configs = parse_configs(args.configs)
    figures = measure(configs, args.reps, args.slower_trees, s)
    _finish(configs, default, args, figures)
    return 0


def measure(configs: list[tuple[int, int]], reps: int, trees: int, s) -> dict:
    """Every round's gates, summarised per configuration (see the module docstring)."""
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
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(reps):
        for config in configs:
            for which in ("identical", "slower"):
                r = gate_once(folders["champion"], folders[which], config, sample, s, tools)
                runs.setdefault((label(config), which), []).append(r)
                print(f"round {rep + 1} {label(config)} {which}: {json.dumps(r)}", flush=True)
    kinds = ("identical", "slower")
    return {label(c): {k: summarise(runs[(label(c), k)], k == "slower") for k in kinds} for c in configs}


def _finish(configs: list[tuple[int, int]], default: tuple[int, int], args, figures: dict) -> None:
    """The standard last line: the settings' configuration judged, every configuration's figures beside."""
    from report import equals, finish, not_measured

    judged = figures.get(label(default))
    goals = {
        "false_rejections_at_default": (equals(judged["identical"]["false_rejections"], 0) if judged
                                        else not_measured("== 0")),
        "slower_detected_at_default": (equals(judged["slower"]["detected"], args.reps, f"of {args.reps}")
                                       if judged else not_measured(f"== {args.reps} of {args.reps}")),
    }
    finish("perf_gate",
           f"The p99 gate (scratch Triton, interleaved perf_analyzer passes at concurrency {CONCURRENCY}) on a "
           f"~2 ms ONNX champion against an identical challenger and a {args.slower_trees}-tree forest 1-3 ms "
           f"slower; rounds: {args.reps}, each at passes@window_ms {', '.join(map(label, configs))} side by side; "
           f"judged at the default {label(default)}.",
           goals, configs=[label(c) for c in configs], default_config=label(default), reps=args.reps,
           concurrency=CONCURRENCY, per_config=figures,
           gate_s_median={label(c): figures[label(c)]["identical"]["gate_s_median"] for c in configs})


if __name__ == "__main__":
    raise SystemExit(main())
