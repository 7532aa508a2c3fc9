"""The figures tables of README.md and docs/benchmarks.md, generated from the latest results file.

:func:`render` reads the newest ``benchmarks/results/<UTC date>-<short commit>.json`` (newest by
the date in its name, then by its ``finished_at``) written by ``python -m benchmarks`` and returns
the two tables: README's (per benchmark: what it measured, each goal's figure with the goal and
met or not, the load average before and after, the commit it was measured at) and
docs/benchmarks.md's fuller one (also the argv, exit status and wall time). A benchmark absent from
the file, failed or skipped in it gets a row saying so, never an older figure.

The tables name the commit each row was measured at, never an age counted from HEAD: a count
would change with every later commit and make the committed tables stale without a figure moving.
:func:`git_age` (``scripts/update_figures.py --stale``) reports the age on demand: the commits
since that commit that changed a path the benchmark measures (the record's ``measured_paths``),
``git rev-list --count <commit>..HEAD -- <paths>``.

``scripts/update_figures.py`` writes the tables between the ``<!-- figures:begin -->`` and
``<!-- figures:end -->`` markers; ``tests/test_benchmarks_report.py`` fails when the committed
tables differ from :func:`render`'s.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.suite import NAMES

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
MARKERS = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
RESULTS_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-[0-9A-Za-z]+(-\d+)?\.json$")
NO_RESULTS = "No results file yet: run `python -m benchmarks`."

#: ``age(commit, paths)`` -> the age cell's text.
AgeFn = Callable[[str | None, list[str]], str]


def measured_at(commit: str | None, _paths: list[str]) -> str:
    """The table's age cell: the short commit a row was measured at (stable as HEAD moves)."""
    return f"at `{commit[:7]}`" if commit else "commit not recorded"


def latest_results(results_dir: Path = RESULTS_DIR) -> Path | None:
    """The newest results file in ``results_dir`` (by the date in its name, then ``finished_at``), or None."""
    found = []
    for path in results_dir.glob("*.json") if results_dir.is_dir() else ():
        m = RESULTS_NAME.match(path.name)
        if m:
            try:
                finished = json.loads(path.read_text()).get("finished_at") or ""
            except ValueError:
                finished = ""
            found.append((m.group(1), finished, path.name, path))
    return max(found)[3] if found else None


