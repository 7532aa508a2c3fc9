"""Build, parse and check Triton ``config.pbtxt`` files with protobuf (never string templates).

The message type is :class:`tritonclient.grpc.model_config_pb2.ModelConfig` (Triton's own
``model_config.proto``); text is produced and read by :mod:`repository_sync.model_config` (the one
parser and serialiser, re-exported here as :func:`parse_config` and :func:`to_pbtxt`).

Rules applied (Triton model configuration documentation, "Maximum Batch Size" and "Inputs and
Outputs" in ``shared/cases``):

* With ``max_batch_size > 0`` the batch axis is implicit: ``dims`` holds the model shape WITHOUT
  the leading batch axis, and that axis must be dynamic in the model.
* A model whose batch axis is fixed (e.g. exported with batch 1) is served with
  ``max_batch_size: 0``, full ``dims`` and no ``dynamic_batching`` (a warning is logged), or refused
  (``on_fixed_batch="refuse"``) (a).
* Data types come from the model: ``tensor(int64)`` becomes ``TYPE_INT64``.
* A batched tensor whose only axis is the batch axis (shape ``[N]``) is written as ``dims: [1]``
  with ``reshape { shape: [] }`` (Triton's documented idiom for rank-1 batched tensors).

Example::

    cfg = build_config("churn_head", "model.onnx", max_batch_size=64,
                       dynamic_batching=DynamicBatchingSpec(max_queue_delay_us=500))
    text = to_pbtxt(cfg)
    validate_config(parse_config(text), "model.onnx", model_name="churn_head")
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence, Union, cast

from ground.exceptions import ModelConfigError
from repository_sync.model_config import parse_config as parse_config  # the one config.pbtxt parser
from repository_sync.model_config import to_pbtxt as to_pbtxt

if TYPE_CHECKING:  # pragma: no cover
    import onnx
    from tritonclient.grpc import model_config_pb2

log = logging.getLogger(__name__)

#: ONNX Runtime tensor type string -> Triton data type name (Triton "Datatypes" table).
ONNX_TO_TRITON: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
    "tensor(bfloat16)": "TYPE_BF16",
}
TRITON_TO_ONNX: dict[str, str] = {v: k for k, v in ONNX_TO_TRITON.items()}

#: Triton data type name -> numpy dtype string (TYPE_STRING is served as bytes objects).
TRITON_TO_NUMPY: dict[str, str] = {
    "TYPE_BOOL": "bool", "TYPE_UINT8": "uint8", "TYPE_UINT16": "uint16", "TYPE_UINT32": "uint32",
    "TYPE_UINT64": "uint64", "TYPE_INT8": "int8", "TYPE_INT16": "int16", "TYPE_INT32": "int32",
    "TYPE_INT64": "int64", "TYPE_FP16": "float16", "TYPE_FP32": "float32", "TYPE_FP64": "float64",
    "TYPE_STRING": "object",
}

OnnxLike = Union["onnx.ModelProto", str, os.PathLike, bytes]
#: An ONNX model, or the ``(inputs, outputs)`` of a model that is not ONNX (:func:`declared_io`).
ModelIO = Union[OnnxLike, "tuple[Sequence[TensorInfo], Sequence[TensorInfo]]"]
Dim = Union[int, str, None]  # fixed size, symbolic name, or unknown


# ----------------------------------------------------------------------------- ONNX I/O reading
def load_onnx(model: OnnxLike) -> "onnx.ModelProto":
    """Return an ``onnx.ModelProto`` from a proto, a file path or serialized bytes.

    Raises:
        ModelConfigError: The path does not exist or the bytes are not an ONNX model.
    """
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model))
        path = Path(model)
        if not path.is_file():
            raise ModelConfigError(f"ONNX model path {str(path)!r} does not exist (expected a .onnx file)")
        return onnx.load(str(path))
    except ModelConfigError:
        raise
    except Exception as exc:  # onnx raises DecodeError / various
        raise ModelConfigError(f"cannot read ONNX model from {model!r:.200}: {exc}") from exc


def describe_onnx_type(type_proto: Any) -> str:
    """Format an ONNX ``TypeProto`` the way ONNX Runtime prints it.

    Examples: ``tensor(float)``, ``seq(map(int64,tensor(float)))``.
    """
    which = type_proto.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({_elem_name(type_proto.tensor_type.elem_type)})"
    if which == "sequence_type":
        return f"seq({describe_onnx_type(type_proto.sequence_type.elem_type)})"
    if which == "map_type":
        key = _elem_name(type_proto.map_type.key_type)
        return f"map({key},{describe_onnx_type(type_proto.map_type.value_type)})"
    if which == "optional_type":
        return f"optional({describe_onnx_type(type_proto.optional_type.elem_type)})"
    if which == "sparse_tensor_type":
        return f"sparse_tensor({_elem_name(type_proto.sparse_tensor_type.elem_type)})"
    return str(which)


def _elem_name(elem_type: int) -> str:
    from onnx import TensorProto

    return TensorProto.DataType.Name(elem_type).lower()


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One model input or output as declared by the ONNX graph.

    Attributes:
        name: Tensor name in the graph.
        onnx_type: ONNX Runtime style type string, e.g. ``tensor(int64)``.
        shape: Dimensions: ``int`` fixed size, ``str`` symbolic name, ``None`` unknown; ``None``
            for the whole shape when the graph declares no shape.
    """

    name: str
    onnx_type: str
    shape: tuple[Dim, ...] | None

    @property
    def is_tensor(self) -> bool:
        """True for dense tensors (Triton serves nothing else)."""
        return self.onnx_type.startswith("tensor(")

    @property
    def triton_type(self) -> str | None:
        """Triton data type name, or ``None`` when Triton has no equivalent."""
        return ONNX_TO_TRITON.get(self.onnx_type)

    @property
    def rank(self) -> int | None:
        """Number of axes, ``None`` when unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def batch_axis_dynamic(self) -> bool:
        """True when axis 0 exists and is symbolic or unknown (a dynamic batch axis)."""
        shape = self.shape
        return shape is not None and len(shape) > 0 and not isinstance(shape[0], int)

    def shape_text(self) -> str:
        """Shape as ``[batch, 12]`` (symbolic names kept, unknown axes as ``?``)."""
        if self.shape is None:
            return "unknown"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"


def _tensor_info(value_info: Any) -> TensorInfo:
    t = value_info.type
    onnx_type = describe_onnx_type(t)
    shape: tuple[Dim, ...] | None = None
    if t.WhichOneof("value") == "tensor_type" and t.tensor_type.HasField("shape"):
        dims: list[Dim] = []
        for d in t.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return TensorInfo(value_info.name, onnx_type, shape)


def model_io(model: ModelIO) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """Return the graph's (inputs, outputs), initializers excluded from the inputs.

    ``model`` may also be an ``(inputs, outputs)`` pair of :class:`TensorInfo` (a model that is
    not ONNX, e.g. TorchScript, see :func:`declared_io`); it is returned as lists.

    Raises:
        ModelConfigError: The model cannot be read.
    """
    if isinstance(model, tuple) and len(model) == 2 and all(
            isinstance(t, TensorInfo) for side in model for t in side):
        return list(model[0]), list(model[1])
    proto = load_onnx(cast(OnnxLike, model))  # not an (inputs, outputs) pair
    inits = {i.name for i in proto.graph.initializer}
    inputs = [_tensor_info(v) for v in proto.graph.input if v.name not in inits]
    outputs = [_tensor_info(v) for v in proto.graph.output]
    return inputs, outputs


#: numpy dtype name -> ONNX Runtime style tensor type.
NUMPY_TO_ONNX: dict[str, str] = {TRITON_TO_NUMPY[t]: o for o, t in ONNX_TO_TRITON.items() if t in TRITON_TO_NUMPY}


def declared_io(inputs: Sequence[Any], outputs: Sequence[Any]) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """``(inputs, outputs)`` as :class:`TensorInfo` from schema items.

    Items have ``name``, ``dtype`` (numpy name) and ``shape`` (``-1`` axes become symbolic, axis 0
    ``"batch"``).

    Used for models that are not ONNX (TorchScript: :class:`model_registry.conversion.TensorSchema`
    items), so :func:`build_config` and :func:`check_config` treat them alike.
    """
    def info(t: Any) -> TensorInfo:
        dims = tuple(("batch" if i == 0 else f"d{i}") if int(d) < 0 else int(d) for i, d in enumerate(t.shape))
        return TensorInfo(t.name, NUMPY_TO_ONNX.get(str(t.dtype), f"tensor({t.dtype})"), dims)

    return [info(t) for t in inputs], [info(t) for t in outputs]


# ----------------------------------------------------------------------------- building configs
@dataclasses.dataclass(frozen=True)
class InstanceGroupSpec:
    """One ``instance_group`` entry.

    Attributes:
        kind: ``KIND_CPU`` or ``KIND_GPU``.
        count: Instances per device (per GPU listed, or on the host for KIND_CPU), >= 1.
        gpus: GPU indices for KIND_GPU (empty: all visible GPUs).
    """

    kind: str = "KIND_CPU"
    count: int = 1
    gpus: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class DynamicBatchingSpec:
    """The ``dynamic_batching`` block.

    Attributes:
        preferred_batch_sizes: Batch sizes the scheduler tries to form (each <= max_batch_size).
        max_queue_delay_us: Longest time a request waits for a batch to fill, in microseconds.
    """

    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0


def build_config(
    name: str,
    model: ModelIO,
    *,
    max_batch_size: int = 0,
    dynamic_batching: DynamicBatchingSpec | None = None,
    instance_groups: Sequence[InstanceGroupSpec] = (),
    version_policy: str | Sequence[int] | None = None,
    default_model_filename: str = "model.onnx",
    backend: str = "onnxruntime",
    on_fixed_batch: str = "disable_batching",
    parameters: dict[str, str] | None = None,
    platform: str = "",
) -> "model_config_pb2.ModelConfig":
    """Build a ``ModelConfig`` from an ONNX model's declared inputs and outputs.

    Args:
        name: Triton model name.
        model: ONNX model (proto, path or bytes); names, data types and shapes come from it. Or an
            ``(inputs, outputs)`` pair from :func:`declared_io` (TorchScript).
        max_batch_size: Largest batch Triton may form; ``0`` disables batching and writes the full
            model shape into ``dims``. With ``> 0`` every input and output must have a dynamic
            axis 0, which is left out of ``dims``.
        dynamic_batching: Optional dynamic batching block (ignored, with a warning, when batching
            ends up disabled).
        instance_groups: Instance groups; empty leaves Triton's default.
        version_policy: ``None`` (Triton default: latest 1), ``"latest"``, ``"latest:N"``,
            ``"all"`` or a sequence of version numbers (``specific``).
        default_model_filename: File name inside the version folder.
        backend: Triton backend name (``onnxruntime``).
        on_fixed_batch: What to do when ``max_batch_size > 0`` but the model fixes axis 0:
            ``"disable_batching"`` (serve with ``max_batch_size: 0`` and full dims, warn) or
            ``"refuse"`` (raise).
        parameters: Optional string ``parameters`` map (e.g. ``intra_op_thread_count``).
        platform: Triton platform instead of a backend (``"pytorch_libtorch"`` for TorchScript:
            NVIDIA's image runs its libtorch backend, the local runtime the Python-based
            ``pytorch`` backend); ``backend`` is then left empty.

    Returns:
        The ``ModelConfig`` message; render it with :func:`to_pbtxt`.

    Raises:
        ModelConfigError: A tensor is not a dense tensor (e.g. a ZipMap output), has a type Triton
            cannot serve, has no declared shape, the batch axis is fixed with
            ``on_fixed_batch="refuse"``, or an argument is out of range.
    """
    from tritonclient.grpc import model_config_pb2 as pb

    if max_batch_size < 0:
        raise ModelConfigError(f"max_batch_size={max_batch_size} is invalid (expected an int >= 0)")
    if on_fixed_batch not in {"disable_batching", "refuse"}:
        raise ModelConfigError(
            f"on_fixed_batch={on_fixed_batch!r} is invalid (expected 'disable_batching' or 'refuse')"
        )
    inputs, outputs = model_io(model)
    for t in inputs + outputs:
        if not t.is_tensor:
            raise ModelConfigError(
                f"model {name!r}: tensor {t.name!r} has type {t.onnx_type}; Triton serves only "
                "dense tensors (re-convert with ZipMap disabled, see model_registry.conversion)"
            )
        if t.triton_type is None:
            raise ModelConfigError(f"model {name!r}: tensor {t.name!r} type {t.onnx_type} has no Triton data type")
        if t.shape is None:
            raise ModelConfigError(
                f"model {name!r}: tensor {t.name!r} declares no shape; re-export with static ranks"
            )

    batched = max_batch_size > 0
    if batched:
        fixed = [t for t in inputs + outputs if not t.batch_axis_dynamic]
        if fixed:
            t = fixed[0]
            msg = (
                f"model {name!r}: max_batch_size {max_batch_size} needs a dynamic batch axis but "
                f"tensor {t.name!r} has shape {t.shape_text()} (axis 0 fixed"
                + (f" to {t.shape[0]}" if t.shape else "")
                + "); re-export with a dynamic batch axis"
            )
            if on_fixed_batch == "refuse":
                raise ModelConfigError(msg + ", or build with max_batch_size=0")
            log.warning("%s; serving with max_batch_size 0, full dims and no dynamic batching", msg)
            batched = False
            max_batch_size = 0

    cfg = pb.ModelConfig(name=name, max_batch_size=max_batch_size)
    if platform:
        cfg.platform = platform
    else:
        cfg.backend = backend
    cfg.default_model_filename = default_model_filename
    for spec, group in ((inputs, cfg.input), (outputs, cfg.output)):
        for t in spec:
            io = group.add()
            io.name = t.name
            io.data_type = pb.DataType.Value(t.triton_type)
            shape = t.shape
            assert shape is not None  # every tensor's shape was checked above
            dims = [_config_dim(d) for d in (shape[1:] if batched else shape)]
            if batched and not dims:
                io.dims.extend([1])
                io.reshape.SetInParent()  # reshape { shape: [] }: the tensor is [batch] in the model
            else:
                io.dims.extend(dims)

    if dynamic_batching is not None:
        if not batched:
            log.warning("model %r: dynamic_batching dropped because max_batch_size is 0", name)
        else:
            too_big = [b for b in dynamic_batching.preferred_batch_sizes if b < 1 or b > max_batch_size]
            if too_big:
                raise ModelConfigError(
                    f"preferred_batch_sizes={list(dynamic_batching.preferred_batch_sizes)} has {too_big} "
                    f"(expected values in 1..max_batch_size={max_batch_size})"
                )
            if dynamic_batching.max_queue_delay_us < 0:
                raise ModelConfigError(
                    f"max_queue_delay_us={dynamic_batching.max_queue_delay_us} is invalid (expected >= 0)"
                )
            db = cfg.dynamic_batching
            db.SetInParent()
            db.preferred_batch_size.extend(dynamic_batching.preferred_batch_sizes)
            db.max_queue_delay_microseconds = int(dynamic_batching.max_queue_delay_us)

    for g in instance_groups:
        if g.kind not in {"KIND_CPU", "KIND_GPU"}:
            raise ModelConfigError(f"instance group kind={g.kind!r} is invalid (expected KIND_CPU or KIND_GPU)")
        if g.count < 1:
            raise ModelConfigError(f"instance group count={g.count} is invalid (expected >= 1)")
        ig = cfg.instance_group.add()
        ig.kind = pb.ModelInstanceGroup.Kind.Value(g.kind)
        ig.count = g.count
        if g.kind == "KIND_GPU":
            ig.gpus.extend(g.gpus)

    _apply_version_policy(cfg, version_policy)
    for key, value in (parameters or {}).items():
        cfg.parameters[key].string_value = str(value)
    return cfg


def _config_dim(d: Dim) -> int:
    return d if isinstance(d, int) else -1


def _apply_version_policy(cfg: Any, policy: str | Sequence[int] | None) -> None:
    if policy is None:
        return
    if isinstance(policy, str):
        if policy == "all":
            cfg.version_policy.all.SetInParent()
            return
        if policy == "latest" or policy.startswith("latest:"):
            n = 1 if policy == "latest" else policy.split(":", 1)[1]
            try:
                num = int(n)
            except ValueError:
                num = 0
            if num < 1:
                raise ModelConfigError(f"version_policy={policy!r} is invalid (expected 'latest:N' with N >= 1)")
            cfg.version_policy.latest.num_versions = num
            return
        raise ModelConfigError(
            f"version_policy={policy!r} is invalid (expected 'latest', 'latest:N', 'all' or a list of versions)"
        )
    versions = list(policy)
    if not versions or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in versions):
        raise ModelConfigError(
            f"version_policy={versions!r} is invalid (expected a non-empty list of positive int versions)"
        )
    cfg.version_policy.specific.versions.extend(versions)


# ----------------------------------------------------------------------------- text <-> message
def read_config(path: str | os.PathLike) -> "model_config_pb2.ModelConfig":
    """Read and parse a ``config.pbtxt`` file.

    Raises:
        ModelConfigError: The file is missing or does not parse.
    """
    p = Path(path)
    if not p.is_file():
        raise ModelConfigError(f"config path {str(p)!r} does not exist (expected a config.pbtxt file)")
    return parse_config(p.read_text(), source=str(p))


def data_type_name(value: int) -> str:
    """``DataType`` enum value -> name, e.g. ``TYPE_INT64``."""
    from tritonclient.grpc import model_config_pb2 as pb

    return pb.DataType.Name(value)


def instance_kind_name(value: int) -> str:
    """``ModelInstanceGroup.Kind`` enum value -> name, e.g. ``KIND_CPU``."""
    from tritonclient.grpc import model_config_pb2 as pb

    return pb.ModelInstanceGroup.Kind.Name(value)


# ----------------------------------------------------------------------------- checking configs
def check_config(
    config: "model_config_pb2.ModelConfig", model: ModelIO, *, model_name: str | None = None
) -> list[str]:
    """List every way ``config`` contradicts the ONNX model (empty list: consistent).

    Checks (each problem names the model and the tensor):

    * every config input/output exists in the model (unknown names), every model input is
      declared in the config;
    * data types: ``config TYPE_FP32, model tensor(int64)`` (config first, model second);
    * rank: the model's rank against the rank the config implies (``dims``, plus one implicit
      batch axis when ``max_batch_size > 0``), with a suggested ``dims``;
    * fixed sizes agree; with ``max_batch_size > 0`` the model's axis 0 is dynamic (a);
    * ``dynamic_batching`` only with ``max_batch_size > 0``; preferred sizes within it.

    Args:
        config: Parsed ``ModelConfig``.
        model: The ONNX model it should serve, or the ``(inputs, outputs)`` of a model that is
            not ONNX (:func:`declared_io`).
        model_name: Name used in messages (default: ``config.name``).
    """
    name = model_name or config.name or "<unnamed>"
    inputs, outputs = model_io(model)
    mbs = int(config.max_batch_size)
    batched = mbs > 0
    problems: list[str] = []
    for kind, declared, actual in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {t.name: t for t in actual}
        seen = set()
        for io in declared:
            seen.add(io.name)
            t = by_name.get(io.name)
            if t is None:
                problems.append(
                    f"model {name!r}: config {kind} {io.name!r} is not a model {kind} "
                    f"(model {kind}s: {', '.join(sorted(by_name)) or 'none'})"
                )
                continue
            problems.extend(_check_tensor(name, kind, io, t, mbs))
        if kind == "input":
            for missing in sorted(set(by_name) - seen):
                problems.append(
                    f"model {name!r}: model input {missing!r} is missing from the config "
                    f"(expected an input entry with data_type {by_name[missing].triton_type})"
                )
    if config.HasField("dynamic_batching"):
        if not batched:
            problems.append(
                f"model {name!r}: dynamic_batching is set while max_batch_size is 0 "
                "(expected no dynamic_batching block, or max_batch_size > 0)"
            )
        bad = [b for b in config.dynamic_batching.preferred_batch_size if b < 1 or b > mbs]
        if batched and bad:
            problems.append(
                f"model {name!r}: preferred_batch_size {bad} outside 1..max_batch_size={mbs}"
            )
    return problems


def _check_tensor(name: str, kind: str, io: Any, t: TensorInfo, mbs: int) -> list[str]:
    problems: list[str] = []
    where = f"model {name!r}, {kind} {t.name!r}"
    if not t.is_tensor:
        problems.append(
            f"{where}: model type {t.onnx_type} is not a tensor; Triton serves only tensors "
            "(re-convert with ZipMap disabled)"
        )
        return problems
    cfg_type = data_type_name(io.data_type)
    if t.triton_type != cfg_type:
        problems.append(
            f"{where}: data type mismatch: config {cfg_type}, model {t.onnx_type} "
            f"(expected data_type: {t.triton_type})"
        )
    if t.shape is None:
        return problems
    batched = mbs > 0
    dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    implied_rank = len(dims) + (1 if batched else 0)
    model_dims = list(t.shape)
    if batched:
        suggestion = [_config_dim(d) for d in model_dims[1:]] if model_dims else []
        if not suggestion and model_dims:
            suggestion_text = "dims: [1] with reshape { shape: [] }"
        else:
            suggestion_text = f"dims: {suggestion}"
    else:
        suggestion_text = f"dims: {[_config_dim(d) for d in model_dims]}"
    if implied_rank != len(model_dims):
        implied = (
            f"an implicit batch axis (max_batch_size {mbs}) plus {len(dims)} dims {list(io.dims)}"
            if batched
            else f"{len(dims)} dims {list(io.dims)} (max_batch_size 0, no batch axis)"
        )
        problems.append(
            f"{where}: rank mismatch: the model tensor has rank {len(model_dims)} "
            f"(shape {t.shape_text()}) but the config implies rank {implied_rank} ({implied}); "
            + (
                "with max_batch_size > 0 leave the batch axis out of dims: "
                if batched
                else "expected "
            )
            + suggestion_text
        )
        return problems
    if batched and model_dims and isinstance(model_dims[0], int):
        problems.append(
            f"{where}: max_batch_size {mbs} needs a dynamic batch axis but the model fixes axis 0 "
            f"to {model_dims[0]} (shape {t.shape_text()}); re-export with a dynamic batch axis, or "
            f"serve with max_batch_size: 0 and dims: {[_config_dim(d) for d in model_dims]} "
            "and no dynamic_batching"
        )
    own = model_dims[1:] if batched else model_dims
    for i, (c, m) in enumerate(zip(dims, own, strict=True)):  # ranks agree: checked above
        if isinstance(m, int) and c != -1 and c != m:
            axis = i + (1 if batched else 0)
            problems.append(
                f"{where}: axis {axis} is {c} in the config but {m} in the model "
                f"(shape {t.shape_text()}; expected {suggestion_text})"
            )
    return problems


def validate_config(
    config: "model_config_pb2.ModelConfig", model: ModelIO, *, model_name: str | None = None
) -> None:
    """Raise when :func:`check_config` finds any problem.

    Raises:
        ModelConfigError: One line per problem, each naming the model and the tensor.
    """
    problems = check_config(config, model, model_name=model_name)
    if problems:
        raise ModelConfigError(
            "config.pbtxt contradicts the model:\n  - " + "\n  - ".join(problems)
        )


def config_summary(config: "model_config_pb2.ModelConfig") -> dict[str, Any]:
    """Small JSON-able summary (for MLflow tags): batching, instance groups, version policy."""
    groups = [
        {"kind": instance_kind_name(g.kind), "count": int(g.count), "gpus": list(g.gpus)}
        for g in config.instance_group
    ]
    summary: dict[str, Any] = {
        "name": config.name,
        "backend": config.backend or config.platform,
        "max_batch_size": int(config.max_batch_size),
        "instance_groups": groups,
        "dynamic_batching": None,
        "version_policy": config.version_policy.WhichOneof("policy_choice"),
    }
    if config.HasField("dynamic_batching"):
        summary["dynamic_batching"] = {
            "preferred_batch_sizes": list(config.dynamic_batching.preferred_batch_size),
            "max_queue_delay_us": int(config.dynamic_batching.max_queue_delay_microseconds),
        }
    return summary


def iter_io(config: "model_config_pb2.ModelConfig") -> Iterable[tuple[str, Any]]:
    """Yield ``("input"|"output", io)`` pairs of a config."""
    for io in config.input:
        yield "input", io
    for io in config.output:
        yield "output", io
