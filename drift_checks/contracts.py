"""Great Expectations (1.x) data contract derived from the reference, run on every window.

:func:`derive_contract` writes, per feature of the reference sample:

* the column exists and has a compatible dtype (``ExpectColumnValuesToBeInTypeList``);
* numeric range with tolerance: ``ExpectColumnMinToBeBetween`` / ``ExpectColumnMaxToBeBetween``
  with bounds ``[min - t * span, max + t * span]`` (``t = range_tolerance``, default 1.0 reference
  span on each side: a guard against unit or scale errors, not a drift test);
* null fraction: ``ExpectColumnValuesToNotBeNull`` with ``mostly = 1 - (reference null fraction +
  null_tolerance)``; the reference's null fraction travels in the expectation's ``meta`` so an
  alert can show it beside the window's;
* allowed categories: ``ExpectColumnValuesToBeInSet`` with the reference's categories and
  ``mostly = 1 - category_tolerance``;
* datetime columns: min/max bounds as ISO strings.

**Severity** (a failed contract is not drift, a shifted valid feature is not
"invalid"): every expectation has a ``severity``. ``"critical"`` (the default, and every
expectation a user declares) fails the contract: the window raises a data-quality alert, the
column is invalid, the window raises no drift alert. ``"warning"`` is what :func:`derive_contract`
gives the ranges and category sets it LEARNED from the reference: a window outside them is
reported as a data-quality warning and its features are still scored (a strongly shifted valid
feature is drift, not invalid). Presence, dtype and null fraction stay critical.

:func:`run_contract` evaluates the expectations :func:`derive_contract` writes (presence, dtype,
null fraction, min/max range, allowed values) EXACTLY on the full window with vectorised
numpy/pandas code (GX 1.x semantics), and every other expectation with an *ephemeral* GX context
(imported lazily: GX is slow to import and noisy) on the window, or on a seeded uniform sample of
``gx_sample_rows`` rows when the window is larger (GX alone took 4.7 s on a 100,000-row window).
Only ROW-WISE expectations (``ExpectColumnValues...``, ``ExpectColumnPairValues...``,
``ExpectMulticolumn...``, ``ExpectSelectColumnValues...``: a share of rows, with ``mostly``) may be
evaluated on a sample; aggregate expectations (distinct value sets, min/max, unique counts, row
counts, means...) always see the whole window, because a sample can miss a rare value and report
a false failure. The three distinct-value-set expectations have exact vectorised checks.
Before validating, datetime columns and every datetime-like value in
the expectations (value sets, bounds) are normalised to ONE representation, a fixed-width ISO-8601
string in UTC (``YYYY-MM-DDTHH:MM:SS.ffffff``), whose lexical order is chronological (``Timestamp``
vs ``date`` comparisons otherwise raise inside GX).

Each expectation yields an :class:`ExpectationResult`; an expectation that RAISED inside GX is an
*error of the check* (``raised=True``), reported separately from data failures and never taken
as proof that the data is bad or good.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from typing import Any, Mapping

import numpy as np
import pandas as pd

from drift_checks.column_facts import ColumnFacts
from drift_checks.inference_log import LogSchema

#: Default tolerance of numeric ranges, in reference spans added on each side.
DEFAULT_RANGE_TOLERANCE = 1.0
#: Default extra null fraction allowed above the reference's.
DEFAULT_NULL_TOLERANCE = 0.05
#: Default share of rows allowed outside the reference's categories.
DEFAULT_CATEGORY_TOLERANCE = 0.10
#: Most categories written into a value set (higher-cardinality columns get no set check).
MAX_CATEGORIES = 1000
#: Rows of the seeded sample GX evaluates on large windows (expectations without an exact
#: vectorised implementation only; see :func:`run_contract`).
DEFAULT_GX_SAMPLE_ROWS = 20_000
#: The one datetime representation used during validation.
DATETIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"

_FLOAT_TYPES = ["float64", "float32", "float16", "Float64", "Float32", "int64", "int32", "int16",
                "int8", "uint64", "uint32", "uint16", "uint8", "Int64", "Int32"]
_INT_TYPES = ["int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "Int64",
              "Int32"]
_STR_TYPES = ["object", "str", "string", "category", "StringDtype"]
_TYPE_LISTS = {"float": _FLOAT_TYPES, "int": _INT_TYPES, "category": _STR_TYPES,
               "string": _STR_TYPES, "bool": ["bool", "boolean"]}


#: Severities of an expectation: ``critical`` fails the contract, ``warning`` only reports.
SEVERITIES = ("critical", "warning")


@dataclasses.dataclass(frozen=True)
class ExpectationSpec:
    """One expectation.

    Attributes:
        type: GX class name (e.g. ``"ExpectColumnMaxToBeBetween"``).
        kwargs: Its GX keyword arguments.
        severity: ``"critical"`` (default; fails the contract) or ``"warning"`` (reported only).
        meta: Extra facts kept with the result (e.g. ``reference_null_fraction``); never passed
            to GX.
    """

    type: str
    kwargs: Mapping[str, Any]
    severity: str = "critical"
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"expectation {self.type} severity={self.severity!r}; expected one of {SEVERITIES}")

    @property
    def column(self) -> str | None:
        """The column the expectation checks (``kwargs['column']``); ``None`` for table-level ones."""
        return self.kwargs.get("column")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``type``, ``kwargs``, ``severity``, ``meta``), read back by :meth:`Contract.from_dict`."""
        return {"type": self.type, "kwargs": _jsonable(dict(self.kwargs)), "severity": self.severity,
                "meta": _jsonable(dict(self.meta))}


