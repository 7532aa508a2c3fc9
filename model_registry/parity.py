"""The numerical parity gate: source model against the converted model, per output.

Numeric outputs pass when every element satisfies ``|served - source| <= atol + rtol * |source|``
(the ``numpy.isclose`` formula); label outputs (integer, bool or string dtypes) pass when the
fraction of agreeing rows is >= ``min_label_agreement``. Class-probability outputs (``[N, C]``)
also report the largest difference per class and the label flips (rows whose arg-max changes).
The report (rows checked, max abs and rel difference per output, label flips, worst rows) is what
the publish pipeline logs to MLflow as ``parity_report.json``.

The converted model is an ONNX model/session or any ``feeds -> {output: array}`` callable (a
TorchScript runner, :func:`model_registry.validation.make_runner`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ground.exceptions import ParityError
from ground.settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    import onnxruntime

    from model_registry.triton_config import OnnxLike


def _n_rows(feeds: Mapping[str, np.ndarray]) -> int:
    return min(len(np.asarray(v)) for v in feeds.values()) if feeds else 0


@dataclasses.dataclass
class OutputParity:
    """Parity of one output.

    Attributes:
        name: ONNX output name.
        kind: ``"numeric"`` (tolerance) or ``"label"`` (exact agreement).
        max_abs_error: Largest |onnx - source| (0 for labels).
        max_rel_error: Largest |onnx - source| / |source| (|source| floored at 1e-12).
        atol: Absolute tolerance used.
        rtol: Relative tolerance used.
        label_agreement: Fraction of rows whose label agrees (labels only).
        violations: Rows out of tolerance (or disagreeing).
        worst_rows: Up to ``worst_k`` row indices, worst first.
        passed: Whether this output passed.
        per_class_max_abs: For a ``[N, C]`` output with ``C >= 2`` (class probabilities), the
            largest |onnx - source| of each column (class), else None.
        label_flips: Rows whose predicted class changes: the arg-max of a ``[N, C]`` output, or the
            disagreeing rows of a label output; None for other outputs.
    """

    name: str
    kind: str
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    label_agreement: float | None
    violations: int
    worst_rows: list[int]
    passed: bool
    per_class_max_abs: list[float] | None = None
    label_flips: int | None = None


@dataclasses.dataclass
class ParityResult:
    """Outcome of :func:`parity_check`.

    Attributes:
        rows: Rows compared.
        outputs: Per-output results.
    """

    rows: int
    outputs: dict[str, OutputParity]

    @property
    def passed(self) -> bool:
        """True when every output passed."""
        return all(o.passed for o in self.outputs.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for MLflow tags/artifacts)."""
        return {"rows": self.rows, "passed": self.passed,
                "outputs": {k: dataclasses.asdict(v) for k, v in self.outputs.items()}}

    def describe_failures(self, model_name: str = "model") -> str:
        """One sentence per failed output: name, worst rows, max abs and rel errors."""
        parts = []
        for o in self.outputs.values():
            if o.passed:
                continue
            if o.kind == "label":
                parts.append(
                    f"output {o.name!r}: label agreement {o.label_agreement:.4f} below the minimum "
                    f"({o.violations}/{self.rows} rows disagree); worst rows {o.worst_rows}"
                )
            else:
                flips = f", {o.label_flips} label flip(s)" if o.label_flips else ""
                classes = ""
                if o.per_class_max_abs:
                    classes = ", per class max abs " + "/".join(f"{v:.3g}" for v in o.per_class_max_abs)
                parts.append(
                    f"output {o.name!r}: {o.violations}/{self.rows} rows out of tolerance "
                    f"(atol {o.atol:g}, rtol {o.rtol:g}); max abs error {o.max_abs_error:.6g}, "
                    f"max rel error {o.max_rel_error:.6g}{classes}{flips}; worst rows {o.worst_rows}"
                )
        return f"parity gate failed for model {model_name!r}: " + "; ".join(parts)


