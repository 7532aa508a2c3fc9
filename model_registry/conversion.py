"""Convert registered models to formats Triton serves: ONNX (and TorchScript for PyTorch).

Supported sources:

* **scikit-learn** estimators and pipelines through ``skl2onnx``, with ZipMap disabled so a
  classifier's probabilities are a plain ``tensor(float) [N, C]`` and labels ``tensor(int64)``
  (skl2onnx documentation "Probabilities as a vector or as a ZipMap").
* **PyTorch** ``nn.Module`` to ONNX with a dynamic batch axis, and to TorchScript traced in
  ``eval()`` under ``torch.no_grad()``; :func:`verify_torchscript` then requires TorchScript and
  eager-eval outputs to agree within ``torchscript_atol`` (1e-5) and two calls to be identical.
  ``torch`` is imported lazily.
* **XGBoost** and **LightGBM** (their MLflow flavours) through ``onnxmltools``
  (:mod:`model_registry.boosting`).
* **ONNX** models pass through (loaded, checked, I/O names made safe).

Flavours are a registry in :mod:`model_registry.flavors` (``register_converter``, ``CONVERTERS``,
``convert_mlflow_model``): the dispatcher above the flavour converters, this module's
(scikit-learn, ONNX), :mod:`model_registry.pytorch_conversion`'s and :mod:`model_registry.boosting`'s.
This module holds what every converter shares (tensor schemas, safe names, the result type).

**String columns.** A tabular signature with a string column (e.g. a ``ColumnTransformer`` with a
``OneHotEncoder``) becomes one ``[-1, 1]`` tensor per column, named after the column (skl2onnx
matches ``ColumnTransformer`` columns by input name): strings are ``tensor(string)``
(``TYPE_STRING`` in Triton, ``BYTES`` on the wire), integers ``int64``, other numbers ``float32``.
A missing string is sent as :data:`MISSING_STRING` (``"nan"``), the category skl2onnx writes for
the ``NaN`` category scikit-learn's encoders learn. Signatures without strings keep the single
folded ``features`` tensor.

Shapes and dtypes come from the MLflow model signature (``mlflow.models.ModelSignature``) or an
explicit ``schema``; a model with neither gets :class:`ModelConversionError`.

Tensor names are made safe identifiers matching ``[A-Za-z_][A-Za-z0-9_]*`` (a name such
as ``onnx::Cast_2`` breaks perf_analyzer's ``NAME:DIMS`` syntax); the renames are kept in
``ConvertedModel.name_mapping`` for the name-mapping file.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ground.exceptions import ModelConversionError
from ground.settings import Settings
from model_registry.triton_config import OnnxLike, load_onnx, model_io

if TYPE_CHECKING:  # pragma: no cover
    import onnx

SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: How a missing value of a string column is sent to the converted model: skl2onnx encodes the
#: ``NaN`` category of scikit-learn's OneHotEncoder/OrdinalEncoder as the string ``"nan"``.
MISSING_STRING = "nan"

_NUMPY_KINDS = {
    "float32": "float32", "float64": "float64", "float16": "float16", "double": "float64",
    "float": "float32", "int64": "int64", "long": "int64", "int32": "int32", "integer": "int32",
    "bool": "bool", "boolean": "bool", "int8": "int8", "uint8": "uint8", "int16": "int16",
    "string": "object", "str": "object", "object": "object",
}


@dataclasses.dataclass(frozen=True)
class TensorSchema:
    """One model input as conversion needs it.

    Attributes:
        name: Tensor name (a safe identifier after conversion).
        dtype: numpy dtype name (``float32``, ``int64``, ...).
        shape: Dimensions, ``-1`` for variable (axis 0 is the batch axis).
        columns: Source column names folded into this tensor (tabular signatures), else empty.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    columns: tuple[str, ...] = ()


