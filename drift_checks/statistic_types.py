"""What every drift statistic returns and how the registry describes it.

:class:`StatisticResult` (one statistic for one feature and one window; ``value=None`` with a
status instead of a silent NaN when a side is empty or all null) and :class:`Statistic` (a
registry entry: kind, direction, role, static threshold and its source, minimum and strong
effect). The registry itself and the thresholds' sources are in :mod:`drift_checks.statistics`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Literal, Mapping

Kind = Literal["numeric", "categorical"]
Direction = Literal["p_value", "distance"]
Role = Literal["significance", "effect", "guard"]

Status = Literal["ok", "empty", "all_null", "constant"]


@dataclasses.dataclass(frozen=True)
class StatisticResult:
    """One statistic for one feature and one window.

    Attributes:
        name: Registry name of the statistic (e.g. ``"psi"``).
        value: The score compared with the threshold; ``None`` when undefined (see ``status``).
            Never NaN or infinite.
        status: ``"ok"``, ``"empty"`` (a side has no rows), ``"all_null"`` (a side has rows but
            every value is null) or ``"constant"`` (the reference is constant; value still given).
        extra: Secondary numbers (e.g. the KS statistic next to its p-value), JSON-serialisable.
    """

    name: str
    value: float | None
    status: str = "ok"
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"name": self.name, "value": self.value, "status": self.status, **dict(self.extra)}


@dataclasses.dataclass(frozen=True)
class Statistic:
    """Registry entry: a pure statistic and its metadata.

    Attributes:
        name: Unique name, used as the key in the history store.
        kind: ``"numeric"`` or ``"categorical"``.
        direction: ``"p_value"`` (drift when value < threshold) or ``"distance"`` (drift when
            value > threshold); comparisons are strict.
        default_threshold: Static threshold used until a calibrated one exists.
        threshold_source: Where the default comes from.
        fn: ``fn(pair) -> StatisticResult`` with a :class:`NumericPair` or
            :class:`CategoricalPair`.
        description: One line for reports.
        role: ``"significance"``, ``"effect"`` or ``"guard"`` (see the module docstring).
        minimum_effect: Distances: the lowest threshold ever used (floor). p-values: the highest
            threshold ever used (equals the static α).
        strong_effect: Distances: the size from which an effect is large (``None``: p-values).
    """

    name: str
    kind: Kind
    direction: Direction
    default_threshold: float
    threshold_source: str
    fn: Callable[[Any], StatisticResult]
    description: str
    role: Role = "effect"
    minimum_effect: float = 0.0
    strong_effect: float | None = None

    def is_drift(self, value: float | None, threshold: float) -> bool | None:
        """Whether ``value`` is STRICTLY on the drift side of ``threshold``.

        Returns:
            ``True``/``False``; ``None`` when the value is undefined (``None``, NaN, inf).
        """
        if value is None or not math.isfinite(value):
            return None
        return value < threshold if self.direction == "p_value" else value > threshold

    def bounded(self, threshold: float) -> float:
        """``threshold`` moved inside the statistic's allowed range.

        Never below the minimum effect (distances), never above the static α (p-values).
        """
        if self.direction == "p_value":
            return min(float(threshold), self.minimum_effect)
        return max(float(threshold), self.minimum_effect)


def degenerate_result(name: str, status: str) -> StatisticResult:
    """The result of a statistic that cannot be computed on its inputs.

    Args:
        name: The statistic's registry name (``"psi"``, ``"ks_p_value"``...).
        status: Why it is undefined (``"empty"``, ``"constant"``..., as the input checks say).

    Returns:
        A :class:`StatisticResult` with ``value=None`` and that status: never read as "no drift".
    """
    return StatisticResult(name=name, value=None, status=status)
