"""Probe rows next to the split thresholds of tree ensembles, where float32 changes the branch.

ONNX tree ensembles (``ai.onnx.ml`` ``TreeEnsembleClassifier``/``TreeEnsembleRegressor``) hold
their thresholds as float32 and compare float32 inputs, even when the graph input is double. A
source model that compares in double (LightGBM; scikit-learn trees behind a float64 transform)
sends an input that sits between two float32 values next to a threshold to the other branch:
scores change silently, and only for those inputs, which a random validation sample rarely holds.

:func:`threshold_probes` builds rows that do hold them. For each split of a tree ensemble fed
straight from the model input (through ``Cast``/``Identity``/``Reshape``/``Flatten`` only), on
feature ``j`` with float32 threshold ``f``:

* the feature's **resolution** ``r_j`` is the finest decimal step its real values use
  (:func:`decimal_resolution`: ``10**-d`` for the smallest ``d`` in 0..6 such that every value of
  the dataset or input example is a multiple, else ``1e-6``);
* a threshold is probed when the float32 spacing there is at least that resolution
  (``numpy.spacing(float32(f)) >= r_j``: two distinct real inputs can round to the same float32),
  so ``|f| >= 2**23`` for integers, ``>= 2**20`` for one decimal, ``>= 16`` for six;
* the probe values are the grid values ``floor(f / r_j) * r_j + k * r_j`` around ``f`` covering
  one float32 spacing on each side (at most 4 per side), set into a copy of a base row (the first
  row of the sample, missing values replaced by the column median).

The largest-magnitude thresholds are probed first, at most ``max_thresholds`` of them. The parity
gate runs the source and the converted model on these rows with its usual tolerances and refuses
the model when they differ; the report lists the rows (column, threshold, value), the max absolute
difference and the label flips. XGBoost rounds its inputs and thresholds to float32 as ONNX does,
so its probes agree.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import onnx
    import pandas as pd

    from model_registry.conversion.common import TensorSchema

#: ONNX operators whose thresholds are float32 splits.
TREE_OPS = ("TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble")
#: Operators a tree's input may pass through and still be the model input, feature for feature.
_PASS_THROUGH = ("Cast", "Identity", "Reshape", "Flatten")
#: Finest decimal resolution considered (values with more decimals count as continuous).
MAX_DECIMALS = 6
#: Default cap on thresholds probed (rows: up to 8 per threshold).
DEFAULT_MAX_THRESHOLDS = 128


@dataclasses.dataclass(frozen=True)
class Split:
    """One split threshold of a tree ensemble.

    Attributes:
        feature: Column index in the model input.
        threshold: The float32 threshold stored in the graph.
    """

    feature: int
    threshold: float


@dataclasses.dataclass
class ProbeSet:
    """Rows next to float32 split thresholds (:func:`threshold_probes`).

    Attributes:
        frame: The probe rows with the source columns (float64/int64 values as the source sees
            them), empty when nothing needs probing.
        rows: Per probe row: ``{"column", "threshold", "value"}``.
        thresholds_probed: Distinct (feature, threshold) pairs probed.
        splits: Split thresholds found in the graph.
        note: Why nothing was probed, when nothing was.
        resolution: Resolution used per column.
    """

    frame: "pd.DataFrame"
    rows: list[dict[str, Any]]
    thresholds_probed: int
    splits: int
    note: str
    resolution: dict[str, float]


def _attr(node: Any, name: str) -> Any:
    from onnx import helper, numpy_helper

    for a in node.attribute:
        if a.name == name:
            if a.type == a.TENSOR:
                return numpy_helper.to_array(a.t).tolist()
            return helper.get_attribute_value(a)
    return None


def tree_splits(model: "onnx.ModelProto") -> tuple[list[Split], str | None]:
    """Split thresholds of the model's tree ensembles and the graph input feeding them.

    Returns:
        ``(splits, input_name)``; ``input_name`` is None when a tree's input is computed (e.g. a
        scaler before the trees), in which case the splits cannot be mapped to input columns.
    """
    g = model.graph
    producers = {o: n for n in g.node for o in n.output}
    graph_inputs = {v.name for v in g.input}
    splits: list[Split] = []
    fed_by: set[str | None] = set()
    for node in g.node:
        if node.op_type not in TREE_OPS:
            continue
        source = node.input[0]
        while source not in graph_inputs and source in producers and producers[source].op_type in _PASS_THROUGH:
            source = producers[source].input[0]
        fed_by.add(source if source in graph_inputs else None)
        modes = _attr(node, "nodes_modes") or []
        feats = _attr(node, "nodes_featureids") or []
        values = _attr(node, "nodes_values") or _attr(node, "nodes_values_as_tensor") or []
        # strict=False: an attribute the node lacks reads as [] and leaves nothing to probe
        for mode, feat, value in zip(modes, feats, values, strict=False):
            mode = mode.decode() if isinstance(mode, bytes) else str(mode)
            if mode != "LEAF" and math.isfinite(float(value)):
                splits.append(Split(int(feat), float(np.float32(value))))
    name = next(iter(fed_by)) if len(fed_by) == 1 else None
    return sorted(set(splits), key=lambda s: (-abs(s.threshold), s.feature, s.threshold)), name


def decimal_resolution(values: Any) -> float:
    """Finest decimal step of ``values`` (1.0 for no values).

    ``10**-d`` for the smallest ``d`` in 0..6 such that every finite value is a multiple of it (to
    1e-9 relative), else ``10**-6``.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 1.0
    for d in range(MAX_DECIMALS + 1):
        scaled = v * 10.0 ** d
        if np.all(np.abs(scaled - np.round(scaled)) <= 1e-9 * np.maximum(1.0, np.abs(scaled))):
            return 10.0 ** -d
    return 10.0 ** -MAX_DECIMALS


