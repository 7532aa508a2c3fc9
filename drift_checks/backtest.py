"""Backtest a drift policy on a historical table: ``tritonflow drift backtest``.

Replays a table (Parquet or CSV with a time column) through EXACTLY the check the hourly
``drift_monitor`` runs (:func:`drift_checks.verdict.check_window`: contract -> statistics ->
thresholds -> vote -> dataset verdict -> alert policy) on a temporary history store, so a user can
see what a policy would have said before switching monitoring on.

* **Reference**: the first N rows, or the rows of a time range (the training data of the model
  you serve); or, with ``reference_strategy`` ``trailing`` / ``seasonal``, the table's own earlier
  rows (data time: the last ``trailing`` span, or the same window one ``period`` earlier).
* **Windows**: the rows after the reference, cut into consecutive windows of N rows or of a
  duration (data time; an empty duration window is replayed as "no data").
* **Logical time**: window ``i`` is replayed as hourly run ``i`` (the check is hourly), so the
  time-based knobs of the policy count windows as hours: a 30-day look-back is 720 windows, a 24 h
  cooldown is 24 windows. The data-time bounds of every window are reported beside it.

Outputs (``out`` folder): ``backtest.json`` (per window: start, end, n_rows, status, severity,
alert, dataset verdict and score, flagged features with statistic, value, threshold and threshold
source, the contract failures naming column, expectation, source (``derived`` or ``user``) and
message, and the expectations that could not be evaluated (``contract_check_errors``); summary: windows,
alerts, dataset alarms (windows whose dataset verdict is drift), alerts per 100 windows in the
static phase (before enough taught history: reference or static thresholds) and the dynamic
phase, and the realised false-alarm rate of the quiet windows per 100 windows and per model-week
with its exact 95 % upper bound, beside the policy's declared budget (:mod:`drift_checks.budget`))
and ``index.html`` with one plot per feature (its main drift statistic per window against the
threshold used, alerts marked), as the demo report draws them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import json
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from drift_checks.budget import realised_rate
from drift_checks.contract_types import Contract
from drift_checks.history import HistoryStore
from drift_checks.inference_log import LogSchema, arrow_to_pandas
from drift_checks.season_match import SeasonalReference
from drift_checks.strategies import ReferenceStrategy, served_reference
from drift_checks.verdict import CheckConfig, PreparedReference, check_window, json_default, prepare_reference
from ground.exceptions import DataError

#: Logical start of window 0 (each window is one hourly run).
LOGICAL_START = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
#: Statistic plotted per feature kind (the first one present).
PLOTTED = {"numeric": ("psi", "wasserstein_normed", "ks_p_value"),
           "categorical": ("jensen_shannon", "chi_square_p_value", "unseen_share")}
#: Largest number of windows listed in the HTML table.
MAX_HTML_ROWS = 500


@dataclasses.dataclass(frozen=True)
class BacktestWindow:
    """How to cut the replayed rows: ``rows`` rows each, or a ``duration`` of data time."""

    rows: int | None = None
    duration: pd.Timedelta | None = None

    @classmethod
    def parse(cls, text: str | int) -> "BacktestWindow":
        """``"48"`` -> 48 rows; ``"1h"``, ``"2D"``, ``"30min"`` -> a duration.

        Raises:
            DataError: Neither a positive integer nor a positive duration.
        """
        raw = str(text).strip()
        if raw.isdigit():
            if int(raw) < 1:
                raise DataError(f"--window {raw!r}: expected at least 1 row")
            return cls(rows=int(raw))
        try:
            d = pd.Timedelta(raw)
        except (ValueError, TypeError):
            raise DataError(f"--window {raw!r}: expected a number of rows (e.g. 48) or a duration "
                            "(e.g. 1h, 2D)") from None
        if d <= pd.Timedelta(0):
            raise DataError(f"--window {raw!r}: expected a positive duration")
        return cls(duration=d)


def read_suite(path: str | Path) -> Contract:
    """A user's expectation suite: a GX 1.x suite JSON or :meth:`Contract.to_dict` output.

    Raises:
        DataError: Missing file, not JSON, or not ``{"expectations": [{"type", "kwargs"}...]}``
            (names the file and what is wrong).
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("expectations"), list):
            raise ValueError("no list 'expectations'")
        return Contract.from_dict(doc)
    except (OSError, ValueError, TypeError) as exc:
        raise DataError(f"--suite {str(path)!r}: {exc}; expected a JSON suite "
                        "{\"expectations\": [{\"type\": ..., \"kwargs\": {...}}]}") from None


