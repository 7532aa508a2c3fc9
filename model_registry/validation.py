"""Pre-push checks of a converted model and its ``config.pbtxt``, and the numerical parity gate.

Nothing is pushed unless :func:`validate_for_push` and :func:`model_registry.parity.parity_check` pass. The checks:

1. ``onnx.checker.check_model``.
2. IR version and every ``opset_import`` within the target serving release
   (``max_onnx_ir_version``, ``max_onnx_opset``, ``max_onnx_ml_opset``).
   :func:`make_compatible` re-exports with ``onnx.version_converter`` and lowers the IR version
   when that is safe; the caller then re-runs parity.
3. Outputs are dense tensors: ZipMap / sequence / map outputs are refused.
4. The config agrees with the model (names, dtypes, ranks), see
   :func:`model_registry.triton_config.check_config`.
5. The model runs in ONNX Runtime at batch 1 AND at a batch >= 2 whenever ``max_batch_size > 0``,
   and each row's output does not depend on the batch it was in.
6. No NaN/Inf in the outputs.

Parity (:func:`model_registry.parity.parity_check`, which runs the model through
:func:`make_runner`) compares the source model with the converted one per output with
``|onnx - source| <= atol + rtol * |source|`` (the ``numpy.isclose`` formula) and, for label
outputs (integer/bool/string), the fraction of agreeing rows.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ground.exceptions import ModelValidationError
from ground.settings import Settings
from model_registry.triton_config import OnnxLike, load_onnx, model_io, validate_config

if TYPE_CHECKING:  # pragma: no cover
    import onnx
    import onnxruntime
    from tritonclient.grpc import model_config_pb2

    from model_registry.conversion import TensorSchema

log = logging.getLogger(__name__)

#: ONNX element types that need at least this IR version (onnx/docs/IR.md, "Versioning").
_ELEM_TYPE_MIN_IR = {17: 9, 18: 9, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11}


# ----------------------------------------------------------------------------- IR / opset
@dataclasses.dataclass
class CompatReport:
    """IR/opset compatibility of a model with the target release.

    Attributes:
        ir_version: The model's IR version.
        opsets: ``{domain: version}`` (``""`` is ai.onnx).
        problems: One message per limit exceeded (empty: compatible).
    """

    ir_version: int
    opsets: dict[str, int]
    problems: list[str]

    @property
    def ok(self) -> bool:
        """True when no limit is exceeded."""
        return not self.problems


def check_onnx_compat(
    model: OnnxLike, settings: Settings, *, model_name: str = "model"
) -> CompatReport:
    """Compare ``ir_version`` and every ``opset_import`` with the target release's limits.

    Limits: ``settings.max_onnx_ir_version``, ``max_onnx_opset`` (ai.onnx),
    ``max_onnx_ml_opset`` (ai.onnx.ml); the release is ``settings.target_triton_release``.
    """
    s = settings
    proto = load_onnx(model)
    opsets: dict[str, int] = {}
    for o in proto.opset_import:
        opsets[o.domain] = max(opsets.get(o.domain, 0), o.version)
    how = (
        "re-export at the allowed versions: lower target_opset in the exporter (skl2onnx "
        "target_opset / torch.onnx.export opset_version), or onnx.version_converter."
        "convert_version(model, {op}) and set model.ir_version (model_registry.validation."
        "make_compatible does both when safe), then re-run parity"
    )
    problems = []
    target = s.target_triton_release
    if proto.ir_version > s.max_onnx_ir_version:
        problems.append(
            f"model {model_name!r} IR {proto.ir_version} > target max {s.max_onnx_ir_version} "
            f"({target}); {how.format(op=min(opsets.get('', s.max_onnx_opset), s.max_onnx_opset))}"
        )
    limits = {"": ("ai.onnx", s.max_onnx_opset), "ai.onnx": ("ai.onnx", s.max_onnx_opset),
              "ai.onnx.ml": ("ai.onnx.ml", s.max_onnx_ml_opset)}
    for domain, version in sorted(opsets.items()):
        if domain in limits and version > limits[domain][1]:
            label, limit = limits[domain]
            problems.append(
                f"model {model_name!r} opset {label} {version} > target max {limit} ({target}); "
                + how.format(op=s.max_onnx_opset)
            )
    return CompatReport(int(proto.ir_version), opsets, problems)


def ensure_onnx_compat(model: OnnxLike, settings: Settings, *, model_name: str = "model") -> CompatReport:
    """:func:`check_onnx_compat`, raising when a limit is exceeded.

    Raises:
        ModelValidationError: Names the model's IR/opset, the limit, the target release and how to
            re-export.
    """
    report = check_onnx_compat(model, settings, model_name=model_name)
    if report.problems:
        raise ModelValidationError("; ".join(report.problems))
    return report


def min_ir_version(model: "onnx.ModelProto") -> int:
    """Lowest IR version that can express ``model`` (its opsets and element types).

    Source: ``onnx.helper.VERSION_TABLE`` (release, IR, ai.onnx opset, ai.onnx.ml opset, ...) and
    the IR changelog for element types (float8: IR 9; int4/uint4: IR 10; float4: IR 11).
    """
    return max((need for need, _ in ir_requirements(model)), default=3)


def ir_requirements(model: "onnx.ModelProto") -> list[tuple[int, str]]:
    """``(IR version, what needs it)`` for every opset and element type of ``model``, highest first.

    Example: ``[(10, "opset ai.onnx.ml 5"), (10, "opset ai.onnx 21")]``.
    """
    from onnx import TensorProto, helper

    found: list[tuple[int, str]] = []
    for o in model.opset_import:
        col = {"": 2, "ai.onnx": 2, "ai.onnx.ml": 3}.get(o.domain)
        if col is None:
            continue
        rows = [r[1] for r in helper.VERSION_TABLE if r[col] is not None and r[col] >= o.version]
        found.append((min(rows) if rows else int(model.ir_version), f"opset {o.domain or 'ai.onnx'} {o.version}"))
    for t in sorted(_element_types(model)):
        if t in _ELEM_TYPE_MIN_IR:
            found.append((_ELEM_TYPE_MIN_IR[t], f"element type {TensorProto.DataType.Name(t)}"))
    return sorted(found, key=lambda x: -x[0])


def _element_types(model: "onnx.ModelProto") -> set[int]:
    g = model.graph
    types: set[int] = {t.data_type for t in g.initializer}
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.WhichOneof("value") == "tensor_type":
            types.add(v.type.tensor_type.elem_type)
    for n in g.node:
        for a in n.attribute:
            if a.name == "to" and n.op_type in {"Cast", "CastLike"}:
                types.add(a.i)
    return types


def downconvert_ir_version(model: "onnx.ModelProto", max_ir: int, *, model_name: str = "model") -> "onnx.ModelProto":
    """Return a copy of ``model`` with ``ir_version`` lowered to ``max_ir`` when that is safe.

    Safe means every opset and element type the model uses exists at ``max_ir``
    (:func:`min_ir_version`) and the result passes ``onnx.checker``.

    Raises:
        ModelValidationError: Lowering is not safe; the message names the needed IR version.
    """
    import onnx

    if model.ir_version <= max_ir:
        return model
    need = min_ir_version(model)
    if need > max_ir:
        blockers = [what for ir, what in ir_requirements(model) if ir > max_ir]
        raise ModelValidationError(
            f"model {model_name!r}: IR version cannot be lowered to {max_ir}: "
            + ", ".join(f"{w} needs IR {ir}" for ir, w in ir_requirements(model) if ir > max_ir)
            + f" (need IR {need}); re-export without {' and '.join(blockers)}"
        )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.ir_version = max_ir
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as exc:
        raise ModelValidationError(
            f"model {model_name!r}: lowered to IR {max_ir} the model is invalid: {exc}"
        ) from exc
    return out


def make_compatible(
    model: OnnxLike, settings: Settings, *, model_name: str = "model"
) -> tuple["onnx.ModelProto", list[str]]:
    """Bring a model within the target limits: opset via ``onnx.version_converter``, then IR.

    The caller must re-run the parity gate on the result.

    Returns:
        ``(model, notes)``; notes list what changed (empty: nothing to do).

    Raises:
        ModelValidationError: The version converter fails, or limits are still exceeded.
    """
    import onnx
    from onnx import version_converter

    s = settings
    proto = load_onnx(model)
    notes: list[str] = []
    # onnx.version_converter rewrites the default domain only: an ai.onnx.ml opset above the limit
    # blocks the model whatever happens to the IR version, so it is named first.
    ml = max((o.version for o in proto.opset_import if o.domain == "ai.onnx.ml"), default=0)
    if ml > s.max_onnx_ml_opset:
        raise ModelValidationError(
            f"model {model_name!r} cannot be served by {s.target_triton_release}: opset ai.onnx.ml "
            f"{ml} > target max {s.max_onnx_ml_opset} (onnx.version_converter cannot lower the "
            f"ai.onnx.ml domain); re-export with target_opset={{'': {s.max_onnx_opset}, "
            f"'ai.onnx.ml': {s.max_onnx_ml_opset}}} (skl2onnx/onnxmltools) or raise "
            "TRITONFLOW_MAX_ONNX_ML_OPSET for a newer image"
        )
    default = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if default > s.max_onnx_opset:
        try:
            proto = version_converter.convert_version(proto, s.max_onnx_opset)
            onnx.checker.check_model(proto)
        except Exception as exc:  # converter raises RuntimeError / ValidationError
            raise ModelValidationError(
                f"model {model_name!r}: onnx.version_converter cannot lower opset {default} to "
                f"{s.max_onnx_opset}: {exc}; re-export with target_opset={s.max_onnx_opset}"
            ) from exc
        notes.append(f"opset {default} -> {s.max_onnx_opset} (onnx.version_converter)")
    if proto.ir_version > s.max_onnx_ir_version:
        before = proto.ir_version
        try:
            proto = downconvert_ir_version(proto, s.max_onnx_ir_version, model_name=model_name)
        except ModelValidationError as exc:
            raise ModelValidationError(
                f"model {model_name!r} cannot be served by {s.target_triton_release}: IR {before} > "
                f"target max {s.max_onnx_ir_version}, and {exc}"
            ) from exc
        notes.append(f"IR {before} -> {proto.ir_version}")
    ensure_onnx_compat(proto, s, model_name=model_name)
    return proto, notes


# ----------------------------------------------------------------------------- outputs
def check_outputs_are_tensors(model: OnnxLike, *, model_name: str = "model") -> None:
    """Refuse outputs that are not dense tensors (ZipMap, sequence, map).

    Raises:
        ModelValidationError: Names each such output and its type, and how to re-convert.
    """
    _, outputs = model_io(model)
    bad = [o for o in outputs if not o.is_tensor]
    if bad:
        listed = ", ".join(f"output {o.name!r} has type {o.onnx_type}" for o in bad)
        raise ModelValidationError(
            f"model {model_name!r}: {listed}; Triton serves only tensors. Re-convert with "
            "ZipMap disabled: skl2onnx convert_sklearn(..., options={id(clf): {'zipmap': False}}) "
            "(model_registry.conversion.convert_sklearn does this), which gives "
            "probabilities as tensor(float) [N, C]"
        )


# ----------------------------------------------------------------------------- running models
def make_session(model: "OnnxLike | onnxruntime.InferenceSession") -> "onnxruntime.InferenceSession":
    """ONNX Runtime CPU session from a proto, path, bytes, or an existing session (returned as is)."""
    import onnxruntime as ort

    if isinstance(model, ort.InferenceSession):
        return model
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    proto = load_onnx(model)
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def make_runner(model: Any, model_name: str = "model") -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """``feeds -> {output: array}`` for an ONNX model/session.

    ``model`` itself is returned when it is already such a callable (e.g. :func:`torchscript_runner`).
    """
    import onnxruntime as ort

    if callable(model) and not isinstance(model, ort.InferenceSession):
        return model
    sess = make_session(model)
    return lambda feeds: _run(sess, dict(feeds), model_name, batch=None)


def take_rows(feeds: Mapping[str, np.ndarray], idx: Sequence[int]) -> dict[str, np.ndarray]:
    """The rows ``idx`` (repeats allowed) of every feed: ``{input: array [len(idx), ...]}``."""
    return {k: np.asarray(v)[list(idx)] for k, v in feeds.items()}


def _n_rows(feeds: Mapping[str, np.ndarray]) -> int:
    return min(len(np.asarray(v)) for v in feeds.values()) if feeds else 0


def check_batching(
    model: "OnnxLike | onnxruntime.InferenceSession",
    sample: Mapping[str, np.ndarray],
    *,
    max_batch_size: int,
    model_name: str = "model",
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> dict[str, Any]:
    """Run the model at batch 1 and at a batch >= 2 in ONNX Runtime.

    With ``max_batch_size > 0`` every input and output must declare a dynamic axis 0, the model
    must run at batch 1 and at batch ``b = min(max_batch_size, 3)`` (when ``b >= 2``), and row 0's
    outputs in the batch must equal its batch-1 outputs. With ``max_batch_size == 0`` the model
    runs once on ``sample`` as given (full shapes).

    Args:
        model: ONNX model or session.
        sample: ``{input name: array}``; rows along axis 0 (repeated when fewer than ``b``).
        max_batch_size: The config's value.
        model_name: Used in messages.
        atol: Absolute tolerance of the row-independence comparison.
        rtol: Relative tolerance of the row-independence comparison.

    Returns:
        ``{"batch_sizes": [...], "outputs": {name: array of the batch-1 run}}``.

    Raises:
        ModelValidationError: A fixed batch axis with batching on; a failed run (the message names
            the batch size); or outputs that depend on the batch composition.
    """
    sess = make_session(model)
    if max_batch_size <= 0:
        outs = _run(sess, dict(sample), model_name, batch=None)
        return {"batch_sizes": [], "outputs": outs}
    fixed = []
    # Inputs only: ONNX Runtime reports *inferred* output shapes (a baked Reshape shows up as a
    # fixed output batch), which the runs below diagnose with the failing batch size instead.
    for t in sess.get_inputs():
        if t.shape and isinstance(t.shape[0], int) and t.shape[0] > 0:
            fixed.append(f"{t.name!r} shape {list(t.shape)}")
    if fixed:
        raise ModelValidationError(
            f"model {model_name!r}: max_batch_size {max_batch_size} needs a dynamic batch axis but "
            f"the model fixes axis 0 ({'; '.join(fixed)}); re-export with a dynamic batch axis, or "
            "serve with max_batch_size: 0, full dims and no dynamic_batching"
        )
    n = _n_rows(sample)
    if n < 1:
        raise ModelValidationError(f"model {model_name!r}: validation sample has no rows (expected >= 1)")
    one = _run(sess, take_rows(sample, [0]), model_name, batch=1)
    sizes = [1]
    b = min(max_batch_size, 3)
    if b >= 2:
        idx = [i % n for i in range(b)]
        many = _run(sess, take_rows(sample, idx), model_name, batch=b)
        sizes.append(b)
        for name, arr in one.items():
            got = np.asarray(many[name])
            if got.shape[0] != b:
                raise ModelValidationError(
                    f"model {model_name!r}: output {name!r} has {got.shape[0]} rows for a batch of "
                    f"{b} (expected {b}); the graph does not keep the batch axis"
                )
            if not outputs_match(got[:1], np.asarray(arr), atol, rtol):
                raise ModelValidationError(
                    f"model {model_name!r}: output {name!r} of row 0 differs between batch 1 and "
                    f"batch {b}; the outputs depend on the batch (e.g. batch statistics)"
                )
    return {"batch_sizes": sizes, "outputs": one}


def outputs_match(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    """Same shape and values: floats within ``atol + rtol * |b|`` (NaN equals NaN), others equal."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return bool(np.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True))
    return bool(np.array_equal(a, b))


