"""PyTorch conversion: ``nn.Module`` to ONNX (dynamic batch axis) or TorchScript (traced in eval).

The converter of the ``pytorch`` MLflow flavour (registered in :mod:`model_registry.flavors`). Both
formats deep-copy the module, put it in ``eval()`` and export/trace under ``torch.no_grad()``;
TorchScript results must pass :func:`verify_torchscript`. TorchScript tensors are named
by NVIDIA's libtorch convention (``<name>__<index>``, outputs ``output__<index>``), so the same
repository loads on NVIDIA's image (``platform: "pytorch_libtorch"``) and on the local Python-based
``pytorch`` backend. ``torch`` is imported lazily.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any, Sequence

import numpy as np

from ground.exceptions import ModelConversionError, ModelValidationError
from ground.settings import Settings
from model_registry.conversion import (
    SAFE_NAME,
    ConvertedModel,
    TensorSchema,
    safe_tensor_name,
    sanitize_io_names,
    schema_from_signature,
)
from model_registry.triton_config import load_onnx


def _example_tensors(inputs: Sequence[TensorSchema], batch: int = 2, seed: int = 0) -> list[Any]:
    import torch

    rng = np.random.default_rng(seed)
    out = []
    for s in inputs:
        shape = [batch if i == 0 and d < 0 else (d if d > 0 else 8) for i, d in enumerate(s.shape)]
        if s.dtype.startswith("float"):
            arr = rng.normal(size=shape).astype(s.dtype)
        elif s.dtype == "bool":
            arr = rng.integers(0, 2, size=shape).astype(bool)
        else:
            arr = rng.integers(0, 10, size=shape).astype(s.dtype)
        out.append(torch.from_numpy(arr))
    return out


def convert_pytorch(
    module: Any,
    signature: Any = None,
    *,
    schema: Any = None,
    example: Sequence[Any] | None = None,
    output_names: Sequence[str] | None = None,
    target_opset: int | None = None,
    export_format: str = "onnx",
    model_name: str = "model",
    settings: Settings,
) -> ConvertedModel:
    """Convert a PyTorch module to ONNX (dynamic batch axis) or TorchScript (traced in eval).

    The module is deep-copied, put in ``eval()`` and exported/traced under ``torch.no_grad()``,
    so Dropout and BatchNorm are recorded in inference behaviour. The caller's module
    is not modified.

    Args:
        module: ``torch.nn.Module``.
        signature: MLflow ``ModelSignature`` (input names, dtypes, shapes; -1 axes are dynamic).
        schema: Explicit schema, wins over the signature.
        example: Example input tensors for tracing (default: seeded values of batch 2 built from
            the schema).
        output_names: Output tensor names (default ``output_0``...).
        target_opset: ONNX opset (default: ``settings.max_onnx_opset``, capped at 18, the
            highest the TorchScript-based exporter emits reliably).
        export_format: ``"onnx"`` or ``"torchscript"``.
        model_name: Used in messages.
        settings: Settings the defaults come from.

    Raises:
        ModelConversionError: No signature/schema, bad arguments, or the exporter failed.
        ModelValidationError: TorchScript result fails :func:`verify_torchscript`.
    """
    import torch

    if export_format not in {"onnx", "torchscript"}:
        raise ModelConversionError(
            f"export_format={export_format!r} is invalid (expected 'onnx' or 'torchscript')"
        )
    inputs = schema_from_signature(signature, schema, model_name=model_name, input_name="input")
    renamed = [dataclasses.replace(s, name=safe_tensor_name(s.name)) for s in inputs]
    mapping = {a.name: b.name for a, b in zip(inputs, renamed, strict=True) if a.name != b.name}
    args = tuple(example) if example is not None else tuple(_example_tensors(renamed))
    net = copy.deepcopy(module).eval()
    if export_format == "torchscript":
        with torch.no_grad():
            traced = torch.jit.trace(net, args)
        verify_torchscript(traced, module, args, atol=settings.torchscript_atol, model_name=model_name)
        # NVIDIA's libtorch backend binds tensors by the <name>__<index> naming convention.
        served = [dataclasses.replace(s, name=f"{s.name}__{i}") for i, s in enumerate(renamed)]
        mapping = {a.name: b.name for a, b in zip(inputs, served, strict=True)}
        with torch.no_grad():
            probe = _flat(traced(*args))
        outs = [TensorSchema(f"output__{i}", np.dtype(p.dtype).name, (-1,) + tuple(p.shape[1:]))
                for i, p in enumerate(probe)]
        return ConvertedModel(None, "torchscript", "pytorch", served, mapping, torchscript=traced,
                              notes=["traced in eval() under no_grad"], outputs=outs, converter="torch")

    import io

    with torch.no_grad():
        probe = net(*args)
    n_out = len(probe) if isinstance(probe, (tuple, list)) else 1
    out_names = list(output_names or [f"output_{i}" for i in range(n_out)])
    if len(out_names) != n_out or not all(SAFE_NAME.match(o) for o in out_names):
        raise ModelConversionError(
            f"output_names={out_names!r} is invalid (expected {n_out} names matching [A-Za-z_][A-Za-z0-9_]*)"
        )
    opset = min(target_opset or settings.max_onnx_opset, settings.max_onnx_opset, 18)
    dynamic_axes: dict[str, dict[int, str]] = {}
    for s in renamed:
        dyn = {i: ("batch" if i == 0 else f"{s.name}_dim{i}") for i, d in enumerate(s.shape) if d < 0}
        dyn.setdefault(0, "batch")
        dynamic_axes[s.name] = dyn
    for o in out_names:
        dynamic_axes[o] = {0: "batch"}
    buf = io.BytesIO()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                # torch's annotation omits file objects, which the TorchScript exporter writes to
                net, args, buf,  # type: ignore[arg-type]
                input_names=[s.name for s in renamed], output_names=out_names,
                dynamic_axes=dynamic_axes, opset_version=opset, dynamo=False,
                do_constant_folding=True,
            )
    except Exception as exc:  # exporter raises many types
        raise ModelConversionError(f"model {model_name!r}: torch.onnx.export failed: {exc}") from exc
    onx = load_onnx(buf.getvalue())
    onx, more = sanitize_io_names(onx)
    mapping.update(more)
    return ConvertedModel(onx, "onnx", "pytorch", renamed, mapping,
                          notes=[f"torch.onnx.export opset {opset}, dynamic batch axis, eval()"], converter="torch")


def verify_torchscript(
    scripted: Any,
    eager_module: Any,
    sample: Sequence[Any],
    *,
    atol: float,
    model_name: str = "model",
) -> dict[str, float]:
    """Check a TorchScript module against the eager module in eval mode.

    Two checks, both required: (1) max |TorchScript - eager-eval| <= ``atol`` on ``sample``;
    (2) two TorchScript calls on ``sample`` give identical outputs (a train-mode trace keeps
    Dropout active and fails this).

    Args:
        scripted: ``torch.jit.ScriptModule`` to check.
        eager_module: The source ``nn.Module`` (deep-copied and put in eval; not modified).
        sample: Input tensors (a fixed sample).
        atol: Max abs difference (the converter passes ``settings.torchscript_atol``, 1e-5).
        model_name: Used in messages.

    Returns:
        ``{"max_abs_diff": ..., "repeat_max_abs_diff": ...}``.

    Raises:
        ModelValidationError: Either check fails; the message gives both numbers.
    """
    import torch

    ref_net = copy.deepcopy(eager_module).eval()
    args = tuple(sample)
    with torch.no_grad():
        ref = _flat(ref_net(*args))
        a = _flat(scripted(*args))
        b = _flat(scripted(*args))
    if len(a) != len(ref):
        raise ModelValidationError(
            f"model {model_name!r}: TorchScript check failed: the module returns {len(a)} outputs, "
            f"the eager module {len(ref)}"
        )
    diff = max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, ref, strict=True))
    rep = max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, b, strict=True))
    problems = []
    if not np.isfinite(diff) or diff > atol:
        problems.append(
            f"TorchScript vs eager eval() max abs diff {diff:.3g} > {atol:g}"
        )
    if rep != 0.0:
        problems.append(f"two TorchScript calls differ (max abs diff {rep:.3g}; expected identical)")
    if problems:
        raise ModelValidationError(
            f"model {model_name!r}: TorchScript check failed: " + "; ".join(problems)
            + ". The module was probably traced in train mode: call model.eval() and trace "
            "under torch.no_grad() (model_registry.pytorch_conversion.convert_pytorch does this)"
        )
    return {"max_abs_diff": diff, "repeat_max_abs_diff": rep}


def _flat(out: Any) -> list[np.ndarray]:
    if isinstance(out, (tuple, list)):
        return [o.detach().cpu().numpy() for o in out]
    return [out.detach().cpu().numpy()]




# ----------------------------------------------------------------------------- TorchScript checks
def torchscript_runner(module: Any, inputs: Sequence[TensorSchema], outputs: Sequence[TensorSchema]):
    """``feeds -> {output__i: array}`` running a TorchScript module on CPU under ``no_grad``.

    Inputs are passed positionally in ``inputs`` order (the ``__<index>`` convention).
    """
    import torch

    names = [s.name for s in inputs]
    out_names = [o.name for o in outputs]

    def run(feeds):
        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names]
        with torch.no_grad():
            values = _flat(module(*args))
        return dict(zip(out_names, values, strict=True))

    return run


def validate_torchscript_for_push(
    converted: ConvertedModel,
    config: Any,
    sample: Any,
    *,
    model_name: str | None = None,
    settings: Settings,
) -> Any:
    """Pre-push checks of a TorchScript model and its config.

    The TorchScript analogue of :func:`model_registry.validation.validate_for_push`.

    Checks: the config agrees with the traced module's tensors (names, dtypes, ranks; the config
    says ``platform: "pytorch_libtorch"``); the module runs at batch 1 and, when batching, at batch
    ``min(max_batch_size, 3)`` with row 0 unchanged; outputs are finite. The eval-mode
    and determinism checks ran at conversion (:func:`verify_torchscript`).

    Returns:
        :class:`model_registry.validation.ValidationReport` (IR version 0, no opsets).

    Raises:
        ModelValidationError / ModelConfigError: Naming the model, the check and the tensor.
    """
    from model_registry.triton_config import declared_io, validate_config
    from model_registry.validation import ValidationReport, check_finite, outputs_match, take_rows

    name = model_name or config.name or "model"
    if config.platform != "pytorch_libtorch":
        raise ModelValidationError(
            f"model {name!r}: a TorchScript config needs platform \"pytorch_libtorch\" (has "
            f"platform {config.platform!r}, backend {config.backend!r})"
        )
    io = declared_io(converted.inputs, converted.outputs)
    validate_config(config, io, model_name=name)
    checks = ["torchscript_eval_determinism", "config"]
    run = torchscript_runner(converted.torchscript, converted.inputs, converted.outputs)
    n = min(len(np.asarray(v)) for v in sample.values())
    try:
        one = run(take_rows(sample, [0]))
        sizes = [1]
        b = min(int(config.max_batch_size), 3)
        if b >= 2:
            many = run(take_rows(sample, [i % n for i in range(b)]))
            sizes.append(b)
            for out, arr in one.items():
                if many[out].shape[0] != b or not outputs_match(many[out][:1], arr, 1e-5, 1e-4):
                    raise ModelValidationError(
                        f"model {name!r}: output {out!r} of row 0 differs between batch 1 and batch "
                        f"{b} (or loses the batch axis); the outputs depend on the batch"
                    )
    except ModelValidationError:
        raise
    except Exception as exc:  # torch raises RuntimeError for shape problems
        raise ModelValidationError(f"model {name!r} fails in TorchScript: {str(exc).splitlines()[0][:300]}") from exc
    checks.append("batching")
    check_finite(one, model_name=name)
    checks.append("finite")
    return ValidationReport(name, 0, {}, sizes, checks)
