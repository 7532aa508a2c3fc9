"""Python-based Triton backend named ``onnxruntime`` that serves ONNX models with real ONNX Runtime.

The ``nvidia-pytriton`` Triton build has no native ONNX Runtime backend. Triton treats a folder
``<backend-directory>/onnxruntime/model.py`` as a Python-based backend, so models whose
``config.pbtxt`` says ``backend: "onnxruntime"`` (or ``platform: "onnxruntime_onnx"``) load here
unchanged, and the same repository serves on NVIDIA's production image.

It honours the model configuration:

* input/output names and data types (checked against the ONNX graph at load time; a mismatch
  refuses the load and names the tensor, the config type and the model type, in that order);
* ``dims``, ``reshape`` and ``max_batch_size`` (with ``max_batch_size > 0`` the batch axis is implicit and must
  be dynamic or absent from the config; requests larger than ``max_batch_size`` are refused);
* dynamic batching: the requests Triton hands to one ``execute`` call are concatenated along the
  batch axis, run in one ONNX Runtime call and split back per request;
* ``parameters { key: "intra_op_thread_count" }`` sets ONNX Runtime's intra-op threads;
* ``TYPE_STRING`` tensors as NVIDIA's native backend serves them: request ``BYTES`` elements are
  decoded as UTF-8 into ONNX ``tensor(string)`` inputs, string outputs go back UTF-8 encoded.

This file runs inside Triton's Python stub and imports only numpy, onnxruntime and
``triton_python_backend_utils``.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

_ORT_TO_TRITON = {
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(int64)": "TYPE_INT64",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int8)": "TYPE_INT8",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(bool)": "TYPE_BOOL",
    "tensor(string)": "TYPE_STRING",
}


def _shape_ok(config_dims, onnx_shape, batched):
    """True when the config's dims (plus the implicit batch axis) fit the ONNX tensor shape."""
    expected = ([-1] if batched else []) + [int(d) for d in config_dims]
    if onnx_shape is None:
        return True
    if len(onnx_shape) != len(expected):
        return False
    for i, (want, have) in enumerate(zip(expected, onnx_shape, strict=True)):
        fixed = isinstance(have, int) and have > 0
        if batched and i == 0:
            if fixed and have != 1:
                return False
            continue
        if want == -1 or not fixed:
            continue
        if want != have:
            return False
    return True


def _to_str(arr):
    """BYTES request elements -> an object array of ``str`` (ONNX Runtime's string tensors)."""
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(arr.reshape(-1)):
        flat[i] = v.decode("utf-8") if isinstance(v, (bytes, np.bytes_)) else str(v)
    return out


def _to_bytes(arr):
    """A string output -> an object array of UTF-8 ``bytes`` (Triton's BYTES elements)."""
    arr = np.asarray(arr, dtype=object)
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(arr.reshape(-1)):
        flat[i] = v if isinstance(v, bytes) else str(v).encode("utf-8")
    return out


