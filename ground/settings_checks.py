"""Checks of setting *values* beyond their types, for ``tritonflow settings``.

:meth:`ground.settings.Settings.from_env` converts each ``TRITONFLOW_*`` variable to its type
and checks ports. A value of the right type can still be one the code refuses only when it runs
(``TRITONFLOW_DRIFT_ENGINE=sparc``, ``TRITONFLOW_CANARY_STEPS=5,50``): :func:`settings_problems`
finds those up front, so ``tritonflow settings`` exits non-zero before a deployment starts with
them. The rules are the ones the code applies at run time (choices, canary step schedule,
fractions, the local Airflow's slot minimum).
"""

from __future__ import annotations

import json

from ground.exceptions import SettingsError
from ground.settings import ENV_PREFIX, Settings

#: Settings that take one of a few words, and those words (as the code that reads them accepts).
CHOICES = {
    "canary_quality_metric": ("auc", "accuracy"),
    "drift_reference_strategy": ("training", "trailing", "seasonal"),
    "drift_weighting": ("importance", "uniform"),
    "drift_engine": ("local", "spark"),
    "gateway_reload": ("local", "watcher"),
}
#: Settings that are fractions in [0, 1].
FRACTIONS = (
    "canary_max_error_rate", "canary_confidence", "parity_min_label_agreement", "fallback_min_label_agreement",
    "gpu_memory_budget_fraction", "host_memory_budget_fraction", "shadow_confidence", "drift_quantile",
    "retrain_mix_reference_fraction", "drift_dataset_share",
)
#: Settings that may not be negative.
NON_NEGATIVE = ("max_p99_regression", "min_p99_regression_ms")
#: Comma-separated lists of whole numbers (Model Analyzer's search space), and their least value.
INT_LISTS = {
    "analyzer_max_batch_sizes": 1,
    "analyzer_instance_counts": 1,
    "analyzer_queue_delays_us": 0,
    "analyzer_concurrency": 1,
}
#: Whole-number settings and their least value.
AT_LEAST = {"drift_models_per_task": 1, "drift_sustained_windows": 0, "drift_sustained_evidence": 2}
#: Fewest task slots of the local Airflow (runs of different DAGs overlap).
MIN_AIRFLOW_PARALLELISM = 4


def _variable(field: str) -> str:
    return ENV_PREFIX + Settings.__dataclass_fields__[field].metadata["env"]


def settings_problems(settings: Settings) -> list[str]:
    """Every value the code would refuse when it runs, one message each (empty: all valid).

    Each message names the variable, the value and what is expected.
    """
    from ground.values import parse_steps

    problems = []
    for field, choices in CHOICES.items():
        value = getattr(settings, field)
        if value not in choices:
            problems.append(f"{_variable(field)}={value!r}: expected one of {', '.join(choices)}")
    for field in FRACTIONS:
        value = getattr(settings, field)
        if not 0.0 <= value <= 1.0:
            problems.append(f"{_variable(field)}={value!r}: expected a fraction between 0 and 1")
    for field in NON_NEGATIVE:
        if not getattr(settings, field) >= 0:
            problems.append(f"{_variable(field)}={getattr(settings, field)!r}: expected a number >= 0")
    if not 0 <= settings.shadow_mirror_percent <= 100:
        problems.append(f"{_variable('shadow_mirror_percent')}={settings.shadow_mirror_percent!r}: "
                        "expected a percent between 0 and 100")
    for field, least in INT_LISTS.items():
        value = getattr(settings, field)
        items = [item.strip() for item in value.split(",")]
        if not all(item.isdigit() and int(item) >= least for item in items):
            problems.append(f"{_variable(field)}={value!r}: expected comma-separated whole numbers >= {least}")
    for field, least in AT_LEAST.items():
        if getattr(settings, field) < least:
            problems.append(f"{_variable(field)}={getattr(settings, field)!r}: expected a whole number >= {least}")
    n_run, m_run = settings.drift_sustained_windows, settings.drift_sustained_evidence
    if n_run == 1 or (n_run and m_run > n_run):
        problems.append(f"{_variable('drift_sustained_windows')}={n_run!r}: expected 0 (run rule off) or a "
                        f"span >= 2 windows that holds {_variable('drift_sustained_evidence')}={m_run!r}, "
                        "e.g. 5 and 4")
    try:
        parse_steps(settings.canary_steps, field=_variable("canary_steps"))
    except SettingsError as exc:
        problems.append(str(exc))
    if settings.retrain_entry_points.strip():
        try:
            ok = isinstance(json.loads(settings.retrain_entry_points), dict)
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"{_variable('retrain_entry_points')}={settings.retrain_entry_points!r}: expected a "
                            'JSON object {"model": "module:function"}')
    if settings.airflow_parallelism < MIN_AIRFLOW_PARALLELISM:
        problems.append(f"{_variable('airflow_parallelism')}={settings.airflow_parallelism!r}: expected >= "
                        f"{MIN_AIRFLOW_PARALLELISM} (runs of different DAGs overlap)")
    return problems


def check_settings(settings: Settings) -> None:
    """Raise when any value is one the code would refuse.

    Raises:
        SettingsError: Listing every problem of :func:`settings_problems`.
    """
    problems = settings_problems(settings)
    if problems:
        raise SettingsError("invalid settings:\n  " + "\n  ".join(problems))
