"""The fallback replica: an INT8 copy of each published version, served as ``<model>__fallback``.

When the serving version answers 5xx or times out, the gateway retries the request on this replica
(:class:`repository_sync.routing.nginx_router.NginxRouter` with ``fallback=True``) instead of returning the
error: a lower-precision copy that answers is worth more than a 503 (the circuit-breaking pattern
of the reference article on degraded replicas).

:func:`publish_fallback` runs at the end of the publish pipeline's ``load_and_smoke`` stage, after
the version itself is READY:

1. **quantize** the staged ONNX with ONNX Runtime's dynamic quantization
   (``onnxruntime.quantization.quantize_dynamic``: INT8 weights, activations quantized per batch
   at run time; no calibration data needed);
2. **gate** it (:func:`gate`): the main gate's comparison against the source model's outputs on
   the same validation sample, with the looser fallback tolerances (``settings.fallback_atol`` /
   ``fallback_rtol``, and ``fallback_min_label_agreement``: the share of rows that must be within
   them), which are recorded with the result;
3. **sign and push** it as version ``<v>`` of ``<model>__fallback`` with the version's config
   (name changed) through :func:`repository_sync.publish.publish_version` (OpenSSF model-signing,
   verified at the destination);
4. **load** it through the same model-control call as the version itself (:func:`_load`, the one
   call site: verify the signature, load, wait READY, send the validation sample) and gate Triton's
   answers again (its ONNX Runtime build may run INT8 kernels differently from the local one);
5. **record** ``tritonflow.fallback*`` tags on the MLflow model version.

A model quantization cannot handle is *skipped with a reason* and the publish still succeeds: not
ONNX (TorchScript), ``quantize_dynamic`` fails, no operator has an INT8 kernel (tree ensembles,
linear classifiers of ``ai.onnx.ml``), the looser parity gate fails, or Triton refuses the
quantized model. A service not answering (Triton, S3, MLflow) is raised, so the task is retried.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ground.exceptions import DataError, ParityError, ServiceUnavailableError, TransientError
from ground.settings import Settings, get_settings

log = logging.getLogger(__name__)

#: Staged file names (under the version's staging folder).
QUANTIZED_FILENAME = "model.int8.onnx"
FALLBACK_REPORT_FILENAME = "fallback_report.json"
#: Operators that only exist in a model quantize_dynamic changed (INT8 kernels).
QUANTIZED_OP_TYPES = frozenset({
    "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "QLinearMatMul",
    "QLinearConv", "QAttention", "DynamicQuantizeLSTM", "QGemm", "QEmbedLayerNormalization",
})
#: Operators ``quantize_dynamic`` can replace with INT8 ones (ONNX Runtime's dynamic registry).
QUANTIZABLE_OP_TYPES = frozenset({"MatMul", "Gemm", "Conv", "Attention", "LSTM", "Gather", "EmbedLayerNormalization"})
#: ``tritonflow.fallback_status`` values.
STATUSES = ("published", "skipped", "disabled")


class QuantizationUnsupported(DataError):
    """ONNX Runtime's dynamic quantization cannot make an INT8 version of this model."""


