"""Run every benchmark at its stated size, one after another, and write one results file.

``python -m benchmarks`` (see :func:`main`) runs each benchmark of :data:`BENCHMARKS` as a
subprocess (``python benchmarks/<name>.py <argv>``, its own process group, a generous timeout),
and records for each: the argv, the exit status, the wall seconds, ``os.getloadavg()`` before and
after, and its last stdout line parsed as the standard JSON object of :mod:`benchmarks.report`,
or why there is none (non-zero exit, no JSON, timeout) with the output's tail. The file,
``benchmarks/results/<UTC date>-<short commit>.json``, also holds the machine's facts (cores,
memory, Python, commit, dirty flag) and, per benchmark, the paths whose code it measures (what
:mod:`benchmarks.figures` counts commits on to say how old a figure is).

Exits 1 when a benchmark failed or printed no standard JSON line (and, with ``--require-goals``,
when a goal was not met); a benchmark skipped for a missing prerequisite (Docker) is recorded
with the reason and does not fail the run.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
#: Where each benchmark's full stdout and stderr go (ignored by git: ``.tritonflow/``).
LOG_DIR = ROOT / ".tritonflow" / "benchmark-logs"
#: Format of the results file; :mod:`benchmarks.figures` reads this one.
FORMAT = 1
#: The DAG folder and the root packages in their import layers, top first: each may import those after it.
LAYERS = ("dags", "plugins", "tritonflow", "model_registry", "repository_sync", "drift_checks", "ground")
#: Measured by every benchmark: the pinned dependencies.
COMMON_PATHS = ("requirements.txt", "requirements-triton.txt", "constraints")
TAIL_CHARS = 4000


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the suite: ``benchmarks/<name>.py`` (or ``<script_name>.py``) run with ``argv``.

    ``argv`` is empty (the script's defaults) unless the stated figure needs options (then the
    reason is in ``why``); ``needs`` names prerequisites checked before the run; ``paths`` adds
    measured paths that the script's imports do not show (data, compose files, DAG folders).
    ``script_name`` lets a second entry run a script already in the suite with other options
    (the main job's whole replay beside its quick run).
    """

    name: str
    timeout_s: int
    argv: tuple[str, ...] = ()
    why: str = ""
    needs: tuple[str, ...] = ()
    paths: tuple[str, ...] = field(default=())
    script_name: str = ""

    @property
    def script(self) -> Path:
        """The benchmark's script."""
        return ROOT / "benchmarks" / f"{self.script_name or self.name}.py"


#: Every benchmark, in the order they run. Timeouts are generous for a loaded 2-core machine.
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("dag_parse", 1800, paths=("dags",)),
    Benchmark("drift_throughput", 3600),
    Benchmark("drift_quality", 3600),
    Benchmark("retrain_window", 1800),
    Benchmark("drift_scale", 7200, argv=("--airflow-models", "200"),
              why="the many-models goal is stated for 200 models; the script's default skips that part",
              paths=("dags",)),
    Benchmark("drift_hour", 1800, paths=("dags", "plugins")),
    Benchmark("main_job", 3600, paths=("dags", "plugins", "tritonflow")),
    Benchmark("main_job_full", 3600, argv=("--full", "--timeout", "3300"), script_name="main_job",
              why="the full replay's wall time and the served AUC by block are stated for the whole replay; "
                  "the script's default is the quick run (the main_job entry)",
              paths=("dags", "plugins", "tritonflow")),
    Benchmark("publish_latency", 3600, argv=("--champion",),
              why="the stated figures are at default settings with a champion in place (the full sweep, the p99 gate "
                  "on), a fresh sweep against the champion's config reused; the script's default is a bounded sweep "
                  "with no champion"),
    Benchmark("perf_gate", 1800),
    Benchmark("rollback_time", 1800, argv=("--triton", "--keepalive", "--retry-stale"),
              why="the real-Triton run is the headline; the default upstream is a Python stand-in"),
    Benchmark("canary_detection", 3600),
    Benchmark("fallback_unload", 1800),
    Benchmark("sentinel_rollback", 1800),
    Benchmark("replica_promotion", 1800),
    Benchmark("registry_delivery", 1800, paths=("dags/registry_events_watch_all.json",)),
    Benchmark("compose_stack", 7200, needs=("docker",),
              paths=("dags", "docker-compose.yaml", "deploy", "scripts/stack.sh")),
)
NAMES = tuple(b.name for b in BENCHMARKS)


