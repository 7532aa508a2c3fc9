"""Model Analyzer inputs: the bounded search space, the profile config and perf_analyzer's flags.

:func:`build_profile_config` turns a :class:`SearchSpace` and the host's hardware into a Model
Analyzer ``profile`` config (``cpu_only`` and only ``KIND_CPU`` instance groups without a GPU; one
explicit perf_analyzer ``shape`` entry per variable-dim input, as a YAML list of ``NAME:D1,D2``
strings), :func:`check_profile_config` refuses a config that breaks those rules, and
:func:`perf_analyzer_argv` builds the same flags for a direct perf_analyzer run. Used by
:mod:`model_registry.profiling.analyzer`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ground.exceptions import ProfilingError, SettingsError
from ground.settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from tritonclient.grpc import model_config_pb2

    from model_registry.hardware import HardwareInventory


def parse_int_list(text: str | Sequence[int], field: str) -> tuple[int, ...]:
    """Parse ``"8,32"`` (or a sequence) into positive ints.

    Raises:
        SettingsError: An item is not a positive int; names the field and the value.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        try:
            v = int(str(item).strip())
        except ValueError:
            v = -1
        if v < 0:
            raise SettingsError(f"{field}={text!r} is invalid (expected comma-separated ints >= 0)")
        out.append(v)
    if not out:
        raise SettingsError(f"{field}={text!r} is empty (expected at least one int)")
    return tuple(out)


