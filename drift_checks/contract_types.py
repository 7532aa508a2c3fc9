"""Data-contract types and the one datetime representation used while validating.

:class:`ExpectationSpec` (a GX 1.x expectation class name, its kwargs, a severity), :class:`Contract`,
:class:`ExpectationResult` and :class:`ContractResult`; :func:`canonical_datetime` turns every
date/datetime value into one fixed-width ISO-8601 string in UTC whose lexical order is
chronological. The contract itself (derivation and evaluation) is :mod:`drift_checks.contracts`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

import numpy as np
import pandas as pd

#: The one datetime representation used during validation.
DATETIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"

#: Dtype names a ``float`` column may have in GX's ``expect_column_values_to_be_in_type_list``.
FLOAT_TYPES = ["float64", "float32", "float16", "Float64", "Float32", "int64", "int32", "int16",
                "int8", "uint64", "uint32", "uint16", "uint8", "Int64", "Int32"]
_INT_TYPES = ["int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "Int64",
              "Int32"]
_STR_TYPES = ["object", "str", "string", "category", "StringDtype"]
#: ``{declared kind: dtype names}`` of the derived type-list expectation.
TYPE_LISTS = {"float": FLOAT_TYPES, "int": _INT_TYPES, "category": _STR_TYPES,
               "string": _STR_TYPES, "bool": ["bool", "boolean"]}


#: Severities of an expectation: ``critical`` fails the contract, ``warning`` only reports, and so
#: does ``info`` (Great Expectations 1.x writes all three into a suite's JSON).
SEVERITIES = ("critical", "warning", "info")
#: Where an expectation comes from: ``derived`` (the schema and the reference:
#: :func:`drift_checks.contracts.derive_contract`) or ``user`` (written by hand, a user's suite).
SOURCES = ("derived", "user")


@dataclasses.dataclass(frozen=True)
class ExpectationSpec:
    """One expectation.

    Attributes:
        type: GX class name (e.g. ``"ExpectColumnMaxToBeBetween"``).
        kwargs: Its GX keyword arguments.
        severity: ``"critical"`` (default; fails the contract), ``"warning"`` or ``"info"``
            (reported only).
        meta: Extra facts kept with the result (e.g. ``reference_null_fraction``); never passed
            to GX.
        source: ``"user"`` (default: written by hand) or ``"derived"`` (:data:`SOURCES`).
    """

    type: str
    kwargs: Mapping[str, Any]
    severity: str = "critical"
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source: str = "user"

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"expectation {self.type} severity={self.severity!r}; expected one of {SEVERITIES}")
        if self.source not in SOURCES:
            raise ValueError(f"expectation {self.type} source={self.source!r}; expected one of {SOURCES}")

    @property
    def column(self) -> str | None:
        """The column the expectation checks (``kwargs['column']``); ``None`` for table-level ones."""
        return self.kwargs.get("column")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``type``, ``kwargs``, ``severity``, ``meta``, ``source``).

        Read back by :meth:`Contract.from_dict`.
        """
        return {"type": self.type, "kwargs": jsonable(dict(self.kwargs)), "severity": self.severity,
                "meta": jsonable(dict(self.meta)), "source": self.source}


