"""Exact, vectorised evaluation of the standard column expectations on the full window.

Presence, dtype, null fraction, min/max range and allowed/distinct value sets (every expectation
:func:`drift_checks.contracts.derive_contract` writes) are judged from the window's
:class:`~drift_checks.column_facts.ColumnFacts` with GX 1.x semantics, so they stay exact and fast
on large windows; anything else goes to Great Expectations (:mod:`drift_checks.contract_gx`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from drift_checks.column_facts import ColumnFacts
from drift_checks.contract_types import (
    FLOAT_TYPES,
    ExpectationResult,
    ExpectationSpec,
    canonical_datetime,
    jsonable,
    snake_case,
)
from drift_checks.declared_schema import Unreadable


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _between(observed: Any, kw: Mapping[str, Any]) -> bool:
    lo, hi = kw.get("min_value"), kw.get("max_value")
    if lo is not None and (observed <= lo if kw.get("strict_min") else observed < lo):
        return False
    if hi is not None and (observed >= hi if kw.get("strict_max") else observed > hi):
        return False
    return True


def exact_result(spec: ExpectationSpec, facts: ColumnFacts, is_dt: bool) -> ExpectationResult | None:
    """Exact evaluation of the standard column expectations on the FULL window.

    Computed from the window's :class:`~drift_checks.column_facts.ColumnFacts` (the whole column, or a
    streamed window's merged batches). Semantics follow GX 1.x: nulls are ignored by range and
    set checks, ``mostly`` is a share of the non-null rows for sets and of all rows for nulls.

    Args:
        spec: The expectation.
        facts: The window's facts about ``spec.column``.
        is_dt: Whether the column is a datetime one (its bounds and sets are in the canonical form).

    Returns:
        The result, or ``None`` when the expectation (type, kwargs or column dtype) is not one
        handled here; it then goes to Great Expectations.
    """
    allowed = _FAST_KWARGS.get(spec.type)
    if allowed is None or not set(spec.kwargs) <= allowed:
        return None
    if spec.type == "ExpectColumnValuesToNotBeInSet":
        return _infinities_result(spec, facts)
    if spec.type in _DISTINCT_SET_CHECKS:
        return _distinct_set_result(spec, facts, is_dt)
    handler = _EXACT_CHECKS.get(spec.type)
    return handler(spec, facts, is_dt) if handler is not None else None


def _type_list_result(spec: ExpectationSpec, facts: ColumnFacts, is_dt: bool) -> ExpectationResult | None:
    """``ExpectColumnValuesToBeInTypeList``: the column's dtype (an unreadable value fails it)."""
    kw, col, n = spec.kwargs, spec.column, facts.n
    if is_dt or not isinstance(kw.get("type_list"), (list, tuple)):
        return None
    dtype = str(facts.dtype)
    if facts.unreadable is not None and facts.unreadable.count:
        return unreadable_result(facts.unreadable, dtype)
    ok = dtype in {str(t) for t in kw["type_list"]}
    name = snake_case(spec.type)
    if ok or (n > 0 and facts.n_null == n):  # no value to judge: the null check reports it
        return ExpectationResult(col, name, dtype, True)
    bad = offending_values(facts.values_for_messages, kw["type_list"])
    return ExpectationResult(col, name, {"dtype": dtype, "first_offending_values": bad}, False,
                             message=f"column {col!r} has dtype {dtype}, not one of "
                                     f"{list(kw['type_list'])}; first offending values: {bad}")


def _not_null_result(spec: ExpectationSpec, facts: ColumnFacts, is_dt: bool) -> ExpectationResult | None:
    """``ExpectColumnValuesToNotBeNull``: the null share of all rows against ``mostly``."""
    mostly, n = spec.kwargs.get("mostly", 1.0), facts.n
    if not _is_number(mostly):
        return None
    nulls = facts.n_null - (facts.unreadable.count if facts.unreadable else 0)  # unreadable: not null
    pct = 100.0 * nulls / n if n else None
    ok = n == 0 or (n - nulls) / n >= float(mostly)
    return ExpectationResult(spec.column, snake_case(spec.type),
                             {"unexpected_percent": pct, "partial_unexpected_list": []},
                             ok, message="" if ok else f"{pct:.2f} % null (mostly={mostly})")


