"""The flavour registry and dispatcher: which converter turns a registered MLflow model into ONNX.

One :class:`FlavorConverter` per MLflow flavour says how to load the model, how to convert it,
which formats it can produce and which packages' versions are its provenance. The built-in
flavours are registered here, in detection order (a model logged with several flavours uses the
first): ``sklearn`` and ``onnx`` (:mod:`model_registry.conversion`), ``pytorch``
(:mod:`model_registry.pytorch_conversion`), ``xgboost`` and ``lightgbm``
(:mod:`model_registry.boosting`). :func:`convert_mlflow_model` loads a model by URI and converts it
with its flavour's converter.

This module sits above the flavour converters, which never import it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from ground.exceptions import ModelConversionError
from ground.settings import Settings
from model_registry.boosting import convert_lightgbm, convert_xgboost
from model_registry.conversion import ConvertedModel, convert_onnx, convert_sklearn
from model_registry.pytorch_conversion import convert_pytorch

__all__ = [
    "CONVERTERS",
    "FlavorConverter",
    "convert_mlflow_model",
    "convert_model",
    "converter_for",
    "load_flavor",
    "register_converter",
]


# ----------------------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class FlavorConverter:
    """How one MLflow flavour is loaded and converted (one registry entry).

    Attributes:
        flavor: MLflow flavour name (a key of ``MLmodel``'s ``flavors``).
        load: ``model_uri -> native model`` (e.g. ``mlflow.sklearn.load_model``).
        convert: ``(native, signature, *, schema, model_name, settings, **kwargs) -> ConvertedModel``.
        packages: Distributions whose versions are the conversion's provenance (the training
            library and the converter), see :mod:`model_registry.provenance`.
        formats: Formats it can produce (``"onnx"``, ``"torchscript"``).
    """

    flavor: str
    load: Callable[[str], Any]
    convert: Callable[..., ConvertedModel]
    packages: tuple[str, ...]
    formats: tuple[str, ...] = ("onnx",)


#: The registry, in detection order (a model logged with several flavours uses the first).
CONVERTERS: dict[str, FlavorConverter] = {}


def register_converter(converter: FlavorConverter) -> FlavorConverter:
    """Add (or replace) the converter of ``converter.flavor``.

    Args:
        converter: The flavour's entry; a new flavour goes last in the detection order.

    Returns:
        ``converter``.
    """
    CONVERTERS[converter.flavor] = converter
    return converter


def load_flavor(module: str) -> Callable[[str], Any]:
    """The loader of an MLflow flavour module.

    Args:
        module: The flavour's module (``"mlflow.sklearn"``); imported on the first load only.

    Returns:
        ``model_uri -> native model`` (the module's ``load_model``).
    """

    def load(uri: str) -> Any:
        import importlib

        return importlib.import_module(module).load_model(uri)

    return load


def _onnx_convert(native: Any, signature: Any, *, schema: Any = None, model_name: str = "model",
                  settings: Settings, **kwargs: Any) -> ConvertedModel:
    return convert_onnx(native, signature, schema=schema, model_name=model_name, **kwargs)


register_converter(FlavorConverter("sklearn", load_flavor("mlflow.sklearn"), convert_sklearn,
                                   ("scikit-learn", "skl2onnx")))
register_converter(FlavorConverter("pytorch", load_flavor("mlflow.pytorch"), convert_pytorch, ("torch",),
                                   ("onnx", "torchscript")))
register_converter(FlavorConverter("onnx", load_flavor("mlflow.onnx"), _onnx_convert, ()))
register_converter(FlavorConverter("xgboost", load_flavor("mlflow.xgboost"), convert_xgboost,
                                   ("xgboost", "onnxmltools")))
register_converter(FlavorConverter("lightgbm", load_flavor("mlflow.lightgbm"), convert_lightgbm,
                                   ("lightgbm", "onnxmltools")))


def converter_for(flavors: Sequence[str] | Mapping[str, Any], *, model_name: str = "model") -> FlavorConverter:
    """The registered converter of the first supported flavour in ``flavors``.

    Args:
        flavors: The model's MLflow flavours (``MLmodel``'s ``flavors`` mapping, or their names).
        model_name: Used in messages.

    Returns:
        The entry of the first flavour, in detection order, that ``flavors`` has.

    Raises:
        ModelConversionError: No flavour is supported (names the flavours and the supported ones).
    """
    registry = CONVERTERS
    known = set(flavors)
    for flavor, conv in registry.items():
        if flavor in known:
            return conv
    raise ModelConversionError(
        f"model {model_name!r} has flavors {sorted(known)}; expected one of {', '.join(registry)}"
    )


# ----------------------------------------------------------------------------- dispatch
def convert_model(
    model: Any,
    flavor: str,
    signature: Any = None,
    *,
    schema: Any = None,
    model_name: str = "model",
    settings: Settings,
    **kwargs: Any,
) -> ConvertedModel:
    """Convert ``model`` of the given MLflow flavour with its registered converter.

    Args:
        model: The native model (what the flavour's loader returns).
        flavor: A registered flavour name.
        signature: Its MLflow signature (shapes and dtypes of the inputs).
        schema: Explicit schema for a model logged without a signature.
        model_name: Used in messages and as the graph name.
        settings: Settings the converters' defaults come from (opsets, tolerances).
        **kwargs: Passed to the flavour's converter.

    Returns:
        The converted model.

    Raises:
        ModelConversionError: Unknown flavour, or the flavour's converter failed.
    """
    registry = CONVERTERS
    if flavor not in registry:
        raise ModelConversionError(
            f"flavor={flavor!r} is not supported (expected one of {', '.join(repr(f) for f in registry)})"
        )
    return registry[flavor].convert(model, signature, schema=schema, model_name=model_name,
                                    settings=settings, **kwargs)


def convert_mlflow_model(
    model_uri: str,
    *,
    schema: Any = None,
    model_name: str | None = None,
    settings: Settings,
    export_format: str = "onnx",
    **kwargs: Any,
) -> ConvertedModel:
    """Load an MLflow model by URI, pick its flavour's converter and convert it with its signature.

    Args:
        model_uri: ``models:/name/1``, ``runs:/...`` or a local path.
        schema: Explicit schema for a model logged without a signature.
        model_name: Used in messages (default: last URI segment).
        settings: Settings the defaults come from.
        export_format: ``"onnx"`` (every flavour) or ``"torchscript"`` (PyTorch only).
        **kwargs: Passed to the flavour's converter (e.g. ``target_opset``).

    Returns:
        The converted model (ONNX, or TorchScript for ``export_format="torchscript"``).

    Raises:
        ModelConversionError: No supported flavour, a format the flavour cannot produce, no
            signature and no schema, or conversion failed.
    """
    import mlflow

    info = mlflow.models.get_model_info(model_uri)
    name = model_name or model_uri.rstrip("/").split("/")[-1]
    conv = converter_for(info.flavors, model_name=name)
    if export_format not in conv.formats:
        raise ModelConversionError(
            f"model {name!r} ({conv.flavor}): export_format={export_format!r} is not available "
            f"(expected one of {list(conv.formats)})"
        )
    if "torchscript" in conv.formats:
        kwargs["export_format"] = export_format
    native = conv.load(model_uri)
    return convert_model(native, conv.flavor, info.signature, schema=schema, model_name=name,
                         settings=settings, **kwargs)
