"""The last line every benchmark prints: one JSON object with its goals, verdicts and figures.

A benchmark builds one :class:`Goal` per stated goal (the target as text, the measured value, met
or not) and ends with :func:`finish`, which prints::

    {"benchmark": "dag_parse", "summary": "...", "goals": {"cold_parse_median_s": "< 0.5 s"},
     "goals_met": {"cold_parse_median_s": true}, "measured": {"cold_parse_median_s": 0.31},
     "not_measured": {}, ...the benchmark's other figures...}

``goals`` maps a goal's name to its target as text, ``goals_met`` the same names to a bool,
``measured`` the same names to the measured value (the unit is in the name, or the value is a
small dict); a goal the run did not measure (an option skipped that part) is left out of those
three and given in ``not_measured`` (name -> target). ``summary`` is one sentence (what was measured, at what
size, against what baseline) that the README's figures table shows. Benchmarks report and exit 0
when they measured; ``python -m benchmarks`` decides what a missed goal means.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any, TextIO

#: Keys :func:`finish` writes itself; a benchmark's figures may not use them.
RESERVED = ("benchmark", "summary", "goals", "goals_met", "measured", "not_measured")


@dataclass(frozen=True)
class Goal:
    """One stated goal: ``target`` as text (``"<= 5 s"``), the ``measured`` value, whether it is ``met``.

    ``measured`` None with ``met`` None: the run did not measure it (reported in ``not_measured``).
    ``measured`` None with ``met`` False: it should have been measured and was not (a failure).
    """

    target: str
    measured: Any
    met: bool | None


def _fmt(limit: float) -> str:
    return f"{limit:,g}"


def at_most(measured: float | None, limit: float, unit: str = "", *, inclusive: bool = True,
            measured_as: Any = None) -> Goal:
    """Goal ``measured <= limit`` (``<`` when not ``inclusive``); a missing value is not met.

    ``measured_as`` replaces the reported value (e.g. a dict with the median beside the judged maximum).
    """
    target = f"{'<=' if inclusive else '<'} {_fmt(limit)}{' ' + unit if unit else ''}"
    ok = measured is not None and not _nan(measured) and (measured <= limit if inclusive else measured < limit)
    return Goal(target, measured if measured_as is None else measured_as, bool(ok))


def at_least(measured: float | None, limit: float, unit: str = "", *, measured_as: Any = None) -> Goal:
    """Goal ``measured >= limit``; a missing value is not met."""
    target = f">= {_fmt(limit)}{' ' + unit if unit else ''}"
    ok = measured is not None and not _nan(measured) and measured >= limit
    return Goal(target, measured if measured_as is None else measured_as, bool(ok))


def equals(measured: Any, expected: Any, unit: str = "") -> Goal:
    """Goal ``measured == expected``; a missing value is not met."""
    return Goal(f"== {expected}{' ' + unit if unit else ''}", measured, measured is not None and measured == expected)


def not_measured(target: str) -> Goal:
    """A stated goal this run did not measure (the option that measures it was off)."""
    return Goal(target, None, None)


def _nan(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def clean(value: Any) -> Any:
    """``value`` with NaN and infinities as None, so the line is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def document(benchmark: str, summary: str, goals: dict[str, Goal], **figures: Any) -> dict[str, Any]:
    """The standard JSON object (see the module docstring) as a dict."""
    clash = sorted(set(figures) & set(RESERVED))
    if clash:
        raise ValueError(f"figures may not be named {clash}")
    measured = {k: g for k, g in goals.items() if g.met is not None}
    doc: dict[str, Any] = {
        "benchmark": benchmark,
        "summary": summary,
        "goals": {k: g.target for k, g in measured.items()},
        "goals_met": {k: bool(g.met) for k, g in measured.items()},
        "measured": {k: g.measured for k, g in measured.items()},
        "not_measured": {k: g.target for k, g in goals.items() if g.met is None},
    }
    doc.update(figures)
    return clean(doc)


def finish(benchmark: str, summary: str, goals: dict[str, Goal], *, file: TextIO | None = None,
           **figures: Any) -> dict[str, Any]:
    """Print the benchmark's last line (one JSON object) and return it as a dict."""
    doc = document(benchmark, summary, goals, **figures)
    out = file or sys.stdout
    print(json.dumps(doc, allow_nan=False), file=out, flush=True)
    return doc
