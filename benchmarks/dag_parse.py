"""Benchmark: parse time of each DAG file in dags/ and of the whole folder through DagBag.

Goal: under 0.5 s per file on this machine class (2 cores), judged on the worst file's median
of the ``--repeat`` cold parses and on its warm parse. Prints one line per file and a folder
total, then the standard last line (:mod:`benchmarks.report`); exits 0 when it measured (the
goals are reported, ``python -m benchmarks`` decides). Run:

    .venv/bin/python benchmarks/dag_parse.py [--repeat 3] [--dags dags/]

Each file is parsed ``--repeat`` times in a fresh Python process that has already imported
Airflow (as the DAG processor's forked parser has), so the figure includes the file's own imports
(tritonflow, plugin modules); "warm" is a re-parse in this process with those imports cached.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 0.5


_COLD = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
t0 = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
print("RESULT " + json.dumps({"s": time.perf_counter() - t0, "dags": len(bag.dags),
                              "errors": list(bag.import_errors.values())}))
"""


def cold_parse(path: Path) -> dict:
    """Parse ``path`` in a fresh interpreter (Airflow pre-imported); return seconds, DAGs, errors."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins")]))
    out = subprocess.run([sys.executable, "-c", _COLD, str(path)], env=env, capture_output=True,
                         text=True, timeout=600).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dags", default=str(REPO / "dags"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="tf_parse_bench_"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO / "plugins")
    sys.path[:0] = [str(REPO), str(REPO / "plugins")]

    t0 = time.perf_counter()
    from airflow.dag_processing.dagbag import DagBag

    print(f"import airflow DagBag: {time.perf_counter() - t0:.3f} s")
    files = sorted(p for p in Path(args.dags).glob("*.py") if not p.name.startswith("_"))
    if not files:
        print(f"no DAG files in {args.dags}")
        return 0
    t0 = time.perf_counter()
    DagBag(dag_folder=str(files[0]), safe_mode=False)
    print(f"warm-up parse ({files[0].name}, first imports): {time.perf_counter() - t0:.3f} s")
    print(f"{'file':40s} {'dags':>4s} {'cold best s':>11s} {'cold mean s':>11s} {'warm s':>8s}  goal < {GOAL_S} s")
    per_file: dict[str, dict] = {}
    for path in files:
        runs = [cold_parse(path) for _ in range(args.repeat)]
        cold = [r["s"] for r in runs]
        t0 = time.perf_counter()
        DagBag(dag_folder=str(path), safe_mode=False)
        warm = time.perf_counter() - t0
        flag = "ok" if max(statistics.median(cold), warm) < GOAL_S else "SLOW"
        errs = f"  import errors: {runs[-1]['errors']}" if runs[-1]["errors"] else ""
        per_file[path.name] = {"dags": runs[-1]["dags"], "cold_s": [round(x, 3) for x in cold],
                               "cold_median_s": round(statistics.median(cold), 3), "warm_s": round(warm, 3),
                               "import_errors": len(runs[-1]["errors"])}
        print(f"{path.name:40s} {runs[-1]['dags']:4d} {min(cold):11.3f} {sum(cold)/len(cold):11.3f} "
              f"{warm:8.3f}  {flag}{errs}")
    t0 = time.perf_counter()
    bag = DagBag(dag_folder=args.dags, safe_mode=False)
    folder_s = time.perf_counter() - t0
    print(f"whole folder: {len(bag.dags)} DAGs, {len(bag.import_errors)} import errors, {folder_s:.3f} s")
    _finish(args, per_file, folder_s, len(bag.dags), len(bag.import_errors))
    return 0


def _finish(args, per_file: dict[str, dict], folder_s: float, dags: int, import_errors: int) -> None:
    """The standard last line: the worst file's cold median and warm parse against the goal."""
    from report import at_most, finish

    worst_cold = max(per_file, key=lambda f: per_file[f]["cold_median_s"])
    worst_warm = max(per_file, key=lambda f: per_file[f]["warm_s"])
    goals = {
        "cold_parse_median_s_worst_file": at_most(per_file[worst_cold]["cold_median_s"], GOAL_S, "s per file",
                                                  inclusive=False),
        "warm_parse_s_worst_file": at_most(per_file[worst_warm]["warm_s"], GOAL_S, "s per file", inclusive=False),
    }
    finish("dag_parse",
           f"Parse time of each of the {len(per_file)} DAG files in dags/ through DagBag: the median of "
           f"{args.repeat} cold parses (fresh interpreter, Airflow pre-imported) and one warm re-parse, worst "
           f"file against 0.5 s; no baseline.",
           goals, worst_file={"cold": worst_cold, "warm": worst_warm}, repeat=args.repeat, files=per_file,
           whole_folder_s=round(folder_s, 3), dags=dags, import_errors=import_errors)


if __name__ == "__main__":
    raise SystemExit(main())