def _run(sess: Any, feeds: dict[str, np.ndarray], model_name: str, batch: int | None) -> dict[str, np.ndarray]:
    try:
        values = sess.run(None, feeds)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument types
        first = str(exc).strip().splitlines()[0][:400]
        at = f"at batch size {batch}" if batch is not None else "on the validation sample"
        hint = (
            "; the batch axis is declared dynamic but the graph fixes it (e.g. a Reshape baked to "
            "the traced batch size): re-export without hard-coded batch sizes, or serve with "
            "max_batch_size: 0"
            if batch and batch > 1
            else ""
        )
        raise ModelValidationError(
            f"model {model_name!r} fails {at} in onnxruntime: {first}{hint}"
        ) from exc
    return {o.name: v for o, v in zip(sess.get_outputs(), values, strict=True)}


def check_finite(outputs: Mapping[str, Any], *, model_name: str = "model") -> None:
    """Refuse NaN or Inf in float outputs.

    Raises:
        ModelValidationError: Names the output, the count of non-finite values and their first rows.
    """
    for name, value in outputs.items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "fc":
            continue
        bad = ~np.isfinite(arr)
        if bad.any():
            rows = np.unique(np.nonzero(bad.reshape(bad.shape[0], -1) if arr.ndim else bad.reshape(1, 1))[0])
            raise ModelValidationError(
                f"model {model_name!r}: output {name!r} has {int(bad.sum())} NaN/Inf values "
                f"(rows {rows[:10].tolist()}); expected finite values"
            )


