"""What the data contract's exact checks need to know about one column, mergeable across batches.

:func:`drift_checks.contracts.run_contract` evaluates presence, dtype, null fraction, min/max and
value-set expectations from these facts, whether they were taken from a whole window in memory
(:meth:`ColumnFacts.of_series`) or accumulated batch by batch while a large window was streamed
(:meth:`ColumnFacts.merge`, :mod:`drift_checks.summaries`): one implementation of each check.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from drift_checks.declared_schema import Unreadable

#: Distinct non-null values kept as examples for error messages.
MAX_EXAMPLES = 20


def _is_orderable(dtype: Any) -> bool:
    """Numeric (not boolean) or datetime: the dtypes whose min/max a contract checks."""
    return ((pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype))
            or pd.api.types.is_datetime64_any_dtype(dtype))


@dataclasses.dataclass
class ColumnFacts:
    """Facts of one column of a window.

    Attributes:
        dtype: The pandas dtype of the whole column (what ``pd.concat`` of the batches gives).
        n: Rows.
        n_null: Null / NaN rows.
        vmin / vmax: Smallest / largest non-null value (numeric: float, infinities included;
            datetime: Timestamp); ``None`` for other dtypes or when every value is null.
        counts: ``{value: count}`` of the non-null values in order of first appearance (raw
            values, as ``Series.value_counts(sort=False)``); ``None`` when not collected.
        examples: The first distinct non-null values (at most :data:`MAX_EXAMPLES`).
        series: The whole column when the facts come from it (exact messages); never stored.
        n_pos_inf / n_neg_inf: ``+inf`` / ``-inf`` values of a numeric column (not nulls).
        unreadable: Values that could not be read as the column's declared kind
            (:mod:`drift_checks.declared_schema`); ``None``: none.
    """

    dtype: Any
    n: int
    n_null: int
    vmin: Any = None
    vmax: Any = None
    counts: dict | None = None
    examples: list = dataclasses.field(default_factory=list)
    series: pd.Series | None = dataclasses.field(default=None, repr=False, compare=False)
    n_pos_inf: int = 0
    n_neg_inf: int = 0
    unreadable: Unreadable | None = None

    @property
    def n_infinite(self) -> int:
        """``+inf`` and ``-inf`` values."""
        return self.n_pos_inf + self.n_neg_inf

    @classmethod
    def of_series(cls, s: pd.Series, *, counts: bool = True, keep: bool = True) -> "ColumnFacts":
        """Facts of a column (``counts``: also the value counts; ``keep``: keep the series).

        A numpy float column without value counts goes through :meth:`of_float_array` (the same facts).
        """
        if not counts and isinstance(s.dtype, np.dtype) and s.dtype.kind == "f":
            facts = cls.of_float_array(s.to_numpy())
            facts.series = s if keep else None
            return facts
        nulls = s.isna()
        n_null = int(nulls.sum())
        vmin = vmax = None
        pos = neg = 0
        if n_null < len(s) and _is_orderable(s.dtype):
            values = s[~nulls] if n_null else s
            vmin, vmax = values.min(), values.max()
            if pd.api.types.is_float_dtype(s.dtype) and not (np.isfinite(vmin) and np.isfinite(vmax)):
                v = values.to_numpy(dtype="float64")
                pos, neg = int(np.count_nonzero(v == np.inf)), int(np.count_nonzero(v == -np.inf))
        vc = None
        if counts:
            raw = s.value_counts(dropna=True, sort=False)
            vc = {k: int(c) for k, c in raw.items() if c > 0}
        examples = (list(vc)[:MAX_EXAMPLES] if vc is not None
                    else pd.unique(s.head(10 * MAX_EXAMPLES).dropna().to_numpy(dtype=object))[:MAX_EXAMPLES].tolist())
        return cls(s.dtype, int(len(s)), n_null, vmin, vmax, vc, examples, s if keep else None, pos, neg)

    @classmethod
    def of_float_array(cls, values: np.ndarray) -> "ColumnFacts":
        """Facts of a float column given as a numpy array, NaN for null (no value counts).

        What :meth:`of_series` gives for the same values as a pandas float Series, without building
        one: the streamed window's float columns come straight from Arrow record batches.

        Args:
            values: 1-D numpy float array (float16/32/64); NaN marks a null.

        Raises:
            ValueError: ``values`` is not a 1-D numpy float array.
        """
        if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype.kind != "f":
            raise ValueError(f"of_float_array got {type(values).__name__} "
                             f"{getattr(values, 'dtype', '')}; expected a 1-D numpy float array")
        nan = np.isnan(values)
        n_null = int(np.count_nonzero(nan))
        vmin = vmax = None
        pos = neg = 0
        if n_null < values.size:
            present = values[~nan] if n_null else values
            vmin, vmax = present.min(), present.max()
            if not (np.isfinite(vmin) and np.isfinite(vmax)):
                pos, neg = int(np.count_nonzero(present == np.inf)), int(np.count_nonzero(present == -np.inf))
        head = values[:10 * MAX_EXAMPLES]
        examples = pd.unique(head[~np.isnan(head)].astype(object))[:MAX_EXAMPLES].tolist()
        return cls(values.dtype, int(values.size), n_null, vmin, vmax, None, examples, None, pos, neg)

    def merge(self, other: "ColumnFacts") -> "ColumnFacts":
        """Facts of the two batches' rows together (this batch's rows first)."""
        from pandas.core.dtypes.cast import find_common_type

        dtype = self.dtype if self.dtype == other.dtype else find_common_type([self.dtype, other.dtype])
        lo = [v for v in (self.vmin, other.vmin) if v is not None]
        hi = [v for v in (self.vmax, other.vmax) if v is not None]
        counts = None
        if self.counts is not None and other.counts is not None:
            counts = dict(self.counts)
            for k, c in other.counts.items():
                counts[k] = counts.get(k, 0) + c
        examples = list(self.examples)
        for v in other.examples:
            if len(examples) >= MAX_EXAMPLES:
                break
            if v not in examples:
                examples.append(v)
        unreadable: Unreadable | None = None
        if self.unreadable is not None:
            unreadable = self.unreadable.merge(other.unreadable, other.n)
        elif other.unreadable is not None:
            unreadable = other.unreadable.merge(None, self.n)
        return ColumnFacts(dtype, self.n + other.n, self.n_null + other.n_null,
                           min(lo) if lo and _is_orderable(dtype) else None,
                           max(hi) if hi and _is_orderable(dtype) else None, counts, examples, None,
                           self.n_pos_inf + other.n_pos_inf, self.n_neg_inf + other.n_neg_inf, unreadable)

    @property
    def values_for_messages(self) -> pd.Series:
        """The column, or its example values when it was streamed."""
        return self.series if self.series is not None else pd.Series(self.examples, dtype=object)

    def value_counts(self) -> pd.Series:
        """Value counts of the column, as ``Series.value_counts(dropna=True, sort=True)``.

        Ties keep the order of first appearance.
        """
        counts = self.counts or {}
        keys = sorted(counts, key=lambda k: -counts[k])  # stable: ties keep first appearance
        return pd.Series([counts[k] for k in keys], index=pd.Index(keys, dtype=object), dtype="int64")

    def to_json(self) -> dict[str, Any]:
        """JSON form (values tagged with their type; see :func:`from_json`)."""
        return {"dtype": str(self.dtype), "n": self.n, "n_null": self.n_null, "vmin": _enc(self.vmin),
                "vmax": _enc(self.vmax), "examples": [_enc(v) for v in self.examples],
                "counts": None if self.counts is None else [[_enc(k), c] for k, c in self.counts.items()],
                "n_pos_inf": self.n_pos_inf, "n_neg_inf": self.n_neg_inf,
                "unreadable": None if self.unreadable is None else self.unreadable.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ColumnFacts":
        """Rebuild the facts from :meth:`to_json` output (values decoded to their original types)."""
        counts = None if d["counts"] is None else {_dec(k): int(c) for k, c in d["counts"]}
        unreadable = Unreadable.from_json(d["unreadable"]) if d.get("unreadable") else None
        return cls(pd.api.types.pandas_dtype(d["dtype"]), int(d["n"]), int(d["n_null"]), _dec(d["vmin"]),
                   _dec(d["vmax"]), counts, [_dec(v) for v in d["examples"]], None,
                   int(d["n_pos_inf"]), int(d["n_neg_inf"]), unreadable)


def _enc(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, pd.Timestamp):
        return ["ts", v.isoformat()]
    if isinstance(v, (bool, np.bool_)):
        return ["b", bool(v)]
    if isinstance(v, (int, np.integer)):
        return ["i", int(v)]
    if isinstance(v, (float, np.floating)):
        return ["f", repr(float(v))]
    return ["s", str(v)]


def _dec(v: Any) -> Any:
    if v is None:
        return None
    kind, x = v
    return {"ts": pd.Timestamp, "b": bool, "i": int, "f": lambda t: float(t), "s": str}[kind](x)
