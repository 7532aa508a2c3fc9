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

Layout: the inputs (search space, profile config, perf_analyzer flags) are in
:mod:`model_registry.analyzer_config`, the outputs (results CSV, stability, choice) in
:mod:`model_registry.analyzer_results`; this module runs Model Analyzer and confirms its choice.
Their public names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ground.exceptions import ProfilingError, ToolingError, TransientError
from ground.settings import Settings
from model_registry.analyzer_config import (
    SearchSpace,
    build_profile_config,
    check_profile_config,
    parse_int_list,
    perf_analyzer_argv,
    shape_flags,
    write_profile_config,
)
from model_registry.analyzer_results import (
    PA_UNSTABLE_MESSAGE,
    RESULTS_CSV,
    ProfileRow,
    Selection,
    Stability,
    choose_best,
    chosen_config,
    read_perf_passes,
    read_results_csv,
    stability,
    unstable_configs_from_log,
)
from model_registry.triton_tools import TritonTools

if TYPE_CHECKING:  # pragma: no cover
    from tritonclient.grpc import model_config_pb2

    from model_registry.hardware import HardwareInventory

log = logging.getLogger(__name__)

__all__ = [
    "PA_UNSTABLE_MESSAGE",
    "ProfileOutcome",
    "ProfileRow",
    "RESULTS_CSV",
    "SearchSpace",
    "Selection",
    "Stability",
    "analyzer_binary",
    "build_profile_config",
    "check_profile_config",
    "choose_best",
    "chosen_config",
    "confirm_selection",
    "confirmation_repository",
    "measure_config_passes",
    "parse_int_list",
    "perf_analyzer_argv",
    "profile_model",
    "read_perf_passes",
    "read_results_csv",
    "results_path",
    "run_profile",
    "shape_flags",
    "stability",
    "unstable_configs_from_log",
    "write_profile_config",
]


# ----------------------------------------------------------------------------- running
def analyzer_binary(settings: Settings) -> Path:
    """``model-analyzer`` in the Triton tools environment.

    Args:
        settings: Where the Triton tools environment is (``settings.triton_venv``).

    Returns:
        Path of the ``model-analyzer`` console script (it may not exist).
    """
    return settings.triton_venv / "bin" / "model-analyzer"


