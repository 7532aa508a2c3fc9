"""Conversion of registered MLflow models to what Triton serves: ONNX, and TorchScript for PyTorch.

* :mod:`.flavors`: the registry of flavour converters and the dispatcher
  (``register_converter``, ``converter_for``, ``convert_mlflow_model``).
* :mod:`.common`: what every converter shares (tensor schemas, safe tensor names, the
  ``ConvertedModel`` result), and the scikit-learn and ONNX converters.
* :mod:`.boosting`: XGBoost and LightGBM through ``onnxmltools``.
* :mod:`.pytorch`: PyTorch to ONNX or TorchScript, and the TorchScript checks made at conversion.

The converters import nothing of the gate above them: validation, parity and the threshold
probes (:mod:`model_registry.validation`, :mod:`model_registry.parity`,
:mod:`model_registry.probing`) import from here, never the other way round.
"""