@dataclasses.dataclass(frozen=True)
class Contract:
    """An ordered list of expectations (JSON-serialisable through :meth:`to_dict`)."""

    expectations: tuple[ExpectationSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{"expectations": [...]}`` (see :meth:`ExpectationSpec.to_dict`)."""
        return {"expectations": [e.to_dict() for e in self.expectations]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Contract":
        """Read a contract written by :meth:`to_dict`; ``severity`` defaults to ``critical``."""
        return cls(tuple(ExpectationSpec(e["type"], dict(e["kwargs"]), e.get("severity", "critical"),
                                         dict(e.get("meta") or {})) for e in d["expectations"]))


@dataclasses.dataclass(frozen=True)
class ExpectationResult:
    """Outcome of one expectation on one window.

    Attributes:
        column: Column checked (``None`` for table-level expectations).
        expectation: GX expectation type in snake case (``expect_column_max_to_be_between``).
        observed: Observed value (JSON-safe: number, string, list or ``None``).
        success: Whether the data met the expectation (``False`` also when it raised).
        raised: The expectation itself raised: an error of the check, not a data failure.
        message: Exception message when raised, else a short description of the failure.
        sample_rows: Rows GX evaluated when it ran on a seeded sample of a large window
            (``None``: the full window was evaluated).
        severity: The expectation's severity (``critical`` failures fail the contract).
        meta: The expectation's ``meta`` (e.g. the reference's null fraction).
    """

    column: str | None
    expectation: str
    observed: Any
    success: bool
    raised: bool = False
    message: str = ""
    sample_rows: int | None = None
    severity: str = "critical"
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form of the result (every field)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ContractResult:
    """All expectation results of one window.

    Attributes:
        results: One :class:`ExpectationResult` per expectation.
    """

    results: tuple[ExpectationResult, ...]

    @property
    def failures(self) -> list[ExpectationResult]:
        """Critical data failures: the expectation ran and the data broke it.

        They fail the contract.
        """
        return [r for r in self.results if not r.success and not r.raised and r.severity == "critical"]

    @property
    def warnings(self) -> list[ExpectationResult]:
        """Warning-level failures (learned ranges and sets): reported, the contract still passes."""
        return [r for r in self.results if not r.success and not r.raised and r.severity == "warning"]

    @property
    def check_errors(self) -> list[ExpectationResult]:
        """Expectations that raised (errors of the check itself)."""
        return [r for r in self.results if r.raised]

    @property
    def invalid_columns(self) -> list[str]:
        """Columns with at least one data failure, sorted."""
        return sorted({r.column for r in self.failures if r.column})

    @property
    def status(self) -> str:
        """``"passed"``, ``"failed"`` (data failures) or ``"error"`` (a check raised)."""
        if self.check_errors:
            return "error"
        return "failed" if self.failures else "passed"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary: status, invalid columns, failures, warnings and errors of the check."""
        return {"status": self.status, "invalid_columns": self.invalid_columns,
                "failures": [r.to_dict() for r in self.failures],
                "warnings": [r.to_dict() for r in self.warnings],
                "check_errors": [r.to_dict() for r in self.check_errors]}


