"""Hardware awareness: GPU inventory through NVML (``pynvml``), instance planning, memory pre-flight.

* :func:`inventory` lists GPUs (name, total/free memory in bytes, compute capability, MIG mode and
  MIG instances) and host memory. Without a GPU or NVML driver it reports that, with the reason.
* :func:`plan_instances` chooses ``KIND_GPU`` or ``KIND_CPU`` and an instance count that fits a
  memory budget (``gpu_memory_budget_fraction`` of free GPU memory, ``host_memory_budget_fraction``
  of available host memory; per-instance memory = ``instance_memory_factor`` x model size).
* FP16 eligibility: native FP16 arithmetic from compute capability 5.3 (CUDA C Programming Guide,
  "Arithmetic Instructions" throughput table); Tensor Cores, where FP16 pays off most, from 7.0
  (Volta). :func:`fp16_eligibility` records both.
* :func:`preflight_memory_check` checks free memory before a load: GPU through NVML where present,
  host memory through ``psutil`` or ``/proc/meminfo`` otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Sequence

from ground.exceptions import InsufficientMemoryError, SettingsError
from ground.settings import Settings

log = logging.getLogger(__name__)

#: Minimum compute capability with native FP16 arithmetic (CUDA C Programming Guide).
FP16_MIN_COMPUTE_CAPABILITY = (5, 3)
#: Minimum compute capability with Tensor Cores (Volta, sm_70).
TENSOR_CORE_MIN_COMPUTE_CAPABILITY = (7, 0)


@dataclasses.dataclass(frozen=True)
class MigInstance:
    """One MIG device on a GPU.

    Attributes:
        index: MIG device index on its parent GPU.
        uuid: MIG device UUID (``MIG-...``), as ``CUDA_VISIBLE_DEVICES`` accepts it.
        memory_total_bytes: Memory of the instance, bytes.
        memory_free_bytes: Free memory of the instance, bytes.
    """

    index: int
    uuid: str
    memory_total_bytes: int
    memory_free_bytes: int


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One physical GPU.

    Attributes:
        index: NVML device index.
        name: Product name.
        uuid: Device UUID.
        memory_total_bytes: Total memory, bytes.
        memory_free_bytes: Free memory, bytes.
        compute_capability: ``(major, minor)``.
        mig_enabled: MIG mode currently enabled.
        mig_instances: MIG devices (empty when MIG is off).
    """

    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_free_bytes: int
    compute_capability: tuple[int, int]
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()

    @property
    def fp16(self) -> dict[str, bool]:
        """FP16 eligibility of this GPU (see :func:`fp16_eligibility`)."""
        return fp16_eligibility(self.compute_capability)


@dataclasses.dataclass(frozen=True)
class HardwareInventory:
    """GPUs and host memory seen by this process.

    Attributes:
        gpus: GPUs found through NVML (empty on a CPU-only host).
        nvml_available: Whether NVML initialised.
        reason: Why no GPU is reported (empty when GPUs were found).
        host_memory_total_bytes: Host RAM, bytes.
        host_memory_available_bytes: Host RAM available for new allocations, bytes.
        cpu_count: Logical CPUs.
        driver_version: NVIDIA driver version ("" without NVML).
    """

    gpus: tuple[GpuInfo, ...]
    nvml_available: bool
    reason: str
    host_memory_total_bytes: int
    host_memory_available_bytes: int
    cpu_count: int
    driver_version: str = ""

    @property
    def has_gpu(self) -> bool:
        """True when at least one GPU was found."""
        return bool(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for MLflow tags/artifacts)."""
        d = dataclasses.asdict(self)
        for g, gpu in zip(d["gpus"], self.gpus, strict=True):
            g["fp16"] = gpu.fp16
        return d


def fp16_eligibility(compute_capability: tuple[int, int]) -> dict[str, bool]:
    """FP16 eligibility for a compute capability.

    Returns:
        ``{"fp16": cc >= 5.3, "tensor_cores": cc >= 7.0}`` (CUDA C Programming Guide arithmetic
        throughput table; Volta introduced Tensor Cores).
    """
    cc = tuple(compute_capability)
    return {"fp16": cc >= FP16_MIN_COMPUTE_CAPABILITY, "tensor_cores": cc >= TENSOR_CORE_MIN_COMPUTE_CAPABILITY}


# ----------------------------------------------------------------------------- host memory
def host_memory() -> tuple[int, int]:
    """Host ``(total, available)`` memory in bytes (psutil, else ``/proc/meminfo``)."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)
    except ImportError:  # pragma: no cover - psutil is installed here
        return read_meminfo()


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int, int]:
    """``(MemTotal, MemAvailable)`` in bytes from ``/proc/meminfo`` (values there are kB).

    Falls back to MemFree + Buffers + Cached when MemAvailable is absent (kernels < 3.14).
    """
    values: dict[str, int] = {}
    with open(path) as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[key.strip()] = int(parts[0]) * 1024
    avail = values.get("MemAvailable")
    if avail is None:
        avail = values.get("MemFree", 0) + values.get("Buffers", 0) + values.get("Cached", 0)
    return values.get("MemTotal", 0), avail


