"""Hardware inventory, FP16 eligibility, instance planning and memory pre-flight.

The NVML tests marked "fake NVML" replace pynvml functions (``nvmlInit``, ``nvmlDeviceGetCount``,
...) with monkeypatch because this host has no GPU; nothing below the pynvml function level is
faked, and the CPU-only test uses the real NVML library of this host.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from ground.exceptions import InsufficientMemoryError, SettingsError
from model_registry.hardware import (
    HardwareInventory,
    fp16_eligibility,
    inventory,
    plan_instances,
    preflight_memory_check,
    read_meminfo,
)

GB = 1024**3


def _cpu_host(avail=8 * GB, cpus=4):
    return HardwareInventory((), False, "NVML unavailable", 16 * GB, avail, cpus)


@pytest.fixture
def fake_nvml(monkeypatch):
    """Fake NVML at the pynvml function level: GPU 0 = A100 with MIG on (2 instances), GPU 1 = T4."""
    import pynvml

    gpus = {
        0: dict(name="NVIDIA A100-SXM4-40GB", uuid="GPU-aaa", total=40 * GB, free=39 * GB, cc=(8, 0), mig=1,
                migs=[("MIG-1", 20 * GB, 19 * GB), ("MIG-2", 10 * GB, 9 * GB)]),
        1: dict(name="Tesla T4", uuid="GPU-bbb", total=16 * GB, free=6 * GB, cc=(7, 5), mig=None, migs=[]),
    }
    calls = {"init": 0, "shutdown": 0}

    def not_supported(*_a):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def get_mig_mode(h):
        if gpus[h]["mig"] is None:
            not_supported()
        return (gpus[h]["mig"], gpus[h]["mig"])

    def memory(h):
        if isinstance(h, tuple):
            _, total, free = gpus[h[0]]["migs"][h[1]]
            return SimpleNamespace(total=total, free=free, used=total - free)
        return SimpleNamespace(total=gpus[h]["total"], free=gpus[h]["free"], used=0)

    def uuid(h):
        return gpus[h[0]]["migs"][h[1]][0] if isinstance(h, tuple) else gpus[h]["uuid"]

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.__setitem__("init", calls["init"] + 1))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1))
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "550.54.15")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(gpus))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: gpus[h]["name"])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", uuid)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCudaComputeCapability", lambda h: gpus[h]["cc"])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", get_mig_mode)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxMigDeviceCount", lambda h: 7)

    def mig_handle(h, j):
        if j >= len(gpus[h]["migs"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return (h, j)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", mig_handle)
    return calls


def test_host_without_gpu_reports_it_and_plans_cpu(settings):
    """Real NVML (no fake): on this CPU-only host the inventory says why there is no GPU."""
    hw = inventory()
    if hw.has_gpu:
        pytest.skip("this host has a GPU")
    assert hw.reason and hw.host_memory_total_bytes > 0 and hw.cpu_count >= 1
    plan = plan_instances(10 * 1024**2, hardware=hw, settings=settings)
    assert plan.kind == "KIND_CPU" and plan.count >= 1 and plan.gpus == ()
    assert plan.instance_groups()[0].kind == "KIND_CPU"
    assert "CPU" in plan.reason


def test_inventory_lists_gpus_memory_compute_capability_and_mig(fake_nvml):
    """Fake NVML (pynvml functions monkeypatched)."""
    hw = inventory()
    assert fake_nvml == {"init": 1, "shutdown": 1}
    assert [g.name for g in hw.gpus] == ["NVIDIA A100-SXM4-40GB", "Tesla T4"]
    a100, t4 = hw.gpus
    assert a100.memory_total_bytes == 40 * GB and a100.memory_free_bytes == 39 * GB
    assert a100.compute_capability == (8, 0) and t4.compute_capability == (7, 5)
    assert a100.mig_enabled and [m.uuid for m in a100.mig_instances] == ["MIG-1", "MIG-2"]
    assert a100.mig_instances[1].memory_total_bytes == 10 * GB
    assert not t4.mig_enabled and t4.mig_instances == ()
    assert hw.driver_version == "550.54.15" and hw.to_dict()["gpus"][1]["fp16"]["tensor_cores"]


@pytest.mark.parametrize("cc, fp16, tc", [((5, 2), False, False), ((5, 3), True, False),
                                         ((6, 1), True, False), ((7, 0), True, True), ((9, 0), True, True)])
def test_fp16_eligibility_follows_compute_capability(cc, fp16, tc):
    assert fp16_eligibility(cc) == {"fp16": fp16, "tensor_cores": tc}


def test_gpu_plan_fits_the_memory_budget(fake_nvml, settings):
    """Fake NVML (pynvml functions monkeypatched)."""
    hw = inventory()
    s = dataclasses.replace(settings, gpu_memory_budget_fraction=0.8, instance_memory_factor=2.0)
    # 1 GiB model -> 2 GiB per instance. T4 budget 0.8 * 6 = 4.8 GiB -> 2 instances; the MIG A100's
    # largest instance has 19 GiB free -> 15.2 GiB budget; the smaller budget bounds the count.
    plan = plan_instances(GB, hardware=hw, settings=s, max_instances=8)
    assert plan.kind == "KIND_GPU" and plan.gpus == (0, 1) and plan.count == 2
    assert plan.per_instance_bytes == 2 * GB
    assert plan.fp16 == {"fp16": True, "tensor_cores": True}
    assert plan_instances(GB, hardware=hw, settings=s, max_instances=1).count == 1


def test_model_too_big_for_every_gpu_falls_back_to_cpu_with_reason(fake_nvml, settings):
    """Fake NVML (pynvml functions monkeypatched)."""
    hw = dataclasses.replace(inventory(), host_memory_available_bytes=400 * GB, cpu_count=8)
    plan = plan_instances(10 * GB, hardware=hw, settings=settings)
    assert plan.kind == "KIND_CPU" and "no GPU has" in plan.reason


def test_cpu_plan_is_bounded_by_host_memory_and_cpus(settings):
    s = dataclasses.replace(settings, host_memory_budget_fraction=0.5, instance_memory_factor=1.0)
    assert plan_instances(GB, hardware=_cpu_host(avail=8 * GB, cpus=16), settings=s, max_instances=8).count == 4
    assert plan_instances(GB, hardware=_cpu_host(avail=64 * GB, cpus=2), settings=s, max_instances=8).count == 2
    with pytest.raises(InsufficientMemoryError, match="host budget"):
        plan_instances(10 * GB, hardware=_cpu_host(avail=8 * GB), settings=s)
    with pytest.raises(SettingsError, match="model_bytes=0"):
        plan_instances(0, hardware=_cpu_host(), settings=s)


def test_preflight_checks_free_memory_before_a_load(fake_nvml):
    """Fake NVML for the GPU part (pynvml functions monkeypatched); host part uses real psutil."""
    assert preflight_memory_check(1024, kind="KIND_CPU", hardware=inventory())["host"] > 1024
    with pytest.raises(InsufficientMemoryError, match="host has"):
        preflight_memory_check(10**18, kind="KIND_CPU")
    assert preflight_memory_check(5 * GB, kind="KIND_GPU", gpus=[1], hardware=inventory()) == {"gpu1": 6 * GB}
    with pytest.raises(InsufficientMemoryError, match=r"GPU 1 \(Tesla T4\) has 6442450944 bytes free"):
        preflight_memory_check(7 * GB, kind="KIND_GPU", gpus=[1], hardware=inventory())


def test_gpu_preflight_on_a_cpu_only_host_is_refused():
    with pytest.raises(InsufficientMemoryError, match="no GPU"):
        preflight_memory_check(1, kind="KIND_GPU", hardware=_cpu_host())
    with pytest.raises(SettingsError, match="kind='GPU'"):
        preflight_memory_check(1, kind="GPU", hardware=_cpu_host())


def test_meminfo_is_read_in_bytes_with_and_without_memavailable(tmp_path):
    new = tmp_path / "meminfo"
    new.write_text("MemTotal:       16000 kB\nMemFree:         1000 kB\nMemAvailable:    9000 kB\n"
                   "Buffers:          100 kB\nCached:          2000 kB\n")
    assert read_meminfo(str(new)) == (16000 * 1024, 9000 * 1024)
    old = tmp_path / "meminfo_old"
    old.write_text("MemTotal:       16000 kB\nMemFree:         1000 kB\n"
                   "Buffers:          100 kB\nCached:          2000 kB\n")
    assert read_meminfo(str(old)) == (16000 * 1024, 3100 * 1024)