# ------------------------------------------------------------------------------ derivation
def derive_contract(
    reference: pd.DataFrame,
    schema: LogSchema,
    *,
    range_tolerance: float = DEFAULT_RANGE_TOLERANCE,
    null_tolerance: float = DEFAULT_NULL_TOLERANCE,
    category_tolerance: float = DEFAULT_CATEGORY_TOLERANCE,
) -> Contract:
    """Contract of the feature columns of ``schema`` from the reference sample.

    Args:
        reference: Reference sample (training data of the model version).
        schema: Feature kinds (prediction columns are not part of the input contract).
        range_tolerance: Reference spans added below the min and above the max.
        null_tolerance: Extra null fraction allowed above the reference's.
        category_tolerance: Share of rows allowed outside the reference's categories.

    Returns:
        A :class:`Contract`.
    """
    exps: list[ExpectationSpec] = []
    for col, kind in schema.features.items():
        if col not in reference.columns:
            continue
        s = reference[col]
        exps.append(ExpectationSpec("ExpectColumnToExist", {"column": col}))
        if kind in _TYPE_LISTS:
            exps.append(ExpectationSpec("ExpectColumnValuesToBeInTypeList",
                                        {"column": col, "type_list": _TYPE_LISTS[kind]}))
        null_frac = float(s.isna().mean()) if len(s) else 0.0
        mostly = 1.0 - min(1.0, null_frac + null_tolerance)
        if mostly > 0:
            exps.append(ExpectationSpec("ExpectColumnValuesToNotBeNull",
                                        {"column": col, "mostly": round(mostly, 6)},
                                        meta={"reference_null_fraction": round(null_frac, 6)}))
        vals = s.dropna()
        if kind in ("float", "int"):
            vals = vals[np.isfinite(pd.to_numeric(vals, errors="coerce").astype("float64"))]
        if vals.empty:
            continue
        learned = {"learned_from": "reference"}
        if kind in ("float", "int"):
            lo, hi = float(vals.min()), float(vals.max())
            span = hi - lo if hi > lo else max(abs(hi), 1.0)
            exps.append(ExpectationSpec("ExpectColumnMinToBeBetween",
                                        {"column": col, "min_value": lo - range_tolerance * span},
                                        "warning", learned))
            exps.append(ExpectationSpec("ExpectColumnMaxToBeBetween",
                                        {"column": col, "max_value": hi + range_tolerance * span},
                                        "warning", learned))
        elif kind in ("category", "string", "bool"):
            cats = sorted(vals.astype(str).unique().tolist())
            if len(cats) <= MAX_CATEGORIES:
                exps.append(ExpectationSpec("ExpectColumnValuesToBeInSet",
                                            {"column": col, "value_set": cats,
                                             "mostly": round(1.0 - category_tolerance, 6)},
                                            "warning", learned))
        elif kind == "datetime":
            t = pd.to_datetime(vals)
            exps.append(ExpectationSpec("ExpectColumnMinToBeBetween",
                                        {"column": col, "min_value": canonical_datetime(t.min())},
                                        "warning", learned))
            exps.append(ExpectationSpec("ExpectColumnMaxToBeBetween",
                                        {"column": col, "max_value": canonical_datetime(t.max())},
                                        "warning", learned))
    return Contract(tuple(exps))


