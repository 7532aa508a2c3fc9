"""Typed settings of tritonflow, read from ``TRITONFLOW_*`` environment variables.

One frozen dataclass field per variable, with its variable name and a one-line description; every
default is a named constant of :mod:`ground.settings_defaults`, documented there with its unit.
Nothing is read at import time: call :func:`get_settings` (or :meth:`Settings.from_env` with an
explicit mapping in tests). Value checks beyond types are :mod:`ground.settings_checks`.

Example::

    from ground.settings import get_settings
    s = get_settings()
    s.triton_http_port  # 8000 unless TRITONFLOW_TRITON_HTTP_PORT is set
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from ground import settings_defaults as defaults
from ground.exceptions import SettingsError

ENV_PREFIX = "TRITONFLOW_"
#: Set inside Airflow tasks: ``TRITONFLOW_X=conn_id,...``, the settings an Airflow connection gave
#: (``tritonflow_plugin.connections``); read by :meth:`Settings.effective` to name the source.
CONNECTION_SOURCES_ENV = "TRITONFLOW_FROM_CONNECTIONS"


def _field(default: Any, env: str, doc: str) -> Any:
    return dataclasses.field(default=default, metadata={"env": env, "doc": doc})


@dataclasses.dataclass(frozen=True)
class Settings:
    """All tritonflow settings. Build with :meth:`from_env`; fields are immutable."""

    home: Path = _field(defaults.DEFAULT_HOME, "HOME", "State folder: logs, pids, local repository, stores.")
    triton_venv: Path = _field(defaults.DEFAULT_TRITON_VENV, "TRITON_VENV", "Triton tools virtualenv.")
    host: str = _field(defaults.DEFAULT_HOST, "HOST", "Loopback address the local services bind to.")
    triton_http_port: int = _field(defaults.DEFAULT_TRITON_HTTP_PORT, "TRITON_HTTP_PORT", "Triton HTTP port.")
    triton_grpc_port: int = _field(defaults.DEFAULT_TRITON_GRPC_PORT, "TRITON_GRPC_PORT", "Triton gRPC port.")
    triton_metrics_port: int = _field(
        defaults.DEFAULT_TRITON_METRICS_PORT, "TRITON_METRICS_PORT", "Triton Prometheus metrics port."
    )
    mlflow_port: int = _field(defaults.DEFAULT_MLFLOW_PORT, "MLFLOW_PORT", "MLflow tracking server port.")
    s3_port: int = _field(defaults.DEFAULT_S3_PORT, "S3_PORT", "Local S3-compatible endpoint (moto) port.")
    gateway_port: int = _field(defaults.DEFAULT_GATEWAY_PORT, "GATEWAY_PORT", "NGINX gateway port.")
    start_timeout_s: float = _field(
        defaults.DEFAULT_START_TIMEOUT_S, "START_TIMEOUT_S", "Seconds to wait for a service to be healthy."
    )
    mlflow_backend_uri: str = _field(
        defaults.DEFAULT_MLFLOW_BACKEND_URI, "MLFLOW_BACKEND_URI", "MLflow server store URI (empty: SQLite)."
    )
    mlflow_tracking_uri: str = _field(
        defaults.DEFAULT_MLFLOW_TRACKING_URI, "MLFLOW_TRACKING_URI", "Tracking URI (empty: local server)."
    )
    repository_uri: str = _field(
        "", "REPOSITORY_URI", "Triton model repository: a folder or s3://http://host:port/bucket/prefix."
    )
    max_onnx_ir_version: int = _field(
        defaults.DEFAULT_MAX_ONNX_IR_VERSION, "MAX_ONNX_IR_VERSION", "Highest ONNX IR version Triton loads."
    )
    max_onnx_opset: int = _field(defaults.DEFAULT_MAX_ONNX_OPSET, "MAX_ONNX_OPSET", "Highest ONNX opset.")
    load_timeout_s: float = _field(
        defaults.DEFAULT_LOAD_TIMEOUT_S, "LOAD_TIMEOUT_S", "Seconds to wait for a model version to be READY."
    )
    max_xcom_bytes: int = _field(
        defaults.DEFAULT_MAX_XCOM_BYTES, "MAX_XCOM_BYTES", "Largest XCom a task may return (bytes)."
    )

    # ------------------------------------------------------------------ repository_sync: canary
    canary_steps: str = _field(
        defaults.DEFAULT_CANARY_STEPS, "CANARY_STEPS", "Canary steps, percent of traffic, comma-separated."
    )
    canary_bake_s: float = _field(defaults.DEFAULT_CANARY_BAKE_S, "CANARY_BAKE_S", "Seconds each step bakes.")
    canary_min_requests: int = _field(
        defaults.DEFAULT_CANARY_MIN_REQUESTS, "CANARY_MIN_REQUESTS", "Fewest canary requests per step."
    )
    canary_max_extensions: int = _field(
        defaults.DEFAULT_CANARY_MAX_EXTENSIONS, "CANARY_MAX_EXTENSIONS", "Extensions of an inconclusive step."
    )
    canary_max_error_rate: float = _field(
        defaults.DEFAULT_CANARY_MAX_ERROR_RATE, "CANARY_MAX_ERROR_RATE", "Highest canary error rate (0-1)."
    )
    canary_max_mean_latency_ms: float = _field(
        defaults.DEFAULT_CANARY_MAX_MEAN_LATENCY_MS, "CANARY_MAX_MEAN_LATENCY_MS", "Highest canary mean latency (ms)."
    )
    canary_max_latency_ratio: float = _field(defaults.DEFAULT_CANARY_MAX_LATENCY_RATIO, "CANARY_MAX_LATENCY_RATIO",
                                             "Highest canary/champion latency ratio.")
    canary_min_latency_delta_ms: float = _field(defaults.DEFAULT_CANARY_MIN_LATENCY_DELTA_MS,
                                                "CANARY_MIN_LATENCY_DELTA_MS",
                                                "Smallest latency difference (ms) the ratio may fail a step on.")
    canary_max_prediction_ks: float = _field(
        defaults.DEFAULT_CANARY_MAX_PREDICTION_KS, "CANARY_MAX_PREDICTION_KS", "Highest prediction KS statistic."
    )
    canary_max_prediction_psi: float = _field(
        defaults.DEFAULT_CANARY_MAX_PREDICTION_PSI, "CANARY_MAX_PREDICTION_PSI", "Highest prediction PSI."
    )
    canary_analysis_interval_s: float = _field(
        defaults.DEFAULT_CANARY_ANALYSIS_INTERVAL_S, "CANARY_ANALYSIS_INTERVAL_S",
        "Seconds between analyses during a bake (hard failures roll back at once).",
    )
    sentinel_interval_s: float = _field(defaults.DEFAULT_SENTINEL_INTERVAL_S, "SENTINEL_INTERVAL_S",
                                        "Seconds between two sentinel probes of a champion.")
    sentinel_failures: int = _field(defaults.DEFAULT_SENTINEL_FAILURES, "SENTINEL_FAILURES",
                                    "Consecutive failed sentinel probes that roll a champion back.")
    sentinel_latency_s: float = _field(
        defaults.DEFAULT_SENTINEL_LATENCY_S, "SENTINEL_LATENCY_S", "Latency limit of one sentinel probe (s).",
    )
    sentinel_samples: int = _field(
        defaults.DEFAULT_SENTINEL_SAMPLES, "SENTINEL_SAMPLES", "Golden samples sent in each sentinel probe.",
    )
    canary_hard_min_requests: int = _field(
        defaults.DEFAULT_CANARY_HARD_MIN_REQUESTS, "CANARY_HARD_MIN_REQUESTS",
        "Fewest challenger requests before a mid-bake rollback on errors or bad outputs.",
    )
    canary_confidence: float = _field(
        defaults.DEFAULT_CANARY_CONFIDENCE, "CANARY_CONFIDENCE", "Confidence (0-1) of the canary's bounds."
    )
    canary_min_labels: int = _field(defaults.DEFAULT_CANARY_MIN_LABELS, "CANARY_MIN_LABELS",
                                    "Fewest labelled requests per version to compare quality.")
    canary_quality_metric: str = _field(
        defaults.DEFAULT_CANARY_QUALITY_METRIC, "CANARY_QUALITY_METRIC", "Quality metric with labels (auc, accuracy)."
    )
    canary_max_quality_drop: float = _field(
        defaults.DEFAULT_CANARY_MAX_QUALITY_DROP, "CANARY_MAX_QUALITY_DROP",
        "Largest quality drop vs the champion at the upper confidence bound (metric units).",
    )
    canary_coverage_min_requests: int = _field(
        defaults.DEFAULT_CANARY_COVERAGE_MIN_REQUESTS, "CANARY_COVERAGE_MIN_REQUESTS",
        "Fewest challenger requests per reached reference decile bin.",
    )
    canary_coverage_features: int = _field(defaults.DEFAULT_CANARY_COVERAGE_FEATURES, "CANARY_COVERAGE_FEATURES",
                                           "Most important features checked for coverage (0 = all).")
    gateway_response_header: str = _field(
        defaults.DEFAULT_GATEWAY_RESPONSE_HEADER, "GATEWAY_RESPONSE_HEADER", "Header naming the serving version."
    )
    promotion_lock_timeout_s: float = _field(
        defaults.DEFAULT_PROMOTION_LOCK_TIMEOUT_S, "PROMOTION_LOCK_TIMEOUT_S", "Seconds to wait for a promotion lock."
    )
    coordination_db_url: str = _field(defaults.DEFAULT_COORDINATION_DB_URL, "COORDINATION_DB_URL",
                                      "Shared DB of leases and coordination state (empty: the drift history DB).")
    lease_ttl_s: float = _field(
        defaults.DEFAULT_LEASE_TTL_S, "LEASE_TTL_S", "Seconds a lease lives without a heartbeat."
    )
    model_control_lock_timeout_s: float = _field(
        defaults.DEFAULT_MODEL_CONTROL_LOCK_TIMEOUT_S, "MODEL_CONTROL_LOCK_TIMEOUT_S",
        "Seconds a Triton load/unload waits for another one of the same model.",
    )
    preflight_memory_factor: float = _field(
        defaults.DEFAULT_PREFLIGHT_MEMORY_FACTOR, "PREFLIGHT_MEMORY_FACTOR", "Challenger memory / model file size."
    )
    preflight_memory_margin_mib: int = _field(
        defaults.DEFAULT_PREFLIGHT_MEMORY_MARGIN_MIB, "PREFLIGHT_MEMORY_MARGIN_MIB", "Memory kept free (MiB)."
    )

    # -------------------------------------------------------------- model_registry (conversion,
    # validation, parity gate, Model Analyzer, hardware)
    max_onnx_ml_opset: int = _field(
        defaults.DEFAULT_MAX_ONNX_ML_OPSET, "MAX_ONNX_ML_OPSET", "Highest ai.onnx.ml opset Triton's ORT runs."
    )
    target_triton_release: str = _field(
        defaults.DEFAULT_TARGET_TRITON_RELEASE, "TARGET_TRITON_RELEASE", "Serving release the limits describe."
    )
    parity_atol: float = _field(defaults.DEFAULT_PARITY_ATOL, "PARITY_ATOL", "Parity gate absolute tolerance.")
    parity_rtol: float = _field(defaults.DEFAULT_PARITY_RTOL, "PARITY_RTOL", "Parity gate relative tolerance.")
    parity_min_label_agreement: float = _field(
        defaults.DEFAULT_PARITY_MIN_LABEL_AGREEMENT, "PARITY_MIN_LABEL_AGREEMENT", "Min label agreement (0-1)."
    )
    validation_sample_rows: int = _field(
        defaults.DEFAULT_VALIDATION_SAMPLE_ROWS, "VALIDATION_SAMPLE_ROWS", "Rows of a perturbed validation sample."
    )
    validation_perturbation: float = _field(
        defaults.DEFAULT_VALIDATION_PERTURBATION, "VALIDATION_PERTURBATION", "Relative std of perturbations."
    )
    fallback_enabled: bool = _field(
        defaults.DEFAULT_FALLBACK_ENABLED, "FALLBACK_ENABLED", "Publish + route to an INT8 <model>__fallback."
    )
    fallback_atol: float = _field(
        defaults.DEFAULT_FALLBACK_ATOL, "FALLBACK_ATOL", "Fallback parity absolute tolerance."
    )
    fallback_rtol: float = _field(
        defaults.DEFAULT_FALLBACK_RTOL, "FALLBACK_RTOL", "Fallback parity relative tolerance."
    )
    fallback_min_label_agreement: float = _field(
        defaults.DEFAULT_FALLBACK_MIN_LABEL_AGREEMENT, "FALLBACK_MIN_LABEL_AGREEMENT",
        "Fallback min label agreement (0-1)."
    )
    fallback_timeout_s: float = _field(
        defaults.DEFAULT_FALLBACK_TIMEOUT_S, "FALLBACK_TIMEOUT_S", "Gateway wait before retrying on the fallback."
    )
    torchscript_atol: float = _field(
        defaults.DEFAULT_TORCHSCRIPT_ATOL, "TORCHSCRIPT_ATOL", "TorchScript vs eager-eval max abs diff."
    )
    analyzer_max_batch_sizes: str = _field(
        defaults.DEFAULT_ANALYZER_MAX_BATCH_SIZES, "ANALYZER_MAX_BATCH_SIZES", "Searched max_batch_size values."
    )
    analyzer_instance_counts: str = _field(
        defaults.DEFAULT_ANALYZER_INSTANCE_COUNTS, "ANALYZER_INSTANCE_COUNTS", "Searched instance counts."
    )
    analyzer_queue_delays_us: str = _field(
        defaults.DEFAULT_ANALYZER_QUEUE_DELAYS_US, "ANALYZER_QUEUE_DELAYS_US", "Searched queue delays (us)."
    )
    analyzer_concurrency: str = _field(
        defaults.DEFAULT_ANALYZER_CONCURRENCY, "ANALYZER_CONCURRENCY", "Searched client concurrencies."
    )
    analyzer_measurement_ms: int = _field(
        defaults.DEFAULT_ANALYZER_MEASUREMENT_MS, "ANALYZER_MEASUREMENT_MS", "perf_analyzer window (ms)."
    )
    analyzer_p99_latency_ms: float = _field(
        defaults.DEFAULT_ANALYZER_P99_LATENCY_MS, "ANALYZER_P99_LATENCY_MS", "p99 latency constraint (ms)."
    )
    analyzer_stability_cv: float = _field(
        defaults.DEFAULT_ANALYZER_STABILITY_CV, "ANALYZER_STABILITY_CV", "Max throughput CV of a stable config."
    )
    analyzer_timeout_s: float = _field(
        defaults.DEFAULT_ANALYZER_TIMEOUT_S, "ANALYZER_TIMEOUT_S", "Model Analyzer run timeout (s)."
    )
    analyzer_confirm_passes: int = _field(
        defaults.DEFAULT_ANALYZER_CONFIRM_PASSES, "ANALYZER_CONFIRM_PASSES", "Passes confirming the top configs (>= 3)."
    )
    analyzer_confirm_top: int = _field(
        defaults.DEFAULT_ANALYZER_CONFIRM_TOP, "ANALYZER_CONFIRM_TOP", "Top configs confirmed with repeated passes."
    )
    max_p99_regression: float = _field(defaults.DEFAULT_MAX_P99_REGRESSION, "MAX_P99_REGRESSION",
                                       "Allowed challenger p99 regression beyond noise (0.1 = 10 %).")
    min_p99_regression_ms: float = _field(defaults.DEFAULT_MIN_P99_REGRESSION_MS, "MIN_P99_REGRESSION_MS",
                                          "Smallest p99 regression (ms) the perf gate rejects on.")
    publish_profile: bool = _field(
        True, "PUBLISH_PROFILE",
        "model_publish profiles with Model Analyzer unless its 'profile' param says otherwise.",
    )
    publish_perf_gate: bool = _field(
        True, "PUBLISH_PERF_GATE",
        "Publishes run the p99 gate (model_publish unless its 'perf_gate' param says otherwise; "
        "shadow_evaluation's challenger publish always follows this setting).",
    )
    perf_gate_passes: int = _field(
        defaults.DEFAULT_PERF_GATE_PASSES, "PERF_GATE_PASSES", "perf_analyzer passes per model of the p99 gate (>= 3)."
    )
    perf_gate_measurement_ms: int = _field(
        defaults.DEFAULT_PERF_GATE_MEASUREMENT_MS, "PERF_GATE_MEASUREMENT_MS", "p99 gate measurement window (ms)."
    )
    gpu_memory_budget_fraction: float = _field(
        defaults.DEFAULT_GPU_MEMORY_BUDGET_FRACTION, "GPU_MEMORY_BUDGET_FRACTION", "Share of free GPU memory."
    )
    host_memory_budget_fraction: float = _field(
        defaults.DEFAULT_HOST_MEMORY_BUDGET_FRACTION, "HOST_MEMORY_BUDGET_FRACTION", "Share of free host memory."
    )
    instance_memory_factor: float = _field(
        defaults.DEFAULT_INSTANCE_MEMORY_FACTOR, "INSTANCE_MEMORY_FACTOR", "Instance memory / model file size."
    )
    max_instance_count: int = _field(
        defaults.DEFAULT_MAX_INSTANCE_COUNT, "MAX_INSTANCE_COUNT", "Most instances of a model per device."
    )

    # -------------------------------------------------------------- plugins (Airflow)
    webhook_secret: str = _field(
        defaults.DEFAULT_WEBHOOK_SECRET, "WEBHOOK_SECRET", "HMAC secret of the MLflow webhook."
    )
    webhook_tolerance_s: int = _field(
        defaults.DEFAULT_WEBHOOK_TOLERANCE_S, "WEBHOOK_TOLERANCE_S", "Accepted webhook clock skew (s)."
    )
    alert_webhook_url: str = _field(
        defaults.DEFAULT_ALERT_WEBHOOK_URL, "ALERT_WEBHOOK_URL", "Failure notifications POST URL (empty: log)."
    )
    alert_timeout_s: float = _field(
        defaults.DEFAULT_ALERT_TIMEOUT_S, "ALERT_TIMEOUT_S", "Alert webhook timeout (s)."
    )
    event_mapping_path: str = _field(
        defaults.DEFAULT_EVENT_MAPPING_PATH, "EVENT_MAPPING_PATH", "Registry-event-to-DAG mapping file."
    )
    registry_poll_interval_s: float = _field(
        defaults.DEFAULT_REGISTRY_POLL_INTERVAL_S, "REGISTRY_POLL_INTERVAL_S", "Registry watcher poll (s)."
    )
    mlflow_ui_url: str = _field(
        defaults.DEFAULT_MLFLOW_UI_URL, "MLFLOW_UI_URL", "MLflow UI base URL for links (empty: tracking URI)."
    )
    triton_public_url: str = _field(
        defaults.DEFAULT_TRITON_PUBLIC_URL, "TRITON_PUBLIC_URL",
        "Triton HTTP base URL for links (empty: the URL the task used).",
    )
    grafana_dashboard_url: str = _field(
        defaults.DEFAULT_GRAFANA_DASHBOARD_URL, "GRAFANA_DASHBOARD_URL",
        "Grafana serving dashboard URL for links (empty: no Grafana link).",
    )

    # -------------------------------------------------------------- model_registry: shadow/retrain
    shadow_min_labels: int = _field(
        defaults.DEFAULT_SHADOW_MIN_LABELS, "SHADOW_MIN_LABELS", "Fewest labelled rows to decide (else inconclusive)."
    )
    shadow_confidence: float = _field(
        defaults.DEFAULT_SHADOW_CONFIDENCE, "SHADOW_CONFIDENCE", "Bootstrap interval confidence (0-1)."
    )
    shadow_margin: float = _field(
        defaults.DEFAULT_SHADOW_MARGIN, "SHADOW_MARGIN", "Required primary-metric gain at the lower bound."
    )
    shadow_guardrail_tolerance: float = _field(
        defaults.DEFAULT_SHADOW_GUARDRAIL_TOLERANCE, "SHADOW_GUARDRAIL_TOLERANCE", "Tolerated guardrail loss."
    )
    shadow_n_boot: int = _field(defaults.DEFAULT_SHADOW_N_BOOT, "SHADOW_N_BOOT", "Bootstrap resamples.")
    shadow_degradation_tolerance: float = _field(
        defaults.DEFAULT_SHADOW_DEGRADATION_TOLERANCE, "SHADOW_DEGRADATION_TOLERANCE",
        "Champion drop below its reference that counts as degraded.",
    )
    shadow_champion_floor: float = _field(
        defaults.DEFAULT_SHADOW_CHAMPION_FLOOR, "SHADOW_CHAMPION_FLOOR", "Champion metric floor (nan: off)."
    )
    retrain_cooldown_s: float = _field(
        defaults.DEFAULT_RETRAIN_COOLDOWN_S, "RETRAIN_COOLDOWN_S", "Seconds between retrainings of a model."
    )
    retrain_stale_after_s: float = _field(
        defaults.DEFAULT_RETRAIN_STALE_AFTER_S, "RETRAIN_STALE_AFTER_S", "Age (s) of an abandoned retrain lock."
    )

    # -------------------------------------------------------------- drift_checks
    drift_history_window_days: float = _field(
        defaults.DEFAULT_DRIFT_HISTORY_WINDOW_DAYS, "DRIFT_HISTORY_WINDOW_DAYS", "Dynamic threshold look-back (days)."
    )
    drift_quantile: float = _field(
        defaults.DEFAULT_DRIFT_QUANTILE, "DRIFT_QUANTILE", "Threshold quantile of distances (p-values: 1 - q)."
    )
    drift_min_history_windows: int = _field(
        defaults.DEFAULT_DRIFT_MIN_HISTORY_WINDOWS, "DRIFT_MIN_HISTORY_WINDOWS", "Windows before dynamic thresholds."
    )
    drift_evidently_sample_rows: int = _field(
        defaults.DEFAULT_DRIFT_EVIDENTLY_SAMPLE_ROWS, "DRIFT_EVIDENTLY_SAMPLE_ROWS", "Rows per side sent to Evidently."
    )
    drift_history_db_url: str = _field(
        defaults.DEFAULT_DRIFT_HISTORY_DB_URL, "DRIFT_HISTORY_DB_URL", "Drift history DB URL (empty: SQLite)."
    )
    drift_reference_strategy: str = _field(
        defaults.DEFAULT_DRIFT_REFERENCE_STRATEGY, "DRIFT_REFERENCE_STRATEGY",
        "Drift reference: training, trailing (last N days served) or seasonal (one period earlier).",
    )
    drift_trailing_days: float = _field(
        defaults.DEFAULT_DRIFT_TRAILING_DAYS, "DRIFT_TRAILING_DAYS", "Span of the trailing reference (days)."
    )
    drift_seasonal_period_hours: float = _field(
        defaults.DEFAULT_DRIFT_SEASONAL_PERIOD_HOURS, "DRIFT_SEASONAL_PERIOD_HOURS",
        "Period of the seasonal reference (hours; 168 = same hour last week).",
    )
    drift_weighting: str = _field(
        defaults.DEFAULT_DRIFT_WEIGHTING, "DRIFT_WEIGHTING", "Dataset verdict weights: importance or uniform."
    )
    drift_consecutive_windows: int = _field(
        defaults.DEFAULT_DRIFT_CONSECUTIVE_WINDOWS, "DRIFT_CONSECUTIVE_WINDOWS",
        "Dataset-drift windows in a row before a drift alert.",
    )
    drift_sustained_windows: int = _field(
        defaults.DEFAULT_DRIFT_SUSTAINED_WINDOWS, "DRIFT_SUSTAINED_WINDOWS",
        "Run rule span: a feature flagged now with evidence in most of these windows alerts (0: off).",
    )
    drift_sustained_evidence: int = _field(
        defaults.DEFAULT_DRIFT_SUSTAINED_EVIDENCE, "DRIFT_SUSTAINED_EVIDENCE",
        "Windows of the run rule span (this one included) that must show evidence.",
    )
    drift_alert_cooldown_hours: float = _field(
        defaults.DEFAULT_DRIFT_ALERT_COOLDOWN_HOURS, "DRIFT_ALERT_COOLDOWN_HOURS",
        "Hours (logical time) after a drift alert before one naming no new feature.",
    )
    drift_ceiling_factor: float = _field(
        defaults.DEFAULT_DRIFT_CEILING_FACTOR, "DRIFT_CEILING_FACTOR",
        "Learned thresholds stop at this multiple of the reference's (strong effect above).",
    )
    drift_exact_max_rows: int = _field(
        defaults.DEFAULT_DRIFT_EXACT_MAX_ROWS, "DRIFT_EXACT_MAX_ROWS",
        "Largest window (rows) scored exactly in memory; larger ones are streamed (bins + sketches).",
    )
    drift_sketch_k: int = _field(
        defaults.DEFAULT_DRIFT_SKETCH_K, "DRIFT_SKETCH_K",
        "KLL sketch k of streamed windows (4096: rank error 9.6e-4).",
    )
    drift_stream_batch_rows: int = _field(
        defaults.DEFAULT_DRIFT_STREAM_BATCH_ROWS, "DRIFT_STREAM_BATCH_ROWS",
        "Rows per record batch of a streamed window.",
    )
    drift_stream_workers: int = _field(
        defaults.DEFAULT_DRIFT_STREAM_WORKERS, "DRIFT_STREAM_WORKERS",
        "Most processes summarising a streamed window's files, this one included (0: one per CPU core).",
    )
    drift_engine: str = _field(
        defaults.DEFAULT_DRIFT_ENGINE, "DRIFT_ENGINE", "Summaries of streamed windows: local or spark.",
    )
    spark_master: str = _field(
        defaults.DEFAULT_SPARK_MASTER, "SPARK_MASTER", "Spark master URL of the spark drift engine.",
    )
    inference_log_root: str = _field(
        defaults.DEFAULT_INFERENCE_LOG_ROOT, "INFERENCE_LOG_ROOT", "Inference-log root: folder or s3://bucket/prefix."
    )

    # -------------------------------------------------------------- repository_sync: publish
    signing_key_path: Path = _field(
        defaults.DEFAULT_SIGNING_KEY_PATH, "SIGNING_KEY_PATH", "Private key (PEM) that signs model versions."
    )
    signing_trusted_keys_dir: Path = _field(
        defaults.DEFAULT_SIGNING_TRUSTED_KEYS_DIR, "SIGNING_TRUSTED_KEYS_DIR", "Trusted public keys (PEM) folder."
    )
    s3_endpoint_url: str = _field(
        defaults.DEFAULT_S3_ENDPOINT_URL, "S3_ENDPOINT_URL", "boto3 S3 endpoint (empty: from the s3:// URL)."
    )
    staging_uri: str = _field(
        "", "STAGING_URI",
        "s3://bucket/prefix where tasks share the work files they hand on (publish staging, shadow "
        "replays, training windows), so each may run on another worker (empty: one host or a shared home).",
    )

    # -------------------------------------------------------------- tritonflow/pipelines: shadow/retrain
    shadow_window_hours: float = _field(
        defaults.DEFAULT_SHADOW_WINDOW_HOURS, "SHADOW_WINDOW_HOURS", "Hours replayed without a drift window."
    )
    shadow_label_lag_hours: float = _field(
        defaults.DEFAULT_SHADOW_LABEL_LAG_HOURS, "SHADOW_LABEL_LAG_HOURS", "Hours labels may arrive after a window."
    )
    shadow_replay_concurrency: int = _field(
        defaults.DEFAULT_SHADOW_REPLAY_CONCURRENCY, "SHADOW_REPLAY_CONCURRENCY", "Concurrent replay requests."
    )
    shadow_max_replay_rows: int = _field(
        defaults.DEFAULT_SHADOW_MAX_REPLAY_ROWS, "SHADOW_MAX_REPLAY_ROWS", "Most rows a shadow replay sends."
    )
    shadow_mirror_percent: int = _field(
        defaults.DEFAULT_SHADOW_MIRROR_PERCENT, "SHADOW_MIRROR_PERCENT",
        "Live shadow: percent of champion requests mirrored to the challenger.",
    )
    shadow_live_duration_s: float = _field(
        defaults.DEFAULT_SHADOW_LIVE_DURATION_S, "SHADOW_LIVE_DURATION_S", "Live shadow: seconds of mirrored traffic."
    )
    shadow_mirror_host: str = _field(
        defaults.DEFAULT_SHADOW_MIRROR_HOST, "SHADOW_MIRROR_HOST",
        "Live shadow: host the gateway reaches the recorder at."
    )
    retrain_window_days: float = _field(
        defaults.DEFAULT_RETRAIN_WINDOW_DAYS, "RETRAIN_WINDOW_DAYS", "Days of labelled log a retraining uses."
    )
    retrain_mix_reference_fraction: float = _field(
        defaults.DEFAULT_RETRAIN_MIX_REFERENCE_FRACTION, "RETRAIN_MIX_REFERENCE_FRACTION",
        "Share (0-1) of reference rows in a training window.",
    )
    retrain_entry_point: str = _field(
        defaults.DEFAULT_RETRAIN_ENTRY_POINT, "RETRAIN_ENTRY_POINT", "Default training entry point."
    )
    retrain_entry_points: str = _field(
        defaults.DEFAULT_RETRAIN_ENTRY_POINTS, "RETRAIN_ENTRY_POINTS", "Per-model entry points (JSON object)."
    )
    retrain_schedule: str = _field(
        defaults.DEFAULT_RETRAIN_SCHEDULE, "RETRAIN_SCHEDULE", "Schedule of the retrain DAG (empty: none)."
    )
    retrain_default_model: str = _field(
        defaults.DEFAULT_RETRAIN_DEFAULT_MODEL, "RETRAIN_DEFAULT_MODEL", "Model a scheduled retrain retrains."
    )

    # -------------------------------------------------------------- tritonflow/pipelines: drift monitor
    monitored_models: str = _field(
        defaults.DEFAULT_MONITORED_MODELS, "MONITORED_MODELS",
        "Models the drift monitor checks, comma-separated (empty: all)."
    )
    drift_models_per_task: int = _field(
        defaults.DEFAULT_DRIFT_MODELS_PER_TASK, "DRIFT_MODELS_PER_TASK",
        "Models one drift_monitor task instance checks, records and decides (>= 1).",
    )

    # remote deployment (docker-compose): services addressed by name instead of host + port
    triton_url: str = _field(
        "", "TRITON_URL", "host:port of Triton's HTTP endpoint (empty: <host>:<triton_http_port>)."
    )
    triton_replica_urls: str = _field(
        "", "TRITON_REPLICA_URLS",
        "host:port of every Triton replica behind the gateway, comma-separated, sharing one repository "
        "(empty: just triton_url).",
    )
    triton_metrics_url: str = _field(
        "", "TRITON_METRICS_URL", "Triton metrics URL (empty: http://<host>:<triton_metrics_port>/metrics)."
    )
    gateway_url: str = _field("", "GATEWAY_URL", "Gateway base URL (empty: http://<host>:<gateway_port>).")

    # Airflow connections (read by every tritonflow task when it starts; a defined one wins over
    # the matching settings above; empty id: not looked up)
    mlflow_conn_id: str = _field(
        "mlflow_default", "MLFLOW_CONN_ID", "Airflow connection (type mlflow) giving the MLflow tracking URI.",
    )
    triton_conn_id: str = _field(
        "triton_default", "TRITON_CONN_ID", "Airflow connection (type triton) giving Triton's HTTP and metrics URLs.",
    )
    gateway_conn_id: str = _field(
        "tritonflow_gateway", "GATEWAY_CONN_ID", "Airflow connection (type http) giving the gateway URL.",
    )
    aws_conn_id: str = _field(
        "aws_default", "AWS_CONN_ID",
        "Airflow connection (type aws) giving the S3 endpoint (extra endpoint_url) and credentials.",
    )
    gateway_conf_dir: str = _field(
        "", "GATEWAY_CONF_DIR", "Gateway config folder the router writes (empty: <home>/run/gateway)."
    )
    gateway_reload: str = _field(
        defaults.DEFAULT_GATEWAY_RELOAD, "GATEWAY_RELOAD",
        "How the router reloads NGINX: 'local' (nginx -s reload) or 'watcher' (reload.request file).",
    )
    gateway_access_log: str = _field(
        "", "GATEWAY_ACCESS_LOG",
        "Gateway status log (one JSON line per routed request) the canary counts per-version errors "
        "from (empty: <gateway conf dir>/tritonflow-router/gateway_access.jsonl, written only where "
        "NGINX runs on the worker's host; 'off': not used).",
    )
    traffic_router: str = _field(
        defaults.DEFAULT_TRAFFIC_ROUTER, "TRAFFIC_ROUTER",
        "Traffic router that splits a model's requests between versions: 'nginx' (the only one so far).",
    )

    # -------------------------------------------------------------- tritonflow.runtime.airflow (local)
    airflow_database_url: str = _field(
        defaults.DEFAULT_AIRFLOW_DATABASE_URL, "AIRFLOW_DATABASE_URL",
        "Metadata DB of the local Airflow (SQLAlchemy URL, e.g. PostgreSQL); empty: SQLite under <home>/airflow.",
    )
    airflow_api_port: int = _field(
        defaults.DEFAULT_AIRFLOW_API_PORT, "AIRFLOW_API_PORT", "Local Airflow API server and UI port.",
    )
    airflow_parallelism: int = _field(
        defaults.DEFAULT_AIRFLOW_PARALLELISM, "AIRFLOW_PARALLELISM", "Local Airflow LocalExecutor task slots (>= 4).",
    )
    airflow_worker_log_port: int = _field(
        defaults.DEFAULT_AIRFLOW_WORKER_LOG_PORT, "AIRFLOW_WORKER_LOG_PORT", "Local Airflow port serving task logs.",
    )
    airflow_triggerer_log_port: int = _field(
        defaults.DEFAULT_AIRFLOW_TRIGGERER_LOG_PORT, "AIRFLOW_TRIGGERER_LOG_PORT",
        "Local Airflow port serving trigger logs.",
    )

    # -------------------------------------------------------------- tritonflow.demo (main job)
    drift_dataset_share: float = _field(
        defaults.DEFAULT_DRIFT_DATASET_SHARE, "DRIFT_DATASET_SHARE",
        "Weighted share of flagged features for a dataset-drift window (0-1).",
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


def get_settings(**overrides: Any) -> Settings:
    """Return settings from the current environment, with optional overrides."""
    return Settings.from_env(**overrides)
