"""Evidently ``DataDriftPreset`` report on a bounded sample of the reference and current window.

Evidently is the user-facing report (HTML to MLflow) and a second opinion per column; our own
statistics (:mod:`drift_checks.statistics`) drive the verdict. Guards (Evidently #1764,
#1480, PR #1820):

* an empty current window never reaches Evidently (it would fail with a TypeError);
* a column whose values are all null on either side is excluded from the Evidently call and
  reported as a data-quality failure, so the other columns still get their drift results.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

#: Default rows of each side passed to Evidently.
DEFAULT_SAMPLE_ROWS = 5_000


@dataclasses.dataclass
class EvidentlyResult:
    """Outcome of the Evidently report.

    Attributes:
        status: ``"ok"``, ``"no_data"`` (empty window, Evidently not called) or
            ``"no_columns"`` (every column excluded).
        html_path: Path of the HTML report (``None`` when not produced).
        scores: ``{column: {"method", "threshold", "value"}}`` from Evidently's ValueDrift.
        excluded: ``{column: reason}`` of columns kept away from Evidently (data-quality
            failures).
        sample_rows: (reference rows, current rows) passed to Evidently.
    """

    status: str
    html_path: str | None
    scores: dict[str, dict[str, Any]]
    excluded: dict[str, str]
    sample_rows: tuple[int, int] = (0, 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form of the result (every field)."""
        return dataclasses.asdict(self)


def _sample(frame: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    return frame.sample(n=n, random_state=seed) if len(frame) > n else frame


def run_evidently(reference: pd.DataFrame, current: pd.DataFrame, *, numeric: Iterable[str] = (),
                  categorical: Iterable[str] = (), out_dir: str | Path,
                  sample_rows: int = DEFAULT_SAMPLE_ROWS, seed: int = 0,
                  name: str = "evidently_data_drift.html") -> EvidentlyResult:
    """Run ``DataDriftPreset`` on deterministic samples of both sides.

    Args:
        reference: Frame holding the reference's feature columns.
        current: Frame holding the window's feature columns.
        numeric: Numeric column names (declared, not inferred: evidently#1764).
        categorical: Categorical column names (declared likewise).
        out_dir: Folder for the HTML file.
        sample_rows: Rows per side (uniform sample, ``seed``).
        seed: Random seed of the samples (same seed, same samples).
        name: HTML file name.

    Returns:
        An :class:`EvidentlyResult`.
    """
    numeric, categorical = list(numeric), list(categorical)
    if len(current) == 0:
        return EvidentlyResult("no_data", None, {}, {})
    excluded = {}
    for col in numeric + categorical:
        for side, frame in (("current", current), ("reference", reference)):
            if col not in frame.columns:
                excluded[col] = f"missing in {side}"
                break
            if frame[col].isna().all():
                excluded[col] = f"all values null in {side} ({len(frame)} rows)"
                break
    numeric = [c for c in numeric if c not in excluded]
    categorical = [c for c in categorical if c not in excluded]
    if not numeric and not categorical:
        return EvidentlyResult("no_columns", None, {}, excluded)
    from evidently import DataDefinition, Dataset, Report
    from evidently.presets import DataDriftPreset

    cols = numeric + categorical
    ref = _sample(reference[cols], sample_rows, seed).reset_index(drop=True)
    cur = _sample(current[cols], sample_rows, seed).reset_index(drop=True)
    for c in categorical:  # one representation for categories on both sides
        ref[c] = ref[c].astype("string").astype(object)
        cur[c] = cur[c].astype("string").astype(object)
    dd = DataDefinition(numerical_columns=numeric, categorical_columns=categorical)
    snap = Report([DataDriftPreset()]).run(Dataset.from_pandas(cur, data_definition=dd),
                                            Dataset.from_pandas(ref, data_definition=dd))
    scores = {}
    for m in snap.dict()["metrics"]:
        cfg = m.get("config", {})
        if cfg.get("type", "").endswith("ValueDrift"):
            v = m.get("value")
            scores[cfg["column"]] = {"method": cfg.get("method"), "threshold": cfg.get("threshold"),
                                     "value": float(v) if v is not None and math.isfinite(float(v)) else None}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html = out / name
    snap.save_html(str(html))
    return EvidentlyResult("ok", str(html), scores, excluded, (len(ref), len(cur)))