# ------------------------------------------------------------------------------ normalisation
def canonical_datetime(value: Any) -> str:
    """A date/datetime/ISO string as the one representation (UTC, ``DATETIME_FORMAT``).

    Raises:
        ValueError: ``value`` is not a date or time.
    """
    t = pd.Timestamp(value)
    if t.tzinfo is not None:
        t = t.tz_convert("UTC").tz_localize(None)
    return t.strftime(DATETIME_FORMAT)


def _canonical_series(s: pd.Series) -> pd.Series:
    if getattr(s.dt, "tz", None) is not None:
        s = s.dt.tz_convert("UTC").dt.tz_localize(None)
    out = s.dt.strftime(DATETIME_FORMAT)
    return out.where(s.notna(), None).astype(object)


def _normalise_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    for k in ("min_value", "max_value", "value"):
        if out.get(k) is not None:
            out[k] = canonical_datetime(out[k])
    for k in ("value_set",):
        if out.get(k) is not None:
            out[k] = sorted({canonical_datetime(v) for v in out[k]})
    return out


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"  # infinite is reported as infinite, never as null
        return f if math.isfinite(f) else None
    if isinstance(v, (pd.Timestamp,)):
        return canonical_datetime(v)
    if v is None or isinstance(v, (int, str)):
        return v
    return str(v)


# ------------------------------------------------------------------------------ validation
_CONTEXT: dict[str, Any] = {}


def _batch_definition():
    """One ephemeral GX context and pandas dataframe asset per process (creation costs ~1 s)."""
    if "bd" not in _CONTEXT:
        for name in ("great_expectations", "great_expectations.core", "py.warnings"):
            logging.getLogger(name).setLevel(logging.ERROR)
        import great_expectations as gx

        ctx = gx.get_context(mode="ephemeral")
        try:
            from great_expectations.data_context.types.base import ProgressBarsConfig

            ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        except Exception:  # older/newer layouts: progress bars are cosmetic only
            pass
        ds = ctx.data_sources.add_pandas("tritonflow_windows")
        _CONTEXT["bd"] = ds.add_dataframe_asset("window").add_batch_definition_whole_dataframe("all")
        _CONTEXT["ctx"] = ctx
    return _CONTEXT["bd"]


def _observed(result: Mapping[str, Any]) -> Any:
    if "observed_value" in result:
        return _jsonable(result["observed_value"])
    if "unexpected_percent" in result:
        return {"unexpected_percent": _jsonable(result.get("unexpected_percent")),
                "partial_unexpected_list": _jsonable(result.get("partial_unexpected_list", [])[:10])}
    return _jsonable(dict(result)) if result else None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _between(observed: Any, kw: Mapping[str, Any]) -> bool:
    lo, hi = kw.get("min_value"), kw.get("max_value")
    if lo is not None and (observed <= lo if kw.get("strict_min") else observed < lo):
        return False
    if hi is not None and (observed >= hi if kw.get("strict_max") else observed > hi):
        return False
    return True