@dataclasses.dataclass
class FallbackResult:
    """What happened to one version's fallback replica.

    Attributes:
        status: ``published`` (READY in Triton), ``skipped`` (reason says why) or ``disabled``.
        triton_model_name: ``<model>__fallback``.
        version: Triton version (same as the MLflow model version).
        reason: Why it was skipped (empty when published).
        atol, rtol, min_label_agreement: The fallback parity gate's tolerances.
        parity: Per output (:class:`FallbackGateResult`): max abs/rel error, share of rows within
            tolerance, passed; ``served_parity``: the same on Triton's answers.
        quantized_ops: Count per INT8 operator type in the quantized model.
        bytes: ``{"fp32": size, "int8": size}`` of the model files.
        signature_digest, key_id: Of the pushed replica. timings_s: per step, seconds.
    """

    status: str
    triton_model_name: str
    version: int
    reason: str = ""
    atol: float = 0.0
    rtol: float = 0.0
    min_label_agreement: float = 0.0
    parity: dict[str, Any] = dataclasses.field(default_factory=dict)
    served_parity: dict[str, Any] = dataclasses.field(default_factory=dict)
    quantized_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    signature_digest: str = ""
    key_id: str = ""
    timings_s: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (the pipeline state's ``fallback``)."""
        return dataclasses.asdict(self)

    def tags(self) -> dict[str, str]:
        """``tritonflow.fallback*`` tags for the MLflow model version (tolerances included)."""
        return {
            "tritonflow.fallback_status": self.status,
            "tritonflow.fallback_model": self.triton_model_name,
            "tritonflow.fallback_reason": self.reason[:2000],
            "tritonflow.fallback_tolerance": json.dumps(
                {"atol": self.atol, "rtol": self.rtol, "min_label_agreement": self.min_label_agreement}),
            "tritonflow.fallback": json.dumps(self.to_dict(), sort_keys=True, default=str)[:20000],
        }


# ---------------------------------------------------------------------------- steps
def quantize(model_path: str | Path, out_path: str | Path) -> dict[str, int]:
    """Dynamically quantize an ONNX model to INT8 weights (``onnxruntime.quantization``).

    Args:
        model_path: The converted FP32 ONNX model.
        out_path: Where the quantized model is written.

    Returns:
        ``{INT8 operator type: count}`` in the quantized model (never empty).

    Raises:
        QuantizationUnsupported: ``quantize_dynamic`` failed on this model, or no operator was
            quantized (the message lists the model's operator types).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        source = onnx.load(str(model_path))
    except Exception as exc:  # noqa: BLE001 - unreadable: nothing to quantize
        raise QuantizationUnsupported(f"onnxruntime.quantization.quantize_dynamic failed: the model does not "
                                      f"load ({type(exc).__name__}: {exc})"[:1000]) from None
    if not any(n.op_type in QUANTIZABLE_OP_TYPES for n in source.graph.node):
        raise QuantizationUnsupported(_no_kernel(source))
    try:
        quantize_dynamic(str(model_path), str(out_path), weight_type=QuantType.QInt8)
    except Exception as exc:  # noqa: BLE001 - any failure of the quantizer means "cannot handle"
        raise QuantizationUnsupported(
            f"onnxruntime.quantization.quantize_dynamic failed: {type(exc).__name__}: {exc}"[:1000]) from None
    model = onnx.load(str(out_path))
    ops: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in QUANTIZED_OP_TYPES:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    if not ops:
        raise QuantizationUnsupported(_no_kernel(source))
    return ops


def _no_kernel(model: Any) -> str:
    kinds = sorted({f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in model.graph.node})
    return (f"no operator has an INT8 kernel in ONNX Runtime's dynamic quantization (quantizable: "
            f"{', '.join(sorted(QUANTIZABLE_OP_TYPES))}); the model has {', '.join(kinds)[:600]}")


@dataclasses.dataclass
class FallbackGateResult:
    """Outcome of :func:`gate`.

    Attributes:
        rows: Rows compared.
        outputs: Per output: ``kind``, ``max_abs_error``, ``max_rel_error``, ``violations`` (rows
            out of tolerance / disagreeing), ``agreement`` (share of rows within tolerance),
            ``passed``.
        min_agreement: Smallest share of rows that must be within tolerance, per output.
    """

    rows: int
    outputs: dict[str, dict[str, Any]]
    min_agreement: float

    @property
    def passed(self) -> bool:
        """True when every output passed."""
        return all(o["passed"] for o in self.outputs.values())

    def describe_failures(self, model_name: str) -> str:
        """One sentence per failed output (share within tolerance, max errors)."""
        parts = [f"output {k!r}: {o['agreement']:.4f} of {self.rows} rows within tolerance "
                 f"(minimum {self.min_agreement:g}); max abs error {o['max_abs_error']:.4g}"
                 for k, o in self.outputs.items() if not o["passed"]]
        return f"fallback parity gate failed for model {model_name!r}: " + "; ".join(parts)


def gate(quantized: str | Path | Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
         feeds: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], *, atol: float, rtol: float,
         min_label_agreement: float, model_name: str) -> FallbackGateResult:
    """The fallback parity gate: quantized model vs the source model's outputs, looser tolerances.

    Same element comparison as the main gate (:func:`model_registry.parity.parity_check`: a row of
    a numeric output is within tolerance when ``|int8 - source| <= atol + rtol * |source|`` for
    every element; a row of a label output when the labels are equal), but an output passes when
    the share of rows within tolerance is >= ``min_label_agreement``, not only when all are: INT8
    activations move rows that sit on the decision boundary, whatever the tolerance (measured: an
    MLP whose probabilities are within 0.05 on 97 % of rows and off by 0.6 on the steepest ones).

    Args:
        quantized: The quantized ONNX file, or ``feeds -> {output: array}`` (e.g. the answers
            Triton served for ``feeds``).
        feeds: ``{input: array [N, ...]}``.
        expected: The source model's ``{output: array [N, ...]}``.
        atol: Absolute tolerance per element (``|a - b| <= atol + rtol * |b|``).
        rtol: Relative tolerance per element.
        min_label_agreement: Share 0-1 of rows within tolerance, per output.
        model_name: Used in messages.

    Returns:
        :class:`FallbackGateResult` (never raises on a failed gate).

    Raises:
        ParityError: The outputs of the quantized model cannot be matched with the source's.
    """
    from model_registry.parity import parity_check

    want = {k: np.asarray(v) for k, v in expected.items()}
    model = quantized if callable(quantized) else str(quantized)
    result = parity_check(lambda _sample: want, model, dict(feeds), source_sample=feeds,
                          atol=atol, rtol=rtol, min_label_agreement=min_label_agreement,
                          raise_on_failure=False, model_name=model_name)
    outputs = {}
    for name, o in result.outputs.items():
        agreement = 1.0 - o.violations / result.rows if result.rows else 1.0
        outputs[name] = {"kind": o.kind, "max_abs_error": float(o.max_abs_error),
                         "max_rel_error": float(o.max_rel_error), "violations": int(o.violations),
                         "agreement": round(agreement, 6), "passed": agreement >= min_label_agreement}
    return FallbackGateResult(result.rows, outputs, float(min_label_agreement))


def fallback_config(config_text: str, fallback_name: str) -> str:
    """The version's ``config.pbtxt`` renamed to ``fallback_name`` (same I/O, batching, instances)."""
    from model_registry.triton_config import parse_config, to_pbtxt

    msg = parse_config(config_text, fallback_name)
    msg.name = fallback_name
    return to_pbtxt(msg)


def _load(name: str, version: int, feeds: Mapping[str, np.ndarray],
          check: Callable[[Mapping[str, np.ndarray]], str], *, repository_uri: str, trusted_keys: str,
          settings: Settings, triton_url: str | None = None) -> dict:
    """Load the fallback on Triton through the version's own model-control path.

    THE Triton load call of the fallback (one call site): the same model-control path as the
    version itself (verify the signature, reconcile the model's desired versions under its shared
    model-control lease, wait READY, send the sample), then ``check(served outputs)``; a non-empty
    answer unloads the version again and raises :class:`ParityError` with it. Swap this body when model control changes;
    nothing else loads fallbacks.

    Returns:
        The load info (``versions``, ``load_s``, ``signature_digest``, ``key_id``).
    """
    from ground.coordination import coordination_store
    from repository_sync.triton.client import TritonModelControl
    from tritonflow.pipelines.publish_common import unload_version_if_ready

    with TritonModelControl(triton_url or settings.triton_http_url, repository=repository_uri,
                            trusted_keys=trusted_keys, endpoint_url=settings.s3_endpoint_url or None,
                            load_timeout_s=settings.load_timeout_s, coordination=coordination_store(settings),
                            holder=f"model_publish/{name}") as ctl:
        info, smoke = ctl.load_and_smoke_test(name, version, dict(feeds), None)
        problem = check(smoke.outputs)
        if problem:
            unload_version_if_ready(ctl, name, version)
            raise ParityError(problem)
        return info


# ---------------------------------------------------------------------------- the pipeline step
def publish_fallback(state: Mapping[str, Any], *, settings: Settings | None = None,
                     triton_url: str | None = None) -> dict[str, Any]:
    """Build, gate, sign, push, load and record the fallback replica of a published version.

    Args:
        state: The publish pipeline's state after the version was loaded (``model``, ``version``,
            ``triton_model_name``, ``model_path``, ``config_path``, ``sample_path``,
            ``expected_path``, ``repository_uri``, ``tracking_uri``).
        settings: Settings (default: from the environment); ``fallback_enabled`` and the
            ``fallback_*`` tolerances.
        triton_url: Triton HTTP ``host:port`` (default ``settings.triton_http_url``).

    Returns:
        :meth:`FallbackResult.to_dict`; the same facts are tagged on the MLflow model version.

    Raises:
        ServiceUnavailableError / TransientError: Triton, S3 or MLflow did not answer (retry).
        SignatureVerificationError: The pushed replica does not verify (never loaded).
        SigningKeyError: No signing key.
    """
    from repository_sync.routing.gateway_probe import fallback_model_name
    from tritonflow.pipelines.publish_common import open_registry, version_ref

    s = settings or get_settings()
    name, version = fallback_model_name(state["triton_model_name"]), int(state["version"])
    result = FallbackResult("disabled", name, version, atol=float(s.fallback_atol), rtol=float(s.fallback_rtol),
                            min_label_agreement=float(s.fallback_min_label_agreement))
    if s.fallback_enabled:
        try:
            _build_and_serve(state, result, s, triton_url)
        except (ServiceUnavailableError, TransientError):
            raise
        except QuantizationUnsupported as exc:
            _skip(result, str(exc))
    stage = Path(state["model_path"]).parent
    (stage / FALLBACK_REPORT_FILENAME).write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True,
                                                             default=str))
    reg = open_registry(s, state.get("tracking_uri"))
    reg.set_version_tags(version_ref(reg, state), result.tags())
    log.info("model %s version %s: fallback %s %s%s", state["model"], version, name, result.status,
             f" ({result.reason})" if result.reason else "")
    return result.to_dict()


