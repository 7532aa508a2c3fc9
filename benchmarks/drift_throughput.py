"""Drift check throughput: the hourly check's own path, exact and streamed, vs Evidently DataDriftPreset.

Usage::

    .venv/bin/python benchmarks/drift_throughput.py                  # 1,000,000 x 20 (Evidently ~2 min idle)
    .venv/bin/python benchmarks/drift_throughput.py --rows 100000    # quick run
    .venv/bin/python benchmarks/drift_throughput.py --skip-evidently

Measures, side by side in one run, on one window of the inference log (``--rows`` x ``--features``
float features written as Parquet partitions, and the model's 100,000-row reference; the data of
``benchmarks/drift_scale.py``):

* **ours**: ``tritonflow.pipelines.drift.check_model_hour`` (list and read the hour's files,
  contract, statistics, thresholds, verdict, history), each run in a fresh process, at default
  settings, on both paths the hourly DAG takes:

  - **exact**: the window read whole (what the DAG does up to ``TRITONFLOW_DRIFT_EXACT_MAX_ROWS``
    rows, 200,000 by default; forced here at every size);
  - **streamed**: the window summarised in record batches (what the DAG does above that limit:
    the default path at 1 M rows);

  each as a **first check** (a fresh home: no history, no cached prepared reference) and an
  **hourly check** (the same hour again in that home: what every hour after a version's first
  costs). Imports a worker pays once are measured and not counted (the Celery workers and the
  LocalExecutor's forkserver preload them).
* **Evidently** ``DataDriftPreset`` on the same window against the same reference, in this process,
  its imports not counted either.
* the 30-day **P95 threshold lookup**, 50 features x 3 statistics x 720 hours (SQLite).

The 1-minute load average is recorded around every measurement (Evidently's ratio depends on it).
The last line is the standard JSON object (:mod:`benchmarks.report`). Goals: Evidently / ours >= 30x
on the default path's hourly check (with the ratio of every other path reported beside it), and the
P95 lookup < 20 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import drift_scale  # noqa: E402  (benchmarks/ is this script's own folder)

from ground.settings import DEFAULTS  # noqa: E402

RATIO_GOAL_X = 30
#: ``TRITONFLOW_DRIFT_EXACT_MAX_ROWS``'s default: the hourly DAG streams windows above it.
DEFAULT_EXACT_MAX_ROWS = DEFAULTS.drift_exact_max_rows


def run_ours(root: Path, tmp: Path, model: str, rows: int, exact: bool) -> dict:
    """The first and the hourly check of one path, each in a fresh process."""
    home = tmp / f"home-{'exact' if exact else 'streamed'}"
    shutil.rmtree(home, ignore_errors=True)
    # exact: read whole at any size; streamed: the default limit, or below the window when it is smaller
    limit = 10**12 if exact else min(DEFAULT_EXACT_MAX_ROWS, rows - 1)
    extra = {} if limit == DEFAULT_EXACT_MAX_ROWS else {"TRITONFLOW_DRIFT_EXACT_MAX_ROWS": limit}
    out = {}
    for phase in ("first", "hourly"):
        shutil.rmtree(root / model / "drift_summaries", ignore_errors=True)  # computed, never reused
        out[phase] = drift_scale.run_child("check", model, drift_scale.check_env(root, home, **extra))
    return out


def run_evidently(root: Path, model: str) -> dict:
    """Evidently ``DataDriftPreset`` on the window's files against the model's stored reference."""
    import pyarrow.dataset as ds

    from drift_checks.reference import load_reference

    t = time.perf_counter()
    from evidently import DataDefinition, Dataset, Report
    from evidently.presets import DataDriftPreset

    imports_s = time.perf_counter() - t
    ref = load_reference(str(root), model, 1, with_profile=False)
    cols = list(ref.schema.features)
    files = sorted(str(p) for p in (root / model).rglob("part-*.parquet"))
    current = ds.dataset(files, format="parquet").to_table(columns=cols).to_pandas()
    dd = DataDefinition(numerical_columns=cols)
    load = os.getloadavg()[0]
    t = time.perf_counter()
    Report([DataDriftPreset()]).run(Dataset.from_pandas(current, data_definition=dd),
                                    Dataset.from_pandas(ref.frame[cols], data_definition=dd))
    seconds = time.perf_counter() - t
    return {"seconds": round(seconds, 2), "imports_s": round(imports_s, 2), "rows": len(current),
            "reference_rows": len(ref.frame), "load_average_1m": [round(load, 1), round(os.getloadavg()[0], 1)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the window")
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--skip-evidently", action="store_true", help="do not run Evidently (no ratio)")
    ap.add_argument("--workdir", default=None, help="where the Parquet data goes (reused when it matches)")
    args = ap.parse_args()

    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="drift_throughput_"))
    root, model = tmp / "logs", f"throughput-{args.rows}"
    t = time.perf_counter()
    drift_scale.generate(root, model, args.rows, args.features)
    print(f"window of {args.rows:,} x {args.features} ready in {time.perf_counter() - t:.1f} s", flush=True)
    ours = {"exact": run_ours(root, tmp, model, args.rows, exact=True),
            "streamed": run_ours(root, tmp, model, args.rows, exact=False)}
    for path, runs in ours.items():
        for phase, r in runs.items():
            r["rows_per_s"] = round(args.rows / r["seconds"]) if r["seconds"] else None
            print(f"ours, {path} path, {phase} check: {json.dumps(r)}", flush=True)
    evidently = None if args.skip_evidently else run_evidently(root, model)
    if evidently:
        print(f"Evidently DataDriftPreset on the same window: {json.dumps(evidently)}", flush=True)
    p95_ms = drift_scale.p95_lookup_ms(tmp)
    print(f"P95 lookup (SQLite, 50 features x 3 statistics x 720 hours): {p95_ms} ms", flush=True)
    finish(args, ours, evidently, p95_ms)
    if not args.workdir:
        shutil.rmtree(tmp, ignore_errors=True)


def finish(args, ours: dict, evidently: dict | None, p95_ms: float) -> None:
    """The standard last line: Evidently over ours on the default path's hourly check, every ratio beside it."""
    from report import at_least, at_most, not_measured
    from report import finish as print_last_line

    default_path = "streamed" if args.rows > DEFAULT_EXACT_MAX_ROWS else "exact"
    ratios = ({f"{path}_{phase}": round(evidently["seconds"] / r["seconds"], 1)
               for path, runs in ours.items() for phase, r in runs.items()} if evidently else {})
    target = f">= {RATIO_GOAL_X} x"
    goals = {
        "evidently_over_ours_x": (not_measured(target) if not evidently else
                                  at_least(ratios[f"{default_path}_hourly"], RATIO_GOAL_X, "x",
                                           measured_as={"judged": f"{default_path}_hourly", **ratios})),
        "p95_lookup_ms": at_most(p95_ms, 20, "ms", inclusive=False),
    }
    print_last_line(
        "drift_throughput",
        f"The hourly drift check (check_model_hour, a fresh process per check, default settings) on "
        f"{args.rows:,} rows x {args.features} features of inference log, exact and streamed, first and "
        f"hourly, against Evidently DataDriftPreset on the same window and reference in the same run; "
        f"judged on the {default_path} path the hourly DAG takes at this size.",
        goals, rows=args.rows, features=args.features, default_path=default_path, ours=ours,
        evidently=evidently, ratios_x=ratios, p95_lookup_ms=p95_ms)


if __name__ == "__main__":
    main()