# ----------------------------------------------------------------------------- NVML inventory
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def inventory() -> HardwareInventory:
    """List GPUs through NVML and host memory.

    On a host without a GPU (no driver, ``nvmlInit`` fails, or zero devices) the inventory has no
    GPUs and ``reason`` says why; nothing raises. NVML is always shut down again.
    """
    total, avail = host_memory()
    cpus = os.cpu_count() or 1
    try:
        import pynvml
    except ImportError:
        return HardwareInventory((), False, "pynvml (nvidia-ml-py) is not installed", total, avail, cpus)
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError_LibraryNotFound / DriverNotLoaded / ...
        return HardwareInventory((), False, f"NVML unavailable (no NVIDIA driver/GPU): {exc}",
                                 total, avail, cpus)
    try:
        driver = ""
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - optional detail
            pass
        gpus = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            gpus.append(_gpu_info(pynvml, i))
        reason = "" if gpus else "NVML reports 0 GPUs"
        return HardwareInventory(tuple(gpus), True, reason, total, avail, cpus, driver)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _gpu_info(pynvml: Any, index: int) -> GpuInfo:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
    mig_enabled = False
    migs: list[MigInstance] = []
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(h)
        mig_enabled = bool(current == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1))
    except Exception:  # noqa: BLE001 - GPUs without MIG support raise NotSupported
        mig_enabled = False
    if mig_enabled:
        for j in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except Exception:  # noqa: BLE001 - empty slot raises NotFound
                continue
            mm = pynvml.nvmlDeviceGetMemoryInfo(mh)
            migs.append(MigInstance(j, _text(pynvml.nvmlDeviceGetUUID(mh)), int(mm.total), int(mm.free)))
    return GpuInfo(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(h)),
        uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
        memory_total_bytes=int(mem.total),
        memory_free_bytes=int(mem.free),
        compute_capability=(int(major), int(minor)),
        mig_enabled=mig_enabled,
        mig_instances=tuple(migs),
    )


# ----------------------------------------------------------------------------- planning
@dataclasses.dataclass(frozen=True)
class InstancePlan:
    """Where and how many instances of a model to run.

    Attributes:
        kind: ``KIND_GPU`` or ``KIND_CPU``.
        count: Instances per listed GPU (or on the host for KIND_CPU).
        gpus: GPU indices used (KIND_GPU).
        per_instance_bytes: Planned memory per instance, bytes.
        budget_bytes: Memory budget per device (smallest across used GPUs), bytes.
        fp16: FP16 eligibility of the chosen GPUs (all must qualify); False flags for KIND_CPU.
        reason: Why this plan was chosen.
    """

    kind: str
    count: int
    gpus: tuple[int, ...]
    per_instance_bytes: int
    budget_bytes: int
    fp16: dict[str, bool]
    reason: str

    def instance_groups(self) -> list[Any]:
        """The plan as :class:`model_registry.triton_config.InstanceGroupSpec` entries."""
        from model_registry.triton_config import InstanceGroupSpec

        return [InstanceGroupSpec(kind=self.kind, count=self.count, gpus=self.gpus)]