def threshold_probes(
    model: "onnx.ModelProto",
    inputs: Sequence["TensorSchema"],
    data: "pd.DataFrame",
    *,
    max_thresholds: int = DEFAULT_MAX_THRESHOLDS,
) -> ProbeSet:
    """Probe rows for the model's float32 split thresholds (see the module docstring).

    Args:
        model: Converted ONNX model.
        inputs: Its input schema; probing needs ONE tensor whose ``columns`` name the features.
        data: Real rows with those columns (the dataset, else the logged input example), used for
            the resolutions and the base row.
        max_thresholds: Most thresholds probed, largest magnitude first.

    Returns:
        A :class:`ProbeSet` (empty ``frame`` with a ``note`` when there is nothing to probe).
    """
    import pandas as pd

    splits, fed = tree_splits(model)
    empty = pd.DataFrame()
    if not splits:
        return ProbeSet(empty, [], 0, 0, "no tree ensemble", {})
    if fed is None or len(inputs) != 1 or inputs[0].name != fed or not inputs[0].columns:
        return ProbeSet(empty, [], 0, len(splits), "the trees read computed features (not the model input "
                        "column by column); covered by the validation sample only", {})
    columns = list(inputs[0].columns)
    missing = [c for c in columns if c not in data.columns]
    if missing or data.empty:
        return ProbeSet(empty, [], 0, len(splits), f"no real rows with columns {missing or columns}", {})
    frame = data[columns]
    numeric = frame.apply(pd.to_numeric, errors="coerce")
    resolution = {c: decimal_resolution(numeric[c]) for c in columns}
    base = numeric.iloc[0].copy()
    base = base.fillna(numeric.median()).fillna(0.0)
    rows, values = [], []
    probed: set[tuple[int, float]] = set()
    for split in splits:
        if split.feature >= len(columns):
            continue
        col = columns[split.feature]
        r = resolution[col]
        f = split.threshold
        ulp = float(np.spacing(np.float32(abs(f))))
        if ulp < r or (split.feature, f) in probed:
            continue
        if len(probed) >= max_thresholds:
            break
        probed.add((split.feature, f))
        k = min(4, int(math.ceil(ulp / (2 * r))) + 1)
        g0 = math.floor(f / r) * r
        for step in range(-k + 1, k + 1):
            row = base.copy()
            value = round(g0 + step * r, MAX_DECIMALS) if r < 1 else g0 + step * r
            row[col] = value
            values.append(row)
            rows.append({"column": col, "threshold": f, "value": float(value)})
    if not values:
        return ProbeSet(empty, [], 0, len(splits), "no threshold where float32 is coarser than the "
                        "features' resolution", resolution)
    out = pd.DataFrame(values).reset_index(drop=True)
    for c in columns:  # keep the source's column dtypes (integers stay integers)
        if pd.api.types.is_integer_dtype(frame[c].dtype):
            out[c] = np.round(out[c]).astype(frame[c].dtype)
    return ProbeSet(out, rows, len(probed), len(splits), "", resolution)
