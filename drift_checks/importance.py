"""Each input's importance for one model version, for the importance-weighted dataset verdict.

Computed at publish time on the drift reference (the validation sample) and stored with it
(:func:`drift_checks.reference.save_reference`). Method: scikit-learn's
``sklearn.inspection.permutation_importance`` with the model's OWN outputs as the target, so no
label is needed: the importance of input ``j`` is the mean absolute change of the model's outputs
when column ``j`` is randomly permuted (``n_repeats`` permutations, seeded), i.e. "model reliance"
(Fisher, Rudin & Dominici, JMLR 20(177), 2019; Breiman 2001 for permutation importance). The
importances are clipped at 0 and normalised to sum to 1.

A feature the model does not use gets 0: its drift does not move the predictions, so it does not
count towards the dataset verdict (a strong shift of it still raises an alert, see
:mod:`drift_checks.policy`). Importance is measured on the reference's spread; an input that is
almost constant there gets a low weight even if later windows vary widely, which is one reason
the strong-effect path of the alert policy ignores weights.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ground.exceptions import DataError

#: Rows of the reference used (seeded sample when larger).
DEFAULT_MAX_ROWS = 2000
#: Permutations per feature.
DEFAULT_N_REPEATS = 5
#: How the importances were computed (stored beside them).
METHOD = ("sklearn.inspection.permutation_importance on the reference, target = the model's own "
          "outputs, score = -mean |output change|; normalised to sum 1")


class _Outputs:
    """The estimator protocol sklearn needs around a prediction function."""

    def __init__(self, predict: Callable[[Any], Any]):
        self._predict = predict

    def fit(self, *_args, **_kwargs):  # pragma: no cover - sklearn never fits it here
        return self

    def predict(self, frame):
        out = self._predict(frame)
        if isinstance(out, dict):
            out = np.column_stack([np.asarray(v, dtype="float64").reshape(len(frame), -1)
                                   for _, v in sorted(out.items())])
        return np.asarray(out, dtype="float64").reshape(len(frame), -1)


def _score(estimator: _Outputs, frame, target) -> float:
    return -float(np.mean(np.abs(estimator.predict(frame) - target)))


def permutation_importances(predict: Callable[[Any], Any], frame, *, n_repeats: int = DEFAULT_N_REPEATS,
                            seed: int = 0, max_rows: int = DEFAULT_MAX_ROWS) -> dict[str, float]:
    """Importance of every column of ``frame`` for the model behind ``predict``.

    Args:
        predict: ``predict(frame) -> outputs`` (array ``[n]`` or ``[n, k]``, or a dict of arrays:
            e.g. a classifier's probabilities).
        frame: The reference (pandas DataFrame of the model's input columns).
        n_repeats: Permutations per column.
        seed: Seed of the row sample and of the permutations (a rerun gives the same values).
        max_rows: Rows used at most (seeded uniform sample).

    Returns:
        ``{column: importance}``, non-negative, summing to 1 (all 0 when no column changes the
        outputs).

    Raises:
        DataError: ``frame`` is empty or the model's outputs are not finite numbers.
    """
    from sklearn.inspection import permutation_importance

    if len(frame) == 0 or frame.shape[1] == 0:
        raise DataError("permutation importance needs a non-empty reference with feature columns")
    data = frame.sample(n=max_rows, random_state=seed) if len(frame) > max_rows else frame
    data = data.reset_index(drop=True)
    est = _Outputs(predict)
    target = est.predict(data)
    if not np.isfinite(target).all():
        raise DataError("the model's outputs on the reference are not all finite; expected numbers")
    res = permutation_importance(est, data, target, scoring=_score, n_repeats=n_repeats,
                                 random_state=seed)
    raw = np.clip(np.asarray(res.importances_mean, dtype="float64"), 0.0, None)
    total = float(raw.sum())
    values = raw / total if total > 0 else raw
    return {str(c): round(float(v), 6) for c, v in zip(data.columns, values, strict=True)}
