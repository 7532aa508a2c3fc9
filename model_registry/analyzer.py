"""Triton Model Analyzer: bounded profiling config, perf_analyzer flags, results and stability.

Flow: :func:`build_profile_config` -> :func:`write_profile_config` -> :func:`run_profile` (runs
``model-analyzer profile`` from the Triton tools environment, ``triton_launch_mode: local``) ->
:func:`read_results_csv` -> :func:`choose_best` (objective: throughput, constraint: p99 latency in
ms, only stable measurements) -> :func:`chosen_config` (the winning ``config.pbtxt``).

Rules (in ``shared/cases``):

* A CPU-only host or model gets ``cpu_only: true`` and ``collect_cpu_metrics: true``, and the
  search space has only ``KIND_CPU`` instance groups; a KIND_GPU config is never generated without
  a GPU. No measured candidate => :class:`ProfilingError` naming the model.
* Variable dims get one explicit perf_analyzer ``shape`` entry per input, written as a YAML list of
  ``NAME:D1,D2`` strings (never one space-separated string, which older Model Analyzer versions
  split per character). A tensor name containing ``:`` stops profiling before it starts.
* A configuration whose throughput coefficient of variation (population std / mean, numpy's
  default ``ddof=0``) across passes exceeds ``analyzer_stability_cv`` (0.1), or for which
  perf_analyzer reported "Failed to obtain stable measurement", is dropped with a reason; the best
  configuration is chosen only among stable ones. perf_analyzer's own stability criterion is
  aligned with the threshold (``stability-percentage`` = CV x 100).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from tritonflow.exceptions import (
    MeasurementUnstableError,
    ProfilingError,
    SettingsError,
    ToolingError,
    TransientError,
)
from tritonflow.settings import Settings, get_settings

if TYPE_CHECKING:  # pragma: no cover
    from tritonclient.grpc import model_config_pb2

    from model_registry.hardware import HardwareInventory

log = logging.getLogger(__name__)

#: Model Analyzer's inference results file (``<export_path>/results/``).
RESULTS_CSV = "metrics-model-inference.csv"
#: perf_analyzer's message when its stability criterion is not met (perf_analyzer source).
PA_UNSTABLE_MESSAGE = "Failed to obtain stable measurement"


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
    measurement_ms: int = 1000
    max_auto_adjusts: int = 2

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> "SearchSpace":
        """Search space from the ``analyzer_*`` settings."""
        s = settings or get_settings()
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
            :func:`model_registry.conversion.sanitize_io_names`), a variable input has no shape,
            or a given shape does not fit the config's dims.
    """
    name = model_name or config.name
    out = []
    for io_ in config.input:  # names first: a ':' name stops profiling whatever the shapes say
        if ":" in io_.name:
            raise ProfilingError(
                f"model {name!r}: input {io_.name!r} contains ':' which perf_analyzer's --shape "
                "NAME:DIMS cannot express; rename it to an identifier ([A-Za-z_][A-Za-z0-9_]*) with "
                "model_registry.conversion.sanitize_io_names and regenerate config.pbtxt"
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
    settings: Settings | None = None,
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
        settings: Settings (default: from the environment).

    Raises:
        ProfilingError: Tensor names with ``:`` or variable dims without shapes, or
            ``cpu_only=False`` on a host without a GPU.
    """
    s = settings or get_settings()
    search = search or SearchSpace.from_settings(s)
    if cpu_only is None or cpu_only is False:
        if hardware is None:
            from model_registry.hardware import inventory

            hardware = inventory()
        if cpu_only is False and not hardware.has_gpu:
            raise ProfilingError(
                f"model {model_name!r}: cpu_only=False requested but this host has no GPU "
                f"({hardware.reason}); KIND_GPU configs cannot load here"
            )
        cpu_only = not hardware.has_gpu
    shape_list = shape_flags(config, shapes, model_name=model_name)
    kind = "KIND_CPU" if cpu_only else "KIND_GPU"
    batching = int(config.max_batch_size) > 0
    params: dict[str, Any] = {
        "instance_group": [{"kind": kind, "count": list(search.instance_counts)}],
    }
    if batching:
        params["max_batch_size"] = list(search.max_batch_sizes)
        params["dynamic_batching"] = {"max_queue_delay_microseconds": list(search.queue_delays_us)}
    pa_flags: dict[str, Any] = {
        "measurement-mode": "time_windows",
        "measurement-interval": int(search.measurement_ms),
        "stability-percentage": int(round(s.analyzer_stability_cv * 100)),
    }
    if shape_list:
        pa_flags["shape"] = list(shape_list)
    model_entry: dict[str, Any] = {
        "cpu_only": bool(cpu_only),
        "model_config_parameters": params,
        "parameters": {"concurrency": list(search.concurrency), "batch_sizes": [1]},
        "perf_analyzer_flags": pa_flags,
    }
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
    if backend_directory:
        cfg["triton_server_flags"] = {"backend-directory": str(backend_directory)}
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


# ----------------------------------------------------------------------------- results
@dataclasses.dataclass(frozen=True)
class ProfileRow:
    """One measured (config, concurrency) from Model Analyzer's results CSV.

    Attributes:
        config: Tried config folder name (``<model>_config_N`` or ``..._config_default``).
        model: Model name.
        batch: Client batch size.
        concurrency: Client concurrency.
        throughput: Inferences per second.
        p99_latency_ms: p99 latency, milliseconds.
        instance_group: Model Analyzer's instance group text (e.g. ``1:CPU``).
        max_batch_size: The config's ``max_batch_size``.
        satisfies_constraints: Model Analyzer's own verdict.
    """

    config: str
    model: str
    batch: int
    concurrency: int
    throughput: float
    p99_latency_ms: float
    instance_group: str
    max_batch_size: int
    satisfies_constraints: bool


def _num(row: Mapping[str, str], *keys: str, default: float = math.nan) -> float:
    for k in keys:
        if k in row and str(row[k]).strip() not in {"", "None"}:
            try:
                return float(row[k])
            except ValueError:
                return default
    return default


def read_results_csv(path_or_text: str | os.PathLike) -> list[ProfileRow]:
    """Parse Model Analyzer's ``metrics-model-inference.csv`` (path or CSV text).

    Columns used: Model, Batch, Concurrency, Model Config Path, Instance Group, Max Batch Size,
    Satisfies Constraints, Throughput (infer/sec), p99 Latency (ms).

    Raises:
        ProfilingError: The file is missing or lacks the throughput/latency columns.
    """
    text = str(path_or_text)
    if "\n" not in text:
        p = Path(text)
        if not p.is_file():
            raise ProfilingError(f"Model Analyzer results {text!r} do not exist (no config was measured)")
        text = p.read_text()
    reader = csv.DictReader(io.StringIO(text))
    fields = reader.fieldnames or []
    need = ["Model Config Path", "Throughput (infer/sec)", "p99 Latency (ms)"]
    missing = [f for f in need if f not in fields]
    if missing:
        raise ProfilingError(f"Model Analyzer results lack columns {missing} (have {fields})")
    rows = []
    for r in reader:
        rows.append(ProfileRow(
            config=r["Model Config Path"].strip(),
            model=r.get("Model", "").strip(),
            batch=int(_num(r, "Batch", default=1)),
            concurrency=int(_num(r, "Concurrency", default=0)),
            throughput=_num(r, "Throughput (infer/sec)"),
            p99_latency_ms=_num(r, "p99 Latency (ms)"),
            instance_group=r.get("Instance Group", "").strip(),
            max_batch_size=int(_num(r, "Max Batch Size", default=0)),
            satisfies_constraints=str(r.get("Satisfies Constraints", "")).strip().lower() in {"yes", "true"},
        ))
    return rows


def read_perf_passes(path_or_text: str | os.PathLike) -> dict[str, list[float]]:
    """Throughput per pass per config from repeated perf_analyzer passes.

    Reads a ``config,concurrency,pass,throughput_infer_per_s,...`` CSV; passes are ordered by ``pass``.
    """
    text = str(path_or_text)
    if "\n" not in text:
        text = Path(text).read_text()
    rows = sorted(csv.DictReader(io.StringIO(text)), key=lambda r: (r["config"], int(r.get("pass", 0) or 0)))
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["config"].strip(), []).append(float(r["throughput_infer_per_s"]))
    return out


@dataclasses.dataclass(frozen=True)
class Stability:
    """Stability of one config's throughput across passes.

    Attributes:
        config: Config name.
        passes: Number of passes.
        mean: Mean throughput, infer/s.
        cv: Coefficient of variation (population std / mean).
        stable: ``cv <= threshold`` and perf_analyzer did not report instability.
        reason: Why it is unstable ("" when stable).
    """

    config: str
    passes: int
    mean: float
    cv: float
    stable: bool
    reason: str


def stability(
    passes: Mapping[str, Sequence[float]],
    *,
    threshold: float | None = None,
    unstable_flags: Iterable[str] = (),
    settings: Settings | None = None,
) -> dict[str, Stability]:
    """Coefficient of variation of each config's throughput passes.

    Args:
        passes: ``{config: [throughput per pass]}``.
        threshold: Largest stable CV (default ``settings.analyzer_stability_cv``, 0.1).
        unstable_flags: Configs for which perf_analyzer reported "Failed to obtain stable
            measurement".
        settings: Settings (default: from the environment).
    """
    import numpy as np

    limit = (settings or get_settings()).analyzer_stability_cv if threshold is None else threshold
    flagged = set(unstable_flags)
    out = {}
    for config, values in passes.items():
        v = np.asarray(list(values), dtype=float)
        mean = float(v.mean()) if v.size else math.nan
        cv = float(v.std() / mean) if v.size and mean > 0 else math.inf
        reason = ""
        if config in flagged:
            reason = "perf_analyzer could not obtain a stable measurement"
        elif not v.size:
            reason = "no measurement"
        elif not cv <= limit:
            reason = (
                f"unstable: throughput coefficient of variation {cv:.2f} > {limit:g} across "
                f"{v.size} passes (min {v.min():.1f}, max {v.max():.1f} infer/s)"
            )
        out[config] = Stability(config, int(v.size), mean, cv, reason == "", reason)
    return out


def unstable_configs_from_log(text: str, config_names: Iterable[str]) -> set[str]:
    """Configs whose perf_analyzer run reported instability in a Model Analyzer log.

    A config is flagged when the stability failure message appears after the line that names it
    and before the next config's line.
    """
    names = sorted(set(config_names), key=len, reverse=True)
    flagged: set[str] = set()
    current = None
    for line in text.splitlines():
        for n in names:
            if n in line:
                current = n
                break
        if PA_UNSTABLE_MESSAGE in line and current:
            flagged.add(current)
    return flagged


@dataclasses.dataclass
class Selection:
    """The chosen config and why the others were not chosen.

    Attributes:
        model: Model name.
        best: Winning config name.
        best_row: Its measurement (best concurrency within the constraint).
        ranking: ``[(config, throughput)]`` of eligible configs, best first (ranked by the mean
            of its passes when passes were given, else by the measured throughput).
        dropped: ``{config: reason}`` for every config left out.
        p99_latency_ms: The constraint used.
    """

    model: str
    best: str
    best_row: ProfileRow
    ranking: list[tuple[str, float]]
    dropped: dict[str, str]
    p99_latency_ms: float

    def report(self) -> str:
        """Human-readable summary: the choice, the ranking and each dropped config's reason."""
        lines = [
            f"model {self.model!r}: chose {self.best} ({self.best_row.throughput:.1f} infer/s, "
            f"p99 {self.best_row.p99_latency_ms:.2f} ms <= {self.p99_latency_ms:g} ms, "
            f"concurrency {self.best_row.concurrency})"
        ]
        lines += [f"  rank {i + 1}: {c} {t:.1f} infer/s" for i, (c, t) in enumerate(self.ranking)]
        lines += [f"  dropped {c}: {r}" for c, r in sorted(self.dropped.items())]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for MLflow)."""
        return {"model": self.model, "best": self.best, "best_row": dataclasses.asdict(self.best_row),
                "ranking": self.ranking, "dropped": self.dropped, "p99_latency_ms": self.p99_latency_ms}


def choose_best(
    rows: Sequence[ProfileRow],
    *,
    model_name: str,
    passes: Mapping[str, Sequence[float]] | None = None,
    unstable: Iterable[str] = (),
    p99_latency_ms: float | None = None,
    stability_cv: float | None = None,
    settings: Settings | None = None,
) -> Selection:
    """Pick the highest-throughput config whose p99 latency meets the constraint, among stable ones.

    A config is dropped (with the reason recorded) when perf_analyzer flagged it unstable, its
    passes' CV exceeds ``stability_cv``, none of its measurements is finite, or every
    measurement violates ``p99 <= p99_latency_ms``.

    Args:
        rows: Measurements (:func:`read_results_csv`).
        model_name: Used in messages.
        passes: Optional ``{config: [throughput per pass]}`` from repeated measurements.
        unstable: Configs perf_analyzer reported unstable.
        p99_latency_ms: Constraint (default ``settings.analyzer_p99_latency_ms``).
        stability_cv: CV threshold (default ``settings.analyzer_stability_cv``).
        settings: Settings (default: from the environment).

    Raises:
        ProfilingError: No candidate survived; the message names the model and each reason. An
            empty or all-dropped table never yields a "best config".
        MeasurementUnstableError: Every candidate was dropped for instability alone (none for its
            latency): the measurements say nothing about the model (a busy host), so this is an
            infrastructure error, not a :class:`ProfilingError`.
    """
    s = settings or get_settings()
    limit = s.analyzer_p99_latency_ms if p99_latency_ms is None else p99_latency_ms
    stab = stability(passes or {}, threshold=stability_cv, unstable_flags=unstable, settings=s)
    flagged = set(unstable)
    by_config: dict[str, list[ProfileRow]] = {}
    for r in rows:
        by_config.setdefault(r.config, []).append(r)
    for c in list(passes or {}) + list(flagged):
        by_config.setdefault(c, [])
    dropped: dict[str, str] = {}
    unstable_only: set[str] = set()  # dropped for how they were measured, not for what was measured
    eligible: list[tuple[str, float, ProfileRow]] = []
    for config, measured in by_config.items():
        st = stab.get(config)
        if config in flagged:
            dropped[config] = "perf_analyzer could not obtain a stable measurement"
            unstable_only.add(config)
            continue
        if st is not None and not st.stable:
            dropped[config] = st.reason
            unstable_only.add(config)
            continue
        finite = [r for r in measured if math.isfinite(r.throughput) and math.isfinite(r.p99_latency_ms)]
        if not finite:
            if st is not None and measured == []:
                # Passes only (no Model Analyzer row): rank by the pass mean.
                row = ProfileRow(config, model_name, 1, 0, st.mean, math.nan, "", 0, True)
                eligible.append((config, st.mean, row))
            else:
                dropped[config] = "no finite measurement"
                unstable_only.add(config)
            continue
        ok = [r for r in finite if r.p99_latency_ms <= limit]
        if not ok:
            worst = min(r.p99_latency_ms for r in finite)
            dropped[config] = f"p99 latency {worst:.2f} ms > constraint {limit:g} ms at every concurrency"
            continue
        best_row = max(ok, key=lambda r: r.throughput)
        score = st.mean if st is not None else best_row.throughput
        eligible.append((config, score, best_row))
    if not eligible:
        reasons = "; ".join(f"{c}: {r}" for c, r in sorted(dropped.items())) or "no configuration was measured"
        if dropped and set(dropped) == unstable_only:
            raise MeasurementUnstableError(
                f"profiling model {model_name!r}: no configuration could be measured stably ({reasons}); "
                "the host is too busy for a stable measurement, which says nothing about the model"
            )
        raise ProfilingError(
            f"profiling model {model_name!r} produced no usable configuration ({reasons}); "
            "nothing is published as best config"
        )
    eligible.sort(key=lambda e: e[1], reverse=True)
    best, _, row = eligible[0]
    return Selection(model_name, best, row, [(c, sc) for c, sc, _ in eligible], dropped, float(limit))


def chosen_config(
    output_model_repository: str | os.PathLike, selection: Selection, *, model_name: str | None = None
) -> "model_config_pb2.ModelConfig":
    """Read the winning config from Model Analyzer's output repository, renamed to the model.

    Raises:
        ProfilingError: The config file is missing.
    """
    from model_registry.triton_config import read_config

    path = Path(output_model_repository) / selection.best / "config.pbtxt"
    if not path.is_file():
        raise ProfilingError(f"chosen config {str(path)!r} does not exist (Model Analyzer output missing)")
    cfg = read_config(path)
    cfg.name = model_name or selection.model
    return cfg


# ----------------------------------------------------------------------------- running
def analyzer_binary(settings: Settings | None = None) -> Path:
    """``model-analyzer`` in the Triton tools environment."""
    return (settings or get_settings()).triton_venv / "bin" / "model-analyzer"


def run_profile(
    profile_config_path: str | os.PathLike,
    *,
    settings: Settings | None = None,
    timeout_s: float | None = None,
    log_path: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Run ``model-analyzer profile -f <config>`` with the environment Triton needs.

    The environment comes from :func:`tritonflow.runtime.services.triton_environment`
    (``LD_LIBRARY_PATH`` = the Triton venv's ``nvidia_pytriton.libs`` and
    ``nvidia/cuda_runtime/lib``; ``PYTHONPATH``; ``PATH``). Output goes to ``log_path`` when given.

    Raises:
        ToolingError: Model Analyzer exited non-zero (the log tail is included): an
            infrastructure error, never a verdict on the model.
        TransientError: It ran past ``timeout_s`` (default ``settings.analyzer_timeout_s``) and was
            stopped.
    """
    from tritonflow.runtime.services import triton_environment

    s = settings or get_settings()
    env = triton_environment(s)
    cmd = [str(analyzer_binary(s)), "profile", "-f", str(profile_config_path)]
    limit = s.analyzer_timeout_s if timeout_s is None else timeout_s
    out_path = Path(log_path) if log_path else Path(profile_config_path).with_suffix(".log")
    with open(out_path, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired as exc:
            import signal

            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise TransientError(
                f"model-analyzer profile ran past {limit:g} s and was stopped (log {out_path})"
            ) from exc
    tail = out_path.read_text()[-3000:]
    if rc != 0:  # the tool failed, not the model: an infrastructure error, never a rejection
        raise ToolingError(f"model-analyzer profile failed (exit {rc}); log {out_path}:\n{tail}")
    return subprocess.CompletedProcess(cmd, rc, tail, "")


def results_path(export_path: str | os.PathLike) -> Path:
    """Model Analyzer's inference results CSV under ``export_path``."""
    return Path(export_path) / "results" / RESULTS_CSV


@dataclasses.dataclass
class ProfileOutcome:
    """Result of :func:`profile_model`.

    Attributes:
        selection: The chosen config and the dropped ones with reasons.
        config: The chosen ``ModelConfig`` (named after the model), ready to write as config.pbtxt.
        rows: Every measurement (the results table for MLflow).
        profile_config_path: The YAML that was run.
        log_path: Model Analyzer's log.
    """

    selection: Selection
    config: "model_config_pb2.ModelConfig"
    rows: list[ProfileRow]
    profile_config_path: Path
    log_path: Path


def profile_model(
    model_name: str,
    config: "model_config_pb2.ModelConfig",
    *,
    model_repository: str | os.PathLike,
    work_dir: str | os.PathLike,
    shapes: Mapping[str, int | Sequence[int]] | None = None,
    search: SearchSpace | None = None,
    hardware: "HardwareInventory | None" = None,
    passes: Mapping[str, Sequence[float]] | None = None,
    settings: Settings | None = None,
    timeout_s: float | None = None,
) -> ProfileOutcome:
    """Profile a model with Model Analyzer on a local Triton and choose its config.

    Builds the bounded profile config (Triton binary, perf_analyzer, backend directory and
    environment from :mod:`tritonflow.runtime.services`, free loopback ports), runs it, reads the
    results, flags configs perf_analyzer could not stabilise (from the Model Analyzer log and
    ``perf_analyzer_error.log``) and picks the best stable config under the p99 constraint.

    Args:
        model_name: Model folder in ``model_repository`` (``<name>/<version>/`` + config.pbtxt).
        config: The model's current config.
        model_repository: Local repository folder Model Analyzer reads.
        work_dir: Folder for the profile YAML, output repository, results and logs.
        shapes: Explicit shapes for variable dims.
        search: Bounded search (default from settings).
        hardware: Inventory (default: :func:`model_registry.hardware.inventory`).
        passes: Optional repeated-pass throughputs for the stability check.
        settings: Settings (default: from the environment).
        timeout_s: Limit for the Model Analyzer run.

    Raises:
        ProfilingError: Bad names/shapes, or no stable config met the constraint (names the
            model and each reason).
        ToolingError: Model Analyzer failed or measured nothing (the profiling environment).
        TransientError: The run timed out.
    """
    from tritonflow.runtime.services import (
        free_port,
        triton_backend_directory,
        triton_environment,
        triton_server_binary,
    )

    s = settings or get_settings()
    work = Path(work_dir)
    export = work / "export"
    export.mkdir(parents=True, exist_ok=True)
    env = triton_environment(s, {})
    profile = build_profile_config(
        model_name, config, model_repository=model_repository,
        output_model_repository=work / "output_model_repository", export_path=export,
        hardware=hardware, shapes=shapes, search=search, settings=s,
        triton_server_path=triton_server_binary(s), perf_analyzer_path=s.triton_venv / "bin" / "perf_analyzer",
        backend_directory=triton_backend_directory(s), ports=(free_port(), free_port(), free_port()),
        environment={k: env[k] for k in ("LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONNOUSERSITE", "PATH") if k in env},
    )
    triton_log = work / "triton.log"  # Triton's own output: why a config did not load (e.g. the stub's imports)
    profile["triton_output_path"] = str(triton_log)
    path = write_profile_config(profile, work / "profile.yaml")
    log_path = work / "model_analyzer.log"
    run_profile(path, settings=s, timeout_s=timeout_s, log_path=log_path)
    csv_path = results_path(export)
    rows = read_results_csv(csv_path) if csv_path.is_file() else []
    logs = log_path.read_text()
    pa_log = export / "perf_analyzer_error.log"
    if pa_log.is_file():
        logs += "\n" + pa_log.read_text()
    if not rows:
        # Nothing measured at all: the model passed ONNX Runtime validation before profiling, so
        # this is the profiling environment (Triton's Python backend, perf_analyzer), not the model.
        triton_errors = ""
        if triton_log.is_file():
            triton_errors = "\n".join(line for line in triton_log.read_text(errors="replace").splitlines()
                                      if line.startswith("E") or "Error" in line)[-2000:]
        raise ToolingError(f"model {model_name!r}: Model Analyzer measured no config (its Triton or "
                           f"perf_analyzer failed); Triton errors ({triton_log}):\n{triton_errors}\n"
                           f"log {log_path}:\n{logs[-2000:]}")
    output_repo = work / "output_model_repository"
    tried = [p.name for p in output_repo.iterdir()] if output_repo.is_dir() else []
    measured = {r.config for r in rows}
    unstable = {c for c in unstable_configs_from_log(logs, tried) if c not in measured}
    selection = choose_best(rows, model_name=model_name, passes=passes, unstable=unstable, settings=s)
    for c in tried:
        if c not in measured and c not in selection.dropped and c not in dict(selection.ranking):
            selection.dropped[c] = "no measurement (perf_analyzer error, see perf_analyzer_error.log)"
    chosen = chosen_config(work / "output_model_repository", selection, model_name=model_name)
    return ProfileOutcome(selection, chosen, rows, path, log_path)


# ----------------------------------------------------------------------------- confirmation
def confirmation_repository(output_model_repository: str | os.PathLike, configs: Sequence[str],
                            dest: str | os.PathLike) -> Path:
    """A repository Triton can load every tried config from: ``<dest>/<config>/`` per config.

    Model Analyzer leaves each variant's ``config.pbtxt`` named after the *base* model, which
    Triton refuses to load from a folder of another name ("directory name must equal model
    name"); here each config is renamed after its folder. Model files are hard-linked (copied
    across file systems).

    Raises:
        ProfilingError: A config is missing from the output repository.
    """
    import shutil

    from model_registry.triton_config import read_config, to_pbtxt

    src_root, root = Path(output_model_repository), Path(dest)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    for c in configs:
        if not (src_root / c / "config.pbtxt").is_file():
            raise ProfilingError(f"config {c!r} is not in Model Analyzer's output repository {str(src_root)!r}")
        shutil.copytree(src_root / c, root / c, copy_function=link)
        config = read_config(root / c / "config.pbtxt")
        config.name = c
        (root / c / "config.pbtxt").unlink()  # a hard link would change Model Analyzer's copy too
        (root / c / "config.pbtxt").write_text(to_pbtxt(config))
    return root


def measure_config_passes(output_model_repository: str | os.PathLike, configs: Sequence[str], concurrency: int, *,
                          passes: int, settings: Settings | None = None,
                          measurement_ms: int | None = None) -> dict[str, list]:
    """Repeated, interleaved perf_analyzer passes of Model Analyzer's tried configs on one Triton.

    Starts a local Triton over :func:`confirmation_repository` (each config a model folder named
    after it), loads ``configs`` and runs :func:`model_registry.perf.measure_interleaved` with perf_analyzer's
    stability criterion aligned with ``analyzer_stability_cv``.

    Returns:
        ``{config: [model_registry.perf.PerfPass, ...]}``.

    Raises:
        TransientError: Triton or perf_analyzer failed.
    """
    import dataclasses as dc

    from model_registry.perf import measure_interleaved
    from tritonflow.exceptions import RuntimeStartError
    from tritonflow.runtime.services import TritonServer, free_port

    s = settings or get_settings()
    home = Path(output_model_repository).parent / "confirm_home"
    repository = confirmation_repository(output_model_repository, configs,
                                         Path(output_model_repository).parent / "confirm_repository")
    ts = dc.replace(s, home=home, triton_http_port=free_port(), triton_grpc_port=free_port(),
                    triton_metrics_port=free_port())
    server = TritonServer(ts, repository=str(repository))
    try:
        server.start()
    except RuntimeStartError as exc:
        raise TransientError(f"Triton for the confirmation passes did not start: {exc}") from exc
    try:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300.0)
        try:
            for c in configs:
                client.load_model(c)
        except Exception as exc:  # noqa: BLE001 - the tool failed, not the model
            raise TransientError(f"could not load configs {list(configs)} for confirmation passes: {exc}") from exc
        finally:
            client.close()
        return measure_interleaved(list(configs), server.http_url, concurrency, passes=passes, settings=s,
                                   measurement_ms=measurement_ms or s.analyzer_measurement_ms,
                                   stability_percentage=int(round(s.analyzer_stability_cv * 100)))
    finally:
        server.stop()


