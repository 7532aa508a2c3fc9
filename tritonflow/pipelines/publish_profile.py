"""Publish stages 3 and 3b: Model Analyzer profiling and the p99 latency regression gate.

:func:`profile` sweeps a bounded configuration space with Triton Model Analyzer on the local
Triton tools and adopts the best stable configuration (or keeps the generated one and says why);
:func:`perf_gate` measures the challenger against the serving champion on one local Triton and
rejects a p99 latency regression beyond the measured noise, before anything is pushed.
:func:`profiling_unavailable_reason` says whether this host can run either.

Plain Python (no Airflow import).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

from ground.exceptions import DataError, MeasurementUnstableError, ProfilingError, SettingsError
from ground.settings import Settings, get_settings
from tritonflow.pipelines.publish_claim import claimed_stage
from tritonflow.pipelines.publish_common import (
    CONFIG_FILENAME,
    GENERATED_CONFIG_FILENAME,
    MODEL_FILENAME,
    PERF_GATE_FILENAME,
    PROFILE_ARTIFACT_PATH,
    PUBLISH_ARTIFACT_PATH,
    PublishState,
    enter_staging,
    json_safe,
    open_registry,
    read_npz,
    reject_version,
    timed,
    version_ref,
)
from tritonflow.pipelines.publish_reuse import champion_folder

log = logging.getLogger(__name__)

#: Keys of ``bounds`` accepted by :func:`profile` (SearchSpace fields + constraint + timeout).
PROFILE_BOUND_KEYS = ("max_batch_sizes", "instance_counts", "queue_delays_us", "concurrency",
                      "measurement_ms", "max_auto_adjusts", "p99_latency_ms", "stability_cv",
                      "timeout_s")


def profiling_unavailable_reason(settings: Settings | None = None) -> str:
    """Why Model Analyzer cannot run on this host ('' when it can).

    Needs ``model-analyzer``, ``perf_analyzer`` and ``tritonserver`` in the Triton tools
    environment (``settings.triton_venv``).
    """
    from model_registry.profiling.analyzer import analyzer_binary
    from tritonflow.runtime.services import triton_server_binary

    s = settings or get_settings()
    missing = []
    for label, path in (("model-analyzer", analyzer_binary(s)),
                        ("perf_analyzer", s.triton_venv / "bin" / "perf_analyzer")):
        if not Path(path).is_file():
            missing.append(f"{label} not found at {path}")
    try:
        server = triton_server_binary(s)
        if not Path(server).is_file():
            missing.append(f"tritonserver not found at {server}")
    except Exception as exc:  # noqa: BLE001 - the runtime raises when the wheel is missing
        missing.append(f"tritonserver unavailable ({exc})")
    return "; ".join(missing)


def _search_space(bounds: Mapping[str, Any] | None, s: Settings, max_batch_size: int):
    from model_registry.profiling.analyzer import SearchSpace, parse_int_list

    b = dict(bounds or {})
    unknown = sorted(set(b) - set(PROFILE_BOUND_KEYS))
    if unknown:
        raise SettingsError(f"profile bounds {unknown} are unknown; expected keys among {list(PROFILE_BOUND_KEYS)}")
    base = SearchSpace.from_settings(s)
    kw: dict[str, Any] = {}
    for key in ("max_batch_sizes", "instance_counts", "queue_delays_us", "concurrency"):
        kw[key] = parse_int_list(b[key], f"bounds.{key}") if key in b else getattr(base, key)
    if max_batch_size > 0:  # the requested max_batch_size is the ceiling of the sweep
        capped = tuple(sorted({v for v in kw["max_batch_sizes"] if 0 < v <= max_batch_size}))
        kw["max_batch_sizes"] = capped or (max_batch_size,)
    kw["measurement_ms"] = int(b.get("measurement_ms", base.measurement_ms))
    kw["max_auto_adjusts"] = int(b.get("max_auto_adjusts", base.max_auto_adjusts))
    return SearchSpace(**kw)


@claimed_stage()
def profile(
    staged: Mapping[str, Any],
    *,
    enabled: bool = True,
    bounds: Mapping[str, Any] | None = None,
    settings: Settings | None = None,
    pass_runner: Any = None,
    perf_gate_enabled: bool = True,
    repository_uri: str | None = None,
) -> PublishState:
    """Profile the staged model with Triton Model Analyzer and adopt the best stable config.

    The sweep is bounded (:class:`model_registry.profiling.analyzer.SearchSpace`: max batch sizes capped at
    the requested ``max_batch_size``, instance counts, dynamic-batching delays, concurrencies,
    measurement window); objective throughput under ``p99 <= p99_latency_ms``; CPU-only hosts
    search KIND_CPU only; configs whose throughput CV exceeds the stability threshold or
    that perf_analyzer could not stabilise are dropped: Model Analyzer's ranking (one
    measurement per config) is confirmed by :func:`model_registry.profiling.analyzer.confirm_selection`,
    which re-measures the ``analyzer_confirm_top`` best configs in ``analyzer_confirm_passes``
    interleaved perf_analyzer passes on one Triton. The winning config replaces the
    staged ``config.pbtxt`` after the same pre-push checks; the results table, the chosen config
    and the selection report are logged to the version's MLflow publish run.

    Before sweeping, :func:`~tritonflow.pipelines.publish_reuse.reuse_decision` checks whether the
    challenger is like its champion (flavour, tensors and dtypes, model size within
    ``profile_reuse_size_factor``; the p99 gate on; ``profile_force_sweep`` off). Then the champion's
    measured config is adopted after the same pre-push checks (status ``reused``) and
    :func:`perf_gate` confirms it with its measurement; else the sweep runs. ``profile["decision"]``
    says ``reused`` or ``swept`` and ``profile["decision_reason"]`` why.

    When ``enabled`` is false, or Model Analyzer cannot run on this host
    (:func:`profiling_unavailable_reason`), the generated config is kept and
    ``state["profile"]["status"]`` says ``skipped``/``unavailable`` with the reason. When Model
    Analyzer ran but no configuration could be measured stably (a busy host:
    :class:`~ground.exceptions.MeasurementUnstableError`), the generated config is kept too,
    status ``inconclusive``: noise is no verdict on the model and no config is chosen from it.

    Args:
        staged: State from :func:`~tritonflow.pipelines.publish_validate.convert_and_validate`.
        enabled: Run the profiling.
        bounds: Overrides among :data:`PROFILE_BOUND_KEYS` (lists as ``"8,32"`` or sequences;
            ``p99_latency_ms``, ``stability_cv``, ``timeout_s`` as numbers).
        settings: Settings (default: from the environment).
        pass_runner: Confirmation-pass runner ``(configs, concurrency) -> {config: [PerfPass]}``
            (default: real perf_analyzer passes; for library callers and tests).
        perf_gate_enabled: Whether :func:`perf_gate` runs next (a reused config needs it).
        repository_uri: Repository holding the champion (default ``settings.resolved_repository_uri``).

    Returns:
        ``staged`` plus ``profile`` (``status``, ``reason`` or ``best``/``throughput``/
        ``p99_latency_ms``/``dropped``/``configs_measured``) and the updated ``config_summary``.

    Raises:
        SettingsError: Unknown or invalid bounds.
        ProfilingError: Configs were measured stably and none met the p99 constraint (names the
            model and each reason; tagged rejected).
        ToolingError: Model Analyzer or its Triton failed, or its Python environment is broken
            (an infrastructure error: not tagged, retried).
        TransientError: Model Analyzer ran past its timeout.
    """
    t0 = time.perf_counter()
    s = settings or get_settings()
    name = staged["triton_model_name"]
    if not enabled:
        info = {"status": "skipped", "reason": "profiling disabled (profile=false); the generated config.pbtxt is kept"}
        log.info("model %s: %s", name, info["reason"])
        return timed(staged, "profile", t0, profile=info)
    missing = profiling_unavailable_reason(s)
    if missing:
        info = {"status": "unavailable",
                "reason": f"Model Analyzer cannot run on this host ({missing}); the generated config.pbtxt is kept"}
        log.warning("model %s: %s", name, info["reason"])
        return timed(staged, "profile", t0, profile=info)
    search = _search_space(bounds, s, int(staged["max_batch_size"]))
    b = dict(bounds or {})
    s_run = dataclasses.replace(
        s,
        analyzer_p99_latency_ms=float(b.get("p99_latency_ms", s.analyzer_p99_latency_ms)),
        analyzer_stability_cv=float(b.get("stability_cv", s.analyzer_stability_cv)),
    )
    reg = open_registry(s, staged.get("tracking_uri"))
    ref = version_ref(reg, staged)
    decision = _decide_reuse(staged, perf_gate_enabled, repository_uri, s)
    if decision.reuse:
        try:
            return timed(staged, "profile", t0, **_adopt_champion_config(staged, decision, s))
        except DataError as exc:  # the champion's config does not fit this model: sweep instead
            decision = dataclasses.replace(decision, reuse=False, why=f"the champion's config failed the "
                                                                      f"pre-push checks: {exc}"[:500])
    log.info("model %s: full Model Analyzer sweep (%s)", name, decision.why)
    swept = {"decision": "swept", "decision_reason": decision.why}
    try:
        updates = _profile(staged, search, s_run, reg, ref, b.get("timeout_s"), pass_runner)
    except MeasurementUnstableError as exc:  # the host's noise: keep the generated config, no verdict
        reason = f"{exc}; the generated config.pbtxt is kept"[:1000]
        log.warning("model %s: profile inconclusive: %s", name, reason)
        return timed(staged, "profile", t0, profile=json_safe(
            {"status": "inconclusive", "reason": reason, "search": dataclasses.asdict(search), **swept}))
    except (ProfilingError, DataError) as exc:  # ToolingError (the environment) is never a verdict
        reject_version(reg, ref, exc, "profile")
        raise
    updates["profile"] = {**updates["profile"], **swept}
    return timed(staged, "profile", t0, **updates)


def _decide_reuse(staged: Mapping[str, Any], perf_gate_enabled: bool, repository_uri: str | None,
                  s: Settings) -> Any:
    from tritonflow.pipelines.publish_reuse import reuse_decision

    work = enter_staging(staged) / "reuse"
    if work.exists():
        shutil.rmtree(work)
    decision = reuse_decision(staged, work, perf_gate_enabled=perf_gate_enabled, repository_uri=repository_uri,
                              settings=s)
    log.info("model %s v%s: profile %s (%s)", staged["triton_model_name"], staged["version"], decision.decision,
             decision.why)
    return decision


def _adopt_champion_config(staged: Mapping[str, Any], decision: Any, s: Settings) -> dict[str, Any]:
    """The champion's measured config as this version's, after the pre-push checks (state updates).

    Raises:
        DataError: The config does not fit this model (a pre-push check failed).
    """
    from model_registry.triton_config import config_summary, parse_config, to_pbtxt
    from model_registry.validation import validate_for_push

    name = staged["triton_model_name"]
    filename = staged.get("model_filename") or MODEL_FILENAME
    chosen = parse_config(decision.champion_config)
    chosen.name = name
    chosen.default_model_filename = filename
    requested = int(staged["max_batch_size"])
    if requested > 0 and int(chosen.max_batch_size) > requested:
        raise DataError(f"its max_batch_size {chosen.max_batch_size} exceeds the requested {requested}")
    if filename == MODEL_FILENAME:
        validate_for_push(staged["model_path"], chosen, read_npz(staged["sample_path"]), model_name=name, settings=s)
    (enter_staging(staged) / CONFIG_FILENAME).write_text(to_pbtxt(chosen))
    champ = decision.champion_profile
    info = {"status": "reused", "decision": "reused", "decision_reason": decision.why,
            "champion_version": decision.champion_version, "best": champ.get("best"),
            "concurrency": champ.get("concurrency"), "champion_throughput": champ.get("throughput"),
            "champion_p99_latency_ms": champ.get("p99_latency_ms"), "confirmed_by": "perf_gate"}
    log.info("model %s v%s: reuses champion version %s's measured config (%s)", name, staged["version"],
             decision.champion_version, decision.why)
    return {"profile": json_safe(info), "config_summary": json_safe(config_summary(chosen)),
            "max_batch_size": int(chosen.max_batch_size)}


def _profile(staged, search, s: Settings, reg, ref, timeout_s, pass_runner=None) -> dict[str, Any]:
    import csv

    from model_registry.profiling.analyzer import confirm_selection, profile_model
    from model_registry.triton_config import config_summary, read_config, to_pbtxt
    from model_registry.validation import validate_for_push
    from tritonflow.runtime.triton_tools import triton_tools

    name = staged["triton_model_name"]
    stage = enter_staging(staged)  # this attempt's own folder, marked alive for sweep_staging
    work = stage / "profile"
    if work.exists():
        shutil.rmtree(work)
    repo = work / "repository"
    (repo / name / "1").mkdir(parents=True)
    filename = staged.get("model_filename") or MODEL_FILENAME
    shutil.copyfile(staged["model_path"], repo / name / "1" / filename)
    generated = read_config(stage / GENERATED_CONFIG_FILENAME)
    (repo / name / CONFIG_FILENAME).write_text(to_pbtxt(generated))
    log.info("model %s: Model Analyzer sweep %s (p99 <= %s ms, CV <= %s)", name, search,
             s.analyzer_p99_latency_ms, s.analyzer_stability_cv)
    tools = triton_tools(s)
    outcome = profile_model(name, generated, model_repository=repo, work_dir=work / "run", search=search,
                            tools=tools, settings=s, timeout_s=float(timeout_s) if timeout_s is not None else None)
    # Model Analyzer measured each config once: its best ones are confirmed with repeated passes,
    # and unstable ones (CV or perf_analyzer's own verdict) are dropped before adoption.
    outcome = confirm_selection(outcome, work / "run" / "output_model_repository", tools=tools, settings=s,
                                pass_runner=pass_runner)
    chosen = outcome.config
    chosen.name = name
    chosen.default_model_filename = filename
    if not chosen.backend and not chosen.platform:
        chosen.backend = generated.backend
        chosen.platform = generated.platform
    if filename == MODEL_FILENAME:
        validate_for_push(staged["model_path"], chosen, read_npz(staged["sample_path"]), model_name=name, settings=s)

    results = work / "results.csv"
    fields = [f.name for f in dataclasses.fields(outcome.rows[0])] if outcome.rows else ["config"]
    with open(results, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in outcome.rows:
            writer.writerow(dataclasses.asdict(row))
    chosen_path = work / "chosen_config.pbtxt"
    chosen_path.write_text(to_pbtxt(chosen))
    selection_path = work / "selection.json"
    selection_path.write_text(json.dumps(json_safe({**outcome.selection.to_dict(),
                                                     "report": outcome.selection.report()}), indent=2))
    (stage / CONFIG_FILENAME).write_text(to_pbtxt(chosen))
    for path in (results, chosen_path, selection_path, outcome.profile_config_path):
        reg.log_version_artifact(ref, path, PROFILE_ARTIFACT_PATH)
    sel = outcome.selection
    log.info("model %s: %s", name, sel.report())
    info = {"status": "profiled", "best": sel.best, "throughput": float(sel.best_row.throughput),
            "p99_latency_ms": float(sel.best_row.p99_latency_ms), "concurrency": int(sel.best_row.concurrency),
            "configs_measured": len({r.config for r in outcome.rows}),
            "dropped": {k: v[:200] for k, v in list(sel.dropped.items())[:10]},
            "p99_constraint_ms": float(sel.p99_latency_ms), "search": dataclasses.asdict(search)}
    return {"profile": json_safe(info), "config_summary": json_safe(config_summary(chosen)),
            "max_batch_size": int(chosen.max_batch_size)}


@claimed_stage()
def perf_gate(
    staged: Mapping[str, Any],
    *,
    enabled: bool = True,
    repository_uri: str | None = None,
    settings: Settings | None = None,
) -> PublishState:
    """The p99 latency regression gate: challenger against the serving champion, before the push.

    The champion is the version holding the ``champion`` alias (skipped when there is none, when it
    is this version, or when it is not in the repository). Both are measured on one local Triton
    (:func:`model_registry.profiling.perf.perf_regression_gate`) at the champion's chosen concurrency (its
    ``tritonflow.profile`` tag, else the first ``analyzer_concurrency``), in interleaved
    perf_analyzer passes (``perf_gate_passes``, >= 3 each) with the validation sample as input
    data. The challenger is rejected when its median p99 is worse than the champion's by more
    than ``max_p99_regression`` beyond the measured noise band and by more than
    ``min_p99_regression_ms`` milliseconds. Figures and verdict go to the
    version as tag ``tritonflow.perf_gate`` and artifact ``publish/perf_gate.json``.

    Args:
        staged: State from :func:`profile` (or :func:`~tritonflow.pipelines.publish_validate.convert_and_validate`).
        enabled: Run the gate (``False``: skipped, recorded as such).
        repository_uri: Repository holding the champion (default ``settings.resolved_repository_uri``).
        settings: Settings (default: from the environment).

    Returns:
        ``staged`` plus ``perf_gate`` (``status``: ``passed``/``skipped``/``unavailable``, figures).

    Raises:
        PerformanceRegressionError: The challenger regresses (tagged rejected, nothing pushed).
        TransientError: perf_analyzer or the local Triton failed (not tagged: not a verdict).
    """
    t0 = time.perf_counter()
    s = settings or get_settings()
    info = _perf_gate(staged, enabled, repository_uri, s)
    extra: dict[str, Any] = {}
    if (staged.get("profile") or {}).get("status") == "reused":  # the gate's measurement confirms it
        extra["profile"] = {**staged["profile"], "confirmation": json_safe({k: info[k] for k in (
            "status", "reason", "challenger_p99_ms", "champion_p99_ms", "concurrency") if k in info})}
    return timed(staged, "perf_gate", t0, perf_gate=json_safe(info), **extra)


def _perf_gate(staged: Mapping[str, Any], enabled: bool, repository_uri: str | None, s: Settings) -> dict[str, Any]:
    from ground.exceptions import PerformanceRegressionError, RegistryError
    from model_registry.profiling.perf import perf_regression_gate
    from tritonflow.runtime.triton_tools import triton_tools

    name = staged["triton_model_name"]
    if not enabled:
        return {"status": "skipped", "reason": "perf gate disabled (perf_gate=false)"}
    reg = open_registry(s, staged.get("tracking_uri"))
    try:
        champion = reg.resolve(f"{staged['model']}@champion")
    except RegistryError as exc:
        return {"status": "skipped", "reason": f"no champion to compare with ({exc})"[:300]}
    if int(champion.version) == int(staged["version"]):
        return {"status": "skipped", "reason": "this version is the champion"}
    missing = profiling_unavailable_reason(s)
    if missing:
        return {"status": "unavailable", "reason": f"perf_analyzer/Triton cannot run here ({missing})"}
    work = enter_staging(staged) / "perf_gate"
    if work.exists():
        shutil.rmtree(work)
    champ_dir = champion_folder(repository_uri or s.resolved_repository_uri, name, int(champion.version),
                                 work / "champion", s)
    if champ_dir is None:
        return {"status": "skipped", "reason": f"champion version {champion.version} is not in the repository"}
    chal_dir = work / "challenger"
    (chal_dir / "1").mkdir(parents=True)
    filename = staged.get("model_filename") or MODEL_FILENAME
    shutil.copyfile(staged["model_path"], chal_dir / "1" / filename)
    shutil.copyfile(staged["config_path"], chal_dir / CONFIG_FILENAME)
    concurrency = _champion_concurrency(champion, s)
    sample = read_npz(staged["sample_path"])
    result = perf_regression_gate(champ_dir, chal_dir, concurrency=concurrency, passes=s.perf_gate_passes,
                                  measurement_ms=s.perf_gate_measurement_ms,
                                  samples={"champion": sample, "challenger": sample}, tools=triton_tools(s),
                                  settings=s)
    info = {"status": "rejected" if result.verdict.rejected else "passed", "champion_version": int(champion.version),
            **result.to_dict()}
    path = Path(staged["staging_dir"]) / PERF_GATE_FILENAME
    path.write_text(json.dumps(json_safe(info), indent=2, sort_keys=True))
    ref = version_ref(reg, staged)
    reg.set_version_tags(ref, {"tritonflow.perf_gate": {k: info[k] for k in (
        "status", "champion_version", "champion_p99_ms", "challenger_p99_ms", "regression", "noise_band",
        "max_regression", "limit", "regression_ms", "min_regression_ms", "concurrency")}})
    reg.log_version_artifact(ref, path, PUBLISH_ARTIFACT_PATH)
    log.info("model %s v%s perf gate against champion v%s: %s", name, staged["version"], champion.version,
             result.verdict.reason)
    if result.verdict.rejected:
        error = PerformanceRegressionError(f"model {staged['model']!r} version {staged['version']}: p99 latency "
                                           f"regression against champion version {champion.version}: "
                                           f"{result.verdict.reason}")
        reject_version(reg, ref, error, "perf_gate")
        raise error
    return {k: v for k, v in info.items() if k != "passes"}


def _champion_concurrency(champion: Any, s: Settings) -> int:
    """The champion's profiled concurrency (``tritonflow.profile`` tag), else the first searched one."""
    from model_registry.profiling.analyzer import parse_int_list

    try:
        value = int(json.loads(champion.tags.get("tritonflow.profile", "{}")).get("concurrency") or 0)
    except (TypeError, ValueError):
        value = 0
    return value if value > 0 else parse_int_list(s.analyzer_concurrency, "analyzer_concurrency")[0]