class TritonPythonModel:
    """Serves one ONNX model version through ONNX Runtime."""

    def initialize(self, args):
        """Triton Python backend hook: read the config and open the ONNX Runtime session."""
        import onnxruntime as ort

        self.config = json.loads(args["model_config"])
        self.name = self.config.get("name", args.get("model_name", "?"))
        self.max_batch_size = int(self.config.get("max_batch_size", 0))
        filename = self.config.get("default_model_filename") or "model.onnx"
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(
                f"model '{self.name}' version {args['model_version']}: file {filename} not found"
            )
        params = {k: v.get("string_value") for k, v in self.config.get("parameters", {}).items()}
        options = ort.SessionOptions()
        threads = params.get("intra_op_thread_count")
        options.intra_op_num_threads = int(threads) if threads else 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])

        graph_inputs = {i.name: i for i in self.session.get_inputs()}
        graph_outputs = {o.name: o for o in self.session.get_outputs()}
        batched = self.max_batch_size > 0
        problems = []
        self.inputs = []
        for cfg in self.config.get("input", []):
            problems += self._check(cfg, graph_inputs, "input", batched)
            self.inputs.append((cfg["name"], pb_utils.triton_string_to_numpy(cfg["data_type"])))
        self.outputs = []
        for cfg in self.config.get("output", []):
            problems += self._check(cfg, graph_outputs, "output", batched)
            self.outputs.append((cfg["name"], pb_utils.triton_string_to_numpy(cfg["data_type"])))
        missing = sorted(set(graph_inputs) - {n for n, _ in self.inputs})
        if missing:
            problems.append(f"model inputs {missing} are not declared in config.pbtxt")
        if not self.inputs or not self.outputs:
            problems.append("config.pbtxt must declare at least one input and one output")
        if problems:
            raise pb_utils.TritonModelException(f"model '{self.name}': " + "; ".join(problems))

    def _check(self, cfg, graph, kind, batched):
        name = cfg["name"]
        if name not in graph:
            return [f"{kind} '{name}' is not in the ONNX graph (has {sorted(graph)})"]
        tensor = graph[name]
        have = _ORT_TO_TRITON.get(tensor.type)
        problems = []
        if have is None:
            problems.append(f"{kind} '{name}' has non-tensor type {tensor.type}; only tensors are served")
        elif have != cfg["data_type"]:
            problems.append(f"{kind} '{name}': config {cfg['data_type']}, model {tensor.type}")
        shape = [d if isinstance(d, int) else -1 for d in (tensor.shape or [])]
        # With a reshape block the model sees reshape.shape, Triton's clients see dims.
        dims = cfg["reshape"].get("shape", []) if "reshape" in cfg else cfg.get("dims", [])
        if tensor.shape is not None and not _shape_ok(dims, tensor.shape, batched):
            implied = len(dims) + (1 if batched else 0)
            problems.append(
                f"{kind} '{name}': model has rank {len(shape)} shape {shape}, config implies rank "
                f"{implied} (dims {cfg.get('dims', [])}, max_batch_size {self.max_batch_size})"
            )
        return problems

    def execute(self, requests):
        """Triton Python backend hook: run a batch of requests, one response each."""
        responses = [None] * len(requests)
        feeds: dict[str, list] = {}
        sizes: list[int] = []
        live: list[int] = []
        for idx, request in enumerate(requests):
            try:
                arrays = {}
                for name, dtype in self.inputs:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is None:
                        raise ValueError(f"input '{name}' is missing from the request")
                    arr = tensor.as_numpy()
                    arrays[name] = _to_str(arr) if dtype == np.object_ else arr.astype(dtype, copy=False)
                size = next(iter(arrays.values())).shape[0] if self.max_batch_size > 0 else 1
                if self.max_batch_size > 0 and size > self.max_batch_size:
                    raise ValueError(f"batch size {size} exceeds max_batch_size {self.max_batch_size}")
                for name, arr in arrays.items():
                    feeds.setdefault(name, []).append(arr)
                sizes.append(size)
                live.append(idx)
            except Exception as exc:  # one bad request must not fail the others
                responses[idx] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        if live:
            try:
                if self.max_batch_size > 0:
                    joined = {n: np.concatenate(parts, axis=0) for n, parts in feeds.items()}
                    results = self.session.run([n for n, _ in self.outputs], joined)
                    offsets = np.cumsum([0] + sizes)
                    for k, idx in enumerate(live):
                        lo, hi = offsets[k], offsets[k + 1]
                        responses[idx] = self._response(requests[idx], [r[lo:hi] for r in results])
                else:
                    for k, idx in enumerate(live):
                        one = {n: parts[k] for n, parts in feeds.items()}
                        results = self.session.run([n for n, _ in self.outputs], one)
                        responses[idx] = self._response(requests[idx], results)
            except Exception as exc:
                for idx in live:
                    responses[idx] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"onnxruntime failed: {exc}")
                    )
        return responses

    def _response(self, request, results):
        wanted = set(request.requested_output_names() or [n for n, _ in self.outputs])
        tensors = [
            pb_utils.Tensor(name, _to_bytes(value) if dtype == np.object_
                            else np.ascontiguousarray(value.astype(dtype, copy=False)))
            for (name, dtype), value in zip(self.outputs, results, strict=True)
            if name in wanted
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self):
        """Triton Python backend hook: release the session."""
        self.session = None
