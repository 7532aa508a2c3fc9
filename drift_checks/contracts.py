"""Great Expectations (1.x) data contract derived from the reference, run on every window.

:func:`derive_contract` writes, per feature of the reference sample:

* the column exists and has a compatible dtype (``ExpectColumnValuesToBeInTypeList``);
* numeric range with tolerance: ``ExpectColumnMinToBeBetween`` / ``ExpectColumnMaxToBeBetween``
  with bounds ``[min - t * span, max + t * span]`` (``t = range_tolerance``, default 1.0 reference
  span on each side: a guard against unit or scale errors, not a drift test);
* numeric columns hold finite numbers: ``ExpectColumnValuesToNotBeInSet`` with ``[inf, -inf]``
  (critical: a model fed infinities is fed garbage; the result names the column, the count and
  the share);
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
feature is drift, not invalid). Presence, dtype (declared kind), finiteness and null fraction stay
critical.

:func:`run_contract` evaluates the expectations :func:`derive_contract` writes (presence, dtype, finiteness,
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

Layout: the types and the datetime normalisation are in :mod:`drift_checks.contract_types`, the
exact checks in :mod:`drift_checks.contract_exact`, the GX path in :mod:`drift_checks.contract_gx`;
this module derives and runs a contract and re-exports the public names.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from drift_checks.contract_exact import (
    COUNTED_EXPECTATIONS,
    LazyColumnFacts,
    exact_result,
    offending_values,
    unreadable_result,
)
from drift_checks.contract_gx import ROW_WISE_PREFIXES, run_gx, run_gx_streamed
from drift_checks.contract_types import (
    DATETIME_FORMAT,
    SEVERITIES,
    SOURCES,
    TYPE_LISTS,
    Contract,
    ContractResult,
    ExpectationResult,
    ExpectationSpec,
    canonical_datetime,
    normalise_kwargs,
    snake_case,
)
from drift_checks.declared_schema import (
    CATEGORICAL_KINDS,
    Unreadable,
    apply_schema,
    category_name,
    typed_reference,
)
from drift_checks.inference_log import LogSchema

__all__ = [
    "Contract",
    "ContractResult",
    "DATETIME_FORMAT",
    "DEFAULT_CATEGORY_TOLERANCE",
    "DEFAULT_GX_SAMPLE_ROWS",
    "DEFAULT_NULL_TOLERANCE",
    "DEFAULT_RANGE_TOLERANCE",
    "ExpectationResult",
    "ExpectationSpec",
    "MAX_CATEGORIES",
    "ROW_WISE_PREFIXES",
    "SEVERITIES",
    "SOURCES",
    "canonical_datetime",
    "derive_contract",
    "offending_values",
    "run_contract",
    "with_derived",
]

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

    Raises:
        WindowError: A reference value cannot be read as its column's declared kind (the sample
            is read as ``schema`` first: :func:`drift_checks.declared_schema.typed_reference`).
    """
    reference = typed_reference(reference, schema.features)
    exps: list[ExpectationSpec] = []
    for col, kind in schema.features.items():
        if col not in reference.columns:
            continue
        s = reference[col]
        exps.append(ExpectationSpec("ExpectColumnToExist", {"column": col}))
        if kind in TYPE_LISTS:
            exps.append(ExpectationSpec("ExpectColumnValuesToBeInTypeList",
                                        {"column": col, "type_list": TYPE_LISTS[kind]}))
        plain_float = kind in ("float", "int") and isinstance(s.dtype, np.dtype) and s.dtype.kind == "f"
        if plain_float:  # numpy float column: the same facts without pandas' null handling
            v = s.to_numpy()
            null_frac = float(np.count_nonzero(np.isnan(v)) / v.size) if v.size else 0.0
            finite = v[np.isfinite(v)]
        else:
            null_frac = float(s.isna().mean()) if len(s) else 0.0
        mostly = 1.0 - min(1.0, null_frac + null_tolerance)
        if mostly > 0:
            exps.append(ExpectationSpec("ExpectColumnValuesToNotBeNull",
                                        {"column": col, "mostly": round(mostly, 6)},
                                        meta={"reference_null_fraction": round(null_frac, 6)}))
        if kind in ("float", "int"):  # a model fed +/-inf is fed garbage: critical, never learned
            exps.append(ExpectationSpec("ExpectColumnValuesToNotBeInSet",
                                        {"column": col, "value_set": [math.inf, -math.inf]},
                                        meta={"check": "finite"}))
        exps += _learned_expectations(col, kind, s, finite if plain_float else None,
                                      range_tolerance, category_tolerance)
    derived = tuple(dataclasses.replace(e, source="derived") for e in exps)
    return Contract(derived, {c: k for c, k in schema.features.items() if c in reference.columns})