def _fast_result(spec: ExpectationSpec, facts: ColumnFacts, is_dt: bool) -> ExpectationResult | None:
    """Exact evaluation of the standard column expectations on the FULL window.

    Computed from the window's :class:`~drift_checks.column_facts.ColumnFacts` (the whole column, or a
    streamed window's merged batches).

    Returns ``None`` when the expectation (type, kwargs or column dtype) is not one handled here;
    it then goes to Great Expectations. Semantics follow GX 1.x: nulls are ignored by range and
    set checks, ``mostly`` is a share of the non-null rows for sets and of all rows for nulls.
    """
    kw = spec.kwargs
    name = _snake(spec.type)
    allowed = _FAST_KWARGS.get(spec.type)
    if allowed is None or not set(kw) <= allowed:
        return None
    col = spec.column
    n = facts.n
    if spec.type == "ExpectColumnValuesToBeInTypeList":
        if is_dt or not isinstance(kw.get("type_list"), (list, tuple)):
            return None
        dtype = str(facts.dtype)
        ok = dtype in {str(t) for t in kw["type_list"]}
        if ok or (n > 0 and facts.n_null == n):  # no value to judge: the null check reports it
            return ExpectationResult(col, name, dtype, True)
        bad = offending_values(facts.values_for_messages, kw["type_list"])
        return ExpectationResult(col, name, {"dtype": dtype, "first_offending_values": bad}, False,
                                 message=f"column {col!r} has dtype {dtype}, not one of "
                                         f"{list(kw['type_list'])}; first offending values: {bad}")
    if spec.type == "ExpectColumnValuesToNotBeNull":
        mostly = kw.get("mostly", 1.0)
        if not _is_number(mostly):
            return None
        nulls = facts.n_null
        pct = 100.0 * nulls / n if n else None
        ok = n == 0 or (n - nulls) / n >= float(mostly)
        return ExpectationResult(col, name, {"unexpected_percent": pct, "partial_unexpected_list": []},
                                 ok, message="" if ok else f"{pct:.2f} % null (mostly={mostly})")
    if spec.type in ("ExpectColumnMinToBeBetween", "ExpectColumnMaxToBeBetween"):
        bounds = [kw.get("min_value"), kw.get("max_value")]
        if all(b is None for b in bounds):
            return None
        if facts.n_null == n:
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
        return ExpectationResult(col, name, _jsonable(observed), ok, message="" if ok else
                                 f"observed {_jsonable(observed)!r} outside [{bounds[0]!r}, {bounds[1]!r}]")
    if spec.type in _DISTINCT_SET_CHECKS:
        value_set = kw.get("value_set")
        if not isinstance(value_set, (list, tuple, set)):
            return None
        if facts.counts is None:
            return None
        keys = [canonical_datetime(k) if is_dt else (k.item() if hasattr(k, "item") else k)
                for k, c in facts.counts.items() if c > 0]
        try:
            have, want = set(keys), set(value_set)
        except TypeError:  # unhashable values: leave it to GX
            return None
        ok = _DISTINCT_SET_CHECKS[spec.type](have, want)
        observed = _jsonable(sorted(have, key=str))
        missing, extra = sorted(want - have, key=str), sorted(have - want, key=str)
        return ExpectationResult(col, name, observed, ok, message="" if ok else
                                 f"distinct values {observed[:20]}; missing {_jsonable(missing[:10])}, "
                                 f"not in the set {_jsonable(extra[:10])}")
    if spec.type == "ExpectColumnValuesToBeInSet":
        value_set, mostly = kw.get("value_set"), kw.get("mostly", 1.0)
        if not isinstance(value_set, (list, tuple, set)) or not _is_number(mostly):
            return None
        if facts.counts is None:
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
        return ExpectationResult(col, name, {"unexpected_percent": pct,
                                             "partial_unexpected_list": _jsonable([k for k, _ in bad[:10]])},
                                 ok, message="" if ok else f"{pct:.2f} % of values outside the set")
    return None


#: Distinct-value-set expectations (GX 1.x semantics on the non-null distinct values).
_DISTINCT_SET_CHECKS = {
    "ExpectColumnDistinctValuesToEqualSet": lambda have, want: have == want,
    "ExpectColumnDistinctValuesToContainSet": lambda have, want: want <= have,
    "ExpectColumnDistinctValuesToBeInSet": lambda have, want: have <= want,
}
#: Prefixes of row-wise GX expectations (a share of rows, ``mostly``): the only ones that may be
#: evaluated on a sample of a large window.
ROW_WISE_PREFIXES = ("ExpectColumnValues", "ExpectColumnPairValues", "ExpectMulticolumn",
                     "ExpectSelectColumnValues", "ExpectCompoundColumns")