@dataclasses.dataclass(frozen=True)
class Contract:
    """An ordered list of expectations (JSON-serialisable through :meth:`to_dict`).

    Attributes:
        expectations: The expectations, in order.
        schema: The declared ``{column: kind}`` the contract was derived with (``{}``: none);
            :func:`drift_checks.contracts.run_contract` reads a window as it first.
    """

    expectations: tuple[ExpectationSpec, ...]
    schema: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{"expectations": [...], "schema": {...}}`` (see :meth:`ExpectationSpec.to_dict`)."""
        return {"expectations": [e.to_dict() for e in self.expectations], "schema": dict(self.schema)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Contract":
        """Read a contract written by :meth:`to_dict`, or a Great Expectations 1.x suite's JSON.

        ``type`` is a GX class name (``ExpectColumnValuesToNotBeNull``) or, as a GX suite stores
        it, its snake-case name (``expect_column_values_to_not_be_null``); ``severity`` defaults to
        ``critical`` and ``source`` to ``user``.

        Raises:
            ValueError: An expectation without ``type`` or ``kwargs`` (names its position).
        """
        exps = []
        for i, e in enumerate(d["expectations"]):
            if not isinstance(e, Mapping) or "type" not in e or not isinstance(e.get("kwargs"), Mapping):
                raise ValueError(f"expectation {i} is {e!r}; expected {{'type': ..., 'kwargs': {{...}}}}")
            exps.append(ExpectationSpec(_camel(str(e["type"])), dict(e["kwargs"]), e.get("severity", "critical"),
                                        dict(e.get("meta") or {}), e.get("source", "user")))
        return cls(tuple(exps), dict(d.get("schema") or {}))


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
        source: ``"derived"`` or ``"user"``: where the expectation came from (:data:`SOURCES`).
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
    source: str = "user"

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
        """Non-critical failures: reported, the contract still passes.

        Those of ``warning`` and ``info`` expectations: the ranges and sets learned from the
        reference, a user suite's non-critical expectations.
        """
        return [r for r in self.results if not r.success and not r.raised and r.severity != "critical"]

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
        """``"failed"`` (data failures), else ``"error"`` (a check raised), else ``"passed"``.

        A data failure wins over an error of the check: an expectation that could not be
        evaluated (say one of a user's suite) never hides a derived check the data broke, and is
        still listed in :attr:`check_errors`. A non-critical expectation that could not be
        evaluated is listed there too, and only reports, as its failure would.
        """
        if self.failures:
            return "failed"
        return "error" if any(r.severity == "critical" for r in self.check_errors) else "passed"

    @property
    def sources(self) -> dict[str, int]:
        """How many expectations came from each source (``{"derived": n, "user": m}``)."""
        out = {k: 0 for k in SOURCES}
        for r in self.results:
            out[r.source] = out.get(r.source, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary.

        Status, expectations per source, invalid columns, the outcome of every user expectation,
        and the failures, warnings and errors of the check (each with its ``source``).
        """
        return {"status": self.status, "sources": self.sources, "invalid_columns": self.invalid_columns,
                "user_expectations": [{"column": r.column, "expectation": r.expectation, "success": r.success,
                                       "raised": r.raised, "severity": r.severity}
                                      for r in self.results if r.source == "user"],
                "failures": [r.to_dict() for r in self.failures],
                "warnings": [r.to_dict() for r in self.warnings],
                "check_errors": [r.to_dict() for r in self.check_errors]}


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


def canonical_series(s: pd.Series) -> pd.Series:
    """A datetime column in the one representation used during validation.

    Args:
        s: A datetime64 Series (naive is read as UTC; aware is converted to UTC).

    Returns:
        An object Series of :data:`DATETIME_FORMAT` strings, ``None`` where ``s`` is null.
    """
    if getattr(s.dt, "tz", None) is not None:
        s = s.dt.tz_convert("UTC").dt.tz_localize(None)
    out = s.dt.strftime(DATETIME_FORMAT)
    return out.where(s.notna(), None).astype(object)


def normalise_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """An expectation's kwargs with its datetime bounds and value set in the canonical form.

    Args:
        kwargs: The expectation's kwargs (``min_value``, ``max_value``, ``value``, ``value_set``...).

    Returns:
        A copy whose bounds are :func:`canonical_datetime` strings and whose ``value_set`` is the
        sorted set of them; other keys unchanged.
    """
    out = dict(kwargs)
    for k in ("min_value", "max_value", "value"):
        if out.get(k) is not None:
            out[k] = canonical_datetime(out[k])
    for k in ("value_set",):
        if out.get(k) is not None:
            out[k] = sorted({canonical_datetime(v) for v in out[k]})
    return out


def _camel(name: str) -> str:
    """``expect_column_values_to_not_be_null`` -> ``ExpectColumnValuesToNotBeNull`` (class names unchanged)."""
    return "".join(p[:1].upper() + p[1:] for p in name.split("_")) if "_" in name or name.islower() else name


def snake_case(name: str) -> str:
    """A GX expectation class name as its snake-case expectation name.

    Args:
        name: ``ExpectColumnValuesToNotBeNull`` (a snake-case name is returned unchanged).

    Returns:
        ``expect_column_values_to_not_be_null``.
    """
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def jsonable(v: Any) -> Any:
    """A value made JSON-safe for results and summaries.

    Args:
        v: Any value: containers, numpy scalars, timestamps...

    Returns:
        Dicts (string keys) and lists recursively; numpy scalars as Python ones; infinite floats
        as ``"inf"`` / ``"-inf"`` and NaN as ``None``; timestamps as :func:`canonical_datetime`;
        anything else as its ``str``.
    """
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [jsonable(x) for x in v]
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
