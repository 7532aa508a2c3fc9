"""Drift checks: inference logs, references, drift statistics, thresholds, verdicts and reports.

Import-light: submodules load their heavy dependencies (whylogs, Evidently, Great Expectations,
pyspark) inside functions. Import what you need from the submodules, e.g.
``from drift_checks.verdict import check_window``.
"""