def offending_values(s: pd.Series, type_list: Any = (), limit: int = 5) -> list[Any]:
    """The first distinct values of ``s`` that do not fit the expected types (JSON-safe).

    Numeric types expected: values that are not numbers; boolean: values that are not booleans;
    otherwise the first non-null values (the column's dtype itself is wrong).
    """
    wanted = {str(t) for t in type_list}
    values = s.dropna()
    if wanted & set(_FLOAT_TYPES):
        bad = values[pd.to_numeric(values, errors="coerce").isna()]
    elif wanted & {"bool", "boolean"}:
        bad = values[~values.map(lambda v: isinstance(v, (bool, np.bool_)))]
    else:
        bad = values
    return _jsonable(list(pd.unique(bad.to_numpy(dtype=object))[:limit]))


#: Expectations evaluated exactly by :func:`_fast_result`, with the kwargs it understands.
_FAST_KWARGS: dict[str, set[str]] = {
    **{t: {"column", "value_set"} for t in _DISTINCT_SET_CHECKS},
    "ExpectColumnValuesToBeInTypeList": {"column", "type_list"},
    "ExpectColumnValuesToNotBeNull": {"column", "mostly"},
    "ExpectColumnMinToBeBetween": {"column", "min_value", "max_value", "strict_min", "strict_max"},
    "ExpectColumnMaxToBeBetween": {"column", "min_value", "max_value", "strict_min", "strict_max"},
    "ExpectColumnValuesToBeInSet": {"column", "value_set", "mostly"},
}


