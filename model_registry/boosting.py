"""Gradient boosting conversion: XGBoost and LightGBM models (their MLflow flavours) to ONNX.

The converters of the ``xgboost`` and ``lightgbm`` MLflow flavours (registered in
:mod:`model_registry.flavors`). Both use ``onnxmltools``
(``convert_xgboost`` / ``convert_lightgbm``) at the highest default-domain opset that both the
target Triton release and onnxmltools support; classifiers give ``label`` (``[N]``) and
``probabilities`` (``tensor(float) [N, C]``, never a ZipMap), regressors ``variable``
(``[N, 1]``). Scikit-learn API models (``XGBClassifier``, ``LGBMRegressor``, ...) and native
``Booster`` objects are accepted.

Tree ensembles in ONNX (``ai.onnx.ml`` ``TreeEnsemble*``) compare thresholds in float32. XGBoost
does too, so its scores match; LightGBM compares in double, so an input that sits between two
float32 values next to a split threshold can take the other branch: the parity gate probes such
values (:mod:`model_registry.probing`) and refuses the model when the scores change.
"""

from __future__ import annotations

import copy
from typing import Any

from ground.exceptions import ModelConversionError
from ground.settings import Settings
from model_registry.conversion import (
    ConvertedModel,
    fix_output_batch_axes,
    sanitize_io_names,
    schema_from_signature,
)


def _opset(settings: Settings) -> int:
    from onnxmltools.convert.common.onnx_ex import get_maximum_opset_supported

    return min(settings.max_onnx_opset, int(get_maximum_opset_supported()))


def _initial_types(inputs: list, model_name: str) -> list:
    from onnxmltools.convert.common.data_types import FloatTensorType

    if len(inputs) != 1 or inputs[0].dtype == "object":
        raise ModelConversionError(
            f"model {model_name!r}: gradient boosting models take one numeric feature matrix; the "
            f"signature gives {[(s.name, s.dtype) for s in inputs]} (expected numeric columns only; "
            "encode string columns in a scikit-learn pipeline and log it with mlflow.sklearn)"
        )
    return [(inputs[0].name, FloatTensorType([None if d < 0 else d for d in inputs[0].shape]))]


def _finish(onx: Any, inputs: list, flavor: str, opset: int) -> ConvertedModel:
    onx = fix_output_batch_axes(onx, inputs)
    onx, mapping = sanitize_io_names(onx)
    return ConvertedModel(onx, "onnx", flavor, inputs, mapping, converter="onnxmltools",
                          notes=[f"onnxmltools opset {opset}, ZipMap disabled"])


def convert_xgboost(model: Any, signature: Any = None, *, schema: Any = None, model_name: str = "model",
                    settings: Settings, input_name: str = "features") -> ConvertedModel:
    """Convert an XGBoost model (``XGBClassifier``/``XGBRegressor`` or ``Booster``) to ONNX.

    Feature names are dropped on a copy first: onnxmltools reads splits as ``f<index>``.

    Raises:
        ModelConversionError: No signature/schema, non-numeric inputs, or onnxmltools failed.
    """
    from onnxmltools import convert_xgboost as _convert

    s = settings
    inputs = schema_from_signature(signature, schema, model_name=model_name, input_name=input_name)
    initial = _initial_types(inputs, model_name)
    native = copy.deepcopy(model)
    booster = native.get_booster() if hasattr(native, "get_booster") else native
    booster.feature_names = None
    booster.feature_types = None
    opset = _opset(s)
    try:
        onx = _convert(native, initial_types=initial, target_opset=opset, name=model_name)
    except Exception as exc:  # onnxmltools raises many types
        raise ModelConversionError(f"model {model_name!r}: onnxmltools cannot convert "
                                   f"{type(model).__name__}: {exc}") from exc
    return _finish(onx, inputs, "xgboost", opset)


def convert_lightgbm(model: Any, signature: Any = None, *, schema: Any = None, model_name: str = "model",
                     settings: Settings, input_name: str = "features") -> ConvertedModel:
    """Convert a LightGBM model (``LGBMClassifier``/``LGBMRegressor`` or ``Booster``) to ONNX.

    Raises:
        ModelConversionError: No signature/schema, non-numeric inputs, or onnxmltools failed.
    """
    from onnxmltools import convert_lightgbm as _convert

    s = settings
    inputs = schema_from_signature(signature, schema, model_name=model_name, input_name=input_name)
    initial = _initial_types(inputs, model_name)
    opset = _opset(s)
    try:
        onx = _convert(model, initial_types=initial, target_opset=opset, zipmap=False, name=model_name)
    except Exception as exc:  # onnxmltools raises many types
        raise ModelConversionError(f"model {model_name!r}: onnxmltools cannot convert "
                                   f"{type(model).__name__}: {exc}") from exc
    return _finish(onx, inputs, "lightgbm", opset)

