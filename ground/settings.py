"""Typed settings of tritonflow, read from ``TRITONFLOW_*`` environment variables.

Each setting is declared once, as one field of :class:`Settings` (the way MLflow's
``environment_variables.py`` declares its variables): ``setting(variable, default, doc, check=)``
gives the variable's name without the ``TRITONFLOW_`` prefix, its default, the one-line description
the configuration reference (``docs/configuration.md``) prints, and the check its value must pass
(from :mod:`ground.values`). The ``#:`` comment above a field gives its unit and the source of its
default. Code that needs a default without reading the environment (a policy's field, a keyword
default, the demo's port search) reads it from :data:`DEFAULTS`; nothing writes a default twice.

Nothing is read at import time: call :func:`get_settings` (or :meth:`Settings.from_env` with an
explicit mapping in tests). :func:`ground.settings_checks.settings_problems` runs every field's
check and the rules that relate two settings.

Example::

    from ground.settings import DEFAULTS, get_settings
    s = get_settings()
    s.triton_http_port  # 8000 unless TRITONFLOW_TRITON_HTTP_PORT is set
    DEFAULTS.canary_bake_s  # 300.0, whatever the environment says
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from ground.exceptions import SettingsError
from ground.values import (
    FRACTION,
    JSON_OBJECT,
    NON_NEGATIVE,
    PERCENT,
    POSITIVE_FINITE,
    STEP_SCHEDULE,
    Check,
    at_least,
    one_of,
    whole_numbers,
)

ENV_PREFIX = "TRITONFLOW_"
#: Set inside Airflow tasks: ``TRITONFLOW_X=conn_id,...``, the settings an Airflow connection gave
#: (``tritonflow_plugin.connections``); read by :meth:`Settings.effective` to name the source.
CONNECTION_SOURCES_ENV = "TRITONFLOW_FROM_CONNECTIONS"
#: Project root (the folder holding ``requirements.txt``); the default home and Triton tools
#: environment lie under it.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
_DEFAULT_HOME = PROJECT_ROOT / ".tritonflow"


def setting(env: str, default: Any, doc: str, *, check: Check | None = None) -> Any:
    """Declare one setting: a dataclass field of :class:`Settings`.

    Args:
        env: The variable's name without ``TRITONFLOW_`` (``"CANARY_BAKE_S"``).
        default: Its value when the variable is unset; its type converts the variable's text.
        doc: One line for the configuration reference, with the unit.
        check: What a value of the right type must also satisfy (:mod:`ground.values`); run by
            :func:`ground.settings_checks.settings_problems`.

    Returns:
        A :func:`dataclasses.field` whose metadata holds ``env``, ``doc`` and ``check``.
    """
    return dataclasses.field(default=default, metadata={"env": env, "doc": doc, "check": check})


@dataclasses.dataclass(frozen=True)
class Settings:
    """All tritonflow settings. Build with :meth:`from_env`; fields are immutable."""

    #: State folder for logs, pid files, the local repository and stores (``TRITONFLOW_HOME``).
    home: Path = setting("HOME", _DEFAULT_HOME, "State folder: logs, pids, local repository, stores.")
    #: Virtual environment holding the Triton tools (server, perf_analyzer, Model Analyzer).
    triton_venv: Path = setting("TRITON_VENV", PROJECT_ROOT / ".venv-triton", "Triton tools virtualenv.")
    host: str = setting("HOST", "127.0.0.1", "Loopback address the local services bind to.")
    triton_http_port: int = setting("TRITON_HTTP_PORT", 8000, "Triton HTTP port.")
    triton_grpc_port: int = setting("TRITON_GRPC_PORT", 8001, "Triton gRPC port.")
    triton_metrics_port: int = setting("TRITON_METRICS_PORT", 8002, "Triton Prometheus metrics port.")
    mlflow_port: int = setting("MLFLOW_PORT", 5000, "MLflow tracking server port.")
    s3_port: int = setting("S3_PORT", 5555, "Local S3-compatible endpoint (moto) port.")
    gateway_port: int = setting("GATEWAY_PORT", 8080, "NGINX gateway port.")
    #: Seconds to wait for a started service to report healthy.
    start_timeout_s: float = setting("START_TIMEOUT_S", 180.0, "Seconds to wait for a service to be healthy.")
    #: MLflow tracking server backend; empty means SQLite under ``<home>/mlflow/mlflow.db``.
    mlflow_backend_uri: str = setting("MLFLOW_BACKEND_URI", "", "MLflow server store URI (empty: SQLite).")
    #: Tracking URI the clients use; empty means ``http://<host>:<mlflow_port>``.
    mlflow_tracking_uri: str = setting("MLFLOW_TRACKING_URI", "", "Tracking URI (empty: local server).")
    repository_uri: str = setting(
        "REPOSITORY_URI", "", "Triton model repository: a folder or s3://http://host:port/bucket/prefix.",
    )
    #: Highest ONNX IR version the target Triton release's ONNX Runtime loads (Triton 2.51 ships
    #: ONNX Runtime 1.19, which supports IR 10; see ONNX Runtime's compatibility table).
    max_onnx_ir_version: int = setting("MAX_ONNX_IR_VERSION", 10, "Highest ONNX IR version Triton loads.")
    #: Highest default-domain opset the target ONNX Runtime implements (ORT 1.19: opset 21).
    max_onnx_opset: int = setting("MAX_ONNX_OPSET", 21, "Highest ONNX opset.")
    #: Seconds to wait for a model version to become READY after a load request.
    load_timeout_s: float = setting("LOAD_TIMEOUT_S", 120.0, "Seconds to wait for a model version to be READY.")
    #: Largest serialised return value (bytes) a tritonflow task may push to XCom.
    max_xcom_bytes: int = setting("MAX_XCOM_BYTES", 48 * 1024, "Largest XCom a task may return (bytes).")

    # ------------------------------------------------------------------ canary, sentinel, coordination
    #: Canary traffic steps for the challenger, percent of requests, comma-separated.
    canary_steps: str = setting(
        "CANARY_STEPS", "5,25,50,100", "Canary steps, percent of traffic, comma-separated.", check=STEP_SCHEDULE,
    )
    #: Promotion policy of a model without tag ``tritonflow.promotion_policy``: ``auto`` (a shadow
    #: winner goes straight to its canary), ``approve`` (a person approves before the canary starts)
    #: or ``approve-steps`` (that approval, then a person decides at the end of each canary step:
    #: continue, hold or roll back).
    promotion_policy: str = setting(
        "PROMOTION_POLICY", "auto", "Default promotion policy (auto, approve, approve-steps).",
        check=one_of("auto", "approve", "approve-steps"),
    )
    #: Hours an approval before a canary waits for an answer; then it defaults to reject.
    approval_timeout_h: float = setting("APPROVAL_TIMEOUT_H", 24.0, "Hours an approval waits before it rejects.",
                                        check=POSITIVE_FINITE)
    #: Airflow users (comma-separated ids) an approval is assigned to when the model has no tag
    #: ``tritonflow.owners``; empty: any user may answer.
    approval_owners: str = setting("APPROVAL_OWNERS", "", "Default approvers (Airflow user ids, comma-separated).")
    #: Seconds a canary, rollback or publish run may overrun what its settings make it expected to take
    #: before its deadline alert posts through the failure notifier (``tritonflow.pipelines.run_deadlines``).
    deadline_margin_s: float = setting("DEADLINE_MARGIN_S", 900.0, "Margin of the runs' deadline alerts (s).",
                                       check=NON_NEGATIVE)
    #: Whether those runs carry deadline alerts at all. Airflow 3.3's ``dag.test()`` (``airflow dags
    #: test``) fails at the end of a successful run of a DAG that has one: turn them off there.
    deadline_alerts: bool = setting("DEADLINE_ALERTS", True,
                                    "Deadline alerts on canary, rollback and publish runs (false: none).")
    #: Seconds each canary step bakes before its analysis.
    canary_bake_s: float = setting("CANARY_BAKE_S", 300.0, "Seconds each step bakes.")
    #: Fewest canary requests a step needs; fewer makes the step inconclusive, never a pass.
    canary_min_requests: int = setting("CANARY_MIN_REQUESTS", 100, "Fewest canary requests per step.")
    #: How many times an inconclusive step is extended (one more bake each) before the canary fails;
    #: under policy ``approve-steps`` a person's *hold* of a step uses one of them too.
    canary_max_extensions: int = setting("CANARY_MAX_EXTENSIONS", 2, "Extensions (or holds) of a step.")
    #: Under promotion policy ``approve-steps``: seconds a canary pause (the end of a step's bake)
    #: waits for a person's decision, traffic at the step's split and the checks running, before it
    #: takes its default (continue after a passed verdict, hold after an inconclusive one).
    canary_pause_timeout_s: float = setting(
        "CANARY_PAUSE_TIMEOUT_S", 600.0, "Seconds a canary pause waits for a decision (approve-steps).",
        check=POSITIVE_FINITE,
    )
    #: Highest canary error rate (failed / all requests, 0-1) a step may show.
    canary_max_error_rate: float = setting(
        "CANARY_MAX_ERROR_RATE", 0.01, "Highest canary error rate (0-1).", check=FRACTION,
    )
    #: Highest canary mean request latency (milliseconds, Triton's nv_inference_request_duration_us).
    canary_max_mean_latency_ms: float = setting(
        "CANARY_MAX_MEAN_LATENCY_MS", 1000.0, "Highest canary mean latency (ms).",
    )
    #: Highest ratio of canary to champion mean latency over the same step (dimensionless).
    canary_max_latency_ratio: float = setting("CANARY_MAX_LATENCY_RATIO", 1.5, "Highest canary/champion latency ratio.")
    #: Smallest mean-latency difference (milliseconds, challenger minus champion) that lets the latency
    #: ratio fail a canary step: a model answering in 2 ms had its live mean move from 1.83 to 2.90 ms on
    #: a loaded host (ratio 1.59) with nothing wrong. 5 ms is 2.5 % of the 200 ms p99 red line of the
    #: practitioners' serving dashboard (``shared/references``, notebook-to-production, section 4.3).
    canary_min_latency_delta_ms: float = setting(
        "CANARY_MIN_LATENCY_DELTA_MS", 5.0, "Smallest latency difference (ms) the ratio may fail a step on.",
    )
    #: Highest two-sample KS statistic between the challenger's live predictions and its own expected
    #: predictions (shadow replay or mirrored live requests) on comparable inputs (0-1).
    canary_max_prediction_ks: float = setting("CANARY_MAX_PREDICTION_KS", 0.2, "Highest prediction KS statistic.")
    #: Highest PSI between the challenger's live and expected predictions (0.25 = "significant
    #: shift", Siddiqi 2006).
    canary_max_prediction_psi: float = setting("CANARY_MAX_PREDICTION_PSI", 0.25, "Highest prediction PSI.")
    #: Seconds between two analyses during a step's bake; hard failures roll back at the first
    #: analysis that sees them (the reference setup switches back 4.7 s after detection).
    canary_analysis_interval_s: float = setting(
        "CANARY_ANALYSIS_INTERVAL_S", 5.0, "Seconds between analyses during a bake (hard failures roll back at once).",
    )
    #: Seconds between two looks of the hard checks (errors, non-finite or constant outputs; latency
    #: waits for the analyses) inside an analysis interval; a failing look rolls back at once.
    #: 0: hard checks only at the analyses. Each look is another test of the same step, so the hard error-rate bound's
    #: confidence is split over them (``CanaryPolicy.hard_confidence``).
    canary_hard_check_interval_s: float = setting(
        "CANARY_HARD_CHECK_INTERVAL_S", 1.0,
        "Seconds between hard-check looks inside an analysis interval (0: only at analyses).",
        check=NON_NEGATIVE,
    )
    #: Seconds between two probes of a champion by the health sentinel (``champion_sentinel``).
    sentinel_interval_s: float = setting(
        "SENTINEL_INTERVAL_S", 10.0, "Seconds between two sentinel probes of a champion.",
    )
    #: Consecutive failed probes after which the sentinel rolls a champion back to previous_champion.
    sentinel_failures: int = setting(
        "SENTINEL_FAILURES", 3, "Consecutive failed sentinel probes that roll a champion back.",
    )
    #: Seconds a sentinel probe (one request with every golden sample) may take before it fails.
    sentinel_latency_s: float = setting("SENTINEL_LATENCY_S", 2.0, "Latency limit of one sentinel probe (s).")
    #: Golden samples (rows of the champion's drift reference) sent in each sentinel probe.
    sentinel_samples: int = setting("SENTINEL_SAMPLES", 8, "Golden samples sent in each sentinel probe.")
    #: Fewest challenger requests (or logged predictions) before an error rate, non-finite or constant
    #: outputs roll back in the middle of a bake.
    canary_hard_min_requests: int = setting(
        "CANARY_HARD_MIN_REQUESTS", 10,
        "Fewest challenger requests before a mid-bake rollback on errors or bad outputs.",
    )
    #: Confidence (0-1) of the canary's bounds: error-rate lower bound (Clopper-Pearson), KS/PSI
    #: sampling margins and the quality interval.
    canary_confidence: float = setting(
        "CANARY_CONFIDENCE", 0.95, "Confidence (0-1) of the canary's bounds.", check=FRACTION,
    )
    #: Fewest labelled requests per version before the canary compares quality.
    canary_min_labels: int = setting(
        "CANARY_MIN_LABELS", 30, "Fewest labelled requests per version to compare quality.",
    )
    #: Quality metric compared when labels arrive during a canary (``auc`` or ``accuracy``).
    canary_quality_metric: str = setting(
        "CANARY_QUALITY_METRIC", "auc", "Quality metric with labels (auc, accuracy).", check=one_of("auc", "accuracy"),
    )
    #: Largest quality drop (metric units) of the challenger vs the champion tolerated at the upper
    #: confidence bound; a bigger drop with confidence fails the step.
    canary_max_quality_drop: float = setting(
        "CANARY_MAX_QUALITY_DROP", 0.02,
        "Largest quality drop vs the champion at the upper confidence bound (metric units).",
    )
    #: Feature-space coverage: fewest challenger requests in every reference decile bin that live
    #: traffic reaches, per important feature; fewer makes a step inconclusive (extended).
    canary_coverage_min_requests: int = setting(
        "CANARY_COVERAGE_MIN_REQUESTS", 5, "Fewest challenger requests per reached reference decile bin.",
    )
    #: Feature-space coverage: most important features checked (by the reference's importances;
    #: all features when the reference has none; 0 = all features).
    canary_coverage_features: int = setting(
        "CANARY_COVERAGE_FEATURES", 5, "Most important features checked for coverage (0 = all).",
    )
    #: Response header the gateway adds to name the model version that served a request.
    gateway_response_header: str = setting(
        "GATEWAY_RESPONSE_HEADER", "X-Tritonflow-Version", "Header naming the serving version.",
    )
    #: Seconds a second promotion of the same model waits for the lock (0: fail at once).
    promotion_lock_timeout_s: float = setting("PROMOTION_LOCK_TIMEOUT_S", 0.0, "Seconds to wait for a promotion lock.")
    #: SQLAlchemy URL of the coordination database (leases, watcher and retrain state, the versions each
    #: model keeps loaded); empty means the drift history database (``TRITONFLOW_DRIFT_HISTORY_DB_URL``).
    coordination_db_url: str = setting(
        "COORDINATION_DB_URL", "", "Shared DB of leases and coordination state (empty: the drift history DB).",
    )
    #: Seconds a lease lives without a heartbeat; its holder renews it every third of that.
    lease_ttl_s: float = setting("LEASE_TTL_S", 60.0, "Seconds a lease lives without a heartbeat.")
    #: Seconds a model-control operation (a Triton load/unload) waits for another one of the same model.
    model_control_lock_timeout_s: float = setting(
        "MODEL_CONTROL_LOCK_TIMEOUT_S", 600.0, "Seconds a Triton load/unload waits for another one of the same model.",
    )
    #: Memory a challenger needs, as a multiple of its model files' size (pre-flight estimate).
    preflight_memory_factor: float = setting("PREFLIGHT_MEMORY_FACTOR", 2.0, "Challenger memory / model file size.")
    #: Extra memory (MiB) the pre-flight keeps free beside the challenger estimate.
    preflight_memory_margin_mib: int = setting("PREFLIGHT_MEMORY_MARGIN_MIB", 512, "Memory kept free (MiB).")

    # -------------------------------------------------------------- conversion, validation, parity gate,
    # Model Analyzer, hardware
    #: Highest ``ai.onnx.ml`` opset the target ONNX Runtime implements (ORT 1.19: ai.onnx.ml 4).
    max_onnx_ml_opset: int = setting("MAX_ONNX_ML_OPSET", 4, "Highest ai.onnx.ml opset Triton's ORT runs.")
    #: The serving image the ONNX limits describe, quoted in every IR/opset refusal.
    target_triton_release: str = setting(
        "TARGET_TRITON_RELEASE", "nvcr.io/nvidia/tritonserver:24.10-py3 (Triton 2.51, ONNX Runtime 1.19)",
        "Serving release the limits describe.",
    )
    #: Parity gate: absolute tolerance per output element (|onnx - source| <= atol + rtol * |source|).
    parity_atol: float = setting("PARITY_ATOL", 1e-5, "Parity gate absolute tolerance.")
    #: Parity gate: relative tolerance per output element (same formula as ``numpy.isclose``).
    parity_rtol: float = setting("PARITY_RTOL", 1e-4, "Parity gate relative tolerance.")
    #: Parity gate: smallest fraction (0-1) of rows whose classifier label must agree.
    parity_min_label_agreement: float = setting(
        "PARITY_MIN_LABEL_AGREEMENT", 1.0, "Min label agreement (0-1).", check=FRACTION,
    )
    #: Rows in a validation sample built from an input example (example rows + seeded perturbations).
    validation_sample_rows: int = setting("VALIDATION_SAMPLE_ROWS", 64, "Rows of a perturbed validation sample.")
    #: Std of the seeded Gaussian perturbation, relative to each float column's scale (unitless).
    validation_perturbation: float = setting("VALIDATION_PERTURBATION", 0.05, "Relative std of perturbations.")
    #: Fallback replica: build, gate and serve an INT8 ``<model>__fallback`` beside each published version.
    fallback_enabled: bool = setting("FALLBACK_ENABLED", True, "Publish + route to an INT8 <model>__fallback.")
    #: Fallback parity gate: absolute tolerance per output element (looser: INT8 weights, dynamic
    #: activations; same formula as the main gate). Recorded on the MLflow model version.
    fallback_atol: float = setting("FALLBACK_ATOL", 0.05, "Fallback parity absolute tolerance.")
    #: Fallback parity gate: relative tolerance per output element.
    fallback_rtol: float = setting("FALLBACK_RTOL", 0.05, "Fallback parity relative tolerance.")
    #: Fallback parity gate: smallest fraction (0-1) of rows whose classifier label must agree.
    fallback_min_label_agreement: float = setting(
        "FALLBACK_MIN_LABEL_AGREEMENT", 0.95, "Fallback min label agreement (0-1).", check=FRACTION,
    )
    #: Seconds the gateway waits for the serving version's answer before retrying on the fallback.
    fallback_timeout_s: float = setting("FALLBACK_TIMEOUT_S", 10.0, "Gateway wait before retrying on the fallback.")
    #: Max abs difference allowed between TorchScript and eager-eval outputs.
    torchscript_atol: float = setting("TORCHSCRIPT_ATOL", 1e-5, "TorchScript vs eager-eval max abs diff.")
    #: Model Analyzer bounded search: candidate max_batch_size values (comma-separated ints).
    analyzer_max_batch_sizes: str = setting(
        "ANALYZER_MAX_BATCH_SIZES", "8,32", "Searched max_batch_size values.", check=whole_numbers(1),
    )
    #: Model Analyzer bounded search: candidate instance counts per group (comma-separated ints).
    analyzer_instance_counts: str = setting(
        "ANALYZER_INSTANCE_COUNTS", "1", "Searched instance counts.", check=whole_numbers(1),
    )
    #: Model Analyzer bounded search: dynamic batching max queue delays (microseconds, comma-separated).
    analyzer_queue_delays_us: str = setting(
        "ANALYZER_QUEUE_DELAYS_US", "500", "Searched queue delays (us).", check=whole_numbers(0),
    )
    #: Model Analyzer bounded search: client concurrencies (comma-separated ints).
    analyzer_concurrency: str = setting(
        "ANALYZER_CONCURRENCY", "4", "Searched client concurrencies.", check=whole_numbers(1),
    )
    #: perf_analyzer measurement window (milliseconds, time_windows mode) of the sweep and of the
    #: confirmation passes. perf_analyzer takes at least three stable windows a measurement: at
    #: 500 ms a confirmation pass takes about 1.9 s instead of 3.6 s, and the passes' throughput
    #: still varied by under 3 % on the publish benchmark's model (the stability limit is 10 %).
    analyzer_measurement_ms: int = setting("ANALYZER_MEASUREMENT_MS", 500, "perf_analyzer window (ms).",
                                           check=at_least(50, what="milliseconds"))
    #: Latency constraint of the profiling objective: p99 latency at most this many milliseconds.
    analyzer_p99_latency_ms: float = setting("ANALYZER_P99_LATENCY_MS", 100.0, "p99 latency constraint (ms).")
    #: A config whose throughput coefficient of variation across passes exceeds this is unstable.
    analyzer_stability_cv: float = setting("ANALYZER_STABILITY_CV", 0.1, "Max throughput CV of a stable config.")
    #: Seconds a Model Analyzer ``profile`` run may take before it is stopped.
    analyzer_timeout_s: float = setting("ANALYZER_TIMEOUT_S", 600.0, "Model Analyzer run timeout (s).")
    #: Passes per top-ranked config that confirm Model Analyzer's ranking before a config is adopted
    #: (perf_analyzer, interleaved; a config whose throughput CV exceeds analyzer_stability_cv or that
    #: perf_analyzer could not stabilise is dropped).
    analyzer_confirm_passes: int = setting("ANALYZER_CONFIRM_PASSES", 3, "Passes confirming the top configs (>= 3).")
    #: How many of Model Analyzer's best configs are confirmed with repeated passes.
    analyzer_confirm_top: int = setting("ANALYZER_CONFIRM_TOP", 2, "Top configs confirmed with repeated passes.")
    #: Largest p99 latency regression (fraction, 0.10 = 10 %) a challenger may show against the champion,
    #: on top of the measured noise band, before it is rejected (the practitioners' latency gate).
    max_p99_regression: float = setting(
        "MAX_P99_REGRESSION", 0.10, "Allowed challenger p99 regression beyond noise (0.1 = 10 %).", check=NON_NEGATIVE,
    )
    #: Smallest p99 latency regression (milliseconds, challenger median p99 minus champion's) that may
    #: reject a challenger, whatever the ratio: on models answering in about a millisecond, a busy CPU
    #: host moves p99 by fractions of a millisecond, and a +40 % ratio can be 0.6 ms of scheduling noise.
    #: 1 ms is 0.5 % of the 200 ms p99 red line of the practitioners' serving dashboard
    #: (``shared/references``, notebook-to-production, section 4.3).
    min_p99_regression_ms: float = setting(
        "MIN_P99_REGRESSION_MS", 1.0, "Smallest p99 regression (ms) the perf gate rejects on.", check=NON_NEGATIVE,
    )
    publish_profile: bool = setting(
        "PUBLISH_PROFILE", True,
        "model_publish profiles with Model Analyzer unless its 'profile' param says otherwise.",
    )
    publish_perf_gate: bool = setting(
        "PUBLISH_PERF_GATE", True,
        ("Publishes run the p99 gate (model_publish unless its 'perf_gate' param says otherwise; shadow_evaluation's"
         " challenger publish always follows this setting)."),
    )
    #: A challenger starts from the champion's measured config (no Model Analyzer sweep; the p99 gate
    #: confirms it) when flavour, tensors and dtypes match and the larger ONNX file is at most this
    #: many times the smaller.
    profile_reuse_size_factor: float = setting(
        "PROFILE_REUSE_SIZE_FACTOR", 1.5, "Largest model-size ratio at which a champion's profile is reused.",
        check=at_least(1, what="a size ratio"),
    )
    profile_force_sweep: bool = setting(
        "PROFILE_FORCE_SWEEP", False, "Always run the full Model Analyzer sweep (never reuse the champion's config).",
    )
    #: Seconds a publish's claim on its version lives without a heartbeat (a DAG run's queue gaps included).
    publish_claim_ttl_s: float = setting(
        "PUBLISH_CLAIM_TTL_S", 300.0, "Seconds a publish claim lives without a heartbeat.", check=POSITIVE_FINITE,
    )
    #: perf_analyzer passes per model of the p99 regression gate (interleaved, >= 3). From 5 on, the
    #: gate's noise band leaves out each end's extreme pass (``benchmarks/perf_gate.py`` compares).
    perf_gate_passes: int = setting(
        "PERF_GATE_PASSES", 5, "perf_analyzer passes per model of the p99 gate (>= 3).",
        check=at_least(3, what="a whole number"),
    )
    #: perf_analyzer measurement window of the p99 regression gate (milliseconds).
    perf_gate_measurement_ms: int = setting(
        "PERF_GATE_MEASUREMENT_MS", 250, "p99 gate measurement window (ms).",
        check=at_least(1, what="milliseconds"),
    )
    #: Requests a p99 gate window should hold: a model's window grows from ``perf_gate_measurement_ms``
    #: (up to 16x) until it holds them at the model's measured throughput, and doubles after an
    #: unstable pass (``model_registry.profiling.perf.next_window_ms``).
    perf_gate_min_requests: int = setting(
        "PERF_GATE_MIN_REQUESTS", 100, "Requests each p99 gate window should hold (its window grows to them).",
        check=at_least(1, what="a whole number"),
    )
    #: Fraction (0-1) of a GPU's free memory the instances of one model may plan to use.
    gpu_memory_budget_fraction: float = setting(
        "GPU_MEMORY_BUDGET_FRACTION", 0.8, "Share of free GPU memory.", check=FRACTION,
    )
    #: Fraction (0-1) of available host memory the CPU instances of one model may plan to use.
    host_memory_budget_fraction: float = setting(
        "HOST_MEMORY_BUDGET_FRACTION", 0.5, "Share of free host memory.", check=FRACTION,
    )
    #: Planned memory per model instance, as a multiple of the model file size (weights + arenas).
    instance_memory_factor: float = setting("INSTANCE_MEMORY_FACTOR", 2.0, "Instance memory / model file size.")
    #: Upper bound on instances of one model per device (or on the host for KIND_CPU).
    max_instance_count: int = setting("MAX_INSTANCE_COUNT", 4, "Most instances of a model per device.")

    # -------------------------------------------------------------- Airflow tasks and links
    #: HMAC secret shared with the MLflow webhook (empty: the receiver refuses every delivery).
    webhook_secret: str = setting("WEBHOOK_SECRET", "", "HMAC secret of the MLflow webhook.")
    #: Seconds a webhook's X-MLflow-Timestamp may differ from now (Standard Webhooks uses 5 minutes).
    webhook_tolerance_s: int = setting("WEBHOOK_TOLERANCE_S", 300, "Accepted webhook clock skew (s).")
    #: URL that failure notifications are POSTed to as JSON (empty: log only).
    alert_webhook_url: str = setting("ALERT_WEBHOOK_URL", "", "Failure notifications POST URL (empty: log).")
    #: Seconds to wait for the alert webhook to answer.
    alert_timeout_s: float = setting("ALERT_TIMEOUT_S", 10.0, "Alert webhook timeout (s).")
    #: YAML/JSON file mapping registry changes to DAG ids (empty: the built-in default mapping).
    event_mapping_path: str = setting("EVENT_MAPPING_PATH", "", "Registry-event-to-DAG mapping file.")
    #: Seconds between two polls of the MLflow registry by the registry watcher.
    registry_poll_interval_s: float = setting("REGISTRY_POLL_INTERVAL_S", 60.0, "Registry watcher poll (s).")
    #: Seconds after which the registry watcher sends again a change it sent whose runs
    #: ``registry_events`` has not confirmed (Airflow left its event for a later one, or the run failed).
    registry_resend_after_s: float = setting(
        "REGISTRY_RESEND_AFTER_S", 180.0, "Registry watcher re-sends an unconfirmed change after (s).",
        check=POSITIVE_FINITE,
    )
    #: Days the change ledger keeps a change whose runs were started, and a finished webhook delivery
    #: (the last value acted on per slot, which numbers the next move, is kept for ever).
    registry_ledger_retention_days: float = setting(
        "REGISTRY_LEDGER_RETENTION_DAYS", 30.0, "Days started registry changes and finished deliveries are kept.",
        check=POSITIVE_FINITE,
    )
    #: What an out-of-band move of alias ``champion`` does: ``request`` (put back, the version goes
    #: through model_publish and the canary) or ``refuse`` (put back, alert, nothing started).
    champion_move_policy: str = setting(
        "CHAMPION_MOVE_POLICY", "request", "Out-of-band champion move: request or refuse.",
        check=one_of("request", "refuse"),
    )
    #: Base URL of the MLflow UI for extra links (empty: the resolved tracking URI).
    mlflow_ui_url: str = setting("MLFLOW_UI_URL", "", "MLflow UI base URL for links (empty: tracking URI).")
    #: Triton HTTP base URL a browser reaches, for the "Triton model" extra link (empty: the URL the
    #: task used, e.g. ``http://127.0.0.1:8000``; docker-compose sets ``http://localhost:8000``).
    triton_public_url: str = setting(
        "TRITON_PUBLIC_URL", "", "Triton HTTP base URL for links (empty: the URL the task used).",
    )
    #: URL of the Grafana serving dashboard for the "Grafana panel" extra link (empty: no such link);
    #: the compose stack's is ``http://localhost:3000/d/tritonflow-triton``.
    grafana_dashboard_url: str = setting(
        "GRAFANA_DASHBOARD_URL", "", "Grafana serving dashboard URL for links (empty: no Grafana link).",
    )

    # -------------------------------------------------------------- shadow evaluation and retraining decisions
    #: Fewest labelled rows a shadow comparison needs; fewer is "inconclusive", never a win.
    shadow_min_labels: int = setting("SHADOW_MIN_LABELS", 200, "Fewest labelled rows to decide (else inconclusive).")
    #: Two-sided confidence level (0-1) of the paired bootstrap intervals of the shadow comparison.
    shadow_confidence: float = setting(
        "SHADOW_CONFIDENCE", 0.95, "Bootstrap interval confidence (0-1).", check=FRACTION,
    )
    #: Improvement (primary-metric units, e.g. AUC points) the challenger must show at the lower bound.
    shadow_margin: float = setting("SHADOW_MARGIN", 0.01, "Required primary-metric gain at the lower bound.")
    #: Largest worsening (metric units) tolerated on a guardrail metric.
    shadow_guardrail_tolerance: float = setting("SHADOW_GUARDRAIL_TOLERANCE", 0.02, "Tolerated guardrail loss.")
    #: Bootstrap resamples of the shadow comparison.
    shadow_n_boot: int = setting("SHADOW_N_BOOT", 1000, "Bootstrap resamples.")
    #: Champion counts as degraded when worse than its reference metric by more (metric units).
    shadow_degradation_tolerance: float = setting(
        "SHADOW_DEGRADATION_TOLERANCE", 0.05, "Champion drop below its reference that counts as degraded.",
    )
    #: Champion counts as degraded below this primary metric value (NaN: check off).
    shadow_champion_floor: float = setting("SHADOW_CHAMPION_FLOOR", float("nan"), "Champion metric floor (nan: off).")
    #: Seconds after a successful retraining of a model before another one may start.
    retrain_cooldown_s: float = setting("RETRAIN_COOLDOWN_S", 6 * 3600.0, "Seconds between retrainings of a model.")
    #: Seconds after which an unfinished retraining lock is treated as abandoned (crashed worker).
    retrain_stale_after_s: float = setting(
        "RETRAIN_STALE_AFTER_S", 12 * 3600.0, "Age (s) of an abandoned retrain lock.",
    )

    # -------------------------------------------------------------- drift statistics and thresholds
    #: Look-back of the dynamic drift threshold (days of hourly windows).
    drift_history_window_days: float = setting("DRIFT_HISTORY_WINDOW_DAYS", 30.0, "Dynamic threshold look-back (days).")
    #: Quantile of a distance statistic's history used as threshold (P95; p-values use 1 - q).
    drift_quantile: float = setting(
        "DRIFT_QUANTILE", 0.95, "Threshold quantile of distances (p-values: 1 - q).", check=FRACTION,
    )
    #: Hourly windows needed before the dynamic threshold replaces the static one (windows).
    drift_min_history_windows: int = setting("DRIFT_MIN_HISTORY_WINDOWS", 48, "Windows before dynamic thresholds.")
    #: Rows of each side passed to Evidently's DataDriftPreset (rows).
    drift_evidently_sample_rows: int = setting("DRIFT_EVIDENTLY_SAMPLE_ROWS", 5000, "Rows per side sent to Evidently.")
    #: SQLAlchemy URL of the drift history store; empty means SQLite at ``<home>/drift/history.db``.
    drift_history_db_url: str = setting("DRIFT_HISTORY_DB_URL", "", "Drift history DB URL (empty: SQLite).")
    #: What a window is compared with: ``training`` (the version's reference), ``trailing`` (the last
    #: N days of served traffic), ``seasonal`` (the same window one period earlier) or
    #: ``training_seasonal`` (the version's reference rows at the window's phase of the period; the
    #: reference needs row times, a ``timestamp`` column in its source).
    drift_reference_strategy: str = setting(
        "DRIFT_REFERENCE_STRATEGY", "training",
        "Drift reference: training, trailing (last N days served), seasonal (one period earlier) or "
        "training_seasonal (reference rows of the same season).",
        check=one_of("training", "trailing", "seasonal", "training_seasonal"),
    )
    #: Span of the ``trailing`` reference (days of served traffic).
    drift_trailing_days: float = setting("DRIFT_TRAILING_DAYS", 7.0, "Span of the trailing reference (days).")
    #: Period of the ``seasonal`` and ``training_seasonal`` references and of the season-matched run
    #: rule (hours; 168 = "the same hour last week"; 8766 = a year). 0: undeclared, a week for
    #: ``seasonal``; for the training reference's season, the longest of a year, a week and a day
    #: its row times cover twice (``drift_checks.season_match.choose_period``, Prophet's rule).
    drift_seasonal_period_hours: float = setting(
        "DRIFT_SEASONAL_PERIOD_HOURS", 0.0,
        "Seasonal period (hours; 0: a week for seasonal, the reference's year, week or day for its season).",
        check=NON_NEGATIVE,
    )
    #: How features weigh in the dataset verdict: ``importance`` (the model version's permutation
    #: importance, stored with its reference at publish time) or ``uniform``.
    drift_weighting: str = setting(
        "DRIFT_WEIGHTING", "importance",
        "Dataset verdict weights: importance or uniform.",
        check=one_of("importance", "uniform"),
    )
    #: Consecutive dataset-drift windows before a drift alert (windows).
    drift_consecutive_windows: int = setting(
        "DRIFT_CONSECUTIVE_WINDOWS", 2, "Dataset-drift windows in a row before a drift alert.",
    )
    #: Sustained-drift run rule (``drift_checks.policy``): one feature alerts, whatever its weight, when
    #: it is flagged in a window and had evidence (a statistic beyond its threshold) in
    #: ``DEFAULT_DRIFT_SUSTAINED_EVIDENCE - 1`` of the ``DEFAULT_DRIFT_SUSTAINED_WINDOWS - 1`` windows
    #: before: 4 of 5, the Western Electric / Nelson run rule (0 windows: rule off).
    drift_sustained_windows: int = setting(
        "DRIFT_SUSTAINED_WINDOWS", 5,
        "Run rule span: a feature flagged now with evidence in most of these windows alerts (0: off).",
        check=at_least(0, what="a whole number"),
    )
    drift_sustained_evidence: int = setting(
        "DRIFT_SUSTAINED_EVIDENCE", 4,
        "Windows of the run rule span (this one included) that must show evidence.",
        check=at_least(2, what="a whole number"),
    )
    #: Season-matched run rule (``drift_checks.policy``): a feature flagged against the reference now
    #: alerts, whatever its weight, when it showed evidence against the rows of its own season (the
    #: same phase of ``DRIFT_SEASONAL_PERIOD_HOURS``, ``drift_checks.season_match``) in each of the
    #: ``DRIFT_SEASONAL_RUN_WINDOWS - 1`` windows before (0: off). Needs the reference's row times
    #: and a season from at least 2 cycles; otherwise it never applies.
    drift_seasonal_run_windows: int = setting(
        "DRIFT_SEASONAL_RUN_WINDOWS", 4,
        "Season-matched run rule span: flagged now, with evidence against its season in every window before (0: off).",
        check=at_least(0, what="a whole number"),
    )
    #: Expected false drift alerts per model-week of hourly windows (alerts per 168 windows) that the
    #: alert policy is calibrated to on the reference's own windows (``drift_checks.budget``: the
    #: "expected run time between false alarms" of Alibi Detect's online detectors, ERT = 168 / budget
    #: windows). 1.0: issue 31's goal, at most one false alert per model-week.
    drift_false_alarm_budget_per_week: float = setting(
        "DRIFT_FALSE_ALARM_BUDGET_PER_WEEK", 1.0,
        "Expected false drift alerts per model-week (168 hourly windows) the thresholds are calibrated to.",
        check=POSITIVE_FINITE,
    )
    #: Quiet time after a drift alert of a model for alerts naming no new feature (hours of logical
    #: time: window starts, so replays and backfills behave like live runs).
    drift_alert_cooldown_hours: float = setting(
        "DRIFT_ALERT_COOLDOWN_HOURS", 24.0,
        "Hours (logical time) after a drift alert before one naming no new feature.",
    )
    #: A learned threshold never exceeds this multiple of the reference's own threshold (nor the
    #: statistic's strong effect); a value above that ceiling is a strong effect that alerts at once.
    drift_ceiling_factor: float = setting(
        "DRIFT_CEILING_FACTOR", 2.0,
        "Learned thresholds stop at this multiple of the reference's (strong effect above).",
    )
    #: Largest window (rows) read whole and scored exactly; larger windows are streamed in record
    #: batches into exact bin counts and KLL sketches (constant memory; ``drift_checks.summaries``).
    drift_exact_max_rows: int = setting(
        "DRIFT_EXACT_MAX_ROWS", 200_000,
        "Largest window (rows) scored exactly in memory; larger ones are streamed (bins + sketches).",
    )
    #: KLL sketch size ``k`` of streamed windows (4096: stated rank error 9.6e-4, ~97 KB per feature).
    drift_sketch_k: int = setting("DRIFT_SKETCH_K", 4096, "KLL sketch k of streamed windows (4096: rank error 9.6e-4).")
    #: Rows per record batch when a window is streamed (memory per batch: rows x columns x 8 bytes).
    drift_stream_batch_rows: int = setting(
        "DRIFT_STREAM_BATCH_ROWS", 131_072, "Rows per record batch of a streamed window.",
    )
    #: Most processes summarising a streamed window's files in parallel, the check's own included (0: one per CPU core).
    drift_stream_workers: int = setting(
        "DRIFT_STREAM_WORKERS", 0,
        "Most processes summarising a streamed window's files, this one included (0: one per CPU core).",
    )
    #: Who summarises a streamed window: ``local`` (this process and its workers) or ``spark``
    #: (per-partition summaries computed by Spark, merged on the driver; ``drift_checks.spark``).
    drift_engine: str = setting(
        "DRIFT_ENGINE", "local", "Summaries of streamed windows: local or spark.", check=one_of("local", "spark"),
    )
    #: Spark master URL of the ``spark`` drift engine (``local[N]`` runs Spark inside the task).
    spark_master: str = setting("SPARK_MASTER", "local[2]", "Spark master URL of the spark drift engine.")
    #: Inference-log root (folder or s3://bucket/prefix); empty means ``<home>/inference_logs``.
    inference_log_root: str = setting("INFERENCE_LOG_ROOT", "", "Inference-log root: folder or s3://bucket/prefix.")

    # -------------------------------------------------------------- publishing to the repository
    #: PEM ECDSA private key used to sign model versions (OpenSSF model-signing); never logged.
    signing_key_path: Path = setting(
        "SIGNING_KEY_PATH", _DEFAULT_HOME / "keys" / "model_signing.pem",
        "Private key (PEM) that signs model versions.",
    )
    #: Folder of trusted PEM public keys (``*.pub``/``*.pem``); several allow key rotation.
    signing_trusted_keys_dir: Path = setting(
        "SIGNING_TRUSTED_KEYS_DIR", _DEFAULT_HOME / "keys" / "trusted", "Trusted public keys (PEM) folder.",
    )
    #: boto3 ``endpoint_url`` for an S3 repository; empty: the endpoint written in the s3:// URL.
    s3_endpoint_url: str = setting("S3_ENDPOINT_URL", "", "boto3 S3 endpoint (empty: from the s3:// URL).")
    staging_uri: str = setting(
        "STAGING_URI", "",
        ("s3://bucket/prefix where tasks share the work files they hand on (publish staging, shadow replays, "
         "training windows), so each may run on another worker (empty: one host or a shared home)."),
    )

    # -------------------------------------------------------------- shadow and retraining runs
    #: Hours of inference log a shadow evaluation replays when no drift window is given (hours).
    shadow_window_hours: float = setting("SHADOW_WINDOW_HOURS", 24.0, "Hours replayed without a drift window.")
    #: Hours after a window's end during which its labels may still arrive (labels read window).
    shadow_label_lag_hours: float = setting("SHADOW_LABEL_LAG_HOURS", 72.0, "Hours labels may arrive after a window.")
    #: Concurrent inference requests of a shadow replay (threads, one HTTP client each).
    shadow_replay_concurrency: int = setting("SHADOW_REPLAY_CONCURRENCY", 4, "Concurrent replay requests.")
    #: Most logged rows a shadow replay sends (the most recent are kept; rows).
    shadow_max_replay_rows: int = setting("SHADOW_MAX_REPLAY_ROWS", 100_000, "Most rows a shadow replay sends.")
    #: Live shadow: percent (1-100) of the champion's requests the gateway mirrors to the challenger.
    shadow_mirror_percent: int = setting(
        "SHADOW_MIRROR_PERCENT", 10,
        "Live shadow: percent of champion requests mirrored to the challenger.",
        check=PERCENT,
    )
    #: Live shadow: seconds the mirror collects the challenger's outputs on live requests.
    shadow_live_duration_s: float = setting(
        "SHADOW_LIVE_DURATION_S", 600.0, "Live shadow: seconds of mirrored traffic.",
    )
    #: Live shadow: address the gateway reaches the mirror recorder at (the worker's host).
    shadow_mirror_host: str = setting(
        "SHADOW_MIRROR_HOST", "127.0.0.1", "Live shadow: host the gateway reaches the recorder at.",
    )
    #: Days of inference log (joined with labels) a retraining trains on (days).
    retrain_window_days: float = setting("RETRAIN_WINDOW_DAYS", 30.0, "Days of labelled log a retraining uses.")
    #: Share (0-1) of the training window taken from the version's reference data.
    retrain_mix_reference_fraction: float = setting(
        "RETRAIN_MIX_REFERENCE_FRACTION", 0.0, "Share (0-1) of reference rows in a training window.", check=FRACTION,
    )
    #: Training entry point of models without their own (``module:function`` or ``project:<uri>``).
    retrain_entry_point: str = setting(
        "RETRAIN_ENTRY_POINT", "model_registry.training:train_noaa", "Default training entry point.",
    )
    #: Per-model entry points, a JSON object ``{"model": "module:function"}`` (empty: none).
    retrain_entry_points: str = setting(
        "RETRAIN_ENTRY_POINTS", "", "Per-model entry points (JSON object).", check=JSON_OBJECT,
    )
    #: Schedule of the ``retrain`` DAG (cron or preset such as ``@daily``; empty: none).
    retrain_schedule: str = setting("RETRAIN_SCHEDULE", "", "Schedule of the retrain DAG (empty: none).")
    #: Model the scheduled ``retrain`` runs retrain (empty: the model must be given as a param).
    retrain_default_model: str = setting("RETRAIN_DEFAULT_MODEL", "", "Model a scheduled retrain retrains.")
    #: How a retraining after a confirmed shift (champion degraded) chooses its rows: ``evidence`` (the
    #: rows since the served model's loss rose, with a floor) or ``span`` (the last RETRAIN_WINDOW_DAYS).
    retrain_window_rule: str = setting(
        "RETRAIN_WINDOW_RULE", "evidence", "Window after a confirmed shift: evidence or span.",
        check=one_of("evidence", "span"),
    )
    #: Floor on the labelled rows of an evidence window (fewer since the change point: the latest this many).
    retrain_min_post_shift_rows: int = setting(
        "RETRAIN_MIN_POST_SHIFT_ROWS", 200, "Fewest rows of an evidence window.", check=at_least(1),
    )
    #: The change point is looked for in this many RETRAIN_WINDOW_DAYS spans before the window's end.
    retrain_evidence_lookback_factor: float = setting(
        "RETRAIN_EVIDENCE_LOOKBACK_FACTOR", 3.0, "Spans searched for the change point.", check=at_least(1),
    )
    #: A window with fewer post-shift rows than this many floors asks for a follow-up retraining.
    retrain_followup_factor: float = setting(
        "RETRAIN_FOLLOWUP_FACTOR", 3.0, "Floors of post-shift rows below which a follow-up is due.",
        check=NON_NEGATIVE,
    )
    #: Hours (logical) after a short window's end its follow-up retraining is due.
    retrain_followup_hours: float = setting(
        "RETRAIN_FOLLOWUP_HOURS", 4.0, "Hours after a short window's end a follow-up is due.", check=POSITIVE_FINITE,
    )
    #: Inference-log column of the served model's score (the loss whose rise locates a shift); empty:
    #: the model logs none, so a retraining after a shift keeps the span (the main job sets its own).
    retrain_score_column: str = setting(
        "RETRAIN_SCORE_COLUMN", "", "Logged score column the change point is found in (empty: none, keep the span).",
    )

    # -------------------------------------------------------------- drift monitor runs
    #: Registered models the hourly drift monitor checks, comma-separated; empty means every model
    #: with a ``champion`` alias.
    monitored_models: str = setting(
        "MONITORED_MODELS", "", "Models the drift monitor checks, comma-separated (empty: all).",
    )
    #: Models one drift_monitor task instance checks (and records, decides) in turn (models): fewer,
    #: larger task instances, since each costs seconds of process start-up on a small deployment.
    drift_models_per_task: int = setting(
        "DRIFT_MODELS_PER_TASK", 10,
        "Models one drift_monitor task instance checks, records and decides (>= 1).",
        check=at_least(1, what="a whole number"),
    )

    # remote deployment (docker-compose): services addressed by name instead of host + port
    triton_url: str = setting(
        "TRITON_URL", "", "host:port of Triton's HTTP endpoint (empty: <host>:<triton_http_port>).",
    )
    triton_replica_urls: str = setting(
        "TRITON_REPLICA_URLS", "",
        ("host:port of every Triton replica behind the gateway, comma-separated, sharing one repository (empty: just"
         " triton_url)."),
    )
    triton_metrics_url: str = setting(
        "TRITON_METRICS_URL", "", "Triton metrics URL (empty: http://<host>:<triton_metrics_port>/metrics).",
    )
    gateway_url: str = setting("GATEWAY_URL", "", "Gateway base URL (empty: http://<host>:<gateway_port>).")

    # Airflow connections (read by every tritonflow task when it starts; a defined one wins over
    # the matching settings above; empty id: not looked up)
    mlflow_conn_id: str = setting(
        "MLFLOW_CONN_ID", "mlflow_default", "Airflow connection (type mlflow) giving the MLflow tracking URI.",
    )
    triton_conn_id: str = setting(
        "TRITON_CONN_ID", "triton_default", "Airflow connection (type triton) giving Triton's HTTP and metrics URLs.",
    )
    gateway_conn_id: str = setting(
        "GATEWAY_CONN_ID", "tritonflow_gateway", "Airflow connection (type http) giving the gateway URL.",
    )
    aws_conn_id: str = setting(
        "AWS_CONN_ID", "aws_default",
        "Airflow connection (type aws) giving the S3 endpoint (extra endpoint_url) and credentials.",
    )
    gateway_conf_dir: str = setting(
        "GATEWAY_CONF_DIR", "", "Gateway config folder the router writes (empty: <home>/run/gateway).",
    )
    #: Gateway reload mechanism: "local" signals NGINX on this host; "watcher" asks the gateway
    #: container's reload watcher through ``<conf_dir>/reload.request`` (docker-compose).
    gateway_reload: str = setting(
        "GATEWAY_RELOAD", "local",
        "How the router reloads NGINX: 'local' (nginx -s reload) or 'watcher' (reload.request file).",
        check=one_of("local", "watcher"),
    )
    gateway_access_log: str = setting(
        "GATEWAY_ACCESS_LOG", "",
        ("Gateway status log (one JSON line per routed request) the canary counts per-version errors from (empty: "
         "<gateway conf dir>/tritonflow-router/gateway_access.jsonl, written only where NGINX runs on the worker's "
         "host; 'off': not used)."),
    )
    #: Traffic router in front of Triton (``repository_sync.routing.router.ROUTERS`` names the choices).
    traffic_router: str = setting(
        "TRAFFIC_ROUTER", "nginx",
        "Traffic router that splits a model's requests between versions: 'nginx' (the only one so far).",
    )

    # -------------------------------------------------------------- the local Airflow
    #: Metadata DB of the local Airflow deployment; empty: SQLite (WAL) under ``<home>/airflow``.
    airflow_database_url: str = setting(
        "AIRFLOW_DATABASE_URL", "",
        "Metadata DB of the local Airflow (SQLAlchemy URL, e.g. PostgreSQL); empty: SQLite under <home>/airflow.",
    )
    #: API server / UI port of the local Airflow deployment (8080 is the gateway's).
    airflow_api_port: int = setting("AIRFLOW_API_PORT", 8280, "Local Airflow API server and UI port.")
    #: Port of the local Airflow's execution API process, SQLite metadata DB only (why:
    #: :class:`tritonflow.runtime.airflow_config.AirflowConfig`'s ``execution_api_port``).
    airflow_execution_api_port: int = setting(
        "AIRFLOW_EXECUTION_API_PORT", 8281,
        "Local Airflow execution API port (its own process when the metadata DB is SQLite).",
    )
    #: LocalExecutor task slots of the local Airflow deployment.
    airflow_parallelism: int = setting(
        "AIRFLOW_PARALLELISM", 4, "Local Airflow LocalExecutor task slots (>= 4).",
        check=at_least(4, what="", why="runs of different DAGs overlap"),
    )
    #: Ports the local Airflow's scheduler (task logs) and triggerer (trigger logs) serve logs on.
    airflow_worker_log_port: int = setting("AIRFLOW_WORKER_LOG_PORT", 8793, "Local Airflow port serving task logs.")
    airflow_triggerer_log_port: int = setting(
        "AIRFLOW_TRIGGERER_LOG_PORT", 8794, "Local Airflow port serving trigger logs.",
    )
    #: Airflow REST API the CLI's ``promote``, ``rollback``, ``approve`` and ``reject`` call; empty:
    #: the local deployment's (``http://HOST:AIRFLOW_API_PORT``).
    airflow_url: str = setting("AIRFLOW_URL", "", "Airflow API server the CLI operates through; empty: the local one.")
    #: Airflow user the CLI signs in as (simple auth manager); empty: all-admins mode, no credentials.
    airflow_username: str = setting("AIRFLOW_USERNAME", "", "Airflow user of the CLI; empty: no credentials.")
    airflow_password: str = setting("AIRFLOW_PASSWORD", "", "Password of TRITONFLOW_AIRFLOW_USERNAME.")

    # -------------------------------------------------------------- the main job
    #: Weighted share (0-1) of flagged features that makes a window's dataset verdict ``drift``
    #: (Evidently's default share 0.5; weights per ``TRITONFLOW_DRIFT_WEIGHTING``). A drift alert
    #: needs it in ``TRITONFLOW_DRIFT_CONSECUTIVE_WINDOWS`` windows in a row, or one strong effect.
    drift_dataset_share: float = setting(
        "DRIFT_DATASET_SHARE", 0.5,
        "Weighted share of flagged features for a dataset-drift window (0-1).",
        check=FRACTION,
    )

    # ------------------------------------------------------------------ derived values
    @property
    def log_dir(self) -> Path:
        """Folder of service logs (``<home>/logs``)."""
        return self.home / "logs"

    @property
    def run_dir(self) -> Path:
        """Folder of pid files and generated service configs (``<home>/run``)."""
        return self.home / "run"

    @property
    def local_repository(self) -> Path:
        """Default filesystem Triton repository (``<home>/model_repository``)."""
        return self.home / "model_repository"

    @property
    def resolved_repository_uri(self) -> str:
        """The configured repository URI, else the local repository folder."""
        return self.repository_uri or str(self.local_repository)

    @property
    def resolved_mlflow_backend_uri(self) -> str:
        """The MLflow server store, SQLite under ``<home>/mlflow`` unless configured."""
        return self.mlflow_backend_uri or f"sqlite:///{self.home / 'mlflow' / 'mlflow.db'}"

    @property
    def resolved_mlflow_tracking_uri(self) -> str:
        """The tracking URI clients use, the local server unless configured."""
        return self.mlflow_tracking_uri or f"http://{self.host}:{self.mlflow_port}"

    @property
    def resolved_airflow_url(self) -> str:
        """The Airflow API server the CLI calls, the local deployment's unless configured."""
        return (self.airflow_url or f"http://{self.host}:{self.airflow_api_port}").rstrip("/")

    @property
    def triton_http_url(self) -> str:
        """``host:port`` of Triton's HTTP endpoint, as tritonclient expects it."""
        return self.triton_url or f"{self.host}:{self.triton_http_port}"

    @property
    def triton_replica_http_urls(self) -> list[str]:
        """``host:port`` of every Triton replica (``triton_replica_urls``, else ``[triton_http_url]``).

        Raises:
            DataError: An entry is not ``host:port``.
        """
        from ground.values import parse_replica_urls

        return parse_replica_urls(self.triton_replica_urls) or [self.triton_http_url]

    @property
    def resolved_triton_metrics_url(self) -> str:
        """Triton's Prometheus metrics URL."""
        return self.triton_metrics_url or f"http://{self.host}:{self.triton_metrics_port}/metrics"

    @property
    def resolved_gateway_url(self) -> str:
        """Base URL of the NGINX gateway."""
        return self.gateway_url or f"http://{self.host}:{self.gateway_port}"

    @property
    def resolved_gateway_conf_dir(self) -> Path:
        """Folder holding the gateway's ``http.d/`` and ``locations.d/`` (the router writes there)."""
        return Path(self.gateway_conf_dir) if self.gateway_conf_dir else self.run_dir / "gateway"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Build settings from ``TRITONFLOW_*`` variables, then apply keyword overrides.

        Args:
            environ: Mapping to read (default ``os.environ``).
            **overrides: Field values that win over the environment.

        Raises:
            SettingsError: A variable cannot be converted to its field's type; the message names
                the variable, the value and the expected type.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = ENV_PREFIX + f.metadata["env"]
            if name in environ:
                values[f.name] = _convert(name, environ[name], f.default)
        values.update(overrides)
        return cls(**values)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_port") and isinstance(value, int) and not 0 <= value <= 65535:
                raise SettingsError(
                    f"{ENV_PREFIX + f.metadata['env']}={value!r} is not a TCP port "
                    "(expected 0-65535; 0 picks a free port where a service allows it)"
                )
        _check_link_urls(self)

    @classmethod
    def effective(cls, environ: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
        """Rows of (variable, value in effect, source).

        The source is ``default``, ``environment`` or ``connection <id>`` (inside an Airflow task,
        for the settings an Airflow connection gave: see ``tritonflow_plugin.connections``).

        Args:
            environ: Mapping to read (default ``os.environ``).

        Raises:
            SettingsError: A variable holds a value its field cannot take (see :meth:`from_env`).
        """
        environ = os.environ if environ is None else environ
        settings = cls.from_env(environ)
        from_connections = dict(
            item.split("=", 1) for item in environ.get(CONNECTION_SOURCES_ENV, "").split(",") if "=" in item
        )
        rows = []
        for f in dataclasses.fields(cls):
            name = ENV_PREFIX + f.metadata["env"]
            source = ("connection " + from_connections[name] if name in from_connections
                      else "environment" if name in environ else "default")
            rows.append((name, str(getattr(settings, f.name)), source))
        return rows

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """Rows of (variable, default, description) for the configuration reference (docs/configuration.md)."""
        return [
            (ENV_PREFIX + f.metadata["env"], str(f.default), f.metadata["doc"])
            for f in dataclasses.fields(cls)
        ]


#: Settings holding a base URL a browser opens from the Airflow UI's extra links.
LINK_URL_FIELDS = ("mlflow_ui_url", "triton_public_url", "grafana_dashboard_url")


def _check_link_urls(settings: Settings) -> None:
    """Refuse a link base URL that is neither empty nor ``http(s)://...`` (a browser could not open it)."""
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if field.name in LINK_URL_FIELDS and value and not value.startswith(("http://", "https://")):
            raise SettingsError(
                f"{ENV_PREFIX + field.metadata['env']}={value!r} is not a URL a browser can open "
                "(expected empty or http(s)://host[:port][/path])"
            )


def _convert(name: str, raw: str, default: Any) -> Any:
    kind = type(default)
    try:
        if isinstance(default, Path):
            return Path(raw).expanduser()
        if kind is bool:
            if raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if raw.lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        raise SettingsError(
            f"{name}={raw!r} is not a valid {kind.__name__} (expected e.g. {default!r})"
        ) from None


#: Every setting at its default, whatever the environment holds: the one source of a default for
#: code that needs it without settings (policies' fields, keyword defaults, the demo's port search).
DEFAULTS = Settings()


def get_settings(**overrides: Any) -> Settings:
    """Return settings from the current environment, with optional overrides."""
    return Settings.from_env(**overrides)