def measured_paths(bench: Benchmark) -> list[str]:
    """The repository paths whose code ``bench`` measures: its script, the root packages it imports
    and every package below the highest of them, its extra paths and the pinned dependencies."""
    scripts: list[str] = []
    roots: set[str] = set()
    todo = [bench.script.stem]
    while todo:  # the script, and the sibling benchmark modules it imports (their imports too)
        name = todo.pop()
        if name in scripts:
            continue
        scripts.append(name)
        for root in _imported_roots(ROOT / "benchmarks" / f"{name}.py"):
            if (ROOT / "benchmarks" / f"{root}.py").is_file():
                todo.append(root)
            else:
                roots.add(root)
    roots = {"plugins" if r == "tritonflow_plugin" else r for r in roots} | set(bench.paths)
    top = min((LAYERS.index(r) for r in roots if r in LAYERS), default=len(LAYERS))
    paths = [*(f"benchmarks/{n}.py" for n in scripts), *LAYERS[top:], *bench.paths, *COMMON_PATHS]
    return sorted(p for p in dict.fromkeys(paths) if (ROOT / p).exists())


def _imported_roots(script: Path) -> set[str]:
    """The top-level names ``script`` imports (anywhere in it, functions included)."""
    roots = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def missing_prerequisite(bench: Benchmark) -> str | None:
    """Why ``bench`` cannot run here (a missing prerequisite), or None."""
    if "docker" in bench.needs:
        if shutil.which("docker") is None:
            return "docker is not installed"
        info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
        if info.returncode != 0 and shutil.which("dockerd") is None:  # an engine installed, stopped: stack.sh starts it
            return f"no Docker engine answers ({(info.stderr or info.stdout).strip()[:200]})"
        if not (ROOT / "scripts" / "stack.sh").is_file():
            return "scripts/stack.sh is missing"
    return None


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def machine_facts(results_dir: Path) -> dict[str, Any]:
    """Cores, memory, Python, platform, the commit and whether the tree differs from it."""
    mem_kb = 0
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    try:
        results_rel = str(results_dir.resolve().relative_to(ROOT))
    except ValueError:
        results_rel = ""
    status = _git("status", "--porcelain", "--", ".", *([f":(exclude){results_rel}"] if results_rel else []))
    commit = _git("rev-parse", "HEAD")
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "memory_total_mb": round(mem_kb / 1024),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit or None,
        "commit_short": commit[:7] if commit else None,
        "dirty": bool(status),
    }