def _min_max_result(spec: ExpectationSpec, facts: ColumnFacts, is_dt: bool) -> ExpectationResult | None:
    """``ExpectColumnMinToBeBetween`` / ``ExpectColumnMaxToBeBetween`` on a numeric or datetime column."""
    kw = spec.kwargs
    bounds = [kw.get("min_value"), kw.get("max_value")]
    if all(b is None for b in bounds) or facts.n_null == facts.n:
        return None
    numeric = pd.api.types.is_numeric_dtype(facts.dtype) and not pd.api.types.is_bool_dtype(facts.dtype)
    if not is_dt and not numeric:
        return None
    v = facts.vmin if spec.type == "ExpectColumnMinToBeBetween" else facts.vmax
    if v is None:
        return None
    if is_dt:  # bounds were normalised to the canonical string form
        if not all(b is None or isinstance(b, str) for b in bounds):
            return None
        observed: Any = canonical_datetime(v)
    elif numeric and all(b is None or _is_number(b) for b in bounds):
        observed = float(v)
        if math.isnan(observed):
            return None
    else:
        return None
    ok = _between(observed, kw)
    return ExpectationResult(spec.column, snake_case(spec.type), jsonable(observed), ok, message="" if ok else
                             f"observed {jsonable(observed)!r} outside [{bounds[0]!r}, {bounds[1]!r}]")


def _distinct_set_result(spec: ExpectationSpec, facts: ColumnFacts, is_dt: bool) -> ExpectationResult | None:
    """The distinct-value set expectations (:data:`_DISTINCT_SET_CHECKS`) from the window's counts."""
    value_set = spec.kwargs.get("value_set")
    if not isinstance(value_set, (list, tuple, set)) or facts.counts is None:
        return None
    keys = [canonical_datetime(k) if is_dt else (k.item() if hasattr(k, "item") else k)
            for k, c in facts.counts.items() if c > 0]
    try:
        have, want = set(keys), set(value_set)
    except TypeError:  # unhashable values: leave it to GX
        return None
    ok = _DISTINCT_SET_CHECKS[spec.type](have, want)
    observed = jsonable(sorted(have, key=str))
    missing, extra = sorted(want - have, key=str), sorted(have - want, key=str)
    return ExpectationResult(spec.column, snake_case(spec.type), observed, ok, message="" if ok else
                             f"distinct values {observed[:20]}; missing {jsonable(missing[:10])}, "
                             f"not in the set {jsonable(extra[:10])}")


def _in_set_result(spec: ExpectationSpec, facts: ColumnFacts, is_dt: bool) -> ExpectationResult | None:
    """``ExpectColumnValuesToBeInSet``: the share of non-null values outside the set against ``mostly``."""
    value_set, mostly = spec.kwargs.get("value_set"), spec.kwargs.get("mostly", 1.0)
    if not isinstance(value_set, (list, tuple, set)) or not _is_number(mostly) or facts.counts is None:
        return None
    vc = facts.value_counts()
    keys = list(vc.index)
    if is_dt:
        keys = [canonical_datetime(k) for k in keys]
    elif pd.api.types.is_bool_dtype(facts.dtype) and all(isinstance(x, str) for x in value_set):
        keys = [str(k) for k in keys]  # derive_contract writes booleans as "True"/"False"
    allowed_values = set(value_set)
    try:
        bad = [(k, int(c)) for k, c in zip(keys, vc.to_numpy(), strict=True) if k not in allowed_values]
    except TypeError:  # unhashable values: leave it to GX
        return None
    nonnull = int(vc.sum())
    unexpected = sum(c for _, c in bad)
    pct = 100.0 * unexpected / nonnull if nonnull else None  # GX: undefined
    ok = nonnull == 0 or (nonnull - unexpected) / nonnull >= float(mostly)
    return ExpectationResult(spec.column, snake_case(spec.type),
                             {"unexpected_percent": pct,
                              "partial_unexpected_list": jsonable([k for k, _ in bad[:10]])},
                             ok, message="" if ok else f"{pct:.2f} % of values outside the set")


#: Exact evaluators by expectation type (the distinct-set ones and the finiteness check aside).
_EXACT_CHECKS = {
    "ExpectColumnValuesToBeInTypeList": _type_list_result,
    "ExpectColumnValuesToNotBeNull": _not_null_result,
    "ExpectColumnMinToBeBetween": _min_max_result,
    "ExpectColumnMaxToBeBetween": _min_max_result,
    "ExpectColumnValuesToBeInSet": _in_set_result,
}


def _infinity(v: Any) -> float | None:
    """``+inf`` / ``-inf`` for an infinite number or its JSON text (``"inf"``, ``"-inf"``), else ``None``."""
    try:
        f = float(v) if isinstance(v, (str, float, np.floating)) else None
    except ValueError:
        return None
    return f if f is not None and math.isinf(f) else None