def run_profile(
    profile_config_path: str | os.PathLike,
    *,
    tools: TritonTools,
    settings: Settings,
    timeout_s: float | None = None,
    log_path: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Run ``model-analyzer profile -f <config>`` with the environment Triton needs.

    The binary and environment come from ``tools`` (``LD_LIBRARY_PATH`` = the Triton venv's
    ``nvidia_pytriton.libs`` and ``nvidia/cuda_runtime/lib``; ``PYTHONPATH``; ``PATH``). Output
    goes to ``log_path`` when given, else beside the config (``.log``).

    Args:
        profile_config_path: The profile YAML (:func:`write_profile_config`).
        tools: The Triton tools (``model-analyzer`` and its environment).
        settings: Default limit (``analyzer_timeout_s``).
        timeout_s: Limit for the run, seconds.
        log_path: Where Model Analyzer's output goes.

    Returns:
        The finished process; ``stdout`` holds the log's last 3000 characters.

    Raises:
        ToolingError: Model Analyzer exited non-zero (the log tail is included): an
            infrastructure error, never a verdict on the model.
        TransientError: It ran past ``timeout_s`` (default ``settings.analyzer_timeout_s``) and was
            stopped.
    """
    env = dict(tools.environment)
    cmd = [str(tools.model_analyzer), "profile", "-f", str(profile_config_path)]
    limit = settings.analyzer_timeout_s if timeout_s is None else timeout_s
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
    tools: TritonTools,
    settings: Settings,
    timeout_s: float | None = None,
) -> ProfileOutcome:
    """Profile a model with Model Analyzer on a local Triton and choose its config.

    Builds the bounded profile config (Triton binary, perf_analyzer, backend directory and
    environment from ``tools``, free loopback ports), runs it, reads the
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
        tools: The Triton tools (binaries, backends, environment, free ports).
        settings: Search defaults, p99 constraint, stability threshold and run limit.
        timeout_s: Limit for the Model Analyzer run.

    Returns:
        The selection, the chosen config, every measurement and the paths of the YAML and log.

    Raises:
        ProfilingError: Bad names/shapes, or no stable config met the constraint (names the
            model and each reason).
        ToolingError: Model Analyzer failed or measured nothing (the profiling environment).
        TransientError: The run timed out.
    """
    s = settings
    work = Path(work_dir)
    export = work / "export"
    export.mkdir(parents=True, exist_ok=True)
    env = tools.own_environment
    profile = build_profile_config(
        model_name, config, model_repository=model_repository,
        output_model_repository=work / "output_model_repository", export_path=export,
        hardware=hardware, shapes=shapes, search=search, settings=s,
        triton_server_path=tools.tritonserver, perf_analyzer_path=tools.perf_analyzer,
        backend_directory=tools.backend_directory, ports=(tools.free_port(), tools.free_port(), tools.free_port()),
        environment={k: env[k] for k in ("LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONNOUSERSITE", "PATH") if k in env},
    )
    triton_log = work / "triton.log"  # Triton's own output: why a config did not load (e.g. the stub's imports)
    profile["triton_output_path"] = str(triton_log)
    path = write_profile_config(profile, work / "profile.yaml")
    log_path = work / "model_analyzer.log"
    run_profile(path, tools=tools, settings=s, timeout_s=timeout_s, log_path=log_path)
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
                          passes: int, tools: TritonTools, settings: Settings,
                          measurement_ms: int | None = None) -> dict[str, list]:
    """Repeated, interleaved perf_analyzer passes of Model Analyzer's tried configs on one Triton.

    Starts a local Triton (``tools.scratch_server``) over :func:`confirmation_repository` (each
    config a model folder named after it), loads ``configs`` and runs
    :func:`model_registry.perf.measure_interleaved` with perf_analyzer's stability criterion
    aligned with ``analyzer_stability_cv``.

    Args:
        output_model_repository: Model Analyzer's output repository (the tried configs).
        configs: Configs measured.
        concurrency: Client concurrency.
        passes: Stable passes wanted per config.
        tools: The Triton tools (perf_analyzer, the scratch Triton starter).
        settings: Stability threshold and default measurement window.
        measurement_ms: perf_analyzer's window, milliseconds (default
            ``settings.analyzer_measurement_ms``).

    Returns:
        ``{config: [model_registry.perf.PerfPass, ...]}``.

    Raises:
        TransientError: Triton or perf_analyzer failed.
    """
    from model_registry.perf import measure_interleaved

    s = settings
    home = Path(output_model_repository).parent / "confirm_home"
    repository = confirmation_repository(output_model_repository, configs,
                                         Path(output_model_repository).parent / "confirm_repository")
    with tools.scratch_server(repository, configs, home=home, purpose="the confirmation passes") as url:
        return measure_interleaved(list(configs), url, concurrency, tools=tools, passes=passes, settings=s,
                                   measurement_ms=measurement_ms or s.analyzer_measurement_ms,
                                   stability_percentage=int(round(s.analyzer_stability_cv * 100)))


def confirm_selection(
    outcome: ProfileOutcome,
    output_model_repository: str | os.PathLike,
    *,
    passes: int | None = None,
    top: int | None = None,
    tools: TritonTools | None = None,
    settings: Settings,
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
        tools: The Triton tools the default ``pass_runner`` measures with (required without
            ``pass_runner``).
        settings: Default passes and top, stability threshold.
        pass_runner: ``(configs, concurrency) -> {config: [PerfPass]}``; default
            :func:`measure_config_passes` (real Triton and perf_analyzer).

    Returns:
        A new :class:`ProfileOutcome` whose selection carries the passes' verdicts.

    Raises:
        ProfilingError: No confirmed config is stable (names each reason).
        TransientError: The measurement tools failed.
        ValueError: Neither ``tools`` nor ``pass_runner`` was given.
    """
    s = settings
    n = max(3, int(passes or s.analyzer_confirm_passes))
    k = max(1, int(top or s.analyzer_confirm_top))
    candidates = [c for c, _ in outcome.selection.ranking[:k]]
    concurrency = int(outcome.selection.best_row.concurrency) or 1
    if pass_runner is not None:
        measured = pass_runner(candidates, concurrency)
    elif tools is not None:
        measured = measure_config_passes(output_model_repository, candidates, concurrency, passes=n, tools=tools,
                                         settings=s)
    else:
        raise ValueError("confirm_selection needs the Triton tools to measure with, or a pass_runner")
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
