"""Great Expectations (1.x) evaluation of the expectations the exact checks do not handle.

One ephemeral GX context per process (imported lazily: GX is slow to import and noisy). Row-wise
expectations (:data:`ROW_WISE_PREFIXES`) may run on a seeded sample of a large window; aggregate
ones always see the whole window, and on a streamed window they are errors of the check. An
expectation that raised inside GX is an error of the check, never a verdict on the data.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import pandas as pd

from drift_checks.contract_types import (
    ExpectationResult,
    ExpectationSpec,
    canonical_series,
    jsonable,
    snake_case,
)

#: Prefixes of row-wise GX expectations (a share of rows, ``mostly``): the only ones that may be
#: evaluated on a sample of a large window.
ROW_WISE_PREFIXES = ("ExpectColumnValues", "ExpectColumnPairValues", "ExpectMulticolumn",
                     "ExpectSelectColumnValues", "ExpectCompoundColumns")


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
        return jsonable(result["observed_value"])
    if "unexpected_percent" in result:
        return {"unexpected_percent": jsonable(result.get("unexpected_percent")),
                "partial_unexpected_list": jsonable(result.get("partial_unexpected_list", [])[:10])}
    return jsonable(dict(result)) if result else None


def failure_message(spec: ExpectationSpec, result: Mapping[str, Any]) -> str:
    """What the data did against ``spec``: the column, the offending values, what was expected.

    Args:
        spec: The expectation GX evaluated.
        result: Its GX result (``BASIC`` format: ``unexpected_count``, ``element_count``,
            ``partial_unexpected_list`` for row-wise ones, ``observed_value`` for aggregates).
            At most five distinct unexpected values are named.

    Returns:
        E.g. ``column 'k': 12 of 48 values (25.00 %) are unexpected, first [60, 77]; expected
        ExpectColumnValuesToBeBetween(min_value=0, max_value=50)``.
    """
    expected = ", ".join(f"{k}={v!r}" for k, v in spec.kwargs.items() if k != "column")
    where = f"column {spec.column!r}: " if spec.column is not None else ""
    if "unexpected_count" in result:
        first: list[Any] = []
        for v in jsonable(list(result.get("partial_unexpected_list") or [])):
            if v not in first and len(first) < 5:  # distinct, in the order GX met them
                first.append(v)
        seen = (f"{result.get('unexpected_count')} of {result.get('element_count')} values "
                f"({float(result.get('unexpected_percent') or 0.0):.2f} %) are unexpected, first {first!r}")
    else:
        seen = f"observed {jsonable(result.get('observed_value'))!r}"
    return f"{where}{seen}; expected {spec.type}({expected})"


def run_gx_streamed(specs: list[tuple[int, ExpectationSpec]], summary: Any,
                     dt_cols: set[str]) -> list[tuple[int, ExpectationResult]]:
    """GX on a streamed window: row-wise expectations on its seeded sample.

    Aggregate ones cannot be judged without every row and are errors of the check.

    Args:
        specs: ``(index in the contract, expectation)`` pairs GX evaluates.
        summary: The window's :class:`~drift_checks.summaries.WindowSummary` (``n_rows``,
            ``sample_frame()``).
        dt_cols: Datetime columns, compared in the canonical form.

    Returns:
        ``(index, result)`` pairs, one per spec.
    """
    row_wise = [(i, sp) for i, sp in specs if sp.type.startswith(ROW_WISE_PREFIXES)]
    out = []
    for i, sp in specs:
        if (i, sp) not in row_wise:
            out.append((i, ExpectationResult(
                sp.column, snake_case(sp.type), None, False, True,
                f"{sp.type} needs every row of the window, and this window ({summary.n_rows} rows) was "
                "streamed; expected a window of at most TRITONFLOW_DRIFT_EXACT_MAX_ROWS rows, or a "
                "row-wise expectation")))
    sample = summary.sample_frame()
    if row_wise and sample is not None:
        res = _run_gx_on(row_wise, sample, dt_cols, 0, 0)
        note = f"evaluated on a seeded sample of {len(sample)} of {summary.n_rows} rows"
        out.extend((i, dataclasses.replace(r, message=f"{r.message} ({note})" if r.message else note,
                                           sample_rows=len(sample))) for i, r in res)
    elif row_wise:
        out.extend((i, ExpectationResult(sp.column, snake_case(sp.type), None, False, True,
                                         "the streamed window kept no sample rows")) for i, sp in row_wise)
    return out


def run_gx(specs: list[tuple[int, ExpectationSpec]], frame: pd.DataFrame, dt_cols: set[str],
            sample_rows: int, seed: int) -> list[tuple[int, ExpectationResult]]:
    """Evaluate ``specs`` with Great Expectations.

    Row-wise ones run on a seeded sample of a large window, aggregate ones (set, min/max, counts...) on
    the whole window.

    Args:
        specs: ``(index in the contract, expectation)`` pairs GX evaluates.
        frame: The window.
        dt_cols: Datetime columns, compared in the canonical form.
        sample_rows: Rows of the seeded sample for row-wise expectations (0: every row).
        seed: Seed of that sample.

    Returns:
        ``(index, result)`` pairs, one per spec; an expectation GX cannot build or that raises
        is an error of the check (``check_error``), not a data failure.
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
        data[c] = canonical_series(data[c])
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
                results.append((i, ExpectationResult(spec.column, snake_case(spec.type), None, False,
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
                if not raised and not r.success:
                    msg = failure_message(spec, r.result or {}) + (f" ({note})" if note else "")
                results.append((i, ExpectationResult(
                    spec.column, snake_case(spec.type), None if raised else _observed(r.result or {}),
                    bool(r.success) and not raised, raised, msg or note,
                    len(data) if sampled else None)))
    return results