def parse_last_line(stdout: str) -> tuple[dict[str, Any] | None, str]:
    """The standard JSON object of the last non-empty stdout line, or None and why not."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None, "no output"
    try:
        doc = json.loads(lines[-1])
    except ValueError:
        return None, "the last line is not JSON"
    if not isinstance(doc, dict):
        return None, "the last line is not a JSON object"
    if not isinstance(doc.get("goals"), dict) or not isinstance(doc.get("goals_met"), dict):
        return doc, "the last JSON line has no goals / goals_met objects"
    return doc, ""


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _tail(path: Path) -> str:
    data = path.read_bytes() if path.is_file() else b""
    return data[-TAIL_CHARS:].decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_one(bench: Benchmark, argv: list[str], timeout_s: float, log_dir: Path, echo: bool) -> dict[str, Any]:
    """Run ``bench`` once as a subprocess; the record the results file keeps for it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{bench.name}.out", log_dir / f"{bench.name}.err"
    cmd = [sys.executable, str(bench.script.relative_to(ROOT)), *argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    record: dict[str, Any] = {"argv": cmd[1:], "timeout_s": timeout_s, "load_before": _load(),
                              "started_at": _now()}
    t0 = time.monotonic()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)

        def pump() -> None:
            for line in iter(proc.stdout.readline, b""):
                out.write(line)
                out.flush()
                if echo:
                    sys.stderr.write(f"  {bench.name}| {line.decode('utf-8', 'replace').rstrip()[:300]}\n")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        finally:
            if proc.poll() is None:
                _kill_group(proc)
        reader.join(timeout=30)
    record.update(rc=proc.returncode, wall_s=round(time.monotonic() - t0, 1), load_after=_load())
    doc, problem = parse_last_line(out_path.read_text(errors="replace"))
    record["result"] = doc if doc is not None and not problem else None
    if timed_out:
        problem = f"timed out after {timeout_s:g} s"
    elif proc.returncode != 0:
        problem = f"exit status {proc.returncode}" + (f"; {problem}" if problem else "")
    record["status"] = "failed" if problem else "ok"
    if problem:
        record["reason"] = problem
        record["output_tail"] = {"stdout": _tail(out_path), "stderr": _tail(err_path)}
        if doc is not None:
            record["result"] = doc
    return record


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def results_path(results_dir: Path, date: str, short: str | None) -> Path:
    """``<date>-<short commit>.json`` in ``results_dir``, with ``-2``, ``-3``... rather than overwrite."""
    stem = f"{date}-{short or 'nocommit'}"
    path, n = results_dir / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = results_dir / f"{stem}-{n}.json"
    return path