# ----------------------------------------------------------------------------- all checks
@dataclasses.dataclass
class ValidationReport:
    """What :func:`validate_for_push` checked.

    Attributes:
        model_name: Model name.
        ir_version: The model's IR version.
        opsets: ``{domain: version}``.
        batch_sizes: Batch sizes the model was run at.
        checks: Names of the checks that passed, in order.
    """

    model_name: str
    ir_version: int
    opsets: dict[str, int]
    batch_sizes: list[int]
    checks: list[str]


def validate_for_push(
    model: OnnxLike,
    config: "model_config_pb2.ModelConfig",
    sample: Mapping[str, np.ndarray],
    *,
    model_name: str | None = None,
    settings: Settings,
) -> ValidationReport:
    """Run every pre-push check; the first failure raises and nothing may be pushed.

    Order: ``onnx.checker``; IR/opset limits; tensor outputs; config vs model; ONNX Runtime runs
    at batch 1 and >= 2 (when batching) with row independence; no NaN/Inf.

    Args:
        model: Converted ONNX model.
        config: The ``ModelConfig`` that will serve it.
        sample: Validation feeds ``{input name: array}``.
        model_name: Used in messages (default ``config.name``).
        settings: Settings the defaults come from.

    Raises:
        ModelValidationError: (or :class:`ModelConfigError`) naming the model, the check and the
            tensor or limit involved.
    """
    import onnx

    s = settings
    name = model_name or config.name or "model"
    proto = load_onnx(model)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise ModelValidationError(f"model {name!r}: onnx.checker refused the model: {exc}") from exc
    checks = ["onnx.checker"]
    compat = ensure_onnx_compat(proto, s, model_name=name)
    checks.append("ir_opset")
    check_outputs_are_tensors(proto, model_name=name)
    checks.append("tensor_outputs")
    validate_config(config, proto, model_name=name)
    checks.append("config")
    run = check_batching(proto, sample, max_batch_size=int(config.max_batch_size), model_name=name)
    checks.append("batching")
    check_finite(run["outputs"], model_name=name)
    checks.append("finite")
    return ValidationReport(name, compat.ir_version, compat.opsets, run["batch_sizes"], checks)