#: ``--exit-timeout-secs`` of a throwaway Triton (Model Analyzer's, the confirmation passes', the
#: perf gate's): seconds it waits on shutdown for open client connections and for its models to
#: unload (Triton's default, 30, suits a serving Triton draining requests; a scratch one serves no one).
SCRATCH_EXIT_TIMEOUT_S = 1


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Bounded manual search of Model Analyzer.

    Attributes:
        max_batch_sizes: Candidate ``max_batch_size`` values (ignored for max_batch_size-0 models).
        instance_counts: Candidate instance counts.
        queue_delays_us: Candidate dynamic-batching max queue delays, microseconds.
        concurrency: Client concurrencies measured per config.
        measurement_ms: perf_analyzer measurement window, milliseconds.
        max_auto_adjusts: Times Model Analyzer may widen an unstable window before giving up.
    """

    max_batch_sizes: tuple[int, ...] = (8, 32)
    instance_counts: tuple[int, ...] = (1,)
    queue_delays_us: tuple[int, ...] = (500,)
    concurrency: tuple[int, ...] = (4,)
    measurement_ms: int = 500
    max_auto_adjusts: int = 2

    @classmethod
    def from_settings(cls, settings: Settings) -> "SearchSpace":
        """Search space from the ``analyzer_*`` settings."""
        s = settings
        return cls(
            parse_int_list(s.analyzer_max_batch_sizes, "analyzer_max_batch_sizes"),
            parse_int_list(s.analyzer_instance_counts, "analyzer_instance_counts"),
            parse_int_list(s.analyzer_queue_delays_us, "analyzer_queue_delays_us"),
            parse_int_list(s.analyzer_concurrency, "analyzer_concurrency"),
            int(s.analyzer_measurement_ms),
        )

    def n_configs(self, batching: bool) -> int:
        """Model configs the search tries (without Model Analyzer's default config)."""
        if not batching:
            return len(self.instance_counts)
        return len(self.max_batch_sizes) * len(self.instance_counts) * len(self.queue_delays_us)


# ----------------------------------------------------------------------------- shapes
def shape_flags(
    config: "model_config_pb2.ModelConfig",
    shapes: Mapping[str, int | Sequence[int]] | None = None,
    *,
    model_name: str | None = None,
) -> list[str]:
    """perf_analyzer ``--shape`` values for every input with a variable (-1) non-batch dim.

    Args:
        config: The model's config (``dims`` exclude the batch axis when batching).
        shapes: ``{input: dims}`` with the full non-batch dims (``[128]``) or one int that replaces
            every -1 of that input.
        model_name: Used in messages (default ``config.name``).

    Returns:
        One ``"NAME:D1,D2"`` string per variable input, in config order.

    Raises:
        ProfilingError: An input name contains ``:`` (ambiguous with ``NAME:DIMS``; rename it with
            :func:`model_registry.conversion.common.sanitize_io_names`), a variable input has no shape,
            or a given shape does not fit the config's dims.
    """
    name = model_name or config.name
    out = []
    for io_ in config.input:  # names first: a ':' name stops profiling whatever the shapes say
        if ":" in io_.name:
            raise ProfilingError(
                f"model {name!r}: input {io_.name!r} contains ':' which perf_analyzer's --shape "
                "NAME:DIMS cannot express; rename it to an identifier ([A-Za-z_][A-Za-z0-9_]*) with "
                "model_registry.conversion.common.sanitize_io_names and regenerate config.pbtxt"
            )
    for io_ in config.input:
        dims = list(io_.dims)
        if -1 not in dims:
            continue
        given = (shapes or {}).get(io_.name)
        if given is None:
            raise ProfilingError(
                f"model {name!r}: input {io_.name!r} has variable dims {dims}; perf_analyzer needs an "
                f"explicit shape (pass shapes={{{io_.name!r}: [...]}})"
            )
        if isinstance(given, int):
            full = [given if d == -1 else d for d in dims]
        else:
            full = [int(d) for d in given]
        if len(full) != len(dims) or any(d <= 0 or (c != -1 and c != d) for c, d in zip(dims, full, strict=True)):
            raise ProfilingError(
                f"model {name!r}: shape {full} for input {io_.name!r} does not fit dims {dims} "
                "(expected positive sizes, same rank, fixed dims unchanged)"
            )
        out.append(f"{io_.name}:{','.join(str(d) for d in full)}")
    return out


# ----------------------------------------------------------------------------- profile config
def _searched_cpu_only(model_name: str, hardware: "HardwareInventory | None",
                       cpu_only: bool | None) -> bool:
    """Whether only KIND_CPU is searched: as asked, else when the host has no GPU.

    Raises:
        ProfilingError: ``cpu_only=False`` on a host without a GPU.
    """
    if cpu_only is True:
        return True
    if hardware is None:
        from model_registry.hardware import inventory

        hardware = inventory()
    if cpu_only is False and not hardware.has_gpu:
        raise ProfilingError(
            f"model {model_name!r}: cpu_only=False requested but this host has no GPU "
            f"({hardware.reason}); KIND_GPU configs cannot load here"
        )
    return not hardware.has_gpu


def _profile_model_entry(config: "model_config_pb2.ModelConfig", search: SearchSpace,
                         shape_list: Sequence[str], *, cpu_only: bool,
                         settings: Settings) -> dict[str, Any]:
    """The model's ``profile_models`` entry: the searched config parameters and perf_analyzer flags."""
    kind = "KIND_CPU" if cpu_only else "KIND_GPU"
    params: dict[str, Any] = {
        "instance_group": [{"kind": kind, "count": list(search.instance_counts)}],
    }
    if int(config.max_batch_size) > 0:
        params["max_batch_size"] = list(search.max_batch_sizes)
        params["dynamic_batching"] = {"max_queue_delay_microseconds": list(search.queue_delays_us)}
    pa_flags: dict[str, Any] = {
        "measurement-mode": "time_windows",
        "measurement-interval": int(search.measurement_ms),
        "stability-percentage": int(round(settings.analyzer_stability_cv * 100)),
    }
    if shape_list:
        pa_flags["shape"] = list(shape_list)
    return {
        "cpu_only": bool(cpu_only),
        "model_config_parameters": params,
        "parameters": {"concurrency": list(search.concurrency), "batch_sizes": [1]},
        "perf_analyzer_flags": pa_flags,
    }


def build_profile_config(
    model_name: str,
    config: "model_config_pb2.ModelConfig",
    *,
    model_repository: str | os.PathLike,
    output_model_repository: str | os.PathLike,
    export_path: str | os.PathLike,
    hardware: "HardwareInventory | None" = None,
    cpu_only: bool | None = None,
    shapes: Mapping[str, int | Sequence[int]] | None = None,
    search: SearchSpace | None = None,
    p99_latency_ms: float | None = None,
    triton_server_path: str | os.PathLike | None = None,
    perf_analyzer_path: str | os.PathLike | None = None,
    backend_directory: str | os.PathLike | None = None,
    ports: tuple[int, int, int] | None = None,
    environment: Mapping[str, str] | None = None,
    settings: Settings,
) -> dict[str, Any]:
    """Build a Model Analyzer ``profile`` config (a dict; write it with :func:`write_profile_config`).

    The search is manual and bounded (``run_config_search_disable: true``) over
    ``max_batch_size`` x instance count x dynamic-batching delay, measured at the given
    concurrencies; objective ``perf_throughput`` under ``perf_latency_p99 <= p99_latency_ms``.

    Args:
        model_name: Model folder name in ``model_repository``.
        config: The model's current ``ModelConfig`` (inputs, batching).
        model_repository: Folder holding ``<model_name>/<version>/`` and ``config.pbtxt``.
        output_model_repository: Where Model Analyzer writes the tried configs (overwritten).
        export_path: Where Model Analyzer writes results and checkpoints.
        hardware: Inventory; with no GPU (or ``cpu_only=True``) only KIND_CPU is searched.
        cpu_only: Force CPU-only (default: ``not hardware.has_gpu``; ``hardware`` defaults to
            :func:`model_registry.hardware.inventory`).
        shapes: Explicit shapes for variable dims (see :func:`shape_flags`).
        search: Search space (default :meth:`SearchSpace.from_settings`).
        p99_latency_ms: Latency constraint in ms (default ``settings.analyzer_p99_latency_ms``).
        triton_server_path: ``tritonserver`` binary (local launch mode).
        perf_analyzer_path: ``perf_analyzer`` binary.
        backend_directory: Triton ``--backend-directory``.
        ports: (http, grpc, metrics) ports for the server Model Analyzer starts.
        environment: Extra environment for tritonserver (``triton_server_environment``).
        settings: Settings the defaults come from.

    Raises:
        ProfilingError: Tensor names with ``:`` or variable dims without shapes, or
            ``cpu_only=False`` on a host without a GPU.
    """
    s = settings
    search = search or SearchSpace.from_settings(s)
    cpu_only = _searched_cpu_only(model_name, hardware, cpu_only)
    shape_list = shape_flags(config, shapes, model_name=model_name)
    model_entry = _profile_model_entry(config, search, shape_list, cpu_only=cpu_only, settings=s)
    http, grpc, metrics = ports or (8000, 8001, 8002)
    cfg: dict[str, Any] = {
        "model_repository": str(Path(model_repository).resolve()),
        "output_model_repository_path": str(Path(output_model_repository).resolve()),
        "override_output_model_repository": True,
        "export_path": str(Path(export_path).resolve()),
        "checkpoint_directory": str(Path(export_path).resolve() / "checkpoints"),
        "triton_launch_mode": "local",
        "triton_http_endpoint": f"127.0.0.1:{http}",
        "triton_grpc_endpoint": f"127.0.0.1:{grpc}",
        "triton_metrics_url": f"http://127.0.0.1:{metrics}/metrics",
        "client_protocol": "http",
        "collect_cpu_metrics": True,
        "run_config_search_disable": True,
        "perf_analyzer_max_auto_adjusts": int(search.max_auto_adjusts),
        "perf_analyzer_timeout": int(s.analyzer_timeout_s),
        "objectives": {"perf_throughput": 10},
        "constraints": {"perf_latency_p99": {"max": float(
            s.analyzer_p99_latency_ms if p99_latency_ms is None else p99_latency_ms)}},
        "skip_summary_reports": False,  # the results CSV is written with the summary tables
        "skip_detailed_reports": True,
        "profile_models": {model_name: model_entry},
    }
    if triton_server_path:
        cfg["triton_server_path"] = str(triton_server_path)
    if perf_analyzer_path:
        cfg["perf_analyzer_path"] = str(perf_analyzer_path)
    # Model Analyzer restarts its Triton for every config and stops it with its own client still
    # connected; Triton then waits out its exit timeout (30 s) for that connection and Model
    # Analyzer kills it after 5 s: 5 s lost per config. Its server serves nothing else.
    cfg["triton_server_flags"] = {"exit-timeout-secs": SCRATCH_EXIT_TIMEOUT_S}
    if backend_directory:
        cfg["triton_server_flags"]["backend-directory"] = str(backend_directory)
    if cpu_only:  # the server-only metrics are GPU monitors: nothing to collect for 3 s without one
        cfg["duration_seconds"] = 1
    if environment:
        cfg["triton_server_environment"] = dict(environment)
    problems = check_profile_config(cfg, {model_name: config}, has_gpu=not cpu_only)
    if problems:  # pragma: no cover - the builder above never produces these
        raise ProfilingError(f"model {model_name!r}: generated profile config is invalid: {problems}")
    return cfg


def check_profile_config(
    profile: Mapping[str, Any],
    configs: Mapping[str, "model_config_pb2.ModelConfig"] | None = None,
    *,
    has_gpu: bool,
) -> list[str]:
    """Problems in a (generated or hand-written) Model Analyzer profile config.

    Checks per profiled model: on a host without a GPU, ``cpu_only: true`` and
    ``collect_cpu_metrics: true`` are set and no ``KIND_GPU`` instance group is searched;
    ``perf_analyzer_flags.shape`` is a list of ``NAME:DIMS`` strings, one per variable input of the
    model's config, none with ``:`` inside the name.

    Args:
        profile: The profile config mapping (as loaded from YAML).
        configs: ``{model: ModelConfig}`` for the input checks (optional).
        has_gpu: Whether the profiling host has a GPU.

    Returns:
        The problems (empty: fine). :func:`build_profile_config` raises when non-empty.

    """
    problems: list[str] = []
    models = profile.get("profile_models")
    if isinstance(models, str):
        models = {m.strip(): {} for m in models.split(",")}
    elif isinstance(models, list):
        models = {m: {} for m in models} if all(isinstance(m, str) for m in models) else {}
    models = dict(models or {})
    if not has_gpu and not profile.get("collect_cpu_metrics"):
        problems.append("collect_cpu_metrics is not true on a host without a GPU")
    for name, entry in models.items():
        entry = entry or {}
        if not has_gpu:
            if entry.get("cpu_only") is not True:
                problems.append(f"model {name!r}: cpu_only is not true on a host without a GPU")
            groups = (entry.get("model_config_parameters") or {}).get("instance_group") or []
            if any(str(g.get("kind", "")).upper() == "KIND_GPU" for g in groups if isinstance(g, Mapping)):
                problems.append(f"model {name!r}: KIND_GPU instance group searched on a host without a GPU")
        flags = entry.get("perf_analyzer_flags") or {}
        shape = flags.get("shape")
        if shape is not None:
            if isinstance(shape, str):
                problems.append(
                    f"model {name!r}: perf_analyzer_flags.shape is one string {shape!r}; it must be a "
                    "list with one NAME:DIMS entry per input (a string is split per character)"
                )
                shape = shape.split()
            for entry_shape in shape:
                tensor, sep, dims = str(entry_shape).rpartition(":")
                if not sep or not tensor or not dims:
                    problems.append(f"model {name!r}: shape entry {entry_shape!r} is not NAME:DIMS")
                elif ":" in tensor:
                    problems.append(
                        f"model {name!r}: tensor {tensor!r} in shape entry {entry_shape!r} contains ':' "
                        "(ambiguous with NAME:DIMS); rename the tensor"
                    )
        if configs and name in configs:
            variable = [io_.name for io_ in configs[name].input if -1 in list(io_.dims)]
            given = [str(x).rpartition(":")[0] for x in (shape or [])] if not isinstance(shape, str) else []
            missing = [v for v in variable if v not in given]
            if missing:
                problems.append(f"model {name!r}: no perf_analyzer shape for variable input(s) {missing}")
    return problems


def write_profile_config(profile: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write the profile config as YAML (``yaml.safe_dump``; lists stay YAML lists)."""
    import yaml

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(dict(profile), sort_keys=False))
    return p


# ----------------------------------------------------------------------------- perf_analyzer argv
def perf_analyzer_argv(
    model_name: str,
    flags: Mapping[str, Any],
    *,
    perf_analyzer_path: str = "perf_analyzer",
    url: str | None = None,
    protocol: str = "http",
    concurrency: int | None = None,
    batch_size: int | None = None,
) -> list[str]:
    """The perf_analyzer command line for ``flags`` (the profile's ``perf_analyzer_flags``).

    List values (``shape``, ``input-data``) expand to one ``--key=value`` per item, as Model
    Analyzer does for its additive arguments; a string ``shape`` is refused rather than split.

    Raises:
        ProfilingError: ``shape`` is a string, or a shape entry's tensor name contains ``:``.
    """
    argv = [perf_analyzer_path, "-m", model_name, "-i", protocol]
    if url:
        argv += ["-u", url]
    if batch_size is not None:
        argv += ["-b", str(batch_size)]
    if concurrency is not None:
        argv += [f"--concurrency-range={concurrency}"]
    for key, value in flags.items():
        if key in {"shape", "input-data"}:
            if isinstance(value, str):
                raise ProfilingError(
                    f"perf_analyzer flag {key}={value!r} is one string; expected a list with one "
                    "entry per input"
                )
            for item in value:
                if key == "shape" and ":" in str(item).rpartition(":")[0]:
                    raise ProfilingError(
                        f"perf_analyzer shape {item!r}: tensor {str(item).rpartition(':')[0]!r} "
                        "contains ':'; rename the tensor"
                    )
                argv.append(f"--{key}={item}")
        elif isinstance(value, bool):
            if value:
                argv.append(f"--{key}")
        elif value is not None:
            argv.append(f"--{key}={value}")
    return argv
