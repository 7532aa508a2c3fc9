"""Provenance of a conversion: the versions of everything that touched the model.

A score change after a converter upgrade can only be traced if the versions are recorded. The
publish pipeline writes :func:`provenance` as ``tritonflow.provenance.*`` tags on the MLflow model
version (:func:`provenance_tags`) and as the ``provenance`` field of the validation report.

Recorded: the training library and the converter of the model's flavour
(:attr:`model_registry.flavors.FlavorConverter.packages`: scikit-learn, xgboost, lightgbm,
torch, skl2onnx, onnxmltools), always onnx and onnxruntime (the parity gate's runtime), the ONNX
IR version and every opset of the converted file, and the target serving release.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Iterable, Mapping

#: Distributions recorded for every model (the format and the parity gate's runtime).
ALWAYS = ("onnx", "onnxruntime")
#: Tag prefix on the MLflow model version.
TAG_PREFIX = "tritonflow.provenance."
#: Import names whose distribution has another name (xgboost ships as xgboost or xgboost-cpu).
_DISTRIBUTIONS = {"xgboost": ("xgboost", "xgboost-cpu"), "torch": ("torch",),
                  "scikit-learn": ("scikit-learn",)}


def package_version(name: str) -> str:
    """Installed version of distribution ``name`` (``""`` when it is not installed)."""
    for dist in _DISTRIBUTIONS.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def provenance(
    packages: Iterable[str],
    *,
    onnx_model: Any = None,
    source_flavor: str = "",
    export_format: str = "onnx",
    converter: str = "",
    target_release: str = "",
) -> dict[str, Any]:
    """The provenance record of one conversion.

    Args:
        packages: Distributions of the flavour (training library, converter).
        onnx_model: The converted ONNX model (IR version and opsets are read from it), or None
            for TorchScript.
        source_flavor: MLflow flavour of the source model.
        export_format: ``onnx`` or ``torchscript``.
        converter: The converter package used.
        target_release: The serving release the model was checked against.

    Returns:
        ``{"packages": {name: version}, "ir_version", "opsets": {domain: version}, "source_flavor",
        "export_format", "converter", "target_release"}`` (``ir_version`` None for TorchScript).
    """
    names = list(dict.fromkeys([*packages, *ALWAYS]))
    out: dict[str, Any] = {
        "packages": {n: package_version(n) for n in names},
        "source_flavor": source_flavor, "export_format": export_format, "converter": converter,
        "target_release": target_release, "ir_version": None, "opsets": {},
    }
    if onnx_model is not None:
        out["ir_version"] = int(onnx_model.ir_version)
        opsets: dict[str, int] = {}
        for o in onnx_model.opset_import:
            domain = o.domain or "ai.onnx"
            opsets[domain] = max(opsets.get(domain, 0), int(o.version))
        out["opsets"] = dict(sorted(opsets.items()))
    return out


def provenance_tags(record: Mapping[str, Any]) -> dict[str, str]:
    """``tritonflow.provenance.*`` tags of a :func:`provenance` record.

    One tag per package (``tritonflow.provenance.skl2onnx = 1.20.0``), plus ``ir_version``,
    ``opsets`` (``ai.onnx=15,ai.onnx.ml=3``), ``source_flavor``, ``export_format``, ``converter``
    and ``target_release``.
    """
    tags = {f"{TAG_PREFIX}{name}": version or "not installed"
            for name, version in record.get("packages", {}).items()}
    if record.get("ir_version") is not None:
        tags[f"{TAG_PREFIX}ir_version"] = str(record["ir_version"])
    if record.get("opsets"):
        tags[f"{TAG_PREFIX}opsets"] = ",".join(f"{d}={v}" for d, v in record["opsets"].items())
    for key in ("source_flavor", "export_format", "converter", "target_release"):
        if record.get(key):
            tags[f"{TAG_PREFIX}{key}"] = str(record[key])
    return tags