def _tolerance(value: float | Mapping[str, float] | None, name: str, settings: Settings | None,
               field: str) -> float:
    """``value`` for output ``name``; ``settings.<field>`` when it is None or a mapping without ``name``."""
    if isinstance(value, Mapping):
        if name in value:
            return float(value[name])
    elif value is not None:
        return float(value)
    if settings is None:
        raise ValueError(f"parity_check needs settings for the {field} of output {name!r}: none was given")
    return float(getattr(settings, field))


def _as_outputs(result: Any) -> dict[str, np.ndarray] | np.ndarray:
    import pandas as pd

    if isinstance(result, Mapping):
        return {k: np.asarray(v) for k, v in result.items()}
    if isinstance(result, pd.DataFrame):
        if result.shape[1] == 1:
            return result.iloc[:, 0].to_numpy()
        return {str(c): result[c].to_numpy() for c in result.columns}
    if isinstance(result, pd.Series):
        return result.to_numpy()
    return np.asarray(result)


def parity_check(
    source_predict: Callable[[Any], Any],
    onnx_model: "OnnxLike | onnxruntime.InferenceSession",
    sample: Mapping[str, np.ndarray],
    *,
    source_sample: Any = None,
    atol: float | Mapping[str, float] | None = None,
    rtol: float | Mapping[str, float] | None = None,
    label_outputs: Sequence[str] | None = None,
    min_label_agreement: float | None = None,
    output_map: Mapping[str, str] | None = None,
    worst_k: int = 5,
    raise_on_failure: bool = True,
    model_name: str = "model",
    settings: Settings | None = None,
) -> ParityResult:
    """Blocking numerical parity gate between the source model and the converted ONNX model.

    Numeric outputs pass when every element satisfies ``|onnx - source| <= atol + rtol * |source|``
    (``numpy.isclose``'s formula); label outputs (integer, bool or string dtypes, or named in
    ``label_outputs``) pass when the fraction of agreeing rows is >= ``min_label_agreement``.

    Args:
        source_predict: Callable taking ``source_sample`` (default: the single sample array, or the
            dict of arrays for several inputs) and returning ``{name: array}``, a DataFrame, or
            one array (e.g. an MLflow pyfunc's ``predict``).
        onnx_model: ONNX model, path, bytes or an ONNX Runtime session.
        sample: ONNX feeds ``{input name: array [N, ...]}``.
        source_sample: What to pass to ``source_predict`` when it needs another form (DataFrame).
        atol: Absolute tolerance, one value or ``{output: value}`` (default ``settings.parity_atol``).
        rtol: Relative tolerance, same forms (default ``settings.parity_rtol``).
        label_outputs: Outputs compared as labels (default: by dtype).
        min_label_agreement: Fraction 0-1 (default ``settings.parity_min_label_agreement``).
        output_map: ``{source output key: onnx output name}`` when the names differ.
        worst_k: How many worst rows to report per output.
        raise_on_failure: Raise :class:`ParityError` when any output fails (default True).
        model_name: Used in messages.
        settings: Where ``atol``, ``rtol`` and ``min_label_agreement`` come from when they are
            None (or an output is missing from a mapping); may be None when all are given.

    Returns:
        ParityResult with per-output max abs/rel error and worst rows.

    Raises:
        ValueError: A tolerance is needed from ``settings`` and none were given.
        ParityError: An output is out of tolerance (names the output, the worst rows, the max
            absolute and relative errors), or source and ONNX outputs cannot be matched.
    """
    from model_registry.validation import make_runner

    onnx_out = make_runner(onnx_model, model_name)(dict(sample))
    if source_sample is None:
        source_sample = next(iter(sample.values())) if len(sample) == 1 else dict(sample)
    src = _as_outputs(source_predict(source_sample))
    pairs = _match_outputs(src, onnx_out, output_map, model_name)
    min_agree = _tolerance(min_label_agreement, "(label outputs)", settings, "parity_min_label_agreement")
    labels = set(label_outputs or ())
    rows = _n_rows(sample)
    results: dict[str, OutputParity] = {}
    for name, (want, got) in pairs.items():
        want = np.asarray(want)
        got = np.asarray(got)
        n = want.shape[0] if want.ndim else 1
        if got.size != want.size or (got.ndim and got.shape[0] != n):
            raise ParityError(
                f"parity gate failed for model {model_name!r}: output {name!r} has shape "
                f"{list(got.shape)} but the source gives {list(want.shape)}"
            )
        w = want.reshape(n, -1)
        g = got.reshape(n, -1)
        is_label = name in labels or want.dtype.kind in "iubOSU" or got.dtype.kind in "iubOSU"
        if is_label:
            if w.dtype.kind in "OSU" or g.dtype.kind in "OSU":
                agree_rows = np.all(w.astype(str) == g.astype(str), axis=1)
            else:
                agree_rows = np.all(w == g, axis=1)
            agreement = float(agree_rows.mean()) if n else 1.0
            bad = np.nonzero(~agree_rows)[0]
            results[name] = OutputParity(name, "label", 0.0, 0.0, 0.0, 0.0, agreement,
                                         int(bad.size), bad[:worst_k].tolist(), agreement >= min_agree,
                                         label_flips=int(bad.size))
            continue
        a = _tolerance(atol, name, settings, "parity_atol")
        r = _tolerance(rtol, name, settings, "parity_rtol")
        w = w.astype(np.float64)
        g = g.astype(np.float64)
        diff = np.abs(g - w)
        diff = np.where(np.isnan(diff) & ~(np.isnan(g) & np.isnan(w)), np.inf, np.nan_to_num(diff, nan=0.0))
        rel = diff / np.maximum(np.abs(w), 1e-12)
        ok = diff <= a + r * np.abs(w)
        row_bad = ~np.all(ok, axis=1)
        row_err = diff.max(axis=1) if diff.size else np.zeros(n)
        order = np.argsort(-row_err, kind="stable")
        worst = [int(i) for i in order[:worst_k] if row_bad[i]] or [int(i) for i in order[:worst_k]]
        per_class = flips = None
        if want.ndim == 2 and want.shape[1] >= 2 and n:
            per_class = [float(v) for v in diff.max(axis=0)]
            flips = int(np.sum(np.argmax(w, axis=1) != np.argmax(g, axis=1)))
        results[name] = OutputParity(
            name, "numeric", float(diff.max()) if diff.size else 0.0,
            float(rel.max()) if rel.size else 0.0, a, r, None, int(row_bad.sum()),
            worst, not row_bad.any(), per_class, flips,
        )
    result = ParityResult(rows, results)
    if raise_on_failure and not result.passed:
        raise ParityError(result.describe_failures(model_name))
    return result