def read_table(path: str | Path) -> pd.DataFrame:
    """A Parquet or CSV table; integer columns with nulls come back as nullable integers.

    Raises:
        DataError: Missing file, unknown suffix, or a file that does not parse.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"--data {str(path)!r} is not a file; expected a Parquet or CSV table")
    try:
        if p.suffix.lower() in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            return arrow_to_pandas(pq.read_table(p))
        if p.suffix.lower() == ".csv":
            frame = pd.read_csv(p, dtype_backend="numpy_nullable")
            for c in frame.columns:  # keep pandas' usual dtypes except nullable integers
                if isinstance(frame[c].dtype, pd.Float64Dtype):
                    frame[c] = frame[c].astype("float64")
                elif isinstance(frame[c].dtype, pd.StringDtype):
                    frame[c] = frame[c].astype(object).where(frame[c].notna(), None)
                elif isinstance(frame[c].dtype, pd.BooleanDtype) and not frame[c].isna().any():
                    frame[c] = frame[c].astype(bool)
            return frame
    except Exception as exc:  # noqa: BLE001 - pandas/pyarrow parse errors
        raise DataError(f"--data {str(path)!r} does not parse: {exc}") from exc
    raise DataError(f"--data {str(path)!r} has suffix {p.suffix!r}; expected .parquet, .pq or .csv")


def _times(frame: pd.DataFrame, column: str, unit: str | None) -> pd.Series:
    if column not in frame.columns:
        raise DataError(f"--time-column {column!r} is not a column; the table has {list(frame.columns)}")
    s = frame[column]
    try:
        if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
            t = pd.to_datetime(s.astype("float64"), unit=unit or "s", origin="unix", utc=True, errors="coerce")
        else:
            t = pd.to_datetime(s, utc=True, format="mixed", errors="coerce")
    except (ValueError, TypeError, OverflowError) as exc:
        raise DataError(f"--time-column {column!r} does not read as times ({exc}); expected datetimes or "
                        "numbers with --time-unit") from None
    if t.isna().any():
        bad = s[t.isna()].head(5).tolist()
        raise DataError(f"--time-column {column!r} has {int(t.isna().sum())} rows without a time; "
                        f"first offending values: {bad!r}")
    return t


def _numeric_unit(column: pd.Series, unit: str | None) -> str | None:
    """The unit a numeric time column is read in (``None``: the column holds datetimes)."""
    numeric = pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
    return (unit or "s") if numeric else None


def _instant(value: Any, option: str, numbers: str | None) -> pd.Timestamp:
    """A time given as an option, in UTC.

    A number in the time column's unit where the column holds numbers (``numbers``), else a datetime
    (a naive one is UTC).

    Raises:
        DataError: ``value`` is not a time; the message names the option, the value and what reads.
    """
    if numbers is not None and not isinstance(value, (pd.Timestamp, dt.datetime)):
        try:
            return pd.to_datetime(float(value), unit=numbers, origin="unix", utc=True)
        except (TypeError, ValueError, OverflowError):
            pass
    expected = "a datetime such as 2024-03-01T00:00Z" + (
        f", or a number of {numbers!r} as in the time column" if numbers else "")
    try:
        t = pd.Timestamp(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise DataError(f"{option} {value!r} is not a time ({exc}); expected {expected}") from None
    if pd.isna(t):
        raise DataError(f"{option} {value!r} is not a time; expected {expected}")
    return t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")


def _numbers_kind(s: pd.Series) -> str:
    """``int`` / ``float`` for a text or object column whose values all read as numbers, else ``category``.

    A CSV column that holds one word somewhere is read as text from top to bottom; its reference
    rows still say whether the feature is numeric.
    """
    values = s.dropna()
    if values.empty or s.dtype != object:
        return "category"
    if pd.api.types.infer_dtype(values, skipna=True) == "boolean":
        return "category"
    num = pd.to_numeric(values, errors="coerce")
    if num.isna().any():
        return "category"
    whole = np.isfinite(num.to_numpy(dtype="float64")) & (num.to_numpy(dtype="float64") % 1 == 0)
    return "int" if bool(whole.all()) else "float"


def _schema(frame: pd.DataFrame, features: Sequence[str] | None, categorical: Sequence[str],
            time_column: str) -> LogSchema:
    """The declared schema of the replay, read from the reference rows ``frame``.

    ``categorical`` columns are categories whatever their dtype; the others take the kind of
    their dtype in the reference; a text column whose reference values all read as numbers is
    numeric (:func:`_numbers_kind`), so a later window holding a word fails its contract naming
    the column and the value.
    """
    cols = list(features) if features else [c for c in frame.columns if c != time_column]
    missing = [c for c in list(cols) + list(categorical) if c not in frame.columns]
    if missing:
        raise DataError(f"features {missing} are not columns of the table ({list(frame.columns)})")
    inferred = dict(LogSchema.infer(frame[cols]).features)
    for c in cols:
        if inferred[c] == "category" and c not in categorical:
            inferred[c] = _numbers_kind(frame[c])
    kinds = {c: ("category" if c in categorical else inferred[c]) for c in cols}
    kinds = {c: ("category" if k in ("datetime", "string") else k) for c, k in kinds.items()}
    return LogSchema(kinds)


def _cut(replay: pd.DataFrame, times: pd.Series, window: BacktestWindow) -> list[tuple[Any, Any, pd.DataFrame]]:
    """(start, end, rows) of consecutive windows over the replayed rows (data time)."""
    out: list[tuple[Any, Any, pd.DataFrame]] = []
    if replay.empty:
        return out
    if window.rows:
        for i in range(0, len(replay), window.rows):
            part = replay.iloc[i:i + window.rows]
            t = times.loc[part.index]
            nxt = times.loc[replay.index[i + window.rows]] if i + window.rows < len(replay) else t.iloc[-1]
            out.append((t.iloc[0], nxt, part))
        return out
    assert window.duration is not None  # BacktestWindow.parse gives rows or a duration
    t0 = times.loc[replay.index[0]]
    idx = ((times.loc[replay.index] - t0) // window.duration).astype(int)
    groups = {k: g for k, g in replay.groupby(idx.to_numpy(), sort=True)}
    for k in range(int(idx.max()) + 1):
        start = t0 + k * window.duration
        out.append((start, start + window.duration, groups.get(k, replay.iloc[0:0])))
    return out


def run_backtest(
    table: pd.DataFrame,
    *,
    time_column: str,
    out_dir: str | Path,
    features: Sequence[str] | None = None,
    categorical: Sequence[str] = (),
    reference_rows: int | None = None,
    reference_range: tuple[Any, Any] | None = None,
    window: BacktestWindow | str | int = "1h",
    strategy: ReferenceStrategy | None = None,
    importance: Mapping[str, float] | None = None,
    config: CheckConfig | None = None,
    time_unit: str | None = None,
    replay_end: Any = None,
    html_report: bool = True,
    model: str = "backtest",
    engine: str = "exact",
    sketch_k: int | None = None,
    contract: Contract | None = None,
    quiet_windows: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Replay ``table`` through the hourly drift check and write ``backtest.json`` (+ HTML).

    Args:
        table: The historical table.
        time_column: Its time column (datetimes; numbers are read with ``time_unit``).
        out_dir: Output folder (created).
        features: Feature columns (default: every column but the time column).
        categorical: Columns scored as categories (object/string/bool ones are anyway).
        reference_rows: The reference is the first N rows (give this or ``reference_range``).
        reference_range: ``(start, end)``: the reference is the rows with ``start <= time < end``
            (give this or ``reference_rows``). Datetimes (naive ones are UTC), or numbers in
            ``time_unit`` when the time column holds numbers.
        window: :class:`BacktestWindow`, or its text (``"48"`` rows, ``"1h"``).
        strategy: Reference strategy (default: ``training``, the reference above).
        importance: ``{feature: importance}`` for the dataset weights (default: none, which the
            ``importance`` weighting treats as uniform).
        config: Check knobs; the caller builds them from its settings with
            :meth:`CheckConfig.from_settings` (default: the built-in defaults, ``CheckConfig()``,
            which are the settings' defaults). Evidently is off either way.
        time_unit: Unit of a numeric time column (``"s"``, ``"D"``...; default seconds).
        replay_end: Stop replaying at this time (exclusive; default: the table's end), read as
            ``reference_range``.
        html_report: Also write ``index.html`` and the plots.
        model: Model name used in the temporary history.
        engine: ``"exact"`` (each window whole in memory) or ``"streamed"`` (each window
            summarised batch by batch into bin counts and sketches, as windows above
            ``TRITONFLOW_DRIFT_EXACT_MAX_ROWS`` are: :mod:`drift_checks.summaries`).
        sketch_k: KLL ``k`` of the streamed engine (default :data:`drift_checks.sketches.DEFAULT_SKETCH_K`).
        contract: The user's own expectations (e.g. a GX suite read with
            :meth:`~drift_checks.contract_types.Contract.from_dict`), added to the derived contract
            of every window, as the hourly check does.
        quiet_windows: Indices of the windows known to hold no real shift, whose alerts are false
            ones in the summary's realised rate (``None``: every window; replay a stretch where
            nothing changed, or shuffled rows, to measure the false-alarm rate).

    Returns:
        The ``backtest.json`` document.

    Raises:
        DataError: Bad options or data (the message names the option, column or value).
    """
    if engine not in ("exact", "streamed"):
        raise DataError(f"--engine {engine!r}: expected exact or streamed")
    if (reference_rows is None) == (reference_range is None):
        raise DataError("give exactly one reference: --reference-rows N or --reference-range START END")
    win = window if isinstance(window, BacktestWindow) else BacktestWindow.parse(window)
    strategy = strategy or ReferenceStrategy()
    cfg = config or CheckConfig()
    cfg = dataclasses.replace(cfg, evidently_sample_rows=0, max_summary_bytes=1 << 30)
    times = _times(table, time_column, time_unit)
    order = np.argsort(times.to_numpy(), kind="stable")
    table, times = table.iloc[order], times.iloc[order]
    numbers = _numeric_unit(table[time_column], time_unit)
    if reference_range is not None:
        reference_range = (_instant(reference_range[0], "--reference-range", numbers),
                           _instant(reference_range[1], "--reference-range", numbers))
    if replay_end is not None:
        replay_end = _instant(replay_end, "--end", numbers)
    ref_frame, replay = _split_reference(table, times, reference_rows, reference_range)
    schema = _schema(ref_frame, features, categorical, time_column)  # declared by the reference rows
    replay = _until(replay, times, replay_end)
    cols = list(schema.features)
    training = prepare_reference(ref_frame[cols].reset_index(drop=True), schema, reference_id="backtest:training",
                                 importance=importance, time_ordered=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    replayer = _Replayer(table=table, times=times, schema=schema, training=training, strategy=strategy,
                         importance=importance, cfg=cfg, contract=contract, model=model, engine=engine,
                         sketch_k=sketch_k, seasons=_seasons(training, times.loc[ref_frame.index], strategy, cfg))
    windows, series = replayer.replay(_cut(replay, times, win))
    doc = {"data": {"rows": int(len(table)), "time_column": time_column, "features": schema.to_dict()["features"],
                    "reference_rows": int(len(ref_frame)),
                    "reference_span": [str(times.loc[ref_frame.index[0]]), str(times.loc[ref_frame.index[-1]])],
                    "window": str(win.rows) + " rows" if win.rows else str(win.duration),
                    "reference_strategy": strategy.describe(), "engine": engine,
                    "weighting": windows[0]["weighting"] if windows else None},
           "policy": _policy_doc(cfg),
           "summary": summarise(windows, cfg.alerts.false_alarm_budget_per_week, quiet=quiet_windows),
           "windows": windows}
    (out / "backtest.json").write_text(json.dumps(doc, indent=1, default=json_default))
    if html_report:
        write_html(out, doc, series)
    return doc


def _seasons(training: PreparedReference, times: pd.Series, strategy: ReferenceStrategy, cfg: CheckConfig
             ) -> SeasonalReference | None:
    """The reference rows by season (else ``None``).

    For the ``training_seasonal`` strategy's windows, or the season run rule's evidence under
    ``training`` with ``seasonal_run_windows`` on (:mod:`drift_checks.policy`).
    """
    if strategy.name != "training_seasonal" and not (strategy.name == "training"
                                                     and cfg.alerts.seasonal_run_windows >= 2):
        return None
    naive = times.dt.tz_convert(None).to_numpy(dtype="datetime64[ns]")  # _times reads them as UTC
    return SeasonalReference(training, naive, strategy.period)


def _split_reference(table: pd.DataFrame, times: pd.Series, reference_rows: int | None,
                     reference_range: tuple[Any, Any] | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(reference rows, rows to replay) of the time-sorted ``table``: the first N rows, or a time range."""
    if reference_rows is not None:
        if reference_rows < 1 or reference_rows >= len(table):
            raise DataError(f"--reference-rows {reference_rows}: expected 1..{len(table) - 1} (the table "
                            f"has {len(table)} rows)")
        return table.iloc[:reference_rows], table.iloc[reference_rows:]
    assert reference_range is not None  # exactly one of the two, checked by the caller
    a, b = reference_range  # UTC instants (_instant)
    inside = (times >= a) & (times < b)
    if not inside.any():
        raise DataError(f"--reference-range {a}..{b} holds no row (the table spans "
                        f"{times.iloc[0]}..{times.iloc[-1]})")
    return table[inside.to_numpy()], table[(times >= b).to_numpy()]


def _until(replay: pd.DataFrame, times: pd.Series, replay_end: Any) -> pd.DataFrame:
    """The replayed rows before ``replay_end`` (all of them when ``None``); never empty."""
    if replay_end is not None:  # a UTC instant (_instant)
        replay = replay[(times.loc[replay.index] < replay_end).to_numpy()]
    if replay.empty:
        raise DataError("no rows left to replay after the reference")
    return replay


@dataclasses.dataclass
class _Replayer:
    """Replays windows through :func:`check_window` on a temporary history, as hourly runs."""

    table: pd.DataFrame
    times: pd.Series
    schema: LogSchema
    training: PreparedReference
    strategy: ReferenceStrategy
    importance: Mapping[str, float] | None
    cfg: CheckConfig
    contract: Contract | None
    model: str
    engine: str
    sketch_k: int | None
    seasons: SeasonalReference | None = None

    def replay(self, cut: list[tuple[Any, Any, pd.DataFrame]]
               ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        """(``backtest.json`` window rows, ``{feature: plot points}``) of the windows in ``cut``."""
        cols = list(self.schema.features)
        windows: list[dict[str, Any]] = []
        series: dict[str, list[Any]] = {c: [] for c in cols}
        with tempfile.TemporaryDirectory(prefix="tritonflow-backtest-") as tmp:
            history = HistoryStore(f"sqlite:///{Path(tmp) / 'history.db'}")
            try:
                for i, (t_start, t_end, rows) in enumerate(cut):
                    reference, note = self.reference_for(t_start, t_end)
                    summary = self.check(i, rows[cols], reference, history, self.season_for(t_start, t_end))
                    windows.append(_window_row(i, t_start, t_end, summary, note))
                    for c in cols:
                        series[c].append(_plot_point(summary, c))
            finally:
                history.engine.dispose()
        return windows, series

    def reference_for(self, t_start: Any, t_end: Any) -> tuple[PreparedReference, str]:
        """The window's reference under the strategy, and the note saying which it was."""
        if self.seasons is not None and self.strategy.name == "training_seasonal":
            return self.seasons.for_window(t_start, t_end)
        span = self.strategy.served_range(t_start, t_end)
        if span is None:
            return self.training, "training"
        mask = ((self.times >= span[0]) & (self.times < span[1])).to_numpy()
        served = served_reference(self.table[mask], list(self.schema.features), kinds=self.schema.features)
        if served is None:
            return self.training, "training (too few served rows)"
        return (prepare_reference(served, self.schema, importance=self.importance, time_ordered=True,
                                  reference_id=f"backtest:{self.strategy.name}"), self.strategy.name)

    def season_for(self, t_start: Any, t_end: Any) -> PreparedReference | None:
        """The window's season for the season run rule (``None``: off).

        The whole reference when the season holds fewer than 2 cycles, which :func:`check_window` ignores.
        """
        if self.seasons is None or self.strategy.name != "training" or self.engine != "exact":
            return None
        return self.seasons.for_window(t_start, t_end)[0]

    def check(self, i: int, rows: pd.DataFrame, reference: PreparedReference,
              history: HistoryStore, season: PreparedReference | None = None) -> dict[str, Any]:
        """Window ``i`` checked as hourly run ``i`` (summarised first by the streamed engine).

        With a user's suite, the streamed engine keeps the seeded sample its row-wise
        expectations run on (as the hourly check's does), keyed by each row's label in the table.
        """
        start = LOGICAL_START + dt.timedelta(hours=i)
        frame: Any = rows.reset_index(drop=True)
        if self.engine == "streamed":
            from drift_checks.sketches import DEFAULT_SKETCH_K
            from drift_checks.summaries import summarize_frame

            sample = self.cfg.contract_sample_rows if self.contract is not None else 0
            keyed = (frame.assign(request_id=[str(k) for k in rows.index])
                     if sample and "request_id" not in frame.columns else frame)
            frame = summarize_frame(keyed, reference, sketch_k=self.sketch_k or DEFAULT_SKETCH_K,
                                    sample_rows=sample)
        return check_window(model=self.model, frame=frame, start=start, end=start + dt.timedelta(hours=1),
                            reference=reference, history=history, config=self.cfg, contract=self.contract,
                            season=season)


def _policy_doc(cfg: CheckConfig) -> dict[str, Any]:
    p, a = cfg.policy, cfg.alerts
    return {"quantile": p.quantile, "look_back_days": p.window_days, "min_history_windows": p.min_history,
            "ceiling_factor": p.ceiling_factor, "consecutive_windows": a.consecutive_windows,
            "cooldown_hours": a.cooldown.total_seconds() / 3600, "dataset_share": a.dataset_share,
            "weighting": a.weighting, "sustained_windows": a.sustained_windows,
            "sustained_evidence": a.sustained_evidence, "false_alarm_budget_per_week": a.false_alarm_budget_per_week}


def _window_row(i: int, start, end, summary: Mapping[str, Any], note: str) -> dict[str, Any]:
    drifted = []
    for f, info in (summary.get("features") or {}).items():
        if not info.get("flagged"):
            continue
        causes = [{"statistic": n, "value": s.get("value"), "threshold": s.get("threshold"),
                   "threshold_source": s.get("threshold_source")}
                  for n, s in (info.get("statistics") or {}).items() if s.get("flagged")]
        drifted.append({"feature": f, "severity": info.get("severity"), "strong": bool(info.get("strong")),
                        "statistics": causes})
    sources = summary.get("threshold_sources") or {}
    phase = "dynamic" if sources.get("dynamic", 0) * 2 > sum(sources.values() or [0]) else "static"
    return {"window": i, "start": str(start), "end": str(end), "n_rows": summary.get("n_rows"),
            "status": summary.get("status"), "severity": summary.get("severity"),
            "alert": bool(summary.get("drift")), "alert_features": summary.get("alert_features") or [],
            "alert_reason": summary.get("alert_reason") or "", "dataset_drift": bool(summary.get("dataset_drift")),
            "dataset_score": summary.get("dataset_score"), "weighting": summary.get("weighting"),
            "threshold_phase": phase, "threshold_sources": sources,
            "threshold_quantile": (summary.get("false_alarm_budget") or {}).get("quantile"),
            "reference": note, "drifted": drifted,
            "contract_failures": _contract_alerts(summary, "data_quality"),
            "contract_check_errors": _contract_alerts(summary, "contract_check_error")}


def _contract_alerts(summary: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    """The window's contract alerts of ``kind``: column, expectation, source and message."""
    return [{k: a.get(k) for k in ("column", "expectation", "source", "message")}
            for a in summary.get("alerts") or [] if a.get("kind") == kind]


def summarise(windows: Sequence[Mapping[str, Any]], budget_per_week: float | None = None, *,
              quiet: Sequence[int] | None = None) -> dict[str, Any]:
    """Counts of ``backtest.json``: windows, alerts and dataset alarms, overall and per phase.

    Args:
        windows: The window rows.
        budget_per_week: The policy's false-alarm budget, reported beside the realised rate.
        quiet: Indices of the windows known to hold no real shift (``None``: every window).

    Returns:
        The summary; ``false_alarms`` (overall and per phase) is the realised rate of the alerts in
        the quiet windows, per 100 windows and per model-week (168 windows), with the exact upper
        bound of :func:`drift_checks.budget.realised_rate`, beside the budget. Every alert in a
        quiet window is a false one.
    """
    keep = None if quiet is None else set(quiet)

    def block(ws):
        n = len(ws)
        alerts = sum(w["alert"] for w in ws)
        dataset = sum(w["dataset_drift"] for w in ws)
        calm = [w for w in ws if keep is None or w["window"] in keep]
        return {"windows": n, "alerts": alerts, "dataset_alarms": dataset,
                "alerts_per_100_windows": round(100 * alerts / n, 2) if n else None,
                "dataset_alarms_per_100_windows": round(100 * dataset / n, 2) if n else None,
                "false_alarms": realised_rate(sum(w["alert"] for w in calm), len(calm), budget_per_week)}

    return {**block(windows), "no_data_windows": sum(w["status"] == "no_data" for w in windows),
            "contract_failed_windows": sum(w["status"] == "contract_failed" for w in windows),
            "check_error_windows": sum(w["status"] == "check_error" for w in windows),
            "alert_windows": [w["window"] for w in windows if w["alert"]],
            "quiet_windows": "all" if quiet is None else sorted(keep or ()),
            "static_phase": block([w for w in windows if w["threshold_phase"] == "static"]),
            "dynamic_phase": block([w for w in windows if w["threshold_phase"] == "dynamic"])}


def _plot_point(summary: Mapping[str, Any], feature: str) -> dict[str, Any]:
    info = (summary.get("features") or {}).get(feature) or {}
    stats = info.get("statistics") or {}
    for name in PLOTTED["numeric"] + PLOTTED["categorical"]:
        if name in stats and stats[name].get("value") is not None:
            return {"statistic": name, "value": stats[name]["value"], "threshold": stats[name].get("threshold"),
                    "source": stats[name].get("threshold_source"), "alert": bool(summary.get("drift")),
                    "severity": info.get("severity")}
    return {"statistic": None, "value": None, "threshold": None, "source": None,
            "alert": bool(summary.get("drift")), "severity": info.get("severity")}


def write_html(out: Path, doc: Mapping[str, Any], series: Mapping[str, list[dict[str, Any]]]) -> Path:
    """``index.html`` with one PNG per feature: the statistic per window against its threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images = []
    alerts = [w["window"] for w in doc["windows"] if w["alert"]]
    for feature, points in series.items():
        xs = [i for i, p in enumerate(points) if p["value"] is not None]
        if not xs:
            continue
        stat = next(p["statistic"] for p in points if p["statistic"])
        fig, ax = plt.subplots(figsize=(9, 2.8))
        ax.plot(xs, [points[i]["value"] for i in xs], lw=1.2, color="tab:blue", label=f"{stat}")
        ax.plot(xs, [points[i]["threshold"] for i in xs], lw=1.2, color="tab:orange",
                label="threshold used (reference / dynamic)")
        flagged = [i for i in xs if points[i]["severity"] in ("warning", "drift")]
        ax.scatter(flagged, [points[i]["value"] for i in flagged], s=10, color="tab:red", zorder=3,
                   label="feature flagged")
        for j, a in enumerate(alerts):
            ax.axvline(a, color="red", lw=1, alpha=0.6, label="drift alert" if j == 0 else None)
        if stat.endswith("p_value"):
            ax.set_yscale("log")
        ax.set_title(f"{feature}: {stat} per window vs the threshold the check used")
        ax.set_xlabel("window")
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        name = f"drift_{''.join(ch if ch.isalnum() else '_' for ch in feature)}.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        images.append((feature, name))
    s = doc["summary"]
    rows = "".join(
        f"<tr><td>{w['window']}</td><td>{html.escape(w['start'])}</td><td>{w['n_rows']}</td>"
        f"<td>{w['status']}</td><td>{w['severity']}</td><td>{'ALERT' if w['alert'] else ''}</td>"
        f"<td>{'' if w['dataset_score'] is None else round(w['dataset_score'], 3)}</td>"
        f"<td>{html.escape(', '.join(d['feature'] for d in w['drifted']))}</td></tr>"
        for w in doc["windows"][:MAX_HTML_ROWS])
    body = f"""<!doctype html><html><head><meta charset="utf-8"><title>tritonflow drift backtest</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:2px 6px;font-size:12px}}</style></head><body>
<h1>Drift backtest</h1>
<p>{html.escape(json.dumps(doc['data'], default=str))}</p>
<p>Policy: {html.escape(json.dumps(doc['policy']))}</p>
<p><b>{s['windows']} windows, {s['alerts']} drift alerts ({s['alerts_per_100_windows']} per 100 windows),
{s['dataset_alarms']} dataset-drift windows.</b> Static phase: {html.escape(json.dumps(s['static_phase']))}.
Dynamic phase: {html.escape(json.dumps(s['dynamic_phase']))}.</p>
{''.join(f'<h3>{html.escape(f)}</h3><img src="{n}">' for f, n in images)}
<h2>Windows</h2><table><tr><th>window</th><th>start</th><th>rows</th><th>status</th><th>severity</th>
<th>alert</th><th>dataset score</th><th>flagged features</th></tr>{rows}</table></body></html>"""
    path = out / "index.html"
    path.write_text(body)
    return path
