"""Checks of setting *values* beyond their types, for ``tritonflow settings``.

:meth:`ground.settings.Settings.from_env` converts each ``TRITONFLOW_*`` variable to its type
and checks ports. A value of the right type can still be one the code refuses only when it runs
(``TRITONFLOW_DRIFT_ENGINE=sparc``, ``TRITONFLOW_CANARY_STEPS=5,50``): :func:`settings_problems`
finds those up front, so ``tritonflow settings`` exits non-zero before a deployment starts with
them. Each field's own check is declared with the field (``setting(..., check=)``); the rules
here are only those that relate two settings.
"""

from __future__ import annotations

import dataclasses

from ground.exceptions import SettingsError
from ground.settings import ENV_PREFIX, Settings


def _variable(field: str) -> str:
    return ENV_PREFIX + Settings.__dataclass_fields__[field].metadata["env"]


def _field_problems(settings: Settings) -> list[str]:
    problems = []
    for field in dataclasses.fields(settings):
        check = field.metadata.get("check")
        value = getattr(settings, field.name)
        expected = check(value) if check else None
        if expected:
            problems.append(f"{_variable(field.name)}={value!r}: {expected}")
    return problems


def _run_rule_problems(settings: Settings) -> list[str]:
    """The sustained-drift run rule: off (0), or a span of >= 2 windows that can hold the evidence."""
    n_run, m_run = settings.drift_sustained_windows, settings.drift_sustained_evidence
    if n_run == 1 or (n_run and m_run > n_run):
        return [f"{_variable('drift_sustained_windows')}={n_run!r}: expected 0 (run rule off) or a "
                f"span >= 2 windows that holds {_variable('drift_sustained_evidence')}={m_run!r}, e.g. 5 and 4"]
    return []


def settings_problems(settings: Settings) -> list[str]:
    """Every value the code would refuse when it runs, one message each (empty: all valid).

    Each message names the variable, the value and what is expected: first each field's own check
    (declared with the field in :class:`ground.settings.Settings`), then the rules that relate two
    settings.

    Args:
        settings: The settings to check.

    Returns:
        One message per problem, in field order; empty when every value is valid.
    """
    return _field_problems(settings) + _run_rule_problems(settings)


def check_settings(settings: Settings) -> None:
    """Raise when any value is one the code would refuse.

    Raises:
        SettingsError: Listing every problem of :func:`settings_problems`.
    """
    problems = settings_problems(settings)
    if problems:
        raise SettingsError("invalid settings:\n  " + "\n  ".join(problems))
