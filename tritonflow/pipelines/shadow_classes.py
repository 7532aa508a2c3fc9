"""Multi-class shadow evaluation: per-class probabilities, the models' class order, label mapping.

A classifier whose score output is ``[N, C]`` with ``C > 2`` (e.g. skl2onnx's ``probabilities``)
is compared per class. :func:`tritonflow.pipelines.shadow_replay.replay` and the live mode store
both versions' probabilities as :data:`CHAMPION_PROBA` / :data:`CHALLENGER_PROBA` ``<c>`` columns
of the predictions file (:func:`predictions_frame`; ``champion_score``/``challenger_score`` hold
the arg-max class index) and the challenger's as ``expected.<column>`` per class in its expected
predictions, named after the output columns the inference log holds (:func:`class_columns`), so
the canary compares each logged probability column with its expected one.
:func:`tritonflow.pipelines.shadow_compare.compare` then decides with the ``multiclass`` task
(one-vs-rest AUC, log-loss, accuracy; :mod:`drift_checks.multiclass`).

The class order is read from the ONNX model file each version serves from the Triton repository
(:func:`class_labels_of`, the classifier node's ``classlabels_*``): labels logged as class names
(``"setosa"``) or class values are mapped to probability-column indices with it
(:func:`drift_checks.multiclass.class_indices`), and a challenger whose columns are in another
order than the champion's is re-ordered to the champion's.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ground.exceptions import DataError
from ground.settings import Settings

#: Column prefixes of the per-class probabilities in the predictions file.
CHAMPION_PROBA = "champion_proba_"
CHALLENGER_PROBA = "challenger_proba_"
#: Prefix of the expected per-column outputs in the expected-predictions file (read by the canary).
EXPECTED_PREFIX = "expected."


def is_multiclass(scores: np.ndarray | None) -> bool:
    """True for ``[n, C]`` class probabilities with ``C > 2``."""
    return scores is not None and np.ndim(scores) == 2 and np.shape(scores)[1] > 2


def class_labels_of(settings: Settings, info: Mapping[str, Any]) -> list[Any] | None:
    """The class order of one version: its ONNX file in the Triton repository.

    Args:
        settings: Settings (repository URI and S3 endpoint).
        info: Version info (``triton_model_name``, ``triton_model_version``).

    Returns:
        The class labels in probability-column order
        (:func:`drift_checks.multiclass.onnx_class_labels`), or None when the version has no
        ONNX file or its graph names no classes (e.g. TorchScript).
    """
    from drift_checks.multiclass import onnx_class_labels
    from repository_sync.layout import plan_version
    from repository_sync.storage.open import open_repository

    storage = open_repository(settings.resolved_repository_uri, endpoint_url=settings.s3_endpoint_url or None)
    layout = plan_version(info["triton_model_name"], int(info["triton_model_version"]))
    with storage.local_version(layout) as folder:
        files = sorted(folder.glob("*.onnx"))
        return onnx_class_labels(files[0]) if files else None


def align(champion_labels: Sequence[Any] | None, challenger_labels: Sequence[Any] | None,
          challenger: np.ndarray, where: str) -> np.ndarray:
    """The challenger's probabilities with columns in the champion's class order.

    Raises:
        DataError: The two versions know different classes (names both lists).
    """
    if champion_labels is None or challenger_labels is None or list(champion_labels) == list(challenger_labels):
        return challenger
    if sorted(map(str, champion_labels)) != sorted(map(str, challenger_labels)):
        raise DataError(f"{where}: the challenger's classes {list(challenger_labels)} differ from the "
                        f"champion's {list(champion_labels)}; expected the same classes to compare")
    order = [list(map(str, challenger_labels)).index(str(label)) for label in champion_labels]
    return challenger[:, order]


def class_columns(logged: Sequence[str], n_classes: int, output: str) -> list[str]:
    """Names of the per-class output columns: the log's own, else ``<output>_<c>``.

    Args:
        logged: The output columns the inference log holds, in order (names starting with
            ``prediction``/``probabilit``/``score``).
        n_classes: ``C``.
        output: The Triton output scored (e.g. ``probabilities``), named ``<output>_<c>`` as
            the mirror recorder flattens it when the log has no ``C`` output columns.
    """
    logged = list(logged)
    return logged if len(logged) == n_classes else [f"{output}_{c}" for c in range(n_classes)]


def predictions_frame(rows: Any, champion: np.ndarray, challenger: np.ndarray | None):
    """The predictions file's frame: keys, scores and, for ``[n, C]`` outputs, per-class columns.

    ``champion_score``/``challenger_score`` are the scores of a binary model or the arg-max class
    index of a multi-class one (NaN without a challenger).
    """
    import pandas as pd

    def score(values: np.ndarray) -> np.ndarray:
        return np.argmax(values, axis=1).astype(np.float64) if is_multiclass(values) else values

    n = len(rows)
    frame = pd.DataFrame({
        "request_id": rows["request_id"].astype(str).to_numpy(),
        "timestamp": pd.to_datetime(rows["timestamp"], utc=True).to_numpy(),
        "model_version": rows["model_version"].to_numpy() if "model_version" in rows else -1,
        "champion_score": score(champion),
        "challenger_score": score(challenger) if challenger is not None else np.full(n, np.nan),
    })
    if is_multiclass(champion):
        for c in range(champion.shape[1]):
            frame[f"{CHAMPION_PROBA}{c}"] = champion[:, c]
            frame[f"{CHALLENGER_PROBA}{c}"] = challenger[:, c] if challenger is not None else np.nan
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    return frame


def probabilities(frame: Any, prefix: str) -> np.ndarray | None:
    """The ``[n, C]`` probabilities stored under ``prefix<c>`` columns, or None when absent."""
    cols = sorted((c for c in frame.columns if str(c).startswith(prefix)), key=lambda c: int(c[len(prefix):]))
    return frame[cols].to_numpy(np.float64) if cols else None


def check_pair(champion: np.ndarray, challenger: np.ndarray | None, where: str) -> None:
    """Both versions answer the same kind of output (scores, or ``C`` class probabilities).

    Raises:
        DataError: One version is multi-class and the other is not, or the class counts differ.
    """
    if challenger is None or champion.shape[1:] == challenger.shape[1:]:
        return
    raise DataError(f"{where}: champion outputs have shape {champion.shape}, challenger outputs "
                    f"{challenger.shape}; expected the same classes to compare")


__all__ = [
    "CHALLENGER_PROBA", "CHAMPION_PROBA", "EXPECTED_PREFIX", "align", "check_pair", "class_columns",
    "class_labels_of", "is_multiclass", "predictions_frame", "probabilities",
]