def _match_outputs(
    src: dict[str, np.ndarray] | np.ndarray,
    onnx_out: dict[str, np.ndarray],
    output_map: Mapping[str, str] | None,
    model_name: str,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    if isinstance(src, dict):
        pairs = {}
        for key, value in src.items():
            target = (output_map or {}).get(key, key)
            if target not in onnx_out:
                raise ParityError(
                    f"parity gate failed for model {model_name!r}: source output {key!r} has no "
                    f"ONNX output {target!r} (ONNX outputs: {sorted(onnx_out)}); pass output_map"
                )
            pairs[target] = (value, onnx_out[target])
        return pairs
    if output_map:
        target = next(iter(output_map.values()))
        return {target: (src, onnx_out[target])}
    if len(onnx_out) == 1:
        name = next(iter(onnx_out))
        return {name: (src, onnx_out[name])}
    same = [k for k, v in onnx_out.items() if np.asarray(v).size == src.size]
    kind = [k for k in same if (np.asarray(onnx_out[k]).dtype.kind in "iub") == (src.dtype.kind in "iubOSU")]
    pick = kind or same
    if len(pick) != 1:
        raise ParityError(
            f"parity gate failed for model {model_name!r}: cannot tell which ONNX output "
            f"({sorted(onnx_out)}) the source's single output matches; pass output_map"
        )
    return {pick[0]: (src, onnx_out[pick[0]])}