# ----------------------------------------------------------------------------- validation sample
def to_feeds(data: Any, inputs: Sequence["TensorSchema"]) -> dict[str, np.ndarray]:
    """Turn an input example / dataset into ONNX feeds ``{input name: array}`` per the schema.

    Accepts a ``pandas.DataFrame`` (columns picked by each schema entry's ``columns``, or all
    columns for a single input), a dict of arrays, or one array (single input).

    Raises:
        ModelValidationError: Missing columns/inputs, or values not castable to the dtype.
    """
    import pandas as pd

    feeds: dict[str, np.ndarray] = {}
    for s in inputs:
        try:
            if isinstance(data, pd.DataFrame):
                if s.columns:
                    missing = [c for c in s.columns if c not in data.columns]
                    if missing:
                        raise ModelValidationError(
                            f"validation data lacks columns {missing} for input {s.name!r} "
                            f"(has {list(data.columns)})"
                        )
                    arr = data[list(s.columns)].to_numpy()
                elif s.name in data.columns:
                    arr = data[[s.name]].to_numpy()
                elif len(inputs) == 1:
                    arr = data.to_numpy()
                else:
                    raise ModelValidationError(f"validation data has no column for input {s.name!r}")
            elif isinstance(data, Mapping):
                if s.name not in data:
                    raise ModelValidationError(
                        f"validation data lacks input {s.name!r} (has {sorted(data)})"
                    )
                arr = np.asarray(data[s.name])
            elif len(inputs) == 1:
                arr = np.asarray(data)
            else:
                raise ModelValidationError(
                    f"validation data of type {type(data).__name__} cannot feed {len(inputs)} inputs "
                    "(expected a DataFrame or a dict)"
                )
            if s.dtype == "object":
                feeds[s.name] = string_tensor(arr)
                continue
            if s.dtype.startswith(("int", "uint")) and np.asarray(arr).dtype.kind == "f":
                if not np.all(np.isfinite(arr)):
                    raise ModelValidationError(
                        f"validation data for integer input {s.name!r} has missing values"
                    )
            feeds[s.name] = np.asarray(arr).astype(s.dtype)
        except (TypeError, ValueError) as exc:
            raise ModelValidationError(
                f"validation data for input {s.name!r} cannot be cast to {s.dtype}: {exc}"
            ) from exc
    return feeds