def run_contract(contract: Contract, frame: Any, *,
                 gx_sample_rows: int = DEFAULT_GX_SAMPLE_ROWS, seed: int = 0) -> ContractResult:
    """Validate one window against the contract.

    Two evaluation paths, so the check stays fast on large windows (a 100,000-row window took
    4.7 s through GX alone; see ``benchmarks/drift_throughput.py``):

    * **exact, vectorised, on the full window** (numpy/pandas, GX 1.x semantics): column
      presence, dtype (``ExpectColumnValuesToBeInTypeList`` on non-object dtypes), null fraction
      (``ExpectColumnValuesToNotBeNull``), numeric and datetime ranges
      (``ExpectColumnMin/MaxToBeBetween``) and allowed values (``ExpectColumnValuesToBeInSet``):
      every expectation :func:`derive_contract` writes. Their observed values are exact;
      ``partial_unexpected_list`` lists up to 10 distinct unexpected values, most frequent first.
    * **Great Expectations** for every other expectation (any GX 1.x class written by hand) and
      for kwargs the fast path does not understand (e.g. non-numeric bounds on a numeric column,
      which GX reports as an error of the check). When the window has more than
      ``gx_sample_rows`` rows, GX runs on a uniform sample of that many rows drawn with ``seed``
      (deterministic: a rerun validates the same rows); those results carry ``sample_rows``.
      GX is not even imported when nothing needs it.

    Args:
        contract: From :func:`derive_contract` or written by hand (any GX 1.x expectation class
            name with its kwargs).
        frame: The window (pandas; not modified), or the
            :class:`~drift_checks.summaries.WindowSummary` of a streamed window: the exact
            checks then run on its merged :class:`~drift_checks.column_facts.ColumnFacts`,
            row-wise GX expectations on its seeded sample (rows with the smallest hash of
            ``request_id``) and aggregate GX expectations, which need every row, are reported as
            errors of the check naming the window-size limit.
        gx_sample_rows: Largest number of rows handed to GX (default
            :data:`DEFAULT_GX_SAMPLE_ROWS`).
        seed: Seed of the GX sample.

    Returns:
        A :class:`ContractResult` with one result per expectation, in contract order.
        Expectations on a missing column are reported as one ``expect_column_to_exist`` failure.
    """
    streamed = not isinstance(frame, pd.DataFrame)
    if streamed:
        facts_of = frame.facts
        dt_cols = {c for c, f in facts_of.items() if pd.api.types.is_datetime64_any_dtype(f.dtype)}
    else:
        dt_cols = {c for c in frame.columns if pd.api.types.is_datetime64_any_dtype(frame[c])}
        counted = {sp.column for sp in contract.expectations if sp.type in _COUNTED}
        facts_of = _LazyFacts(frame, counted)
    pre: list[tuple[int, ExpectationResult]] = []
    specs: list[tuple[int, ExpectationSpec]] = []
    missing: set[str] = set()
    for i, spec in enumerate(contract.expectations):
        col = spec.column
        if col is not None and col not in (facts_of if streamed else frame.columns):
            if col not in missing:
                missing.add(col)
                pre.append((i, ExpectationResult(col, "expect_column_to_exist", None, False,
                                                 message=f"column {col!r} is missing from the window")))
            continue
        if spec.type == "ExpectColumnToExist":
            pre.append((i, ExpectationResult(col, "expect_column_to_exist", True, True)))
            continue
        if col in dt_cols and spec.type == "ExpectColumnValuesToBeInTypeList":
            dtype = str(facts_of[col].dtype)
            ok = dtype.startswith("datetime64")
            pre.append((i, ExpectationResult(col, "expect_column_values_to_be_in_type_list", dtype,
                                             ok, message="" if ok else "expected a datetime64 column")))
            continue
        kwargs = dict(spec.kwargs)
        if col in dt_cols:
            try:
                kwargs = _normalise_kwargs(kwargs)
            except (ValueError, TypeError) as exc:
                pre.append((i, ExpectationResult(col, _snake(spec.type), None, False, True,
                                                 f"cannot read a datetime bound/value set: {exc}")))
                continue
        spec = ExpectationSpec(spec.type, kwargs)
        fast = _fast_result(spec, facts_of[col], col in dt_cols) if col is not None else None
        if fast is not None:
            pre.append((i, fast))
        else:
            specs.append((i, spec))
    if specs and streamed:
        pre.extend(_run_gx_streamed(specs, frame, dt_cols))
    elif specs:
        pre.extend(_run_gx(specs, frame, dt_cols, gx_sample_rows, seed))
    pre.sort(key=lambda x: x[0])
    exps = contract.expectations
    return ContractResult(tuple(dataclasses.replace(r, severity=exps[i].severity, meta=dict(exps[i].meta))
                                for i, r in pre))


class _LazyFacts(dict):
    """Column facts of an in-memory window, taken when first needed."""

    def __init__(self, frame: pd.DataFrame, counted: set):
        super().__init__()
        self.frame, self.counted = frame, counted

    def __missing__(self, col: str) -> ColumnFacts:
        self[col] = f = ColumnFacts.of_series(self.frame[col], counts=col in self.counted)
        return f


#: Expectations whose exact check needs the column's value counts.
_COUNTED = {"ExpectColumnValuesToBeInSet", *_DISTINCT_SET_CHECKS}


