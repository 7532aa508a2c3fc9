"""Multi-class comparisons: metrics with paired bootstrap intervals, and per-class prediction checks.

Pure numpy functions on class probabilities ``[n, C]`` (rows sum to 1, column ``c`` = class ``c``)
and class-index labels ``0..C-1`` (:func:`class_indices` maps class names to them in the model's
class order, :func:`onnx_class_labels`); used by :func:`model_registry.shadow.evaluate` for
``Task.MULTICLASS`` and by canary analysis (:func:`per_class_prediction_shift`).

Metrics (higher is better unless said):

* ``auc_ovr``: one-vs-rest ROC AUC, the unweighted mean over classes of the binary AUC of
  ``P[:, c]`` against ``y == c`` (Provost & Domingos 2000; ``sklearn.metrics.roc_auc_score(...,
  multi_class="ovr", average="macro")``); classes absent or alone in a resample are left out of
  the mean, NaN when none is left;
* ``log_loss`` (lower is better): ``-mean(log(max(P[i, y_i], 1e-15)))`` (``sklearn.metrics.log_loss``);
* ``accuracy``: share of rows whose arg-max class is the label.

The paired bootstrap is the one of :mod:`drift_checks.shadow_metrics` (Efron & Tibshirani 1993,
ch. 13): both versions scored on the same resampled rows, percentile interval of the
sign-adjusted differences.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ground.exceptions import DataError

#: Metrics of a multi-class classifier and whether higher is better.
MULTICLASS_METRICS: dict[str, bool] = {"auc_ovr": True, "log_loss": False, "accuracy": True}
#: Probability floor of the log-loss (sklearn's historical ``eps``).
LOG_LOSS_EPS = 1e-15


def as_probabilities(values: Any, field: str, *, n_classes: int | None = None) -> np.ndarray:
    """``values`` as a finite ``[n, C]`` float array with ``C >= 2``.

    Raises:
        DataError: Wrong rank, fewer than 2 columns, a column count other than ``n_classes``, or a
            non-finite value (names the field and the first bad row).
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise DataError(f"{field} has shape {arr.shape}; expected (n, C) class probabilities with C >= 2")
    if n_classes is not None and arr.shape[1] != n_classes:
        raise DataError(f"{field} has {arr.shape[1]} classes; expected {n_classes}")
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        raise DataError(f"{field}[{int(np.flatnonzero(bad)[0])}] is not finite (expected probabilities)")
    return arr


def as_class_labels(values: Any, n_classes: int, field: str = "labels") -> np.ndarray:
    """Class-index labels ``0..n_classes-1`` as int64 (NaN not allowed).

    Raises:
        DataError: A label that is not an integer in range (names its position and value).
    """
    y = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(y) & (y == np.round(y)) & (y >= 0) & (y < n_classes)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise DataError(f"{field}[{i}]={float(y[i])!r} is not a class index (expected an integer 0..{n_classes - 1})")
    return y.astype(np.int64)