def _infinities_result(spec: ExpectationSpec, facts: ColumnFacts) -> ExpectationResult | None:
    """``ExpectColumnValuesToNotBeInSet`` with only ``+inf`` / ``-inf`` on a numeric column, exactly.

    The finiteness check :func:`drift_checks.contracts.derive_contract` writes for every numeric
    feature, judged from the counts of infinities in the facts (GX 1.x semantics: ``mostly`` and
    the unexpected percent are shares of the non-null values). ``None`` for any other value set or
    dtype (Great Expectations evaluates it).
    """
    kw = spec.kwargs
    value_set, mostly = kw.get("value_set"), kw.get("mostly", 1.0)
    if not isinstance(value_set, (list, tuple, set)) or not value_set or not _is_number(mostly):
        return None
    signs = {_infinity(v) for v in value_set}
    if None in signs or not pd.api.types.is_numeric_dtype(facts.dtype) or pd.api.types.is_bool_dtype(facts.dtype):
        return None
    pos = facts.n_pos_inf if math.inf in signs else 0
    neg = facts.n_neg_inf if -math.inf in signs else 0
    count, nonnull = pos + neg, facts.n - facts.n_null
    pct = 100.0 * count / nonnull if nonnull else None
    ok = nonnull == 0 or (nonnull - count) / nonnull >= float(mostly)
    listed = ["inf"] * bool(pos) + ["-inf"] * bool(neg)
    share = count / facts.n if facts.n else 0.0
    observed = {"unexpected_count": count, "unexpected_percent": pct, "share_of_rows": round(share, 6),
                "n_pos_inf": pos, "n_neg_inf": neg, "partial_unexpected_list": listed}
    return ExpectationResult(spec.column, snake_case(spec.type), observed, ok, message="" if ok else
                             f"column {spec.column!r} holds {count} infinite values (+inf {pos}, -inf {neg}) "
                             f"in {facts.n} rows ({100 * share:.2f} %); expected finite numbers")


def unreadable_result(bad: Unreadable, dtype: str | None = None) -> ExpectationResult:
    """The type check's failure for values that cannot be read as the column's declared kind.

    Args:
        bad: The column's :class:`~drift_checks.declared_schema.Unreadable` values.
        dtype: The column's dtype once read (``None``: unknown).

    Returns:
        A failed ``expect_column_values_to_be_in_type_list`` result whose observed value and
        message name the column, the declared kind, the count, the share and the first values.
    """
    observed = {"dtype": dtype, "declared": bad.kind, "unreadable_count": bad.count,
                "unreadable_share": round(bad.share, 6), "first_offending_values": jsonable(list(bad.examples))}
    return ExpectationResult(bad.column, "expect_column_values_to_be_in_type_list", observed, False,
                             message=bad.message)


#: Distinct-value-set expectations (GX 1.x semantics on the non-null distinct values).
_DISTINCT_SET_CHECKS = {
    "ExpectColumnDistinctValuesToEqualSet": lambda have, want: have == want,
    "ExpectColumnDistinctValuesToContainSet": lambda have, want: want <= have,
    "ExpectColumnDistinctValuesToBeInSet": lambda have, want: have <= want,
}


def offending_values(s: pd.Series, type_list: Any = (), limit: int = 5) -> list[Any]:
    """The first distinct values of ``s`` that do not fit the expected types (JSON-safe).

    Numeric types expected: values that are not numbers; boolean: values that are not booleans;
    otherwise the first non-null values (the column's dtype itself is wrong).
    """
    wanted = {str(t) for t in type_list}
    values = s.dropna()
    if wanted & set(FLOAT_TYPES):
        bad = values[pd.to_numeric(values, errors="coerce").isna()]
    elif wanted & {"bool", "boolean"}:
        bad = values[~values.map(lambda v: isinstance(v, (bool, np.bool_)))]
    else:
        bad = values
    return jsonable(list(pd.unique(bad.to_numpy(dtype=object))[:limit]))


#: Expectations evaluated exactly by :func:`exact_result`, with the kwargs it understands.
_FAST_KWARGS: dict[str, set[str]] = {
    **{t: {"column", "value_set"} for t in _DISTINCT_SET_CHECKS},
    "ExpectColumnValuesToBeInTypeList": {"column", "type_list"},
    "ExpectColumnValuesToNotBeNull": {"column", "mostly"},
    "ExpectColumnMinToBeBetween": {"column", "min_value", "max_value", "strict_min", "strict_max"},
    "ExpectColumnMaxToBeBetween": {"column", "min_value", "max_value", "strict_min", "strict_max"},
    "ExpectColumnValuesToBeInSet": {"column", "value_set", "mostly"},
    "ExpectColumnValuesToNotBeInSet": {"column", "value_set", "mostly"},
}


class LazyColumnFacts(dict):
    """Column facts of an in-memory window, taken when first needed."""

    def __init__(self, frame: pd.DataFrame, counted: set, unreadable: Mapping[str, Unreadable] | None = None):
        super().__init__()
        self.frame, self.counted, self.unreadable = frame, counted, dict(unreadable or {})

    def __missing__(self, col: str) -> ColumnFacts:
        self[col] = f = ColumnFacts.of_series(self.frame[col], counts=col in self.counted)
        f.unreadable = self.unreadable.get(col)
        return f


#: Expectations whose exact check needs the column's value counts.
COUNTED_EXPECTATIONS = {"ExpectColumnValuesToBeInSet", *_DISTINCT_SET_CHECKS}