def _selection(args: argparse.Namespace) -> tuple[list[Benchmark], dict[str, str]]:
    only = [n for n in (args.only or "").split(",") if n]
    skip = [n for n in (args.skip or "").split(",") if n]
    unknown = sorted(set(only + skip + list(args.arg_map)) - set(NAMES))
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)} (known: {', '.join(NAMES)})")
    chosen, excluded = [], {}
    for b in BENCHMARKS:
        if only and b.name not in only:
            excluded[b.name] = "not in --only"
        elif b.name in skip:
            excluded[b.name] = "in --skip"
        else:
            chosen.append(b)
    return chosen, excluded


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated benchmark names to run (default: all)")
    ap.add_argument("--skip", help="comma-separated benchmark names not to run")
    ap.add_argument("--resume", type=Path, metavar="FILE",
                    help="run again, into results FILE, the benchmarks it records as failed or lacks (or --only's)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks with their argv and timeout, run none")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                    help="where the results file goes (default benchmarks/results)")
    ap.add_argument("--arg", action="append", default=[], metavar="NAME=ARGS",
                    help="run NAME with ARGS instead of its stated size (recorded as non-default; for quick checks)")
    ap.add_argument("--timeout", type=float, help="one timeout in seconds for every benchmark (default: each its own)")
    ap.add_argument("--require-goals", action="store_true", help="also exit 1 when a measured goal was not met")
    ap.add_argument("--quiet", action="store_true", help="do not echo the benchmarks' output")
    args = ap.parse_args(argv)
    args.arg_map = {}
    for item in args.arg:
        name, sep, rest = item.partition("=")
        if not sep:
            ap.error(f"--arg wants NAME=ARGS, got {item!r}")
        args.arg_map[name] = shlex.split(rest)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks and write the results file; see the module docstring."""
    args = _parse_args(argv)
    chosen, excluded = _selection(args)
    if args.list:
        for b in BENCHMARKS:
            flags = " ".join(b.argv) or "(defaults)"
            needs = f", needs {', '.join(b.needs)}" if b.needs else ""
            print(f"{b.name:18s} {flags:40s} timeout {b.timeout_s} s{needs}" + (f"  -- {b.why}" if b.why else ""))
        return 0
    signal.signal(signal.SIGTERM, _interrupt)  # stopping the runner stops the benchmark it is running
    stamp = dt.datetime.now(dt.timezone.utc)
    log_dir = LOG_DIR / stamp.strftime("%Y%m%dT%H%M%SZ")
    machine = machine_facts(args.results_dir)
    if args.resume:
        path, doc, chosen = _resume(args, chosen if args.only else None, machine, log_dir)
    else:
        doc = {"format": FORMAT, "started_at": _now(), "finished_at": None, **machine,
               "runner_argv": sys.argv[1:] if argv is None else argv, "excluded": excluded,
               "logs": str(log_dir.relative_to(ROOT)), "benchmarks": {}, "not_run_yet": [b.name for b in chosen]}
        args.results_dir.mkdir(parents=True, exist_ok=True)
        path = results_path(args.results_dir, stamp.strftime("%Y-%m-%d"), machine["commit_short"])
    _write(path, doc)  # rewritten after every benchmark: a run stopped half way keeps what it measured
    for i, bench in enumerate(chosen, 1):
        default = bench.name not in args.arg_map
        argv_b = list(bench.argv) if default else args.arg_map[bench.name]
        print(f"[{i}/{len(chosen)}] {bench.name} {' '.join(argv_b)}", file=sys.stderr, flush=True)
        reason = missing_prerequisite(bench)
        if reason:
            record = {"status": "skipped", "reason": reason, "argv": [str(bench.script.relative_to(ROOT)), *argv_b],
                      "load_before": _load()}
        else:
            record = run_one(bench, argv_b, args.timeout or bench.timeout_s, log_dir, echo=not args.quiet)
        record.update(default_args=default, measured_paths=measured_paths(bench))
        if args.resume and machine["commit"] != doc.get("commit"):
            record.update(commit=machine["commit"], dirty=machine["dirty"])  # its age counts from here
        doc["benchmarks"][bench.name] = record
        if bench.name in doc["not_run_yet"]:
            doc["not_run_yet"].remove(bench.name)
        _write(path, doc)
        print(f"[{i}/{len(chosen)}] {bench.name}: {_verdict(record)}", file=sys.stderr, flush=True)
    doc["finished_at"] = _now()
    doc.pop("not_run_yet")
    _write(path, doc)
    failed = [n for n, r in doc["benchmarks"].items() if r["status"] == "failed"]
    missed = [n for n, r in doc["benchmarks"].items()
              if r["status"] == "ok" and not all((r["result"] or {}).get("goals_met", {}).values())]
    print(json.dumps({"results": str(path), "failed": failed, "goals_not_met": missed,
                      "skipped": [n for n, r in doc["benchmarks"].items() if r["status"] == "skipped"]}))
    return 1 if failed or (args.require_goals and missed) else 0


def _resume(args: argparse.Namespace, only: list[Benchmark] | None, machine: dict[str, Any],
            log_dir: Path) -> tuple[Path, dict[str, Any], list[Benchmark]]:
    """The results file to resume, its document and the benchmarks to run again in it.

    ``only`` (``--only``'s selection; default: those the file records as failed, or has no record
    of) run again; each new record keeps the commit it ran at when that differs from the file's.
    """
    path = args.resume
    if not path.is_file():
        raise SystemExit(f"--resume {path}: no such results file")
    doc = json.loads(path.read_text())
    for key in ("nproc", "memory_total_mb", "python"):
        if doc.get(key) != machine[key]:
            raise SystemExit(f"--resume {path}: {key} is {machine[key]!r} here but {doc.get(key)!r} in the file; "
                             "resume on the machine that measured it")
    chosen = only or [b for b in BENCHMARKS if doc["benchmarks"].get(b.name, {}).get("status") in (None, "failed")]
    doc.setdefault("resumed", []).append({
        "started_at": _now(), "commit": machine["commit"], "dirty": machine["dirty"],
        "benchmarks": [b.name for b in chosen], "logs": str(log_dir.relative_to(ROOT))})
    doc["finished_at"] = None
    doc["not_run_yet"] = [b.name for b in chosen]
    for b in chosen:
        doc["excluded"].pop(b.name, None)
    return path, doc, chosen


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # run_one's finally kills the running benchmark's group


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Replace ``path`` with ``doc`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _verdict(record: dict[str, Any]) -> str:
    if record["status"] != "ok":
        return f"{record['status'].upper()}: {record['reason']}"
    met = record["result"]["goals_met"]
    return (f"ok in {record['wall_s']} s; goals met {sum(met.values())}/{len(met)}"
            + "".join(f", NOT met: {k}" for k, v in met.items() if not v))
