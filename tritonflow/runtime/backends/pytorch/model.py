"""Python-based Triton backend named ``pytorch`` that serves TorchScript models with real libtorch.

The ``nvidia-pytriton`` Triton build has no native PyTorch (libtorch) backend. Triton maps
``platform: "pytorch_libtorch"`` to the backend name ``pytorch`` and treats a folder
``<backend-directory>/pytorch/model.py`` as a Python-based backend, so a TorchScript version
(``model.pt``) loads here unchanged, and the same repository serves on NVIDIA's image with its
native libtorch backend.

It follows the libtorch backend's conventions and honours the model configuration:

* tensors bind by the ``<name>__<index>`` naming convention: inputs are passed to ``forward`` in
  index order, outputs ``<name>__<i>`` are the i-th element of the returned tuple (or the single
  returned tensor); names without the convention bind in config order;
* data types and ranks (``dims`` plus the implicit batch axis when ``max_batch_size > 0``) are
  checked on every request; requests larger than ``max_batch_size`` are refused;
* dynamic batching: the requests of one ``execute`` call are concatenated along the batch axis,
  run in one call and split back per request;
* ``parameters { key: "intra_op_thread_count" }`` sets torch's intra-op threads (default 1).

The module runs in ``eval()`` under ``torch.no_grad()``. This file runs inside Triton's Python
stub and imports only numpy, torch and ``triton_python_backend_utils``.
"""

import json
import os
import re

import numpy as np
import triton_python_backend_utils as pb_utils

_INDEX = re.compile(r"__(\d+)$")


def _order(entries):
    """Config entries sorted by their ``__<index>`` suffix (config order when absent)."""
    keyed = []
    for pos, cfg in enumerate(entries):
        m = _INDEX.search(cfg["name"])
        keyed.append((int(m.group(1)) if m else pos, pos, cfg))
    return [cfg for _, _, cfg in sorted(keyed)]


class TritonPythonModel:
    """Serves one TorchScript model version through libtorch."""

    def initialize(self, args):
        """Triton Python backend hook: read the config and load the TorchScript module."""
        import torch

        self.torch = torch
        self.config = json.loads(args["model_config"])
        self.name = self.config.get("name", args.get("model_name", "?"))
        self.max_batch_size = int(self.config.get("max_batch_size", 0))
        filename = self.config.get("default_model_filename") or "model.pt"
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(
                f"model '{self.name}' version {args['model_version']}: file {filename} not found"
            )
        params = {k: v.get("string_value") for k, v in self.config.get("parameters", {}).items()}
        threads = params.get("intra_op_thread_count")
        torch.set_num_threads(int(threads) if threads else 1)
        try:
            self.module = torch.jit.load(path, map_location="cpu").eval()
        except Exception as exc:  # torch raises RuntimeError for a file that is not TorchScript
            raise pb_utils.TritonModelException(
                f"model '{self.name}': {filename} is not a TorchScript module: {exc}"
            ) from exc
        self.inputs = [(c["name"], pb_utils.triton_string_to_numpy(c["data_type"]), [int(d) for d in c.get("dims", [])])
                       for c in _order(self.config.get("input", []))]
        self.outputs = [(c["name"], pb_utils.triton_string_to_numpy(c["data_type"]))
                        for c in _order(self.config.get("output", []))]
        if not self.inputs or not self.outputs:
            raise pb_utils.TritonModelException(
                f"model '{self.name}': config.pbtxt must declare at least one input and one output"
            )

    def _array(self, request, name, dtype, dims):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise ValueError(f"input '{name}' is missing from the request")
        arr = tensor.as_numpy()
        if arr.dtype != dtype:
            raise ValueError(f"input '{name}' has data type {arr.dtype}, config says {np.dtype(dtype)}")
        rank = len(dims) + (1 if self.max_batch_size > 0 else 0)
        if arr.ndim != rank:
            raise ValueError(f"input '{name}' has rank {arr.ndim} (shape {list(arr.shape)}), config implies "
                             f"rank {rank} (dims {dims}, max_batch_size {self.max_batch_size})")
        return arr

    def execute(self, requests):
        """Triton Python backend hook: run a batch of requests, one response each."""
        responses = [None] * len(requests)
        parts: dict[str, list] = {}
        sizes: list[int] = []
        live: list[int] = []
        for idx, request in enumerate(requests):
            try:
                arrays = {n: self._array(request, n, t, d) for n, t, d in self.inputs}
                size = next(iter(arrays.values())).shape[0] if self.max_batch_size > 0 else 1
                if self.max_batch_size > 0 and size > self.max_batch_size:
                    raise ValueError(f"batch size {size} exceeds max_batch_size {self.max_batch_size}")
                for n, arr in arrays.items():
                    parts.setdefault(n, []).append(arr)
                sizes.append(size)
                live.append(idx)
            except Exception as exc:  # one bad request must not fail the others
                responses[idx] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        if not live:
            return responses
        try:
            if self.max_batch_size > 0:
                joined = [np.concatenate(parts[n], axis=0) for n, _, _ in self.inputs]
                results = self._run(joined)
                offsets = np.cumsum([0] + sizes)
                for k, idx in enumerate(live):
                    lo, hi = offsets[k], offsets[k + 1]
                    responses[idx] = self._response(requests[idx], [r[lo:hi] for r in results])
            else:
                for k, idx in enumerate(live):
                    results = self._run([parts[n][k] for n, _, _ in self.inputs])
                    responses[idx] = self._response(requests[idx], results)
        except Exception as exc:
            for idx in live:
                responses[idx] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"libtorch failed: {exc}"))
        return responses

    def _run(self, arrays):
        torch = self.torch
        with torch.no_grad():
            out = self.module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        values = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(values) < len(self.outputs):
            raise ValueError(f"the module returned {len(values)} tensors, config declares {len(self.outputs)} outputs")
        return [v.detach().cpu().numpy() for v in values[: len(self.outputs)]]

    def _response(self, request, results):
        wanted = set(request.requested_output_names() or [n for n, _ in self.outputs])
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value.astype(dtype, copy=False)))
                   for (name, dtype), value in zip(self.outputs, results, strict=True) if name in wanted]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self):
        """Triton Python backend hook: release the module."""
        self.module = None