@dataclasses.dataclass
class ConvertedModel:
    """Result of a conversion.

    Attributes:
        onnx_model: The ONNX ``ModelProto`` (``None`` for a TorchScript-only result).
        format: ``"onnx"`` or ``"torchscript"``.
        source_flavor: ``sklearn``, ``pytorch`` or ``onnx``.
        inputs: Input schema used for the conversion.
        name_mapping: ``{original tensor name: served name}`` for every renamed tensor.
        torchscript: The traced ``torch.jit.ScriptModule`` when ``format == "torchscript"``.
        notes: Human-readable notes (renames, opset chosen, ...).
        outputs: Output tensors of a TorchScript result (names ``output__<i>``, dtypes, shapes
            with ``-1`` for the batch axis); empty for ONNX (the graph declares them).
        converter: Converter package that produced the file (``skl2onnx``, ``onnxmltools``,
            ``torch``; empty for a passthrough), for the provenance record.
    """

    onnx_model: "onnx.ModelProto | None"
    format: str
    source_flavor: str
    inputs: list[TensorSchema]
    name_mapping: dict[str, str] = dataclasses.field(default_factory=dict)
    torchscript: Any = None
    notes: list[str] = dataclasses.field(default_factory=list)
    outputs: list[TensorSchema] = dataclasses.field(default_factory=list)
    converter: str = ""

    @property
    def default_model_filename(self) -> str:
        """File name in the version folder: ``model.onnx`` or ``model.pt``."""
        return "model.onnx" if self.format == "onnx" else "model.pt"

    def serialized(self) -> bytes:
        """The model file's bytes."""
        if self.format == "onnx":
            assert self.onnx_model is not None  # an "onnx" result always carries its model
            return self.onnx_model.SerializeToString()
        import io

        import torch

        buf = io.BytesIO()
        torch.jit.save(self.torchscript, buf)
        return buf.getvalue()

    def name_mapping_json(self) -> str:
        """The name-mapping file's content (``{"original": "served"}``, sorted keys)."""
        return json.dumps(self.name_mapping, indent=2, sort_keys=True)


# ----------------------------------------------------------------------------- schema
def schema_from_signature(
    signature: Any = None,
    schema: Sequence[TensorSchema] | Mapping[str, Any] | None = None,
    *,
    model_name: str = "model",
    input_name: str = "features",
) -> list[TensorSchema]:
    """Derive the conversion input schema.

    Args:
        signature: ``mlflow.models.ModelSignature`` (or ``None``). Tensor-based input specs map
            one to one; column-based (tabular) specs fold into ONE tensor ``input_name`` of shape
            ``[-1, n_columns]`` whose dtype is ``int64`` when every column is an integer, else
            ``float32``.
        schema: Explicit schema that wins over the signature: a list of :class:`TensorSchema`, or
            a mapping ``{name: {"dtype": "float32", "shape": [-1, 3]}}``.
        model_name: Used in error messages.
        input_name: Tensor name for folded tabular columns.

    Raises:
        ModelConversionError: Neither a signature with inputs nor a schema was given, or an entry
            has an unsupported dtype.
    """
    if schema is not None:
        return _schema_from_user(schema, model_name)
    if signature is None or getattr(signature, "inputs", None) is None:
        raise ModelConversionError(
            f"model {model_name!r} was logged without a signature and no schema was given: "
            "shapes and dtypes cannot be inferred (log the model with "
            "mlflow.models.infer_signature(...) or pass schema={'features': "
            "{'dtype': 'float32', 'shape': [-1, N]}})"
        )
    from mlflow.types.schema import TensorSpec

    specs = list(signature.inputs.inputs)
    if specs and all(isinstance(s, TensorSpec) for s in specs):
        out = []
        for i, s in enumerate(specs):
            name = s.name or (input_name if len(specs) == 1 else f"input_{i}")
            out.append(TensorSchema(name, np.dtype(s.type).name, tuple(int(d) for d in s.shape)))
        return out
    kinds: list[str] = []
    columns: list[str] = []
    for s in specs:
        t = str(getattr(s.type, "name", s.type)).lower()
        if t not in _NUMPY_KINDS:
            raise ModelConversionError(
                f"model {model_name!r}: signature column {s.name!r} has type {t!r} (expected a "
                "numeric column (double, float, long, integer, boolean) or a string column)"
            )
        kinds.append(_NUMPY_KINDS[t])
        columns.append(s.name or f"col_{len(columns)}")
    if "object" in kinds:  # string columns: one [-1, 1] tensor per column, named after it
        per_column = {"object": "object", "int64": "int64", "int32": "int64", "bool": "bool"}
        return [TensorSchema(c, per_column.get(k, "float32"), (-1, 1), (c,))
                for c, k in zip(columns, kinds, strict=True)]
    dtype = "int64" if all(k in {"int64", "int32"} for k in kinds) else "float32"
    return [TensorSchema(input_name, dtype, (-1, len(specs)), tuple(columns))]