def _binary_auc(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """Mann-Whitney AUC per row of ``[B, n]`` arrays (ties count one half), NaN where undefined."""
    from scipy.stats import rankdata

    ranks = rankdata(scores, axis=-1)
    n_pos = positive.sum(axis=-1)
    n_neg = positive.shape[-1] - n_pos
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (np.sum(ranks * positive, axis=-1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return np.where((n_pos > 0) & (n_neg > 0), auc, np.nan)


def multiclass_metric(name: str, labels: np.ndarray, proba: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
    """Metric ``name`` on each resample (rows ``idx`` ``[B, n]``; all rows when None), shape ``[B]``."""
    if idx is None:
        idx = np.arange(labels.size)[None, :]
    y = labels[idx]
    if name == "accuracy":
        return np.mean(np.argmax(proba, axis=1)[idx] == y, axis=1)
    if name == "log_loss":
        per_row = -np.log(np.maximum(proba[np.arange(labels.size), labels], LOG_LOSS_EPS))
        return np.mean(per_row[idx], axis=1)
    if name == "auc_ovr":
        per_class = np.stack([_binary_auc(proba[:, c][idx], y == c) for c in range(proba.shape[1])], axis=-1)
        with np.errstate(invalid="ignore"), __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("ignore", RuntimeWarning)
            return np.nanmean(per_class, axis=-1)
    raise DataError(f"metric={name!r} is not a multiclass metric (expected one of {sorted(MULTICLASS_METRICS)})")


def multiclass_metrics(labels: Any, proba: Any) -> dict[str, float]:
    """``auc_ovr``, ``log_loss`` and ``accuracy`` of one version on labelled rows.

    Raises:
        DataError: Bad shapes, probabilities or labels.
    """
    p = as_probabilities(proba, "outputs")
    y = as_class_labels(labels, p.shape[1])
    if y.size != p.shape[0]:
        raise DataError(f"labels have {y.size} rows, outputs {p.shape[0]}; expected equal")
    return {m: float(multiclass_metric(m, y, p)[0]) for m in MULTICLASS_METRICS}


def paired_bootstrap_multiclass(labels: Any, champion: Any, challenger: Any, *, metrics: Sequence[str],
                                n_boot: int, confidence: float, seed: int = 0, block: int = 200) -> dict[str, Any]:
    """Paired percentile bootstrap of the challenger's improvement on each multi-class metric.

    Returns:
        ``{metric: drift_checks.shadow_metrics.MetricComparison}`` (improvement sign-adjusted: positive
        favours the challenger; log-loss improves when it drops).
    """
    from drift_checks.shadow_metrics import bootstrap_comparisons

    a = as_probabilities(champion, "champion outputs")
    b = as_probabilities(challenger, "challenger outputs", n_classes=a.shape[1])
    y = as_class_labels(labels, a.shape[1])
    if not (y.size == a.shape[0] == b.shape[0]):
        raise DataError(f"labels have {y.size} rows, champion {a.shape[0]}, challenger {b.shape[0]}; expected equal")
    return bootstrap_comparisons(
        metrics, MULTICLASS_METRICS, lambda m, idx: (multiclass_metric(m, y, a, idx), multiclass_metric(m, y, b, idx)),
        {m: float(multiclass_metric(m, y, a)[0]) for m in metrics},
        {m: float(multiclass_metric(m, y, b)[0]) for m in metrics},
        n_rows=y.size, n_boot=n_boot, confidence=confidence, seed=seed, block=block)


def per_class_prediction_shift(champion: Any, canary: Any, *, bins: int = 10) -> dict[str, Any]:
    """Per-class shift between champion and canary predictions (for canary prediction checks).

    For each class ``c``: the two-sample KS statistic (``scipy.stats.ks_2samp``) and the PSI
    (:func:`drift_checks.shadow_metrics.psi`, champion as reference) of ``P[:, c]``, and the change of
    the share of rows predicted as ``c`` (arg-max) in percentage points. The rows need not be the
    same (canary traffic is split), so nothing is paired.

    Args:
        champion: Champion probabilities ``[n, C]``.
        canary: Canary probabilities ``[m, C]``.
        bins: PSI quantile bins.

    Returns:
        ``{"per_class": [{"class", "ks", "psi", "share_champion", "share_canary"}...],
        "max_ks", "max_psi", "worst_class"}``; a canary check compares ``max_ks``/``max_psi``
        with its thresholds (the worst class names the culprit).

    Raises:
        DataError: Shapes or class counts differ, or values are not finite.
    """
    from scipy.stats import ks_2samp

    from drift_checks.shadow_metrics import psi

    a = as_probabilities(champion, "champion outputs")
    b = as_probabilities(canary, "canary outputs", n_classes=a.shape[1])
    share_a = np.bincount(np.argmax(a, axis=1), minlength=a.shape[1]) / a.shape[0]
    share_b = np.bincount(np.argmax(b, axis=1), minlength=a.shape[1]) / b.shape[0]
    rows = []
    for c in range(a.shape[1]):
        rows.append({"class": c, "ks": float(ks_2samp(a[:, c], b[:, c]).statistic),
                     "psi": psi(a[:, c], b[:, c], bins=bins),
                     "share_champion": float(share_a[c]), "share_canary": float(share_b[c])})
    worst = max(rows, key=lambda r: (r["ks"], r["psi"]))
    return {"per_class": rows, "max_ks": max(r["ks"] for r in rows), "max_psi": max(r["psi"] for r in rows),
            "worst_class": worst["class"]}


# ----------------------------------------------------------------------------- class order
#: ONNX-ML attributes naming a classifier's classes in the order of its probability columns
#: (``ai.onnx.ml`` LinearClassifier, TreeEnsembleClassifier, SVMClassifier, ZipMap...).
CLASS_LABEL_ATTRIBUTES = ("classlabels_strings", "classlabels_int64s", "classlabels_ints")


def onnx_class_labels(model: Any) -> list[Any] | None:
    """The class labels of an ONNX classifier, in the order of its probability columns.

    skl2onnx and onnxmltools write them on the classifier node (``classlabels_strings`` for
    string classes, ``classlabels_ints``/``classlabels_int64s`` for integer ones); the
    ``probabilities`` output's column ``c`` is class ``labels[c]`` (ONNX-ML operator spec).

    Args:
        model: An ``onnx.ModelProto`` or the path of an ``.onnx`` file.

    Returns:
        The labels (``str`` decoded from UTF-8, or ``int``), or None when no node names classes
        (a regressor, a network without ONNX-ML classifier node) or two nodes disagree.
    """
    import onnx

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    found: list[list[Any]] = []
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.name not in CLASS_LABEL_ATTRIBUTES:
                continue
            labels = ([s.decode("utf-8") for s in attr.strings] if attr.name.endswith("strings")
                      else [int(i) for i in attr.ints])
            if labels and labels not in found:
                found.append(labels)
    return found[0] if len(found) == 1 else None


def _label_key(value: Any) -> str:
    """A label as a lookup key: ``1``, ``1.0``, ``np.int64(1)`` and ``"1"`` are the same class."""
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        f = float(value)
        if f.is_integer():
            return str(int(f))
    return str(value)


def class_indices(values: Any, class_labels: Sequence[Any] | None, field: str = "labels") -> np.ndarray:
    """Labels as class indices (float, NaN where missing) in the model's class order.

    Args:
        values: Labels per row, shape ``(n,)``: class names (strings), class values (numbers) or,
            when ``class_labels`` is None, class indices; None/NaN where no label arrived.
        class_labels: The model's classes in probability-column order
            (:func:`onnx_class_labels`), or None when unknown.
        field: Name used in error messages.

    Returns:
        ``(n,)`` float array: the index of each label in ``class_labels`` (the value itself when
        ``class_labels`` is None), NaN where missing.

    Raises:
        DataError: A label that is not one of ``class_labels`` (names the value and the known
            classes), or a non-numeric label while the class order is unknown.
    """
    import pandas as pd

    series = pd.Series(values, dtype=object) if not isinstance(values, pd.Series) else values.astype(object)
    missing = series.isna().to_numpy()
    out = np.full(len(series), np.nan)
    if class_labels is None:
        numeric = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~missing & np.isnan(numeric)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{field}[{i}]={series.iloc[i]!r} is not a class index and the model's class "
                            "order is unknown (no ONNX classifier node names its classes); expected "
                            "class indices 0..C-1")
        return numeric
    lookup = {_label_key(label): j for j, label in enumerate(class_labels)}
    for i in (int(k) for k in np.flatnonzero(~missing)):
        j = lookup.get(_label_key(series.iloc[i]))
        if j is None:
            raise DataError(f"{field}[{i}]={series.iloc[i]!r} is not a class of the model; known "
                            f"classes, in probability-column order: {list(class_labels)}")
        out[i] = j
    return out