def _learned_expectations(col: str, kind: str, s: pd.Series, finite: np.ndarray | None,
                          range_tolerance: float, category_tolerance: float) -> list[ExpectationSpec]:
    """The ranges and category sets LEARNED from the reference column ``s`` (severity ``warning``).

    ``finite``: the finite values of a numpy float column (``None``: read them from ``s``).
    """
    out: list[ExpectationSpec] = []
    learned = {"learned_from": "reference"}
    if finite is not None:
        if finite.size == 0:
            return []
        lo, hi = float(finite.min()), float(finite.max())
    else:
        vals = s.dropna()
        if kind in ("float", "int"):
            vals = vals[np.isfinite(pd.to_numeric(vals, errors="coerce").astype("float64"))]
        if vals.empty:
            return []
    if kind in ("float", "int"):
        if finite is None:
            lo, hi = float(vals.min()), float(vals.max())
        span = hi - lo if hi > lo else max(abs(hi), 1.0)
        out.append(ExpectationSpec("ExpectColumnMinToBeBetween",
                                   {"column": col, "min_value": lo - range_tolerance * span},
                                   "warning", learned))
        out.append(ExpectationSpec("ExpectColumnMaxToBeBetween",
                                   {"column": col, "max_value": hi + range_tolerance * span},
                                   "warning", learned))
    elif kind in ("category", "string", "bool"):
        cats = sorted(vals.astype(str).unique().tolist())
        if len(cats) <= MAX_CATEGORIES:
            out.append(ExpectationSpec("ExpectColumnValuesToBeInSet",
                                       {"column": col, "value_set": cats,
                                         "mostly": round(1.0 - category_tolerance, 6)},
                                       "warning", learned))
    elif kind == "datetime":
        t = pd.to_datetime(vals)
        out.append(ExpectationSpec("ExpectColumnMinToBeBetween",
                                   {"column": col, "min_value": canonical_datetime(t.min())},
                                   "warning", learned))
        out.append(ExpectationSpec("ExpectColumnMaxToBeBetween",
                                   {"column": col, "max_value": canonical_datetime(t.max())},
                                   "warning", learned))
    return out


def with_derived(user: Contract | None, derived: Contract) -> Contract:
    """A user's suite ADDED to the derived contract, never in its place.

    The derived expectations (presence, declared kind, finiteness, null fraction, learned ranges
    and sets) always apply, first; the user's follow, each marked ``source="user"`` unless it
    says ``derived``. A user expectation identical to a derived one (same type, kwargs and
    severity: a copy of an earlier derived contract) is not run twice. A user expectation on the
    same column as a derived one is run beside it: a looser hand-written null check does not
    switch off the derived one.

    Args:
        user: The user's suite (``None``: none).
        derived: From :func:`derive_contract` (its schema is the merged contract's).

    Returns:
        The merged :class:`Contract`.
    """
    if user is None or not user.expectations:
        return derived
    def key(e: ExpectationSpec) -> str:  # JSON form: a stored copy writes infinities as text
        return json.dumps([e.type, e.to_dict()["kwargs"], e.severity], sort_keys=True, default=str)

    seen = {key(e) for e in derived.expectations}
    extra = tuple(e for e in user.expectations if key(e) not in seen)
    return Contract(derived.expectations + extra, {**dict(user.schema), **dict(derived.schema)})