def confirm_selection(
    outcome: ProfileOutcome,
    output_model_repository: str | os.PathLike,
    *,
    passes: int | None = None,
    top: int | None = None,
    settings: Settings | None = None,
    pass_runner: Any = None,
) -> ProfileOutcome:
    """Confirm Model Analyzer's single-measurement ranking with repeated passes.

    Model Analyzer measures each config once. The ``top`` best eligible configs are measured again
    in ``passes`` interleaved perf_analyzer passes; a config is dropped when perf_analyzer reported
    "Failed to obtain stable measurement" for any pass or its throughput coefficient of variation
    exceeds ``analyzer_stability_cv``; the best remaining one (by mean throughput) is chosen.

    Args:
        outcome: :func:`profile_model`'s result.
        output_model_repository: Model Analyzer's output repository (the tried configs).
        passes: Passes per config (default ``settings.analyzer_confirm_passes``, at least 3).
        top: Configs confirmed (default ``settings.analyzer_confirm_top``).
        settings: Settings (default: from the environment).
        pass_runner: ``(configs, concurrency) -> {config: [PerfPass]}``; default
            :func:`measure_config_passes` (real Triton and perf_analyzer).

    Returns:
        A new :class:`ProfileOutcome` whose selection carries the passes' verdicts.

    Raises:
        ProfilingError: No confirmed config is stable (names each reason).
        TransientError: The measurement tools failed.
    """
    s = settings or get_settings()
    n = max(3, int(passes or s.analyzer_confirm_passes))
    k = max(1, int(top or s.analyzer_confirm_top))
    candidates = [c for c, _ in outcome.selection.ranking[:k]]
    concurrency = int(outcome.selection.best_row.concurrency) or 1
    runner = pass_runner or (lambda configs, conc: measure_config_passes(
        output_model_repository, configs, conc, passes=n, settings=s))
    measured = runner(candidates, concurrency)
    throughput = {c: [p.throughput for p in measured.get(c, []) if p.stable] for c in candidates}
    flagged = {c for c in candidates if any(not p.stable for p in measured.get(c, [])) or not throughput[c]}
    rows = [r for r in outcome.rows if r.config in candidates]
    selection = choose_best(rows, model_name=outcome.selection.model, passes={c: v for c, v in throughput.items() if v},
                            unstable=flagged, p99_latency_ms=outcome.selection.p99_latency_ms, settings=s)
    for c, reason in outcome.selection.dropped.items():
        selection.dropped.setdefault(c, reason)
    for c in flagged:
        selection.dropped[c] = (f"perf_analyzer could not obtain a stable measurement in "
                                f"{sum(not p.stable for p in measured.get(c, []))} of {len(measured.get(c, []))} "
                                "confirmation passes")
    log.info("model %s: confirmation passes %s -> %s", outcome.selection.model,
             {c: [round(p.throughput, 1) for p in v] for c, v in measured.items()}, selection.best)
    chosen = chosen_config(output_model_repository, selection, model_name=outcome.selection.model)
    return dataclasses.replace(outcome, selection=selection, config=chosen)
