"""Great Expectations (1.x) data contract derived from the reference, run on every window.

:func:`derive_contract` writes, per feature of the reference sample:

* the column exists and has a compatible dtype (``ExpectColumnValuesToBeInTypeList``);
* numeric range with tolerance: ``ExpectColumnMinToBeBetween`` / ``ExpectColumnMaxToBeBetween``
  with bounds ``[min - t * span, max + t * span]`` (``t = range_tolerance``, default 1.0 reference
  span on each side: a guard against unit or scale errors, not a drift test);
* null fraction: ``ExpectColumnValuesToNotBeNull`` with ``mostly = 1 - (reference null fraction +
  null_tolerance)``;
* allowed categories: ``ExpectColumnValuesToBeInSet`` with the reference's categories and
  ``mostly = 1 - category_tolerance``;
* datetime columns: min/max bounds as ISO strings.

:func:`run_contract` validates a window with an *ephemeral* GX context (imported lazily: GX is
slow to import and noisy). Before validating, datetime columns and every datetime-like value in
the expectations (value sets, bounds) are normalised to ONE representation, a fixed-width ISO-8601
string in UTC (``YYYY-MM-DDTHH:MM:SS.ffffff``), whose lexical order is chronological (case H20:
``Timestamp`` vs ``date`` comparisons otherwise raise inside GX).

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

from drift_checks.inference_log import LogSchema

#: Default tolerance of numeric ranges, in reference spans added on each side.
DEFAULT_RANGE_TOLERANCE = 1.0
#: Default extra null fraction allowed above the reference's.
DEFAULT_NULL_TOLERANCE = 0.05
#: Default share of rows allowed outside the reference's categories.
DEFAULT_CATEGORY_TOLERANCE = 0.10
#: Most categories written into a value set (higher-cardinality columns get no set check).
MAX_CATEGORIES = 1000
#: The one datetime representation used during validation.
DATETIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"

_FLOAT_TYPES = ["float64", "float32", "float16", "Float64", "Float32", "int64", "int32", "int16",
                "int8", "uint64", "uint32", "uint16", "uint8", "Int64", "Int32"]
_INT_TYPES = ["int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "Int64",
              "Int32"]
_STR_TYPES = ["object", "str", "string", "category", "StringDtype"]
_TYPE_LISTS = {"float": _FLOAT_TYPES, "int": _INT_TYPES, "category": _STR_TYPES,
               "string": _STR_TYPES, "bool": ["bool", "boolean"]}


@dataclasses.dataclass(frozen=True)
class ExpectationSpec:
    """One expectation: GX class name (e.g. ``"ExpectColumnMaxToBeBetween"``) and kwargs."""

    type: str
    kwargs: Mapping[str, Any]

    @property
    def column(self) -> str | None:
        return self.kwargs.get("column")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "kwargs": _jsonable(dict(self.kwargs))}


@dataclasses.dataclass(frozen=True)
class Contract:
    """An ordered list of expectations (JSON-serialisable through :meth:`to_dict`)."""

    expectations: tuple[ExpectationSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"expectations": [e.to_dict() for e in self.expectations]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Contract":
        return cls(tuple(ExpectationSpec(e["type"], dict(e["kwargs"])) for e in d["expectations"]))


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
    """

    column: str | None
    expectation: str
    observed: Any
    success: bool
    raised: bool = False
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
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
        """Data failures (the expectation ran and the data broke it)."""
        return [r for r in self.results if not r.success and not r.raised]

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
        return {"status": self.status, "invalid_columns": self.invalid_columns,
                "failures": [r.to_dict() for r in self.failures],
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
                                        {"column": col, "mostly": round(mostly, 6)}))
        vals = s.dropna()
        if vals.empty:
            continue
        if kind in ("float", "int"):
            lo, hi = float(vals.min()), float(vals.max())
            span = hi - lo if hi > lo else max(abs(hi), 1.0)
            exps.append(ExpectationSpec("ExpectColumnMinToBeBetween",
                                        {"column": col, "min_value": lo - range_tolerance * span}))
            exps.append(ExpectationSpec("ExpectColumnMaxToBeBetween",
                                        {"column": col, "max_value": hi + range_tolerance * span}))
        elif kind in ("category", "string", "bool"):
            cats = sorted(vals.astype(str).unique().tolist())
            if len(cats) <= MAX_CATEGORIES:
                exps.append(ExpectationSpec("ExpectColumnValuesToBeInSet",
                                            {"column": col, "value_set": cats,
                                             "mostly": round(1.0 - category_tolerance, 6)}))
        elif kind == "datetime":
            t = pd.to_datetime(vals)
            exps.append(ExpectationSpec("ExpectColumnMinToBeBetween",
                                        {"column": col, "min_value": canonical_datetime(t.min())}))
            exps.append(ExpectationSpec("ExpectColumnMaxToBeBetween",
                                        {"column": col, "max_value": canonical_datetime(t.max())}))
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


def run_contract(contract: Contract, frame: pd.DataFrame) -> ContractResult:
    """Validate one window against the contract.

    Args:
        contract: From :func:`derive_contract` or written by hand (any GX 1.x expectation class
            name with its kwargs).
        frame: The window (pandas). Not modified.

    Returns:
        A :class:`ContractResult` with one result per expectation, in contract order.
        Expectations on a missing column are reported as one ``expect_column_to_exist`` failure.
    """
    import great_expectations as gx
    import great_expectations.expectations as gxe

    data = frame.copy(deep=False)
    dt_cols = {c for c in data.columns if pd.api.types.is_datetime64_any_dtype(data[c])}
    pre: list[tuple[int, ExpectationResult]] = []
    specs: list[tuple[int, ExpectationSpec]] = []
    missing: set[str] = set()
    for i, spec in enumerate(contract.expectations):
        col = spec.column
        if col is not None and col not in data.columns:
            if col not in missing:
                missing.add(col)
                pre.append((i, ExpectationResult(col, "expect_column_to_exist", None, False,
                                                 message=f"column {col!r} is missing from the window")))
            continue
        if spec.type == "ExpectColumnToExist":
            pre.append((i, ExpectationResult(col, "expect_column_to_exist", True, True)))
            continue
        if col in dt_cols and spec.type == "ExpectColumnValuesToBeInTypeList":
            dtype = str(frame[col].dtype)
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
        specs.append((i, ExpectationSpec(spec.type, kwargs)))
    for c in dt_cols:
        data[c] = _canonical_series(data[c])

    results: list[tuple[int, ExpectationResult]] = list(pre)
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
                    bool(r.success) and not raised, raised, msg)))
    results.sort(key=lambda x: x[0])
    return ContractResult(tuple(r for _, r in results))