def _schema_from_user(schema: Any, model_name: str) -> list[TensorSchema]:
    if isinstance(schema, Mapping):
        out = []
        for name, spec in schema.items():
            try:
                dtype = np.dtype(spec["dtype"]).name
                shape = tuple(int(d) for d in spec["shape"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ModelConversionError(
                    f"model {model_name!r}: schema entry {name!r}={spec!r} is invalid "
                    "(expected {'dtype': 'float32', 'shape': [-1, N]})"
                ) from exc
            out.append(TensorSchema(str(name), dtype, shape, tuple(spec.get("columns", ()))))
        return out
    out = list(schema)
    if not out or not all(isinstance(s, TensorSchema) for s in out):
        raise ModelConversionError(
            f"model {model_name!r}: schema={schema!r} is invalid (expected TensorSchema items or a mapping)"
        )
    return out


# ----------------------------------------------------------------------------- name safety
def safe_tensor_name(name: str, taken: set[str] | None = None) -> str:
    """Return ``name`` as an identifier matching ``[A-Za-z_][A-Za-z0-9_]*``, unique in ``taken``.

    ``onnx::Cast_2`` becomes ``onnx__Cast_2``.
    """
    out = re.sub(r"[^A-Za-z0-9_]", "_", name) or "t"
    if not re.match(r"[A-Za-z_]", out[0]):
        out = "_" + out
    base, n = out, 1
    while taken is not None and out in taken:
        n += 1
        out = f"{base}_{n}"
    return out


def sanitize_io_names(
    model: "onnx.ModelProto", rename: Mapping[str, str] | None = None
) -> tuple["onnx.ModelProto", dict[str, str]]:
    """Rename graph inputs/outputs to safe identifiers, rewiring every node that uses them.

    Args:
        model: ONNX model (modified copy returned; the argument is untouched).
        rename: Explicit ``{old: new}`` renames (e.g. from the signature's names); other unsafe
            names are made safe with :func:`safe_tensor_name`.

    Returns:
        ``(model, mapping)`` where mapping holds only the names that changed.

    Raises:
        ModelConversionError: An explicit new name is not a safe identifier or collides.
    """
    model = copy.deepcopy(model)
    g = model.graph
    inits = {i.name for i in g.initializer}
    io_names = [v.name for v in g.input if v.name not in inits] + [v.name for v in g.output]
    all_names = set(inits) | {o for n in g.node for o in n.output} | set(io_names)
    mapping: dict[str, str] = {}
    taken = set(all_names)
    for old in io_names:
        new = (rename or {}).get(old)
        if new is None:
            if SAFE_NAME.match(old):
                continue
            new = safe_tensor_name(old, taken)
        elif not SAFE_NAME.match(new):
            raise ModelConversionError(
                f"rename {old!r} -> {new!r}: {new!r} is not a safe tensor name "
                "(expected [A-Za-z_][A-Za-z0-9_]*)"
            )
        elif new != old and new in taken:
            raise ModelConversionError(f"rename {old!r} -> {new!r}: {new!r} is already used in the graph")
        if new != old:
            mapping[old] = new
            taken.add(new)
    if not mapping:
        return model, {}

    def sub(name: str) -> str:
        return mapping.get(name, name)

    for v in list(g.input) + list(g.output) + list(g.value_info):
        v.name = sub(v.name)
    for node in g.node:
        node.input[:] = [sub(x) for x in node.input]
        node.output[:] = [sub(x) for x in node.output]
    return model, mapping


# ----------------------------------------------------------------------------- scikit-learn
def _classifiers(est: Any) -> list[Any]:
    """The estimator and every nested estimator that is a classifier (for ZipMap options)."""
    from sklearn.base import is_classifier

    found = []
    stack = [est]
    seen = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        try:
            if is_classifier(e):
                found.append(e)
        except Exception:  # noqa: BLE001 - non-estimators in containers
            pass
        for attr in ("steps", "transformer_list", "transformers", "estimators"):
            for item in getattr(e, attr, None) or []:
                if isinstance(item, tuple):
                    stack.extend(x for x in item if hasattr(x, "get_params"))
                elif hasattr(item, "get_params"):
                    stack.append(item)
        for attr in ("estimator", "base_estimator", "final_estimator"):
            sub = getattr(e, attr, None)
            if sub is not None and hasattr(sub, "get_params"):
                stack.append(sub)
    return found


def _target_opsets(settings: Settings, target_opset: int | None) -> dict[str, int]:
    from skl2onnx import __max_supported_opset__

    default = min(settings.max_onnx_opset, int(__max_supported_opset__))
    if target_opset is not None:
        if target_opset > settings.max_onnx_opset:
            raise ModelConversionError(
                f"target_opset={target_opset} exceeds max_onnx_opset={settings.max_onnx_opset} "
                f"of {settings.target_triton_release}"
            )
        default = target_opset
    return {"": default, "ai.onnx.ml": settings.max_onnx_ml_opset}


def convert_sklearn(
    model: Any,
    signature: Any = None,
    *,
    schema: Any = None,
    target_opset: int | None = None,
    model_name: str = "model",
    input_name: str = "features",
    settings: Settings,
) -> ConvertedModel:
    """Convert a scikit-learn estimator or pipeline to ONNX with ZipMap disabled.

    Args:
        model: Fitted estimator or ``Pipeline``.
        signature: MLflow ``ModelSignature`` (shapes and dtypes).
        schema: Explicit schema, wins over the signature (see :func:`schema_from_signature`).
        target_opset: Default-domain opset, at most ``settings.max_onnx_opset`` (default: that
            limit, capped by what skl2onnx supports). ``ai.onnx.ml`` uses ``max_onnx_ml_opset``.
        model_name: Used in messages and as the graph name.
        input_name: Tensor name for tabular signatures.
        settings: Settings the defaults come from.

    Returns:
        ConvertedModel whose classifier outputs are ``label`` (int64 ``[N]``) and
        ``probabilities`` (float ``[N, C]``).

    Raises:
        ModelConversionError: No signature/schema, or skl2onnx cannot convert the model.
    """
    from skl2onnx import convert_sklearn as _convert
    from skl2onnx.common.data_types import (
        BooleanTensorType,
        DoubleTensorType,
        FloatTensorType,
        Int32TensorType,
        Int64TensorType,
        StringTensorType,
    )

    inputs = schema_from_signature(signature, schema, model_name=model_name, input_name=input_name)
    types = {
        "float32": FloatTensorType, "float64": DoubleTensorType, "int64": Int64TensorType,
        "int32": Int32TensorType, "bool": BooleanTensorType, "object": StringTensorType,
    }
    initial = []
    for s in inputs:
        if s.dtype not in types:
            raise ModelConversionError(
                f"model {model_name!r}: input {s.name!r} dtype {s.dtype} is not convertible "
                f"(expected one of {sorted(types)})"
            )
        initial.append((s.name, types[s.dtype]([None if d < 0 else d for d in s.shape])))
    options = {id(c): {"zipmap": False} for c in _classifiers(model)}
    opsets = _target_opsets(settings, target_opset)
    try:
        onx = _convert(model, initial_types=initial, options=options or None,
                       target_opset=opsets, name=model_name)
    except Exception as exc:  # skl2onnx raises many types
        hint = ""
        if "missing values are string" in str(exc):
            hint = (" (a SimpleImputer on a string column must declare missing_values as a string; "
                    "or leave NaN to the encoder: OneHotEncoder(handle_unknown='ignore') learns it as "
                    f"a category, served as {MISSING_STRING!r})")
        raise ModelConversionError(
            f"model {model_name!r}: skl2onnx cannot convert {type(model).__name__}: {exc}{hint}"
        ) from exc
    onx = fix_output_batch_axes(_dedupe_opsets(onx), inputs)
    onx, mapping = sanitize_io_names(onx)
    inputs = [dataclasses.replace(s, name=mapping.get(s.name, s.name)) for s in inputs]
    return ConvertedModel(onx, "onnx", "sklearn", inputs, mapping,
                          notes=[f"skl2onnx target opsets {opsets}, ZipMap disabled"], converter="skl2onnx")


def fix_output_batch_axes(model: "onnx.ModelProto", inputs: Sequence[TensorSchema]) -> "onnx.ModelProto":
    """Declare axis 0 of an output dynamic when the graph fixes it to 1 but it follows the batch.

    Some converters (onnxmltools' LightGBM label output) declare ``[1]`` for an output that has one
    row per input row; Triton would then refuse batching. The model is run at batch 1 and 3 in ONNX
    Runtime; an output whose axis 0 equals the batch in both runs gets ``dim_param: "N"``. The
    model is returned unchanged when it does not run on zero-filled inputs.
    """
    from model_registry.triton_config import model_io as _io

    _, outputs = _io(model)
    suspects = [o.name for o in outputs if o.shape and o.shape[0] == 1]
    if not suspects or not inputs or any(s.shape[:1] != (-1,) for s in inputs):
        return model
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        rows = {}
        for batch in (1, 3):
            feeds = {}
            for s in inputs:
                shape = [batch] + [d if d > 0 else 1 for d in s.shape[1:]]
                feeds[s.name] = (np.full(shape, "", dtype=object) if s.dtype == "object"
                                 else np.zeros(shape, dtype=s.dtype))
            rows[batch] = {o.name: np.asarray(v).shape[:1]
                           for o, v in zip(sess.get_outputs(), sess.run(None, feeds), strict=True)}
    except Exception:  # noqa: BLE001 - leave the declaration; validation reports what fails
        return model
    for v in model.graph.output:
        if v.name in suspects and rows[1].get(v.name) == (1,) and rows[3].get(v.name) == (3,):
            dim = v.type.tensor_type.shape.dim[0]
            dim.Clear()
            dim.dim_param = "N"
    return model


def _dedupe_opsets(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """Keep one ``opset_import`` per domain (highest version); skl2onnx may repeat one."""
    best: dict[str, int] = {}
    for o in model.opset_import:
        best[o.domain] = max(best.get(o.domain, 0), o.version)
    if len(best) == len(model.opset_import):
        return model
    del model.opset_import[:]
    for domain, version in best.items():
        op = model.opset_import.add()
        op.domain, op.version = domain, version
    return model


def sklearn_predict_fn(model: Any) -> Callable[[Any], dict[str, np.ndarray]]:
    """Source predictor for :func:`model_registry.parity.parity_check`.

    Returns a callable mapping the input array to ``{"label": predict(X), "probabilities":
    predict_proba(X)}`` for classifiers, ``{"variable": predict(X)}`` (skl2onnx's regressor
    output name) otherwise.
    """
    from sklearn.base import is_classifier

    if is_classifier(model):
        return lambda x: {"label": np.asarray(model.predict(x)),
                          "probabilities": np.asarray(model.predict_proba(x))}
    return lambda x: {"variable": np.asarray(model.predict(x)).reshape(len(x), -1)}


# ----------------------------------------------------------------------------- ONNX passthrough
def convert_onnx(
    model: OnnxLike,
    signature: Any = None,
    *,
    schema: Any = None,
    rename: Mapping[str, str] | None = None,
    model_name: str = "model",
) -> ConvertedModel:
    """Pass an ONNX model through: load, ``onnx.checker``, make I/O names safe.

    Unsafe input names are renamed positionally to the signature's (or schema's) input names when
    those are safe and the counts match (``onnx::Cast_2`` -> ``token_type_ids``), else
    by :func:`safe_tensor_name`. Without a signature or schema the graph's own declaration is used.

    Raises:
        ModelConversionError: The model does not load or fails ``onnx.checker``.
    """
    import onnx

    try:
        proto = load_onnx(model)
        onnx.checker.check_model(proto)
    except Exception as exc:  # ModelConfigError or onnx.checker.ValidationError
        raise ModelConversionError(f"model {model_name!r}: ONNX model is invalid: {exc}") from exc
    graph_inputs, _ = model_io(proto)
    inputs: list[TensorSchema]
    if signature is not None or schema is not None:
        inputs = schema_from_signature(signature, schema, model_name=model_name)
    else:
        inputs = [
            TensorSchema(t.name, _onnx_to_numpy(t.onnx_type),
                         tuple(d if isinstance(d, int) else -1 for d in (t.shape or ())))
            for t in graph_inputs
        ]
    auto: dict[str, str] = {}
    if len(inputs) == len(graph_inputs):
        for g, s in zip(graph_inputs, inputs, strict=True):
            if g.name != s.name and not SAFE_NAME.match(g.name) and SAFE_NAME.match(s.name):
                auto[g.name] = s.name
    auto.update(rename or {})
    proto, mapping = sanitize_io_names(proto, auto)
    served = {t.name for t in model_io(proto)[0]}
    inputs = [s if s.name in served else dataclasses.replace(s, name=mapping.get(s.name, s.name)) for s in inputs]
    return ConvertedModel(proto, "onnx", "onnx", inputs, mapping, notes=["ONNX passthrough"])


def _onnx_to_numpy(onnx_type: str) -> str:
    from model_registry.triton_config import ONNX_TO_TRITON, TRITON_TO_NUMPY

    return TRITON_TO_NUMPY.get(ONNX_TO_TRITON.get(onnx_type, ""), "float32")