def _skip(result: FallbackResult, reason: str) -> None:
    result.status, result.reason = "skipped", reason
    log.warning("fallback %s version %s skipped: %s", result.triton_model_name, result.version, reason)


def _build_and_serve(state: Mapping[str, Any], result: FallbackResult, s: Settings, triton_url: str | None) -> None:
    """Steps 1-4 of :func:`publish_fallback`, filling ``result``."""
    from ground.exceptions import RepositoryConflictError, SignatureVerificationError
    from repository_sync.publish import publish_version
    from tritonflow.pipelines.publish_common import read_npz
    from tritonflow.pipelines.publish_signing import ensure_signing_keys

    t0 = time.perf_counter()
    model_path = Path(state["model_path"])
    if state.get("export_format", "onnx") != "onnx" or model_path.suffix != ".onnx":
        raise QuantizationUnsupported(
            f"the served model is {state.get('export_format') or model_path.suffix}, not ONNX; "
            "onnxruntime.quantization only quantizes ONNX models")
    out = model_path.parent / QUANTIZED_FILENAME
    result.quantized_ops = quantize(model_path, out)
    result.bytes = {"fp32": model_path.stat().st_size, "int8": out.stat().st_size}
    t1 = time.perf_counter()
    feeds = read_npz(state["sample_path"])
    expected = read_npz(state["expected_path"])
    parity = gate(out, feeds, expected, atol=result.atol, rtol=result.rtol,
                  min_label_agreement=result.min_label_agreement, model_name=result.triton_model_name)
    result.parity = parity.outputs
    t2 = time.perf_counter()
    result.timings_s = {"quantize": round(t1 - t0, 4), "gate": round(t2 - t1, 4)}
    if not parity.passed:
        raise QuantizationUnsupported(parity.describe_failures(result.triton_model_name))

    keys = ensure_signing_keys(s, create=False)
    config = fallback_config(Path(state["config_path"]).read_text(), result.triton_model_name)
    try:
        publish_version(repository=state["repository_uri"], model_name=result.triton_model_name,
                        version=result.version, model_file=out, config=config, private_key=keys.private_key,
                        trusted_keys=str(keys.trusted_dir), endpoint_url=s.s3_endpoint_url or None)
    except RepositoryConflictError:  # versions are immutable: load and gate the one already there
        log.warning("fallback %s version %s is already in the repository with other content; it is kept, "
                    "verified and gated again", result.triton_model_name, result.version)
    t3 = time.perf_counter()
    # The gate again on what Triton serves: its ONNX Runtime build may compute INT8 differently
    # (measured: 0.016 on probabilities between ORT 1.19 in Triton and ORT 1.32 here).
    rows = max(1, int(s.validation_sample_rows))
    sent = {k: np.asarray(v)[:rows] for k, v in feeds.items()}

    def served_gate(served: Mapping[str, np.ndarray]) -> str:
        check = gate(lambda _feeds: dict(served), sent, {k: np.asarray(v)[:rows] for k, v in expected.items()},
                     atol=result.atol, rtol=result.rtol, min_label_agreement=result.min_label_agreement,
                     model_name=result.triton_model_name)
        result.served_parity = check.outputs
        return "" if check.passed else "as served by Triton: " + check.describe_failures(result.triton_model_name)

    try:
        info = _load(result.triton_model_name, result.version, sent, served_gate,
                     repository_uri=state["repository_uri"], trusted_keys=str(keys.trusted_dir), settings=s,
                     triton_url=triton_url)
    except (ServiceUnavailableError, TransientError, SignatureVerificationError):
        raise
    except DataError as exc:  # Triton refused the INT8 model, or what it serves fails the gate
        raise QuantizationUnsupported(f"Triton did not serve the quantized model: {exc}"[:1000]) from None
    result.signature_digest, result.key_id = info["signature_digest"], info["key_id"]
    result.timings_s.update(push=round(t3 - t2, 4), load=round(time.perf_counter() - t3, 4))
    result.status = "published"
