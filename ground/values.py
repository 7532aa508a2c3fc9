"""Checks and parsers of setting values, shared by the settings and the packages that read them.

A :data:`Check` is what a value of the right type must also satisfy: called with the value, it
returns ``None`` when the value is fine, else what was expected ("expected a fraction between 0
and 1"), which ``ground.settings_checks.settings_problems`` prints after the variable and value. Each
field of :class:`ground.settings.Settings` names its check where it is declared.

The parsers take the text of a list-valued ``TRITONFLOW_*`` variable (or an already-split
sequence) and return the checked values, or raise an error that names the variable, the value
and what was expected.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ground.exceptions import DataError, SettingsError

__all__ = [
    "FRACTION", "JSON_OBJECT", "NON_NEGATIVE", "PERCENT", "POSITIVE_FINITE", "STEP_SCHEDULE", "Check", "at_least",
    "one_of", "parse_replica_urls", "parse_steps", "whole_numbers",
]

#: ``check(value) -> None`` when the value is fine, else what was expected ("expected a fraction between 0 and 1").
Check = Callable[[Any], "str | None"]


def one_of(*choices: str) -> Check:
    """A check that the value is one of ``choices`` (words the code that reads it accepts)."""
    def check(value: Any) -> str | None:
        return None if value in choices else f"expected one of {', '.join(choices)}"
    return check


def at_least(least: float, *, what: str = "a number", why: str = "") -> Check:
    """A check that a number is at least ``least``.

    Args:
        least: The smallest value accepted.
        what: How the message names the value ("a whole number").
        why: Reason appended to the message, in parentheses, when given.
    """
    def check(value: Any) -> str | None:
        reason = f" ({why})" if why else ""
        named = f"{what} " if what else ""
        return None if value >= least else f"expected {named}>= {least:g}{reason}"
    return check


def whole_numbers(least: int) -> Check:
    """A check that the text is comma-separated whole numbers, each at least ``least``."""
    def check(value: Any) -> str | None:
        items = [item.strip() for item in str(value).split(",")]
        return None if all(item.isdigit() and int(item) >= least for item in items) else (
            f"expected comma-separated whole numbers >= {least}")
    return check


def _fraction(value: Any) -> str | None:
    return None if 0.0 <= value <= 1.0 else "expected a fraction between 0 and 1"


def _percent(value: Any) -> str | None:
    return None if 0 <= value <= 100 else "expected a percent between 0 and 100"


def _positive_finite(value: Any) -> str | None:
    return None if 0 < value < float("inf") else "expected a finite number > 0"


def _step_schedule(value: Any) -> str | None:
    try:
        parse_steps(value, field="")
    except SettingsError as exc:  # "={value!r}: <what is wrong>"
        return str(exc).split(": ", 1)[-1]
    return None


def _json_object(value: Any) -> str | None:
    if not str(value).strip():
        return None
    try:
        ok = isinstance(json.loads(value), dict)
    except ValueError:
        ok = False
    return None if ok else 'expected a JSON object {"model": "module:function"}'


#: A fraction in [0, 1].
FRACTION: Check = _fraction
#: A percent in [0, 100].
PERCENT: Check = _percent
#: A number >= 0.
NON_NEGATIVE: Check = at_least(0)
#: A finite number > 0.
POSITIVE_FINITE: Check = _positive_finite
#: A canary step schedule (:func:`parse_steps`).
STEP_SCHEDULE: Check = _step_schedule
#: Empty, or a JSON object.
JSON_OBJECT: Check = _json_object


def parse_replica_urls(text: str | Sequence[str]) -> list[str]:
    """``host:port`` list from a comma-separated string (or a sequence), order kept, duplicates dropped.

    Raises:
        DataError: An entry is not ``host:port``.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in items:
        url = str(raw).strip()
        if not url:
            continue
        if url.startswith(("http://", "https://")):
            url = url.split("://", 1)[1]
        url = url.rstrip("/")
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise DataError(f"Triton replica {raw!r} is not host:port (TRITONFLOW_TRITON_REPLICA_URLS)")
        if url not in out:
            out.append(url)
    return out


def parse_steps(value: str | Sequence[int], field: str = "canary_steps") -> tuple[int, ...]:
    """Parse and check a step schedule: integer percents, strictly increasing, ending at 100.

    Args:
        value: ``"5,25,50,100"`` or a sequence of ints.
        field: Name used in error messages.

    Raises:
        SettingsError: Not integers 1-100, not increasing, or the last step is not 100.
    """
    raw = value.split(",") if isinstance(value, str) else list(value)
    steps: list[int] = []
    for item in raw:
        text = str(item).strip()
        if isinstance(item, bool) or isinstance(item, float) or not text.lstrip("-").isdigit():
            raise SettingsError(f"{field}={value!r}: step {item!r} is not an integer percent")
        steps.append(int(text))
    if not steps or any(not 1 <= s <= 100 for s in steps):
        raise SettingsError(f"{field}={value!r}: expected percents between 1 and 100")
    # consecutive pairs: the shorter steps[1:] ends the pairing on purpose
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise SettingsError(f"{field}={value!r}: steps must increase strictly")
    if steps[-1] != 100:
        raise SettingsError(f"{field}={value!r}: the last step must be 100 (full promotion)")
    return tuple(steps)