def plan_instances(
    model_bytes: int,
    *,
    hardware: HardwareInventory | None = None,
    prefer_gpu: bool = True,
    max_instances: int | None = None,
    settings: Settings,
) -> InstancePlan:
    """Choose KIND_GPU or KIND_CPU and the instance count within a memory budget.

    Per-instance memory is ``instance_memory_factor * model_bytes`` (a heuristic: weights plus
    ONNX Runtime arenas; raise the factor for models with large activations). On GPUs the budget
    is ``gpu_memory_budget_fraction`` of each GPU's free memory (MIG-enabled GPUs: of their
    largest MIG instance); on the host it is ``host_memory_budget_fraction`` of available memory,
    and the count is also bounded by the CPU count. ``max_instances`` (default
    ``settings.max_instance_count``) bounds both.

    Args:
        model_bytes: Size of the model file, bytes (> 0).
        hardware: Inventory (default: :func:`inventory`).
        prefer_gpu: Use GPUs when present and one instance fits.
        max_instances: Upper bound on the count.
        settings: Settings the defaults come from.

    Raises:
        SettingsError: ``model_bytes`` or ``max_instances`` is not positive.
        InsufficientMemoryError: Not even one instance fits on the host (and no GPU fits).
    """
    s = settings
    if model_bytes <= 0:
        raise SettingsError(f"model_bytes={model_bytes} is invalid (expected > 0 bytes)")
    limit = s.max_instance_count if max_instances is None else max_instances
    if limit < 1:
        raise SettingsError(f"max_instances={limit} is invalid (expected >= 1)")
    hw = hardware or inventory()
    per = int(model_bytes * s.instance_memory_factor)
    gpu_note = hw.reason or "no GPU"
    if prefer_gpu and hw.gpus:
        budgets = {}
        for g in hw.gpus:
            free = (max((m.memory_free_bytes for m in g.mig_instances), default=0) if g.mig_enabled
                    else g.memory_free_bytes)
            budgets[g.index] = int(free * s.gpu_memory_budget_fraction)
        usable = [i for i, b in budgets.items() if b >= per]
        if usable:
            budget = min(budgets[i] for i in usable)
            count = max(1, min(limit, budget // per))
            chosen = [g for g in hw.gpus if g.index in usable]
            fp16 = {k: all(g.fp16[k] for g in chosen) for k in ("fp16", "tensor_cores")}
            return InstancePlan("KIND_GPU", int(count), tuple(usable), per, budget, fp16,
                                f"{len(usable)} GPU(s) fit {count} instance(s) of {per} bytes each "
                                f"within {s.gpu_memory_budget_fraction:.0%} of free memory")
        gpu_note = f"no GPU has {per} bytes free within the {s.gpu_memory_budget_fraction:.0%} budget"
    budget = int(hw.host_memory_available_bytes * s.host_memory_budget_fraction)
    if budget < per:
        raise InsufficientMemoryError(
            f"model needs {per} bytes per instance but the host budget is {budget} bytes "
            f"({s.host_memory_budget_fraction:.0%} of {hw.host_memory_available_bytes} available); "
            f"{gpu_note}"
        )
    count = max(1, min(limit, hw.cpu_count, budget // per))
    return InstancePlan("KIND_CPU", int(count), (), per, budget, {"fp16": False, "tensor_cores": False},
                        f"CPU: {gpu_note}; {count} instance(s) within "
                        f"{s.host_memory_budget_fraction:.0%} of available host memory")


def preflight_memory_check(
    required_bytes: int,
    *,
    kind: str = "KIND_CPU",
    gpus: Sequence[int] = (),
    hardware: HardwareInventory | None = None,
) -> dict[str, int]:
    """Check that ``required_bytes`` are free where the model will load, before the load.

    Args:
        required_bytes: Bytes the load needs on each device (or on the host), >= 0.
        kind: ``KIND_GPU`` (checked through NVML on each GPU in ``gpus``, all GPUs when empty) or
            ``KIND_CPU`` (host memory via psutil or ``/proc/meminfo``).
        gpus: GPU indices for KIND_GPU.
        hardware: Inventory (default: a fresh :func:`inventory`).

    Returns:
        ``{device label: free bytes}`` for the devices checked.

    Raises:
        InsufficientMemoryError: A device has less free memory than required (names the device,
            free and required bytes), or KIND_GPU was asked on a host without GPUs.
        SettingsError: ``kind`` is not KIND_CPU/KIND_GPU or ``required_bytes`` is negative.
    """
    if required_bytes < 0:
        raise SettingsError(f"required_bytes={required_bytes} is invalid (expected >= 0)")
    if kind not in {"KIND_CPU", "KIND_GPU"}:
        raise SettingsError(f"kind={kind!r} is invalid (expected KIND_CPU or KIND_GPU)")
    hw = hardware or inventory()
    if kind == "KIND_CPU":
        free = hw.host_memory_available_bytes
        if free < required_bytes:
            raise InsufficientMemoryError(
                f"host has {free} bytes available, the load needs {required_bytes} bytes"
            )
        return {"host": free}
    if not hw.gpus:
        raise InsufficientMemoryError(f"KIND_GPU load requested but this host has no GPU ({hw.reason})")
    by_index = {g.index: g for g in hw.gpus}
    wanted = list(gpus) or list(by_index)
    out = {}
    for i in wanted:
        g = by_index.get(i)
        if g is None:
            raise InsufficientMemoryError(f"GPU {i} is not present (GPUs: {sorted(by_index)})")
        if g.memory_free_bytes < required_bytes:
            raise InsufficientMemoryError(
                f"GPU {i} ({g.name}) has {g.memory_free_bytes} bytes free, the load needs "
                f"{required_bytes} bytes"
            )
        out[f"gpu{i}"] = g.memory_free_bytes
    return out
