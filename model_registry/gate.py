"""The conversion gate: convert an MLflow model, check it, build its config, run the parity gate.

One function, :func:`validate_model`, used by the publish pipeline's ``convert_and_validate``
stage and by ``tritonflow validate`` (which publishes nothing). Steps:

1. convert with the flavour's registered converter (:mod:`model_registry.conversion`), to ONNX or,
   for PyTorch, TorchScript;
2. ONNX: bring IR/opset within the target release or refuse naming the image and the limit
   (:func:`model_registry.validation.make_compatible`);
3. the validation sample: the dataset's rows, else the input example plus seeded perturbations;
4. ``config.pbtxt`` with protobuf (``platform: "pytorch_libtorch"`` for TorchScript);
5. pre-push checks (:func:`~model_registry.validation.validate_for_push` or
   :func:`~model_registry.pytorch_conversion.validate_torchscript_for_push`);
6. the parity gate against the MLflow model as it predicts (pyfunc; ``predict_proba`` of
   classifiers), per output and per class, with label flips;
7. for tree ensembles, the float32 split-threshold probes (:mod:`model_registry.probing`);
8. the provenance record (:mod:`model_registry.provenance`).

A failed parity gate or probe does not raise here: :attr:`GateResult.passed` is False and
:attr:`GateResult.failure` says why, so the caller can write the report first. Conversion and
pre-push check failures raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Mapping, Sequence

import numpy as np

from ground.settings import Settings

log = logging.getLogger(__name__)

#: File names of the served model in a version folder, per format.
MODEL_FILENAMES = {"onnx": "model.onnx", "torchscript": "model.pt"}
#: Flavours whose raw model gives class probabilities through ``predict_proba``.
_PROBA_FLAVORS = ("sklearn", "xgboost", "lightgbm")
#: Signature dtypes of string/binary columns (never cast).
_TEXT_DTYPES = ("object", "str", "bytes")


# ---------------------------------------------------------------------------- sample helpers
def feature_columns(inputs: Sequence[Any], sample: Mapping[str, Any]) -> list[tuple[str, str, int | None]]:
    """``(column, input tensor, position or None)`` for every source column, in signature order."""
    out: list[tuple[str, str, int | None]] = []
    for spec in inputs:
        if spec.columns:
            out += [(c, spec.name, i) for i, c in enumerate(spec.columns)]
        else:
            arr = sample[spec.name]
            if arr.ndim == 2 and arr.shape[1] > 1:
                out += [(f"{spec.name}_{i}", spec.name, i) for i in range(arr.shape[1])]
            else:
                out.append((spec.name, spec.name, None))
    return out


def sample_frame(inputs: Sequence[Any], model_io: Any, sample: Mapping[str, Any]):
    """The validation sample as a DataFrame with the signature's column names and dtypes.

    String columns get their missing values back (``"nan"`` -> ``NaN``), as the source model saw
    them.
    """
    import pandas as pd

    from model_registry.conversion import MISSING_STRING

    dtypes = {t.name: t.dtype for t in getattr(model_io, "inputs", ()) if t.name}
    data = {}
    for col, tensor, pos in feature_columns(inputs, sample):
        arr = np.asarray(sample[tensor])
        values = arr[:, pos] if pos is not None else arr.reshape(len(arr), -1)[:, 0]
        dtype = dtypes.get(col)
        if values.dtype == object or values.dtype.kind == "U":
            values = np.array([np.nan if v == MISSING_STRING else str(v) for v in values], dtype=object)
        data[col] = values.astype(dtype) if dtype and dtype not in _TEXT_DTYPES else values
    return pd.DataFrame(data)


def round_integer_columns(sample: dict[str, Any], inputs: Sequence[Any], model_io: Any) -> None:
    """Round perturbed values of integer signature columns folded into a float tensor (in place).

    Tabular signatures fold int and float columns into one float tensor, and the perturbation adds
    noise to all of it; the source model receives those columns as integers, so the converted
    model must see the same integral values.
    """
    dtypes = {t.name: t.dtype for t in getattr(model_io, "inputs", ()) if t.name}
    for spec in inputs:
        arr = sample.get(spec.name)
        if arr is None or arr.dtype.kind != "f" or arr.ndim != 2:
            continue
        for i, col in enumerate(spec.columns):
            if np.dtype(dtypes.get(col, "float64")).kind in "iu":
                arr[:, i] = np.round(arr[:, i])


def source_input(model_io: Any, inputs: Sequence[Any], sample: Mapping[str, Any], dataset: Any, rows: int):
    """What the MLflow pyfunc receives: original dataset rows, else the sample in signature form."""
    tensors = next(iter(sample.values())) if len(sample) == 1 else dict(sample)
    if model_io.input_kind == "tensors":
        return tensors
    has_columns = any(s.columns for s in inputs)
    if dataset is not None and has_columns:
        return signature_frame(dataset.iloc[:rows], model_io, [c for c, _, _ in feature_columns(inputs, sample)])
    if has_columns or model_io.input_kind == "columns":
        return sample_frame(inputs, model_io, sample)
    return tensors


def signature_frame(data: Any, model_io: Any, columns: Sequence[str]):
    """Select the signature's columns, cast to its dtypes where they cast.

    ``data[columns]`` with the signature's dtypes where they cast (MLflow's schema enforcement
    refuses e.g. float values in a "long" column).
    """
    frame = data[list(columns)].reset_index(drop=True)
    dtypes = {t.name: t.dtype for t in model_io.inputs if t.name}
    for c in columns:
        if dtypes.get(c) and dtypes[c] not in _TEXT_DTYPES and frame[c].dtype != dtypes[c]:
            with contextlib.suppress(TypeError, ValueError):
                frame[c] = frame[c].astype(dtypes[c])
    return frame


class SourceModel:
    """The MLflow model as it predicts: the pyfunc, plus ``predict_proba`` of classifiers.

    scikit-learn, XGBoost and LightGBM classifiers give ``label`` (the pyfunc's prediction) and
    ``probabilities`` (the raw model's ``predict_proba``); their regressors ``variable`` as
    ``[N, 1]`` (the converters' output name). Other flavours give the pyfunc's output as is.
    """

    def __init__(self, model_uri: str, flavor: str) -> None:
        import mlflow.pyfunc

        self.flavor = flavor
        self.pyfunc = mlflow.pyfunc.load_model(model_uri)
        self.raw = None
        if flavor in _PROBA_FLAVORS:
            try:
                self.raw = self.pyfunc.get_raw_model()
            except (NotImplementedError, AttributeError):
                from model_registry.flavors import CONVERTERS

                self.raw = CONVERTERS[flavor].load(model_uri)

    def predict(self, data: Any) -> Any:
        """Outputs on ``data`` keyed like the converted model's outputs (see the class docstring)."""
        # a copy: the pyfunc's schema enforcement rewrites missing strings of a DataFrame in place
        predicted = self.pyfunc.predict(data.copy() if hasattr(data, "copy") else data)
        if self.raw is None:
            return predicted
        n = len(data)
        if hasattr(self.raw, "predict_proba") and hasattr(self.raw, "classes_"):
            return {"label": np.asarray(predicted).reshape(n),
                    "probabilities": np.asarray(self.raw.predict_proba(data))}
        return {"variable": np.asarray(predicted).reshape(n, -1)}


# ---------------------------------------------------------------------------- the gate
@dataclasses.dataclass
class GateResult:
    """Everything :func:`validate_model` produced.

    Attributes:
        model_name: Triton model name used in messages and the config.
        converted: The :class:`~model_registry.conversion.ConvertedModel`.
        model_bytes: The served model file's bytes.
        model_filename: ``model.onnx`` or ``model.pt``.
        config: The ``ModelConfig``.
        sample: Validation feeds ``{input: array}``.
        expected: Source outputs per served output on the sample (for the smoke test).
        parity: :class:`~model_registry.parity.ParityResult` on the sample.
        probes: Threshold-probe summary (``{"probed": False, "note"}`` when none ran).
        report: :class:`~model_registry.validation.ValidationReport` of the pre-push checks.
        provenance: :func:`~model_registry.provenance.provenance` record.
        notes: What changed on the way (re-exports, renames).
        compat_problems_before: IR/opset problems found before a re-export.
        plan: The instance plan (:func:`model_registry.hardware.plan_instances`).
        hardware: The hardware inventory used.
        failure: Why the gate failed ("" when it passed).
    """

    model_name: str
    converted: Any
    model_bytes: bytes
    model_filename: str
    config: Any
    sample: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    parity: Any
    probes: dict[str, Any]
    report: Any
    provenance: dict[str, Any]
    notes: list[str]
    compat_problems_before: list[str]
    plan: Any
    hardware: Any
    failure: str = ""

    @property
    def passed(self) -> bool:
        """True when parity and the threshold probes passed."""
        return not self.failure

    def parity_doc(self, model_uri: str, atol: float, rtol: float, min_label_agreement: float) -> dict[str, Any]:
        """Build the parity report (``parity_report.json``).

        The parity report (``parity_report.json``): rows checked, per output max abs/rel
        difference, per class differences, label flips, worst rows, and the threshold probes.
        """
        return {"model_uri": model_uri, "source": "mlflow.pyfunc", "atol": atol, "rtol": rtol,
                "min_label_agreement": min_label_agreement, **self.parity.to_dict(),
                "passed": self.passed, "failure": self.failure, "threshold_probes": self.probes,
                "provenance": self.provenance}

    def validation_doc(self, target_release: str) -> dict[str, Any]:
        """The validation report (``validation_report.json``), provenance included."""
        return {**dataclasses.asdict(self.report), "notes": self.notes,
                "compat_problems_before": self.compat_problems_before,
                "instance_plan": dataclasses.asdict(self.plan), "hardware_has_gpu": self.hardware.has_gpu,
                "hardware_reason": self.hardware.reason, "name_mapping": self.converted.name_mapping,
                "validation_rows": len(next(iter(self.sample.values()))), "target_release": target_release,
                "export_format": self.converted.format, "source_flavor": self.converted.source_flavor,
                "provenance": self.provenance}


def _onnx_of(converted: Any, model_name: str) -> Any:
    """The converted ONNX model (an ONNX conversion always has one).

    Raises:
        ToolingError: The conversion produced no ONNX model (our tool's fault, not the model's).
    """
    if converted.onnx_model is None:
        from ground.exceptions import ToolingError

        raise ToolingError(f"model {model_name!r}: the {converted.format} conversion produced no ONNX model")
    return converted.onnx_model


def validate_model(
    model_uri: str,
    model_io: Any,
    *,
    model_name: str,
    dataset: Any = None,
    dataset_rows: int = 1000,
    atol: float | None = None,
    rtol: float | None = None,
    max_batch_size: int = 32,
    export_format: str = "onnx",
    schema: Any = None,
    settings: Settings,
) -> GateResult:
    """Convert, check, build the config and run the parity gate (see the module docstring).

    Args:
        model_uri: MLflow model URI (``models:/name/3``, ``runs:/...``, a local MLflow model folder).
        model_io: :class:`model_registry.registry.ModelIO` of the model (signature, input example).
        model_name: Triton model name.
        dataset: Validation rows (``pandas.DataFrame``), else the input example is perturbed.
        dataset_rows: Rows of the dataset used (the first ones).
        atol: Absolute tolerance (default ``settings.parity_atol``).
        rtol: Relative tolerance (default ``settings.parity_rtol``).
        max_batch_size: 0 disables batching (a fixed batch axis falls back to 0).
        export_format: ``onnx`` or ``torchscript`` (PyTorch only).
        schema: Explicit input schema for a model without signature.
        settings: Settings the defaults come from.

    Raises:
        ModelConversionError, ModelValidationError, ModelConfigError: Conversion or a pre-push
            check failed (nothing to publish).
    """
    from model_registry.analyzer_config import parse_int_list
    from model_registry.flavors import convert_mlflow_model, converter_for
    from model_registry.hardware import inventory, plan_instances
    from model_registry.parity import parity_check
    from model_registry.provenance import provenance
    from model_registry.pytorch_conversion import torchscript_runner, validate_torchscript_for_push
    from model_registry.triton_config import DynamicBatchingSpec, build_config, declared_io
    from model_registry.validation import (
        check_onnx_compat,
        make_compatible,
        validate_for_push,
        validation_sample,
    )

    s = settings
    a = s.parity_atol if atol is None else float(atol)
    r = s.parity_rtol if rtol is None else float(rtol)
    converted = convert_mlflow_model(model_uri, schema=schema, model_name=model_name, settings=s,
                                     export_format=export_format)
    notes = list(converted.notes)
    compat_before: list[str] = []
    torchscript = converted.format == "torchscript"
    if not torchscript:
        compat = check_onnx_compat(_onnx_of(converted, model_name), s, model_name=model_name)
        compat_before = compat.problems
        if not compat.ok:
            converted.onnx_model, changed = make_compatible(_onnx_of(converted, model_name), s,
                                                            model_name=model_name)
            notes += changed
            log.warning("model %s: IR/opset above %s, re-exported: %s", model_name, s.target_triton_release, changed)
    sample = validation_sample(converted.inputs, dataset=dataset, input_example=model_io.input_example,
                               rows=dataset_rows if dataset is not None else None, settings=s)
    round_integer_columns(sample, converted.inputs, model_io)
    n_rows = len(next(iter(sample.values())))

    model_bytes = converted.serialized()
    hardware = inventory()
    plan = plan_instances(len(model_bytes), hardware=hardware, settings=s)
    delay = parse_int_list(s.analyzer_queue_delays_us, "analyzer_queue_delays_us")[0]
    batching = DynamicBatchingSpec(max_queue_delay_us=delay) if max_batch_size > 0 else None
    filename = MODEL_FILENAMES[converted.format]
    if torchscript:
        config = build_config(model_name, declared_io(converted.inputs, converted.outputs),
                              max_batch_size=max_batch_size, dynamic_batching=batching,
                              instance_groups=plan.instance_groups(), default_model_filename=filename,
                              platform="pytorch_libtorch")
        report = validate_torchscript_for_push(converted, config, sample, model_name=model_name, settings=s)
        served = torchscript_runner(converted.torchscript, converted.inputs, converted.outputs)
    else:
        onnx_model = _onnx_of(converted, model_name)
        config = build_config(model_name, onnx_model, max_batch_size=max_batch_size,
                              dynamic_batching=batching, instance_groups=plan.instance_groups(),
                              default_model_filename=filename)
        report = validate_for_push(onnx_model, config, sample, model_name=model_name, settings=s)
        served = onnx_model

    source = SourceModel(model_uri, converted.source_flavor)
    src_in = source_input(model_io, converted.inputs, sample, dataset, n_rows)
    src_out = source.predict(src_in)
    parity = parity_check(lambda _x: src_out, served, sample, source_sample=src_in, atol=a, rtol=r,
                          raise_on_failure=False, model_name=model_name, settings=s)
    failure = "" if parity.passed else parity.describe_failures(model_name)
    if isinstance(src_out, Mapping):
        expected = {k: np.asarray(v) for k, v in src_out.items()}
    else:
        (only,) = parity.outputs  # parity_check matched the single source output to one output
        expected = {only: np.asarray(src_out.to_numpy() if hasattr(src_out, "to_numpy") else src_out)}

    probes: dict[str, Any] = {"probed": False, "note": "TorchScript (no tree ensemble)" if torchscript else ""}
    if not torchscript:
        probes = _probe_thresholds(converted, model_io, dataset, source, served, a, r, model_name, s)
        if probes.get("passed") is False and not failure:
            failure = (f"parity gate failed for model {model_name!r} on {probes['rows']} rows next to float32 "
                       f"split thresholds: max abs difference {probes['max_abs_diff']:.6g}, "
                       f"{probes['label_flips']} label flip(s); worst rows {probes['worst_rows'][:3]}")
    conv = converter_for([converted.source_flavor], model_name=model_name)
    record = provenance(conv.packages, onnx_model=None if torchscript else converted.onnx_model,
                        source_flavor=converted.source_flavor, export_format=converted.format,
                        converter=converted.converter, target_release=s.target_triton_release)
    return GateResult(model_name, converted, model_bytes, filename, config, sample, expected, parity, probes,
                      report, record, notes, compat_before, plan, hardware, failure)


def _probe_thresholds(converted, model_io, dataset, source, served, atol, rtol, model_name, s) -> dict[str, Any]:
    """Run the float32 split-threshold probes; a summary for the parity report."""
    import pandas as pd

    from model_registry.parity import parity_check
    from model_registry.probing import threshold_probes
    from model_registry.validation import to_feeds

    real = dataset
    if real is None and isinstance(model_io.input_example, pd.DataFrame):
        real = model_io.input_example
    probes = threshold_probes(converted.onnx_model, converted.inputs, real if real is not None else pd.DataFrame())
    if probes.frame.empty:
        return {"probed": False, "note": probes.note, "splits": probes.splits}
    feeds = to_feeds(probes.frame, converted.inputs)
    src_in = signature_frame(probes.frame, model_io, list(probes.frame.columns))
    try:
        src_out = source.predict(src_in)
    except Exception as exc:  # noqa: BLE001 - the source refuses synthetic rows: report, do not judge
        return {"probed": False, "note": f"the source model refused the probe rows: {exc}"[:300]}
    result = parity_check(lambda _x: src_out, served, feeds, source_sample=src_in, atol=atol, rtol=rtol,
                          raise_on_failure=False, model_name=model_name, settings=s)
    bad: set[int] = set()
    max_abs, flips = 0.0, 0
    for o in result.outputs.values():
        max_abs = max(max_abs, o.max_abs_error)
        flips = max(flips, o.label_flips or 0)
        if not o.passed:
            bad.update(o.worst_rows)
    worst = [{"row": i, **probes.rows[i]} for i in sorted(bad)[:20]]
    return {"probed": True, "passed": result.passed, "rows": len(probes.frame), "splits": probes.splits,
            "thresholds_probed": probes.thresholds_probed, "max_abs_diff": max_abs, "label_flips": flips,
            "worst_rows": worst, "resolution": probes.resolution,
            "outputs": {k: {"max_abs_error": v.max_abs_error, "label_flips": v.label_flips, "passed": v.passed}
                        for k, v in result.outputs.items()}}


def parity_summary(result: Any) -> dict[str, dict[str, Any]]:
    """Per output ``max_abs``/``max_rel`` (+ ``label_agreement``, ``label_flips``) for MLflow tags."""
    out = {}
    for name, o in result.outputs.items():
        entry: dict[str, Any] = {"max_abs": float(o.max_abs_error), "max_rel": float(o.max_rel_error)}
        if o.label_agreement is not None:
            entry["label_agreement"] = float(o.label_agreement)
        if o.label_flips is not None:
            entry["label_flips"] = int(o.label_flips)
        out[name] = {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in entry.items()}
    return out


def local_model(model_uri: str, download_dir: str | None = None) -> tuple[str, Any]:
    """A local copy of an MLflow model and its :class:`~model_registry.registry.ModelIO`.

    Args:
        model_uri: ``models:/name/version``, ``runs:/<run>/<path>``, any artifact URI, or a local
            MLflow model folder (used in place).
        download_dir: Where a remote model is downloaded (default: a temporary folder).

    Returns:
        ``(local_path, model_io)``; ``model_io.has_signature`` is False without a signature.

    Raises:
        ModelConversionError: The URI does not lead to an MLflow model folder (no ``MLmodel``).
    """
    import os
    import tempfile

    import mlflow
    from mlflow.models import Model

    from ground.exceptions import ModelConversionError
    from model_registry.registry_entities import ModelIO, schema_to_tensors

    path = model_uri[len("file://"):] if model_uri.startswith("file://") else model_uri
    if not os.path.isdir(path):
        target = download_dir or tempfile.mkdtemp(prefix="tritonflow-model-")
        try:
            path = mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=target)
        except Exception as exc:  # noqa: BLE001 - MLflow raises many types
            raise ModelConversionError(f"model_uri={model_uri!r} cannot be downloaded: {exc}") from exc
    if not os.path.isfile(os.path.join(path, "MLmodel")):
        raise ModelConversionError(f"model_uri={model_uri!r} is not an MLflow model (no MLmodel file in {path})")
    model = Model.load(os.path.join(path, "MLmodel"))
    example = model.load_input_example(path) if model.saved_input_example_info else None
    if model.signature is None:
        return path, ModelIO((), (), "none", "none", has_signature=False, input_example=example)
    inputs, in_kind = schema_to_tensors(model.signature.inputs)
    outputs, out_kind = schema_to_tensors(model.signature.outputs)
    return path, ModelIO(inputs, outputs, in_kind, out_kind, True, example)