def run_contract(contract: Contract, frame: Any, *,
                 gx_sample_rows: int = DEFAULT_GX_SAMPLE_ROWS, seed: int = 0,
                 schema: Mapping[str, str] | None = None,
                 unreadable: Mapping[str, Unreadable] | None = None) -> ContractResult:
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
        schema: The declared ``{column: kind}`` (``LogSchema.features``; default: the
            contract's own, which :func:`derive_contract` records). A pandas window is
            first read as it (:func:`drift_checks.declared_schema.apply_schema`) unless
            ``unreadable`` is given, and the value sets of categorical columns are compared as
            category names (``[11, 17]`` and ``["11", "17"]`` are the same set).
        unreadable: ``{column: Unreadable}`` of a pandas window already read as its schema (what
            :func:`~drift_checks.declared_schema.apply_schema` returned with it); a streamed
            window's facts carry their own.

    Returns:
        A :class:`ContractResult` with one result per expectation, in contract order.
        Expectations on a missing column are reported as one ``expect_column_to_exist`` failure.
        A column holding values that cannot be read as its declared kind fails its
        ``expect_column_values_to_be_in_type_list`` (added at the end when the contract has none),
        naming the column, the kind, the count and the values: bad data, not an error of the check.
        An expectation that contradicts a column's declared categorical kind (numeric bounds, a
        non-string dtype) is an error of the check naming the column, the expectation and the kind
        (it would otherwise fail every window whatever its values). A data failure outweighs an
        error of the check in :attr:`ContractResult.status`.
    """
    streamed = not isinstance(frame, pd.DataFrame)
    schema = schema if schema is not None else (contract.schema or None)
    frame, facts_of, dt_cols, bad = _window_facts(contract, frame, schema, unreadable)
    categorical = {c for c, k in (schema or {}).items() if k in CATEGORICAL_KINDS}
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
        conflict = _kind_conflict(spec, (schema or {}).get(col or ""))
        if conflict:
            pre.append((i, ExpectationResult(col, snake_case(spec.type), None, False, True, conflict)))
            continue
        if spec.type == "ExpectColumnValuesToBeInTypeList" and (col in bad or col in dt_cols):
            pre.append((i, _type_result(col, facts_of[col], bad.pop(col, None))))
            continue
        try:
            spec = ExpectationSpec(spec.type, _window_kwargs(spec, col in categorical, col in dt_cols))
        except (ValueError, TypeError) as exc:
            pre.append((i, ExpectationResult(col, snake_case(spec.type), None, False, True,
                                             f"cannot read a datetime bound/value set: {exc}")))
            continue
        fast = exact_result(spec, facts_of[col], col in dt_cols) if col is not None else None
        if fast is not None:
            pre.append((i, fast))
        else:
            specs.append((i, spec))
    if specs and streamed:
        pre.extend(run_gx_streamed(specs, frame, dt_cols))
    elif specs:
        pre.extend(run_gx(specs, frame, dt_cols, gx_sample_rows, seed))
    pre.sort(key=lambda x: x[0])
    exps = contract.expectations
    out = [dataclasses.replace(r, severity=exps[i].severity, meta=dict(exps[i].meta), source=exps[i].source)
           for i, r in pre]
    out += [dataclasses.replace(unreadable_result(u, str(facts_of[c].dtype)), source="derived")  # the schema's
            for c, u in sorted(bad.items()) if c not in missing]
    return ContractResult(tuple(out))


def _window_facts(contract: Contract, frame: Any, schema: Mapping[str, str] | None,
                  unreadable: Mapping[str, Unreadable] | None) -> tuple[Any, Any, set[str], dict[str, Unreadable]]:
    """(window read as ``schema``, facts by column, datetime columns, unreadable values by column)."""
    if not isinstance(frame, pd.DataFrame):  # a streamed window: its merged facts
        facts = frame.facts
        dt_cols = {c for c, f in facts.items() if pd.api.types.is_datetime64_any_dtype(f.dtype)}
        return frame, facts, dt_cols, {c: f.unreadable for c, f in facts.items()
                                       if f.unreadable is not None and f.unreadable.count}
    if schema is not None and unreadable is None:
        applied = apply_schema(frame, schema)
        frame, unreadable = applied.frame, applied.unreadable
    bad = dict(unreadable or {})
    dt_cols = {c for c in frame.columns if pd.api.types.is_datetime64_any_dtype(frame[c])}
    counted = {sp.column for sp in contract.expectations if sp.type in COUNTED_EXPECTATIONS}
    return frame, LazyColumnFacts(frame, counted, bad), dt_cols, bad


def _kind_conflict(spec: ExpectationSpec, kind: str | None) -> str | None:
    """Why ``spec`` cannot be judged on a column declared ``kind`` (``None``: it can).

    A categorical column holds category names (``"11"``, not ``11``: the declared schema is applied
    first), so numeric bounds (``min_value`` / ``max_value``) and a dtype that is not a string one
    contradict the schema. Judging them anyway would fail every window whatever its values: it
    is an error of the check, naming the column, the expectation and the declared kind.
    """
    if kind not in CATEGORICAL_KINDS:
        return None
    kw = spec.kwargs
    bounds = {k: kw[k] for k in ("min_value", "max_value")
              if isinstance(kw.get(k), (int, float)) and not isinstance(kw.get(k), bool)}
    types = [kw["type_"]] if kw.get("type_") is not None else list(kw.get("type_list") or [])
    foreign = bool(types) and not any(str(t) in TYPE_LISTS["category"] for t in types)
    if not bounds and not foreign:
        return None
    what = f"numeric bounds {bounds}" if bounds else f"dtype {types}"
    return (f"column {spec.column!r} is declared {kind}, so its values are compared as category names "
            f"('11', not 11), and {spec.type} with {what} cannot apply to it; expected a value-set "
            f"expectation (ExpectColumnValuesToBeInSet) on a categorical column, or the column declared "
            f"numeric")


def _type_result(col: str, facts: Any, bad: Unreadable | None) -> ExpectationResult:
    """The type check of a column holding unreadable values, or of a datetime column."""
    dtype = str(facts.dtype)
    if bad is not None:
        return unreadable_result(bad, dtype)
    ok = dtype.startswith("datetime64")
    return ExpectationResult(col, "expect_column_values_to_be_in_type_list", dtype, ok,
                             message="" if ok else "expected a datetime64 column")


def _window_kwargs(spec: ExpectationSpec, categorical: bool, datetime: bool) -> dict[str, Any]:
    """``spec``'s kwargs in the window's representation.

    Value sets of a categorical column as category names; datetime bounds and sets as the one
    datetime representation.

    Raises:
        ValueError / TypeError: A datetime bound or value that is not a time.
    """
    kwargs = dict(spec.kwargs)
    if categorical and isinstance(kwargs.get("value_set"), (list, tuple, set)):
        kwargs["value_set"] = sorted({category_name(v) for v in kwargs["value_set"] if v is not None})
    return normalise_kwargs(kwargs) if datetime else kwargs
