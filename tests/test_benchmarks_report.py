"""The benchmarks' standard last line, the runner's results file and the figures tables generated from it.

README.md's and docs/benchmarks.md's figures tables must be what ``benchmarks/figures.py`` makes
of the latest results file (so no figure is typed by hand or kept after the code moved), and the
rendering says, for each benchmark, met / not met / failed / skipped / absent and how old it is.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import figures, report, suite

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_and_docs_tables_are_generated_from_the_latest_results_file():
    readme_table, docs_table = figures.render()
    assert figures.between_markers(figures.README.read_text()) == readme_table, \
        "README.md's figures table is stale: run scripts/update_figures.py"
    assert figures.between_markers(figures.DOCS.read_text()) == docs_table, \
        "docs/benchmarks.md's figures table is stale: run scripts/update_figures.py"


def test_no_hand_typed_figures_table_is_left_in_the_measured_figures_sections():
    readme = figures.README.read_text()
    section = readme[readme.index("## Measured figures"):readme.index("## Limits")]
    assert section.count("| benchmark |") == (0 if figures.latest_results() is None else 1)
    docs = figures.DOCS.read_text()
    latest = docs[docs.index("## Latest results"):docs.index("## History")]
    assert latest.count("| benchmark |") == (0 if figures.latest_results() is None else 1)


# ---- the standard last line (benchmarks/report.py)

def test_the_last_line_holds_goals_verdicts_and_measured_values_per_goal():
    doc = report.document("x", "What, at what size, against what.", {
        "switch_s": report.at_most(0.4, 1, "s", inclusive=False),
        "ratio_x": report.at_least(12.0, 30, "x"),
        "nan_s": report.at_most(math.nan, 5, "s"),
        "mirror_ms": report.not_measured("< 1 ms"),
    }, extra=[math.inf, 1.5])
    assert doc["goals"] == {"switch_s": "< 1 s", "ratio_x": ">= 30 x", "nan_s": "<= 5 s"}
    assert doc["goals_met"] == {"switch_s": True, "ratio_x": False, "nan_s": False}
    assert doc["measured"] == {"switch_s": 0.4, "ratio_x": 12.0, "nan_s": None}
    assert doc["not_measured"] == {"mirror_ms": "< 1 ms"}
    assert doc["extra"] == [None, 1.5]
    json.dumps(doc, allow_nan=False)  # strict JSON
    with pytest.raises(ValueError):
        report.document("x", "s", {}, measured={})


def test_finish_prints_one_json_line():
    import io

    out = io.StringIO()
    report.finish("x", "s", {"a_s": report.equals(0, 0)}, file=out)
    assert out.getvalue().count("\n") == 1
    assert json.loads(out.getvalue())["goals_met"] == {"a_s": True}


def test_every_benchmark_ends_with_the_standard_line():
    for bench in suite.BENCHMARKS:
        text = bench.script.read_text()
        assert "from report import" in text and "finish(" in text, bench.name


# ---- the runner (benchmarks/suite.py)

@pytest.mark.parametrize("stdout, problem", [
    ("", "no output"),
    ("figures\n", "the last line is not JSON"),
    ('{"a": 1}\n', "the last JSON line has no goals / goals_met objects"),
    ('progress\n{"goals": {}, "goals_met": {}}\n\n', ""),
])
def test_the_runner_reads_the_last_stdout_line(stdout, problem):
    assert suite.parse_last_line(stdout)[1] == problem


def _fake_suite(monkeypatch, tmp_path, scripts: dict[str, str]) -> None:
    (tmp_path / "benchmarks").mkdir()
    for name, code in scripts.items():
        (tmp_path / "benchmarks" / f"{name}.py").write_text(code)
    benches = tuple(suite.Benchmark(name, 20) for name in scripts)
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    monkeypatch.setattr(suite, "LOG_DIR", tmp_path / "logs")
    monkeypatch.setattr(suite, "BENCHMARKS", benches)
    monkeypatch.setattr(suite, "NAMES", tuple(scripts))


GOOD = ("import json\nprint('progress')\nprint(json.dumps({'benchmark': 'good', 'summary': 's', "
        "'goals': {'a_s': '<= 1 s'}, 'goals_met': {'a_s': True}, 'measured': {'a_s': 0.5}}))\n")


def test_the_runner_records_each_benchmark_and_fails_on_a_failed_one(monkeypatch, tmp_path):
    _fake_suite(monkeypatch, tmp_path, {
        "good": GOOD,
        "crash": "import sys\nprint('half way')\nsys.exit(3)\n",
        "silent": "print('no json here')\n",
        "slow": "import time\ntime.sleep(60)\n",
        "other": GOOD,
    })
    rc = suite.main(["--skip", "other", "--results-dir", str(tmp_path / "results"), "--timeout", "3", "--quiet"])
    assert rc == 1
    [path] = (tmp_path / "results").glob("*.json")
    assert figures.RESULTS_NAME.match(path.name)
    doc = json.loads(path.read_text())
    runs = doc["benchmarks"]
    assert runs["good"]["status"] == "ok" and runs["good"]["result"]["measured"] == {"a_s": 0.5}
    assert runs["good"]["rc"] == 0 and runs["good"]["default_args"] is True
    assert len(runs["good"]["load_before"]) == 3 and len(runs["good"]["load_after"]) == 3
    assert runs["crash"]["status"] == "failed" and runs["crash"]["reason"].startswith("exit status 3")
    assert "half way" in runs["crash"]["output_tail"]["stdout"]
    assert runs["silent"]["reason"] == "the last line is not JSON"
    assert runs["slow"]["reason"] == "timed out after 3 s"
    assert "other" not in runs and doc["excluded"] == {"other": "in --skip"}
    assert {"nproc", "memory_total_mb", "python", "commit", "dirty"} <= set(doc)


def test_the_runner_passes_when_every_benchmark_printed_its_line_and_never_overwrites(monkeypatch, tmp_path):
    _fake_suite(monkeypatch, tmp_path, {"good": GOOD})
    results = tmp_path / "results"
    assert suite.main(["--results-dir", str(results), "--quiet", "--arg", "good=--fast"]) == 0
    assert suite.main(["--results-dir", str(results), "--quiet"]) == 0
    files = sorted(results.glob("*.json"))
    assert len(files) == 2 and files[0].name.endswith("-2.json")
    assert json.loads(files[0].read_text())["benchmarks"]["good"]["default_args"] is True
    assert json.loads(files[1].read_text())["benchmarks"]["good"]["argv"] == ["benchmarks/good.py", "--fast"]


def test_a_run_stopped_half_way_keeps_what_it_measured_and_names_what_it_did_not_run(monkeypatch, tmp_path):
    snapshot = tmp_path / "snapshot.json"
    spy = (f"import glob, shutil\n[path] = glob.glob({str(tmp_path / 'results' / '*.json')!r})\n"
           f"shutil.copy(path, {str(snapshot)!r})\n" + GOOD)  # what a reader sees if the run stops now
    _fake_suite(monkeypatch, tmp_path, {"good": GOOD, "spy": spy, "last": GOOD})
    assert suite.main(["--results-dir", str(tmp_path / "results"), "--quiet"]) == 0
    half = json.loads(snapshot.read_text())
    assert half["finished_at"] is None and half["not_run_yet"] == ["spy", "last"]
    assert half["benchmarks"]["good"]["status"] == "ok"
    table = figures.readme_table(half, "half.json", age=lambda _c, _p: "current", names=("good", "spy", "last"))
    assert "stopped before it finished" in table
    assert "| `spy` | not run: the run of `half.json` stopped before it |" in table
    assert "`a_s` 0.5 (goal <= 1 s: met)" in table
    [path] = (tmp_path / "results").glob("*.json")
    done = json.loads(path.read_text())
    assert done["finished_at"] and "not_run_yet" not in done and set(done["benchmarks"]) == {"good", "spy", "last"}


def test_a_docker_benchmark_is_skipped_with_the_reason_when_docker_is_absent(monkeypatch):
    monkeypatch.setattr(suite.shutil, "which", lambda _name: None)
    bench = next(b for b in suite.BENCHMARKS if b.name == "compose_stack")
    assert suite.missing_prerequisite(bench) == "docker is not installed"


def test_resume_runs_again_only_what_failed_into_the_same_file_keeping_each_record_commit(monkeypatch, tmp_path):
    flag = tmp_path / "fixed"
    flaky = f"import pathlib, sys\nif not pathlib.Path({str(flag)!r}).exists():\n    sys.exit(2)\n" + GOOD
    _fake_suite(monkeypatch, tmp_path, {"good": GOOD, "flaky": flaky})
    results = tmp_path / "results"
    assert suite.main(["--results-dir", str(results), "--quiet"]) == 1
    [path] = results.glob("*.json")
    first = json.loads(path.read_text())
    flag.write_text("")  # the infrastructure problem is fixed
    monkeypatch.setattr(suite, "machine_facts", lambda _d: {**{k: first[k] for k in (
        "nproc", "cpu_count", "memory_total_mb", "python", "platform", "dirty")}, "commit": "b" * 40,
        "commit_short": "bbbbbbb"})
    assert suite.main(["--resume", str(path), "--quiet"]) == 0
    assert list(results.glob("*.json")) == [path]  # the same file, no new one
    doc = json.loads(path.read_text())
    assert doc["benchmarks"]["good"] == first["benchmarks"]["good"]  # not run again
    assert doc["benchmarks"]["flaky"]["status"] == "ok" and doc["benchmarks"]["flaky"]["commit"] == "b" * 40
    assert doc["resumed"][0]["benchmarks"] == ["flaky"] and doc["finished_at"] and "not_run_yet" not in doc
    seen = []
    table = figures.readme_table(doc, path.name, age=lambda c, _p: seen.append(c) or "current", names=("good", "flaky"))
    assert f"Resumed {doc['resumed'][0]['started_at']} at commit `bbbbbbb` for flaky." in table
    assert seen == [first["commit"], "b" * 40]
    with pytest.raises(SystemExit, match="--resume .*nothere.json: no such results file"):
        suite.main(["--resume", str(results / "nothere.json"), "--quiet"])
    monkeypatch.setattr(suite, "machine_facts", lambda _d: {**first, "nproc": 64})
    with pytest.raises(SystemExit, match="nproc is 64 here but"):
        suite.main(["--resume", str(path), "--quiet"])


def test_stopping_the_runner_stops_the_benchmark_it_is_running(tmp_path):
    pid_file, results = tmp_path / "bench.pid", tmp_path / "results"
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "sleepy.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    driver = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\nfrom pathlib import Path\nfrom benchmarks import suite\n"
              f"suite.ROOT = Path({str(tmp_path)!r}); suite.LOG_DIR = suite.ROOT / 'logs'\n"
              "suite.BENCHMARKS = (suite.Benchmark('sleepy', 300),); suite.NAMES = ('sleepy',)\n"
              f"suite.main(['--results-dir', {str(results)!r}, '--quiet'])\n")
    runner = subprocess.Popen([sys.executable, "-c", driver])
    try:
        for _ in range(600):
            if pid_file.is_file() and pid_file.read_text():
                break
            time.sleep(0.05)
        bench_pid = int(pid_file.read_text())
        runner.terminate()
        assert runner.wait(timeout=60) != 0
    finally:
        runner.kill()
    for _ in range(200):  # the benchmark's group was killed (SIGTERM, then SIGKILL after 30 s at most)
        try:
            os.kill(bench_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(bench_pid, signal.SIGKILL)
        raise AssertionError("the benchmark outlived its runner")
    [path] = results.glob("*.json")
    assert json.loads(path.read_text())["not_run_yet"] == ["sleepy"]


def test_a_stopped_docker_engine_is_no_reason_to_skip_since_the_stack_script_starts_it(monkeypatch):
    monkeypatch.setattr(suite.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(suite.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "no daemon"))
    bench = next(b for b in suite.BENCHMARKS if b.name == "compose_stack")
    assert suite.missing_prerequisite(bench) is None
    monkeypatch.setattr(suite.shutil, "which", lambda name: None if name == "dockerd" else f"/usr/bin/{name}")
    assert suite.missing_prerequisite(bench).startswith("no Docker engine answers (no daemon")


def test_measured_paths_follow_the_imports_down_the_layers():
    by_name = {b.name: suite.measured_paths(b) for b in suite.BENCHMARKS}
    # the hourly check through the pipeline (check_model_hour) and drift_scale's data, down to the ground
    assert {"benchmarks/drift_throughput.py", "benchmarks/drift_scale.py", "tritonflow", "drift_checks",
            "ground"} <= set(by_name["drift_throughput"])
    assert "dags" not in by_name["drift_throughput"] and "plugins" not in by_name["drift_throughput"]
    assert {"dags", "plugins", "tritonflow", "ground"} <= set(by_name["dag_parse"])
    assert "README.md" not in by_name["canary_detection"] and "docs" not in by_name["canary_detection"]


# ---- the tables (benchmarks/figures.py)

def _results(tmp_path: Path) -> Path:
    record = {"rc": 0, "wall_s": 12.3, "load_before": [1.5, 1.2, 1.0], "load_after": [2.5, 1.4, 1.1],
              "default_args": True, "measured_paths": ["drift_checks"]}
    doc = {
        "format": 1, "finished_at": "2025-03-02T10:00:00+00:00", "commit": "a" * 40, "commit_short": "aaaaaaa",
        "dirty": False, "nproc": 2, "memory_total_mb": 8192, "python": "3.11.9",
        "excluded": {"replica_promotion": "not in --only"},
        "benchmarks": {
            "dag_parse": {**record, "status": "ok", "argv": ["benchmarks/dag_parse.py"], "result": {
                "summary": "Parse time | of 8 DAG files.", "goals": {"cold_parse_median_s": "< 0.5 s per file"},
                "goals_met": {"cold_parse_median_s": True}, "measured": {"cold_parse_median_s": 0.31},
                "not_measured": {}}},
            "canary_detection": {**record, "status": "ok", "argv": ["benchmarks/canary_detection.py"],
                                 "measured_paths": ["repository_sync"], "result": {
                "summary": "Canary on real Triton.", "goals": {"detection_to_switch_s_nan": "<= 5 s (worst run)"},
                "goals_met": {"detection_to_switch_s_nan": False},
                "measured": {"detection_to_switch_s_nan": {"max": 5.7, "median": 4.8}},
                "not_measured": {"mirror_p99_added_ms": "< 1 ms"}}},
            "drift_throughput": {**record, "status": "ok", "default_args": False,
                                 "argv": ["benchmarks/drift_throughput.py", "--rows", "20000"], "result": {
                "summary": "Drift check.", "goals": {}, "goals_met": {}, "measured": {}, "not_measured": {}}},
            "publish_latency": {**record, "status": "failed", "rc": -9, "reason": "timed out after 3600 s",
                                "argv": ["benchmarks/publish_latency.py"], "result": None},
            "compose_stack": {"status": "skipped", "reason": "docker is not installed",
                              "argv": ["benchmarks/compose_stack.py"], "load_before": [1.0, 1.0, 1.0]},
        },
    }
    results = tmp_path / "results"
    results.mkdir()
    (results / "2025-03-02-aaaaaaa.json").write_text(json.dumps(doc))
    older = {**doc, "finished_at": "2025-03-01T10:00:00+00:00", "benchmarks": {}}
    (results / "2025-03-01-bbbbbbb.json").write_text(json.dumps(older))
    (results / "notes.json").write_text("{}")
    return results


def _age(commit, paths):
    assert commit == "a" * 40
    return "measured 3 commits ago" if paths == ["repository_sync"] else "current"


def test_the_tables_show_met_not_met_failed_skipped_absent_and_stale(tmp_path):
    results = _results(tmp_path)
    assert figures.latest_results(results).name == "2025-03-02-aaaaaaa.json"
    readme, docs = figures.render(results, age=_age)
    rows = {line.split("|")[1].strip().split()[0]: line for line in readme.splitlines() if line.startswith("| `")}
    assert "(goal < 0.5 s per file: met)" in rows["`dag_parse`"] and "| current |" in rows["`dag_parse`"]
    assert "Parse time \\| of 8 DAG files." in rows["`dag_parse`"]  # a pipe in a summary stays in its cell
    assert "| 1.5 -> 2.5 |" in rows["`dag_parse`"]
    canary = rows["`canary_detection`"]
    assert "max 5.7, median 4.8 (goal <= 5 s (worst run): **not met**)" in canary
    assert "`mirror_p99_added_ms` not measured in this run (goal < 1 ms)" in canary
    assert "measured 3 commits ago" in canary
    assert "non-default arguments: `--rows 20000`" in rows["`drift_throughput`"]
    assert "no stated goal" in rows["`drift_throughput`"]
    assert "**failed** in `2025-03-02-aaaaaaa.json`: timed out after 3600 s" in rows["`publish_latency`"]
    assert "skipped in `2025-03-02-aaaaaaa.json`: docker is not installed" in rows["`compose_stack`"]
    assert "not in the latest results file (`2025-03-02-aaaaaaa.json`; not in --only)" in rows["`replica_promotion`"]
    assert "not in the latest results file" in rows["`sentinel_rollback`"]
    assert set(rows) == {f"`{n}`" for n in suite.NAMES}  # every benchmark has a row
    assert "commit `aaaaaaa`" in readme and "2 cores" in readme
    assert "| `publish_latency` | `benchmarks/publish_latency.py` | failed, rc -9 | 12.3 |" in docs
    assert "1.5, 1.2, 1.0 | 2.5, 1.4, 1.1 | current |" in docs
    assert "(../benchmarks/results/2025-03-02-aaaaaaa.json)" in docs


def test_without_a_results_file_the_tables_say_so(tmp_path):
    assert figures.render(tmp_path / "none") == (figures.NO_RESULTS, figures.NO_RESULTS)


def test_splice_replaces_only_between_the_markers():
    text = f"before\n{figures.BEGIN}\nold | figure\n{figures.END}\nafter\n"
    new = figures.splice(text, "new table")
    assert new == f"before\n{figures.BEGIN}\nnew table\n{figures.END}\nafter\n"
    assert figures.between_markers(new) == "new table"
    with pytest.raises(ValueError):
        figures.splice("no markers", "t")


def test_the_age_counts_commits_that_changed_the_measured_paths(tmp_path):
    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    for path, message in (("pkg/a.py", "measured"), ("pkg/a.py", "code moved"), ("docs.md", "docs only")):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        with (tmp_path / path).open("a") as f:
            f.write(message + "\n")
        git("add", ".")
        git("commit", "-qm", message)
        if message == "measured":
            measured_at = git("rev-parse", "HEAD")
    age = figures.git_age(tmp_path)
    assert age(measured_at, ["pkg"]) == "measured 1 commit ago"
    assert age(git("rev-parse", "HEAD"), ["pkg"]) == "current"
    assert age("0" * 40, ["pkg"]) == "measured at 0000000, not in this history"
    assert age(None, ["pkg"]) == "age unknown (no commit recorded)"


def test_the_tables_name_the_measured_commit_so_a_later_commit_leaves_them_current(tmp_path):
    results = _results(tmp_path)
    readme, docs = figures.render(results)
    rows = [line for line in readme.splitlines() if line.startswith("| `dag_parse`")]
    assert rows and rows[0].endswith("| at `aaaaaaa` |")
    assert "| at `aaaaaaa` |" in docs
    assert figures.measured_at(None, ["."]) == "commit not recorded"
    stale = dict(figures.ages(results, age=_age))
    assert stale["canary_detection"] == "measured 3 commits ago" and stale["dag_parse"] == "current"


def test_update_figures_check_mode_agrees_with_the_test_above():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "update_figures.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_a_goal_not_measured_keeps_the_parentheses_of_its_own_target():
    # "<= 900 s (--full)" was printed "(goal <= 900 s (--full)": the wrapping strip took its ")"
    lines = figures.goal_lines({"goals": {}, "not_measured": {"full_replay_wall_s": "<= 900 s (--full)"}})
    assert lines == ["`full_replay_wall_s` not measured in this run (goal <= 900 s (--full))"]
    older = figures.goal_lines({"goals": {}, "not_measured": ["mirror_p99_added_ms (< 1 ms)"]})
    assert older == ["`mirror_p99_added_ms` not measured in this run (goal < 1 ms)"]


def test_the_full_replay_reports_the_served_auc_by_block_beside_the_champion_and_a_retraining(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # a script: it imports report from its folder
    from benchmarks import main_job
    from model_registry.datasets import FEATURE_COLUMNS, load_noaa
    from model_registry.noaa_model import train_noaa
    from tritonflow.demo.serving import SCORE_COLUMN

    noaa = load_noaa()
    champion = train_noaa(noaa[noaa["day"] < 8000])
    served = noaa[noaa["day"] >= 8000].rename(columns={"rain": "label"})
    served["baseline_score"] = champion.predict_scores(served[list(FEATURE_COLUMNS)])
    # the columns of the demo report's traffic.parquet; a loop that never retrained
    served[SCORE_COLUMN] = served["baseline_score"]
    blocks = {tuple(b["days"]): b for b in main_job.served_auc_by_block(served, noaa)}
    assert set(blocks) == {(first, end - 1) for first, end in main_job.AUC_BLOCKS}
    late = blocks[(16000, 18158)]
    assert late["served_auc"] == late["champion_auc"] < 0.5 < 0.8 < late["retrained_auc"]  # the concept drift
    goals = main_job.auc_goals(list(blocks.values()), full=True)
    assert goals["served_auc_days_16000_18158"].met is False
    assert main_job.auc_goals([], full=False)["served_auc_days_12000_13999"].met is None