def string_tensor(values: Any) -> np.ndarray:
    """A ``tensor(string)`` feed: an object array of ``str``; missing values become ``"nan"``.

    ``None``/``NaN``/``pandas.NA`` become :data:`model_registry.conversion.MISSING_STRING` (the
    category skl2onnx writes for scikit-learn's ``NaN`` category); bytes are decoded as UTF-8.
    """
    import pandas as pd

    from model_registry.conversion import MISSING_STRING

    arr = np.asarray(values, dtype=object)
    out = np.empty(arr.shape, dtype=object)
    flat, res = arr.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat):
        if v is None or (not isinstance(v, (str, bytes)) and pd.isna(v)):
            res[i] = MISSING_STRING
        elif isinstance(v, bytes):
            res[i] = v.decode("utf-8")
        else:
            res[i] = str(v)
    return out


def validation_sample(
    inputs: Sequence["TensorSchema"],
    *,
    dataset: Any = None,
    input_example: Any = None,
    rows: int | None = None,
    perturbation: float | None = None,
    seed: int = 0,
    settings: Settings,
) -> dict[str, np.ndarray]:
    """Build the validation sample: the user's dataset, else the input example plus perturbations.

    With a dataset, its rows are used as they are (the first ``rows`` rows when ``rows`` is given).
    With an input example, the example rows come first unchanged, then copies with seeded Gaussian
    noise of std ``perturbation * scale`` added to float inputs (scale: the column's std in the
    example, else its absolute value, else 1); integer inputs (ids, labels) are repeated unchanged.

    Args:
        inputs: The conversion input schema.
        dataset: User dataset (DataFrame, dict or array).
        input_example: MLflow input example (same kinds).
        rows: Rows in a perturbed sample (default ``settings.validation_sample_rows``).
        perturbation: Relative noise std (default ``settings.validation_perturbation``).
        seed: Seed of ``numpy.random.default_rng``.
        settings: Settings the defaults come from.

    Raises:
        ModelValidationError: Neither a dataset nor an input example, or they do not fit the schema.
    """
    s = settings
    if dataset is not None:
        feeds = to_feeds(dataset, inputs)
        return take_rows(feeds, range(min(_n_rows(feeds), rows))) if rows else feeds
    if input_example is None:
        raise ModelValidationError(
            "no validation data: pass dataset=... or log the model with an input_example "
            "(expected one of the two)"
        )
    base = to_feeds(input_example, inputs)
    n = _n_rows(base)
    if n < 1:
        raise ModelValidationError("input example has no rows (expected >= 1)")
    total = max(rows or s.validation_sample_rows, n)
    rel = s.validation_perturbation if perturbation is None else perturbation
    rng = np.random.default_rng(seed)
    out = {}
    idx = [i % n for i in range(total)]
    for name, arr in base.items():
        tiled = arr[idx].copy()
        if arr.dtype.kind == "f" and total > n:
            scale = arr.std(axis=0) if n > 1 else np.zeros(arr.shape[1:])
            scale = np.where(scale > 0, scale, np.abs(arr).mean(axis=0))
            scale = np.where(scale > 0, scale, 1.0)
            noise = rng.normal(size=tiled[n:].shape) * rel * scale
            tiled[n:] = (tiled[n:] + noise).astype(arr.dtype)
        out[name] = tiled
    return out