def _run_gx_streamed(specs: list[tuple[int, ExpectationSpec]], summary: Any,
                     dt_cols: set[str]) -> list[tuple[int, ExpectationResult]]:
    """GX on a streamed window: row-wise expectations on its seeded sample.

    Aggregate ones cannot be judged without every row and are errors of the check.
    """
    row_wise = [(i, sp) for i, sp in specs if sp.type.startswith(ROW_WISE_PREFIXES)]
    out = []
    for i, sp in specs:
        if (i, sp) not in row_wise:
            out.append((i, ExpectationResult(
                sp.column, _snake(sp.type), None, False, True,
                f"{sp.type} needs every row of the window, and this window ({summary.n_rows} rows) was "
                "streamed; expected a window of at most TRITONFLOW_DRIFT_EXACT_MAX_ROWS rows, or a "
                "row-wise expectation")))
    sample = summary.sample_frame()
    if row_wise and sample is not None:
        res = _run_gx_on(row_wise, sample, dt_cols, 0, 0)
        note = f"evaluated on a seeded sample of {len(sample)} of {summary.n_rows} rows"
        out.extend((i, dataclasses.replace(r, message=r.message or note, sample_rows=len(sample))) for i, r in res)
    elif row_wise:
        out.extend((i, ExpectationResult(sp.column, _snake(sp.type), None, False, True,
                                         "the streamed window kept no sample rows")) for i, sp in row_wise)
    return out


def _run_gx(specs: list[tuple[int, ExpectationSpec]], frame: pd.DataFrame, dt_cols: set[str],
            sample_rows: int, seed: int) -> list[tuple[int, ExpectationResult]]:
    """Evaluate ``specs`` with Great Expectations.

    Row-wise ones run on a seeded sample of a large window, aggregate ones (set, min/max, counts...) on
    the whole window.
    """
    row_wise = [(i, sp) for i, sp in specs if sp.type.startswith(ROW_WISE_PREFIXES)]
    aggregate = [(i, sp) for i, sp in specs if not sp.type.startswith(ROW_WISE_PREFIXES)]
    out = _run_gx_on(row_wise, frame, dt_cols, sample_rows, seed) if row_wise else []
    return out + (_run_gx_on(aggregate, frame, dt_cols, 0, seed) if aggregate else [])


def _run_gx_on(specs: list[tuple[int, ExpectationSpec]], frame: pd.DataFrame, dt_cols: set[str],
               sample_rows: int, seed: int) -> list[tuple[int, ExpectationResult]]:
    """Evaluate ``specs`` with Great Expectations on the window or a seeded sample of it.

    The sample is used when ``sample_rows > 0``.
    """
    import great_expectations as gx
    import great_expectations.expectations as gxe

    sampled = len(frame) > sample_rows > 0
    data = frame.sample(n=sample_rows, random_state=seed).sort_index() if sampled else frame
    data = data.copy(deep=False)
    for c in dt_cols:
        data[c] = _canonical_series(data[c])
    note = f"evaluated on a seeded sample of {len(data)} of {len(frame)} rows" if sampled else ""
    results: list[tuple[int, ExpectationResult]] = []
    if specs:
        bd = _batch_definition()  # creates the ephemeral context the suite needs
        suite = gx.ExpectationSuite(name="tritonflow_window_contract")
        built = []
        for i, spec in specs:
            try:
                exp = getattr(gxe, spec.type)(**spec.kwargs, meta={"tritonflow_index": i})
            except Exception as exc:  # unknown class or bad kwargs: an error of the check
                results.append((i, ExpectationResult(spec.column, _snake(spec.type), None, False,
                                                     True, f"invalid expectation: {exc}")))
                continue
            suite.add_expectation(exp)
            built.append((i, spec))
        by_index = dict(built)
        if built:
            batch = bd.get_batch(batch_parameters={"dataframe": data})
            res = batch.validate(suite, result_format="BASIC")
            for r in res.results:
                i = int((r.expectation_config.meta or {})["tritonflow_index"])
                spec = by_index[i]
                info = r.exception_info or {}
                raised = bool(info.get("raised_exception"))
                msg = str(info.get("exception_message") or "") if raised else ""
                results.append((i, ExpectationResult(
                    spec.column, _snake(spec.type), None if raised else _observed(r.result or {}),
                    bool(r.success) and not raised, raised, msg or note,
                    len(data) if sampled else None)))
    return results
