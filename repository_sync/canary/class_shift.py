"""Per-class canary check of a multi-class challenger against its own expected behaviour.

A multi-class challenger logs one probability column per class; its expected predictions (a
shadow evaluation's, :func:`tritonflow.pipelines.shadow_replay.write_expected`) hold the same
columns as ``expected.<column>``. :func:`repository_sync.canary.checks.expected_behaviour_checks`
judges each column on its own (KS and PSI with sampling margins); :func:`class_shift` looks at the
classes together with :func:`drift_checks.multiclass.per_class_prediction_shift`: per class the
KS and PSI of ``P[:, c]`` and the share of rows predicted as ``c`` (arg-max), expected vs live,
and the class that moved most. The expected rows are matched to the live inputs as the
per-column checks do (:func:`repository_sync.canary.checks.match_on_inputs`, the same
neighbours for every class so a row's probabilities stay together; a repeated live input counts
once). The result is recorded on the step (``prediction_classes``) and, when a column fails, its
reason names the class and how its predicted share moved (:func:`class_shift_reason`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from repository_sync.canary.checks import ExpectedBehaviour, match_on_inputs

#: Fewest probability columns that make a model multi-class (two are a binary model's).
MIN_CLASSES = 3


def class_shift(live_rows: pd.DataFrame, prediction_columns: Sequence[str], feature_columns: Sequence[str],
                expected: ExpectedBehaviour) -> dict[str, Any] | None:
    """Per-class shift of the challenger's live probabilities from its expected ones.

    Args:
        live_rows: The challenger's logged rows with finite outputs.
        prediction_columns: Its logged output columns, one per class in class order.
        feature_columns: The logged input columns (for matching on inputs).
        expected: The challenger's expected behaviour with ``expected.<column>`` per class.

    Returns:
        :func:`drift_checks.multiclass.per_class_prediction_shift`'s dict with the expected
        side as reference; each class has ``column``, ``ks``, ``psi``, ``share_expected`` and
        ``share_live`` (shares of rows predicted as that class); plus ``worst_column``,
        ``columns``, ``matched_on_inputs``, ``n_live``, ``n_expected`` and ``source``; None
        when fewer than :data:`MIN_CLASSES` logged columns have expected ones.

    Raises:
        DataError: No finite row on a side.
    """
    from drift_checks.multiclass import per_class_prediction_shift

    cols = [c for c in prediction_columns if c in expected.columns and c in live_rows.columns]
    if len(cols) < MIN_CLASSES:
        return None
    live = live_rows[cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    keep = np.isfinite(live).all(axis=1)
    features = live_rows[[c for c in feature_columns if c in live_rows.columns]]
    common = [] if expected.features is None else [c for c in expected.features.columns if c in features.columns]
    if common:  # a repeated input counts once, as in the per-column checks
        keep &= ~features[common].duplicated().to_numpy()
    reference = np.column_stack([np.asarray(expected.columns[c], dtype=float) for c in cols])
    matched = match_on_inputs(features[keep], expected, reference) if common else None
    if matched is not None and len(matched[0]):
        reference = matched[0]
    else:
        matched, reference = None, reference[np.isfinite(reference).all(axis=1)]
    shift = per_class_prediction_shift(reference, live[keep])
    for row in shift["per_class"]:  # the reference side is the expected one here, not a champion
        row["column"] = cols[row["class"]]
        row["share_expected"], row["share_live"] = row.pop("share_champion"), row.pop("share_canary")
    return {**shift, "worst_column": cols[shift["worst_class"]], "columns": cols,
            "matched_on_inputs": matched is not None, "n_live": int(keep.sum()),
            "n_expected": int(len(reference)), "source": expected.source}


def class_shift_reason(shift: dict[str, Any]) -> str:
    """One sentence naming the class that moved most and its predicted share, expected vs live."""
    worst = shift["per_class"][shift["worst_class"]]
    return (f"class {worst['column']} moved most: KS {worst['ks']:.3f}, PSI {worst['psi']:.3f}, "
            f"predicted for {worst['share_live']:.1%} of live rows vs {worst['share_expected']:.1%} "
            f"expected ({shift['source']})")


__all__ = ["MIN_CLASSES", "class_shift", "class_shift_reason"]
