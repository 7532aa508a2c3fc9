"""The declared schema, applied first, to the reference and to every window alike.

A :class:`~drift_checks.inference_log.LogSchema` declares the kind of each feature. Before any
contract check or statistic, :func:`apply_schema` reads every feature column as its declared kind:

* ``category`` / ``string``: each value as its category name, a string, whatever the column's
  dtype: ``11``, ``11.0`` and ``"11"`` are all the category ``"11"`` (a whole float is written as
  the integer it holds, so an integer column that picked up nulls, and with them a float dtype,
  names the same categories); nulls stay null (``None``). An integer store id declared
  categorical is compared as categories, never as a wrong dtype;
* ``float`` / ``int``: numbers; text that reads as a number (``"3.5"``, ``"inf"``) is read
  (:func:`pandas.to_numeric`); ``int`` needs whole, finite numbers (``Int64`` when nulls are
  present);
* ``bool``: booleans (also the strings ``"true"`` / ``"false"``, any case);
* ``datetime``: timestamps (text parsed as ISO 8601, :func:`pandas.to_datetime`).

A value that cannot be read as its declared kind becomes null in the typed column and is counted
in an :class:`Unreadable` (column, kind, count, rows, first values). The data contract fails on
it, naming the column, the values and the kind: bad data, never an error of the check
(:func:`drift_checks.contracts.run_contract`). Columns the schema does not declare are left as
they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ground.exceptions import WindowError

#: Distinct unreadable values kept for messages.
MAX_UNREADABLE_EXAMPLES = 5
#: Kinds whose values are compared as category names.
CATEGORICAL_KINDS = ("category", "string")


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """Values of one column that cannot be read as its declared kind (mergeable across batches).

    Attributes:
        column: The column.
        kind: Its declared kind (``float``, ``int``, ``bool``, ``datetime``...).
        count: Non-null values that cannot be read as ``kind``.
        rows: Rows of the column (window or batch).
        examples: The first distinct such values, JSON-safe (at most :data:`MAX_UNREADABLE_EXAMPLES`).
    """

    column: str
    kind: str
    count: int
    rows: int
    examples: tuple = ()

    @property
    def share(self) -> float:
        """``count / rows`` (0.0 for no rows)."""
        return self.count / self.rows if self.rows else 0.0

    @property
    def message(self) -> str:
        """What failed, naming the column, the values and the declared kind."""
        return (f"column {self.column!r} is declared {self.kind}, but {self.count} of {self.rows} values "
                f"({100 * self.share:.2f} %) cannot be read as {self.kind}; first offending values: "
                f"{list(self.examples)!r}")

    def merge(self, other: "Unreadable | None", rows: int = 0) -> "Unreadable":
        """Both batches' unreadable values (``rows``: rows of the other batch when it had none)."""
        if other is None:
            return dataclasses.replace(self, rows=self.rows + rows)
        examples = list(self.examples)
        for v in other.examples:
            if len(examples) < MAX_UNREADABLE_EXAMPLES and v not in examples:
                examples.append(v)
        return Unreadable(self.column, self.kind, self.count + other.count, self.rows + other.rows,
                          tuple(examples))

    def to_json(self) -> dict[str, Any]:
        """JSON form (read back by :meth:`from_json`)."""
        return {"column": self.column, "kind": self.kind, "count": self.count, "rows": self.rows,
                "examples": list(self.examples)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Unreadable":
        """Rebuild from :meth:`to_json` output."""
        return cls(str(d["column"]), str(d["kind"]), int(d["count"]), int(d["rows"]), tuple(d["examples"]))


@dataclasses.dataclass(frozen=True)
class AppliedSchema:
    """A frame read as its declared schema.

    Attributes:
        frame: The typed frame (a shallow copy; the caller's frame is not modified).
        unreadable: ``{column: Unreadable}`` of the columns holding values of another kind.
    """

    frame: pd.DataFrame
    unreadable: dict[str, Unreadable]


def _json_value(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    return v if isinstance(v, (bool, int, float, str)) else str(v)


def category_name(value: Any) -> str:
    """The category name of one non-null value: ``str(value)``, a whole float as its integer.

    Args:
        value: Any non-null scalar (number, string, boolean, timestamp...).

    Returns:
        ``"11"`` for ``11``, ``11.0``, ``np.int64(11)`` and ``"11"``; ``"2.5"`` for ``2.5``;
        ``"True"`` for ``True``.
    """
    if isinstance(value, (float, np.floating)) and np.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _as_categories(s: pd.Series) -> pd.Series:
    if s.dtype == object and pd.api.types.infer_dtype(s, skipna=True) in ("string", "empty"):
        return s.where(s.notna(), None) if s.isna().any() else s
    if pd.api.types.is_integer_dtype(s) and not s.isna().any():
        return pd.Series(s.to_numpy().astype(str), index=s.index, dtype=object)
    return s.astype(object).map(category_name, na_action="ignore").where(s.notna(), None)


def _unreadable(col: str, kind: str, s: pd.Series, bad: pd.Series) -> Unreadable | None:
    n_bad = int(bad.sum())
    if not n_bad:
        return None
    values = pd.unique(s[bad].to_numpy(dtype=object))[:MAX_UNREADABLE_EXAMPLES]
    return Unreadable(col, kind, n_bad, int(len(s)), tuple(_json_value(v) for v in values))


def _as_numbers(col: str, kind: str, s: pd.Series) -> tuple[pd.Series, Unreadable | None]:
    numeric = pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)
    if numeric and (kind == "float" or pd.api.types.is_integer_dtype(s)):
        return s, None
    present = s.notna()
    num = s if numeric else pd.to_numeric(s.astype(object).where(present, None), errors="coerce")
    if pd.api.types.is_bool_dtype(num):  # booleans are not numbers of a numeric feature
        num = pd.Series(np.nan, index=s.index)
    num = num.astype("float64")
    bad = present & num.isna()
    if kind == "int":
        v = num.to_numpy()
        bad |= present & ~pd.Series(np.isfinite(v) & (np.floor(v) == v), index=s.index)
        num = num.where(~bad)
        typed = num.astype("Int64") if num.isna().any() else num.astype("int64")
    else:
        typed = num.where(~bad)
    return typed, _unreadable(col, kind, s, bad)


_TRUE, _FALSE = {"true"}, {"false"}


def _as_booleans(col: str, s: pd.Series) -> tuple[pd.Series, Unreadable | None]:
    if pd.api.types.is_bool_dtype(s):
        return s, None

    def read(v: Any) -> Any:
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        text = str(v).strip().lower() if isinstance(v, str) else None
        return True if text in _TRUE else False if text in _FALSE else None

    present = s.notna()
    typed = s.astype(object).map(read, na_action="ignore")
    bad = present & typed.isna()
    typed = typed.astype("boolean")
    return (typed if typed.isna().any() else typed.astype(bool)), _unreadable(col, "bool", s, bad)


def _as_datetimes(col: str, s: pd.Series) -> tuple[pd.Series, Unreadable | None]:
    if pd.api.types.is_datetime64_any_dtype(s):
        return s, None
    present = s.notna()
    typed = pd.to_datetime(s.astype(object).where(present, None), errors="coerce", utc=True, format="ISO8601")
    return typed, _unreadable(col, "datetime", s, present & typed.isna())


def apply_column(col: str, kind: str, s: pd.Series) -> tuple[pd.Series, Unreadable | None]:
    """One column read as its declared kind (see the module docstring).

    Args:
        col: The column's name (for the :class:`Unreadable` record).
        kind: Its declared kind (a :class:`~drift_checks.inference_log.LogSchema` kind).
        s: The column (any dtype; not modified).

    Returns:
        ``(typed column, Unreadable or None)``; unreadable values are null in the typed column.
        A column already of its kind is returned as it is (no copy).
    """
    if kind in CATEGORICAL_KINDS:
        return _as_categories(s), None
    if kind in ("float", "int"):
        return _as_numbers(col, kind, s)
    if kind == "bool":
        return _as_booleans(col, s)
    if kind == "datetime":
        return _as_datetimes(col, s)
    return s, None


def apply_schema(frame: pd.DataFrame, features: Mapping[str, str]) -> AppliedSchema:
    """Read every declared feature column of ``frame`` as its kind.

    Args:
        frame: The reference sample or a window (pandas; not modified).
        features: ``{column: kind}`` (``LogSchema.features``); columns missing from ``frame`` are
            skipped (the contract reports them).

    Returns:
        An :class:`AppliedSchema`: the typed frame and the unreadable values per column.
    """
    out = frame.copy(deep=False)
    unreadable: dict[str, Unreadable] = {}
    for col, kind in features.items():
        if col not in frame.columns:
            continue
        s = frame[col]
        typed, bad = apply_column(col, kind, s)
        if typed is not s:
            out[col] = typed
        if bad is not None:
            unreadable[col] = bad
    return AppliedSchema(out, unreadable)


def typed_reference(frame: pd.DataFrame, features: Mapping[str, str]) -> pd.DataFrame:
    """The reference sample read as its declared schema.

    Raises:
        WindowError: A reference value cannot be read as its column's declared kind (the baseline
            itself is wrong; names the column, the values and the kind).
    """
    applied = apply_schema(frame, features)
    if applied.unreadable:
        raise WindowError("reference: " + "; ".join(u.message for u in applied.unreadable.values())
                          + "; expected every reference value to be of its declared kind")
    return applied.frame