def git_age(root: Path = ROOT) -> AgeFn:
    """An age function counting the commits since ``commit`` that changed ``paths``, in ``root``'s git."""

    def age(commit: str | None, paths: list[str]) -> str:
        if not commit:
            return "age unknown (no commit recorded)"
        try:
            out = subprocess.run(["git", "rev-list", "--count", f"{commit}..HEAD", "--", *paths], cwd=root,
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return f"age unknown (no git here; measured at {commit[:7]})"
        if out.returncode != 0:
            return f"measured at {commit[:7]}, not in this history"
        n = int(out.stdout.strip() or 0)
        return "current" if n == 0 else f"measured {n} commit{'s' if n != 1 else ''} ago"

    return age


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def fmt(value: Any) -> str:
    """A measured value as short text: numbers rounded, dicts as ``key value`` pairs, lists bracketed."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.0f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        items = [fmt(v) for v in value[:8]]
        return "[" + ", ".join(items) + (", ..." if len(value) > 8 else "") + "]"
    return str(value)


def _unwrap(target: str) -> str:
    """``"(< 1 ms)"`` -> ``"< 1 ms"``; a target ending in its own parentheses keeps them."""
    return target[1:-1] if target.startswith("(") and target.endswith(")") else target


def goal_lines(result: dict[str, Any]) -> list[str]:
    """One line per goal: its figure, the goal and met or not; goals this run did not measure last."""
    lines = []
    for name, target in result.get("goals", {}).items():
        met = result.get("goals_met", {}).get(name)
        verdict = "met" if met else "**not met**"
        lines.append(f"`{name}` {fmt(result.get('measured', {}).get(name))} (goal {target}: {verdict})")
    skipped = result.get("not_measured") or {}
    if isinstance(skipped, list):  # an older line: "name (target)" strings
        pairs = (item.split(" ", 1) if " " in item else (item, "") for item in skipped)
        skipped = {name: _unwrap(target) for name, target in pairs}
    lines += [f"`{name}` not measured in this run (goal {target})" for name, target in skipped.items()]
    return lines or ["no stated goal"]


def _load(record: dict[str, Any]) -> str:
    before, after = record.get("load_before"), record.get("load_after")
    if not before:
        return ""
    return f"{before[0]:.1f} -> {after[0]:.1f}" if after else f"{before[0]:.1f}"


def _status(name: str, doc: dict[str, Any], file_name: str) -> tuple[dict[str, Any] | None, str]:
    """The benchmark's record and, when it has no figures to show, why."""
    record = doc.get("benchmarks", {}).get(name)
    if record is None and name in doc.get("not_run_yet", ()):
        return None, f"not run: the run of `{file_name}` stopped before it"
    if record is None:
        why = doc.get("excluded", {}).get(name)
        return None, f"not in the latest results file (`{file_name}`{'; ' + why if why else ''})"
    if record.get("status") == "skipped":
        return record, f"skipped in `{file_name}`: {record.get('reason')}"
    if record.get("status") != "ok" or not record.get("result"):
        return record, f"**failed** in `{file_name}`: {record.get('reason') or 'no result'}"
    return record, ""


def _argv_note(record: dict[str, Any]) -> str:
    return "" if record.get("default_args", True) else f" (non-default arguments: `{' '.join(record['argv'][1:])}`)"


def _rows(doc: dict[str, Any], file_name: str, age: AgeFn, names: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    extra = [n for n in doc.get("benchmarks", {}) if n not in names]
    for name in (*names, *extra):
        record, problem = _status(name, doc, file_name)
        row: dict[str, Any] = {"name": name, "record": record or {}, "problem": problem}
        if record is not None and record.get("status") != "skipped":
            row["age"] = age(record.get("commit") or doc.get("commit"), record.get("measured_paths") or ["."])
        rows.append(row)
    return rows


def _header(doc: dict[str, Any], file_name: str) -> str:
    dirty = ", uncommitted changes" if doc.get("dirty") else ""
    finished = (f"finished {doc['finished_at']}" if doc.get("finished_at") else
                f"started {doc.get('started_at')} and stopped before it finished")
    return (f"From [`benchmarks/results/{file_name}`](benchmarks/results/{file_name}): commit "
            f"`{doc.get('commit_short')}`{dirty}, {finished}, {doc.get('nproc')} cores, "
            f"{round((doc.get('memory_total_mb') or 0) / 1024)} GB, Python {doc.get('python')}. "
            + "".join(f"Resumed {r.get('started_at')} at commit `{(r.get('commit') or '')[:7]}` for "
                      f"{', '.join(r.get('benchmarks') or [])}. " for r in doc.get("resumed") or [])
            + "Load: 1-minute load average before -> after the benchmark.")


def readme_table(doc: dict[str, Any] | None, file_name: str = "", age: AgeFn | None = None,
                 names: tuple[str, ...] = NAMES) -> str:
    """README's table (between the markers, markers excluded)."""
    if doc is None:
        return NO_RESULTS
    age = age or measured_at
    out = [_header(doc, file_name), "", "| benchmark | what it measured | figures against goals | load | measured |",
           "|---|---|---|---|---|"]
    for row in _rows(doc, file_name, age, names):
        record, name = row["record"], f"`{row['name']}`"
        if row["problem"]:
            load = _load(record) if record.get("status") != "skipped" else ""
            out.append(f"| {name} | {_cell(row['problem'])} | | {load} | {row.get('age', '')} |")
            continue
        result, note = record["result"], _argv_note(record)
        out.append(f"| {name}{' ' + _cell(note) if note else ''} | {_cell(result.get('summary', ''))} | "
                   f"{'<br>'.join(_cell(x) for x in goal_lines(result))} | {_load(record)} | {row['age']} |")
    return "\n".join(out)


def docs_table(doc: dict[str, Any] | None, file_name: str = "", age: AgeFn | None = None,
               names: tuple[str, ...] = NAMES) -> str:
    """docs/benchmarks.md's fuller table: also the argv, exit status, wall time and load (1, 5, 15 min)."""
    if doc is None:
        return NO_RESULTS
    age = age or measured_at
    header = _header(doc, file_name).replace("](benchmarks/results/", "](../benchmarks/results/")
    out = [header, "", "| benchmark | argv | status | wall s | what it measured | figures against goals "
           "| load before | load after | measured |", "|---|---|---|---|---|---|---|---|---|"]
    for row in _rows(doc, file_name, age, names):
        record = row["record"]
        argv = f"`{' '.join(record['argv'])}`" if record.get("argv") else ""
        if not record.get("default_args", True):
            argv += " (non-default)"
        status = record.get("status", "absent") + (f", rc {record['rc']}" if "rc" in record else "")
        wall = fmt(record.get("wall_s")) if "wall_s" in record else ""
        loads = [", ".join(f"{x:.1f}" for x in record.get(k) or []) for k in ("load_before", "load_after")]
        if row["problem"]:
            what, figures = row["problem"], []
        else:
            what, figures = record["result"].get("summary", ""), goal_lines(record["result"])
        out.append(f"| `{row['name']}` | {_cell(argv)} | {_cell(status)} | {wall} | {_cell(what)} | "
                   f"{'<br>'.join(_cell(x) for x in figures)} | {loads[0]} | {loads[1]} | {row.get('age', '')} |")
    return "\n".join(out)


def render(results_dir: Path = RESULTS_DIR, age: AgeFn | None = None) -> tuple[str, str]:
    """README's and docs/benchmarks.md's tables from the latest results file in ``results_dir``."""
    path = latest_results(results_dir)
    doc = json.loads(path.read_text()) if path else None
    name = path.name if path else ""
    return readme_table(doc, name, age), docs_table(doc, name, age)


def ages(results_dir: Path = RESULTS_DIR, age: AgeFn | None = None) -> list[tuple[str, str]]:
    """``(benchmark, age)`` for each measured row of the latest results file, by :func:`git_age` by default."""
    path = latest_results(results_dir)
    if path is None:
        return []
    rows = _rows(json.loads(path.read_text()), path.name, age or git_age(), NAMES)
    return [(row["name"], row["age"]) for row in rows if "age" in row]


def splice(text: str, table: str, page: str = "page") -> str:
    """``text`` with ``table`` between its figures markers; ValueError when they are missing."""
    if not MARKERS.search(text):
        raise ValueError(f"{page}: no {BEGIN} ... {END} markers")
    return MARKERS.sub(lambda _m: f"{BEGIN}\n{table}\n{END}", text, count=1)


def between_markers(text: str) -> str | None:
    """What lies between the figures markers of ``text`` (None without markers)."""
    m = MARKERS.search(text)
    return m.group(0)[len(BEGIN) + 1:-len(END) - 1] if m else None
