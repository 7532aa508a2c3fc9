"""The docker-compose stack: build time cold and warm, ``up`` to all-healthy, the quick closed loop in
the stack with the share of task instances per worker, and requests failed in the worker-kill test.

    .venv/bin/python benchmarks/compose_stack.py [--no-cold] [--no-up] [--no-loop] [--no-kill]

- **cold build**: every image of the stack removed (the Debian root and the wheels fetched on the
  host stay: they are the cache ``scripts/stack.sh`` reuses), then ``scripts/stack.sh build``;
- **warm build**: ``scripts/stack.sh build`` again (nothing changed);
- **up**: ``scripts/stack.sh up`` of a fresh project to every service healthy, then down;
- **quick loop**: ``python -m tritonflow.demo --quick --stack compose`` (closed loop: drift alert to
  promoted challenger, every run made by the scheduler; task instances per worker host);
- **worker kill**: ``tests/compose/test_stack_running.py``'s worker-kill test (it asserts 0 failed
  requests; its result is reported as the count it asserts).

The last line printed is the standard JSON object (:mod:`benchmarks.report`) with every figure;
``python -m benchmarks`` records it in its results file (it skips this benchmark, with the reason,
where Docker is absent). Goals: quick closed loop <= 120 s, 0 failed requests in the kill test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")


def _stack(*args: str, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "stack.sh"), *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **(env or {})})
    return time.monotonic() - t, proc


def _stack_images() -> list[str]:
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}"], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    labelled = []
    for line in filter(None, out):
        name, image_id = line.split()
        fmt = '{{ index .Config.Labels "org.tritonflow.inputs" }}'
        label = subprocess.run(["docker", "image", "inspect", "-f", fmt, image_id], capture_output=True,
                               text=True).stdout.strip()
        if label and label != "<no value>" and not name.startswith("tritonflow/debian-base"):
            labelled.append(name)
    return labelled


def load() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-cold", action="store_true", help="skip the cold build")
    ap.add_argument("--no-up", action="store_true", help="skip the separate up-to-healthy measurement")
    ap.add_argument("--no-loop", action="store_true", help="skip the quick loop in the stack")
    ap.add_argument("--no-kill", action="store_true", help="skip the worker-kill test")
    args = ap.parse_args(argv)
    res: dict = {"load_before": load()}
    _, proc = _stack("status")  # starts dockerd when it is installed but not running
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        raise SystemExit(f"no Docker engine answers, and scripts/stack.sh could not start one:\n{proc.stderr[-2000:]}")
    if not args.no_cold:
        images = _stack_images()
        if images:
            subprocess.run(["docker", "rmi", "-f", *images], capture_output=True)
        res["cold_build_s"], proc = _stack("build")
        res["cold_build_ok"] = proc.returncode == 0
    res["warm_build_s"], proc = _stack("build")
    if not args.no_up:
        _up(res)
    if not args.no_loop:
        home = ROOT / ".cache" / "bench-stack-demo"
        proc = subprocess.run([PY, "-m", "tritonflow.demo", "--quick", "--stack", "compose", "--home", str(home)],
                              cwd=ROOT, capture_output=True, text=True)
        if home.is_dir():  # the demo's progress (the stack's up time, each step) beside its report
            (home / "demo_progress.log").write_text(proc.stderr)
        last = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
        summary_path = home / "report" / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        res["quick_loop"] = {"rc": proc.returncode, "closed_loop_s": last.get("closed_loop_s"),
                             "wall_s": last.get("wall_s"), "tasks_per_host": summary.get("tasks_per_host"),
                             "loop_hosts": [lp.get("hosts") for lp in summary.get("closed_loops") or []],
                             "bad_challenger": (summary.get("bad_challenger") or {}).get("outcome")}
    if not args.no_kill:
        proc = subprocess.run([PY, "-m", "pytest", "-q", "tests/compose/test_stack_running.py", "-k", "killed"],
                              cwd=ROOT, capture_output=True, text=True)
        res["worker_kill"] = {"passed": proc.returncode == 0, "tail": proc.stdout.strip().splitlines()[-1:]}
    res["load_after"] = load()
    _finish(args, res)
    return 0


def _up(res: dict) -> None:
    """``scripts/stack.sh up`` of a fresh project to every service healthy, then down."""
    from tritonflow.demo.stack import shifted_ports

    bench = {"COMPOSE_PROJECT_NAME": "tritonflow-bench", **{k: str(v) for k, v in shifted_ports(30000).items()}}
    _stack("down", "--volumes", env=bench)
    _, proc = _stack("up", env=bench)
    res["up_ok"] = proc.returncode == 0
    line = next((ln for ln in proc.stderr.splitlines() if "every service healthy" in ln), "")
    res["up_to_healthy_s"] = float(line.split("(")[1].split(" s")[0]) if line else None
    _stack("down", "--volumes", env=bench)


def _finish(args, res: dict) -> None:
    """The standard last line: the quick loop and the worker-kill test against their goals."""
    from report import Goal, at_most, finish, not_measured

    loops = (res.get("quick_loop") or {}).get("closed_loop_s") or []
    passed = (res.get("worker_kill") or {}).get("passed")
    kill_target = "== 0 (the worker-kill test asserts it)"
    goals = {  # every closed loop of the run within the goal
        "quick_closed_loop_s": not_measured("<= 120 s") if args.no_loop
        else at_most(max(loops) if loops else None, 120, "s"),
        "worker_kill_failed_requests": not_measured(kill_target) if args.no_kill
        else Goal(kill_target, 0 if passed else "test failed", bool(passed)),
    }
    finish("compose_stack",
           "The docker-compose stack (stand-in images where the official ones cannot be pulled): cold and warm "
           "build, up to every service healthy, the quick closed loop on two Celery workers and the "
           "worker-kill test; no baseline.",
           goals, **res)


if __name__ == "__main__":
    sys.exit(main())
