"""MLflow registry client, conversion, validation, Triton config, Model Analyzer and hardware.

Import-light: submodules load their heavy dependencies (onnx, torch, mlflow, pynvml) inside
functions. Import what you need from the submodules, e.g.
``from model_registry.triton_config import build_config``.
"""
