"""Memory pre-flight of a canary: refuse it before any traffic moves when the challenger cannot fit.

The challenger is loaded beside the champion for the whole canary; :func:`preflight_memory`
compares what it needs (a rule of thumb on its files' size) with the free memory of the GPU or,
without one, of the host.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

from ground.exceptions import PreflightError
from ground.settings import DEFAULTS, Settings


@dataclasses.dataclass(frozen=True)
class PreflightReport:
    """Memory pre-flight figures (bytes). ``source`` is ``"gpu"`` or ``"host"``."""

    model_bytes: int
    required_bytes: int
    available_bytes: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict."""
        return dataclasses.asdict(self)


def model_files_bytes(path: Path | str) -> int:
    """Total size in bytes of the files under ``path`` (a model version folder) or of one file.

    Raises:
        PreflightError: ``path`` does not exist.
    """
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    if not p.is_dir():
        raise PreflightError(f"pre-flight: model path {str(p)!r} does not exist")
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def host_available_bytes(meminfo_path: Path | str = "/proc/meminfo") -> int:
    """Read ``MemAvailable`` from ``/proc/meminfo``, in bytes.

    ``MemAvailable`` from ``/proc/meminfo`` in bytes (the kernel's estimate of memory that can
    be allocated without swapping, see proc(5)).

    Raises:
        PreflightError: The file has no ``MemAvailable`` line.
    """
    for line in Path(meminfo_path).read_text().splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            factor = 1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1
            return int(parts[1]) * factor
    raise PreflightError(f"pre-flight: no MemAvailable line in {meminfo_path}")


def preflight_memory(
    model_bytes: int,
    *,
    factor: float = DEFAULTS.preflight_memory_factor,
    margin_bytes: int = DEFAULTS.preflight_memory_margin_mib * 1024 * 1024,
    gpu_free_bytes: Callable[[], int | None] | None = None,
    meminfo_path: Path | str = "/proc/meminfo",
    model: str = "",
) -> PreflightReport:
    """Refuse a canary when the challenger cannot be loaded beside the (loaded) champion.

    The challenger needs about ``factor * model_bytes + margin_bytes`` (weights plus runtime
    buffers; a rule of thumb, tune ``settings.preflight_memory_factor``). It is compared with the
    free memory of the GPU (``gpu_free_bytes()``, e.g. from pynvml via ``model_registry.hardware``;
    ``None`` means no GPU) or, without a GPU, with the host's ``MemAvailable``.

    Raises:
        PreflightError: Not enough memory; the message names the model and the figures. Raised
            before any traffic is touched.
    """
    if model_bytes < 0:
        raise PreflightError(f"pre-flight: model_bytes={model_bytes} is negative")
    required = int(math.ceil(factor * model_bytes)) + int(margin_bytes)
    free = gpu_free_bytes() if gpu_free_bytes is not None else None
    source = "gpu"
    if free is None:
        free, source = host_available_bytes(meminfo_path), "host"
    report = PreflightReport(int(model_bytes), required, int(free), source)
    if free < required:
        mib = 1024 * 1024
        raise PreflightError(
            f"pre-flight refused the canary of model {model!r}: loading the challenger beside the "
            f"champion needs about {required / mib:.0f} MiB ({factor:g} x {model_bytes / mib:.1f} MiB "
            f"of model files + {margin_bytes / mib:.0f} MiB margin) but only {free / mib:.0f} MiB of "
            f"{source} memory is free; traffic was not touched"
        )
    return report


def preflight_from_settings(
    settings: Settings, model_path: Path | str, *, model: str = "",
    gpu_free_bytes: Callable[[], int | None] | None = None,
) -> PreflightReport:
    """:func:`preflight_memory` for the files under ``model_path`` with the settings' factor/margin."""
    return preflight_memory(
        model_files_bytes(model_path),
        factor=settings.preflight_memory_factor,
        margin_bytes=settings.preflight_memory_margin_mib * 1024 * 1024,
        gpu_free_bytes=gpu_free_bytes,
        model=model,
    )
