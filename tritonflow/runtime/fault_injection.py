"""A Triton Python-backend model whose answers can be switched at run time to errors or NaN.

Used by the canary tests and ``benchmarks/canary_detection.py`` to make a challenger start
failing in the middle of a step, on a real Triton, without reloading anything: every request
reads the mode file of its version (``<mode_dir>/v<version>``: ``ok``, ``error``, ``returned`` or
``nan``; missing means ``ok``). Version ``v`` answers ``Y = x * v`` (so whose answer is whose is
visible), ``error`` raises from ``execute`` (Triton counts failed requests), ``returned`` returns
an error response per request (``pb_utils.InferenceResponse(error=...)``: the client gets HTTP 500,
Triton 2.51 counts a *successful* request in ``nv_inference_request_success``/``_failure``, checked
on this server), ``nan`` answers NaN (a success for Triton). Errors Triton counts as successes are
invisible to a canary that reads only Triton's metrics; the gateway's status log
(:mod:`repository_sync.routing.gateway_status`) sees them.
"""

from __future__ import annotations

from pathlib import Path

MODEL_PY = '''
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        params = json.loads(args["model_config"]).get("parameters", {})
        self.mode_file = os.path.join(params["mode_dir"]["string_value"], f"v{self.version}")

    def _mode(self):
        try:
            with open(self.mode_file) as fh:
                return fh.read().strip() or "ok"
        except FileNotFoundError:
            return "ok"

    def execute(self, requests):
        mode = self._mode()
        if mode == "error":
            # raised, not returned per response: Triton 2.51 counts a Python-backend response
            # carrying an error as a *successful* request in nv_inference_request_*
            raise pb_utils.TritonModelException(f"version {self.version} injected failure")
        out = []
        if mode == "returned":
            err = pb_utils.TritonError(f"version {self.version} injected returned error")
            return [pb_utils.InferenceResponse(error=err) for _ in requests]
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy().astype(np.float32)
            y = np.full_like(x, np.nan) if mode == "nan" else x * self.version
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.float32))]))
        return out
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
version_policy: {{ all {{}} }}
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: {instances} }} ]
parameters: {{ key: "mode_dir" value: {{ string_value: "{mode_dir}" }} }}
'''


#: Modes a version can be switched to (see the module doc).
MODES = ("ok", "error", "returned", "nan")


def write_fault_model(repository: str | Path, name: str, versions=(1, 2), *, instances: int = 1) -> Path:
    """Write ``name`` with ``versions`` into a filesystem ``repository``; returns the mode folder.

    Switch a version with :func:`set_mode`.
    """
    root = Path(repository) / name
    mode_dir = Path(repository).parent / f"{name}-modes"
    mode_dir.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.pbtxt").write_text(CONFIG.format(name=name, instances=instances, mode_dir=mode_dir))
    for v in versions:
        (root / str(v)).mkdir(exist_ok=True)
        (root / str(v) / "model.py").write_text(MODEL_PY)
    return mode_dir


def set_mode(mode_dir: str | Path, version: int, mode: str) -> None:
    """Make ``version`` answer ``ok``, ``error``, ``returned`` or ``nan`` from its next request on."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {MODES}")
    path = Path(mode_dir) / f"v{int(version)}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(mode)
    tmp.replace(path)


__all__ = ["MODES", "MODEL_PY", "set_mode", "write_fault_model"]
