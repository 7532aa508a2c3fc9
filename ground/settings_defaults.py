"""Defaults of the tritonflow settings: one named constant per ``TRITONFLOW_*`` variable.

Each constant is documented with its unit and the source of its value, grouped by the module
that reads it. :class:`ground.settings.Settings` takes its field defaults from here; code that
needs a default without building settings (a function's keyword default, the demo's port
search) imports it from this module. Nothing here reads the environment.
"""

from __future__ import annotations

from pathlib import Path

# ---------------------------------------------------------------------------- paths
#: Project root (the folder holding ``requirements.txt``).
PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: State folder for logs, pid files, the local repository and stores (``TRITONFLOW_HOME``).
DEFAULT_HOME = PROJECT_ROOT / ".tritonflow"
#: Virtual environment holding the Triton tools (server, perf_analyzer, Model Analyzer).
DEFAULT_TRITON_VENV = PROJECT_ROOT / ".venv-triton"

# ---------------------------------------------------------------------------- local runtime ports
DEFAULT_HOST = "127.0.0.1"
DEFAULT_TRITON_HTTP_PORT = 8000
DEFAULT_TRITON_GRPC_PORT = 8001
DEFAULT_TRITON_METRICS_PORT = 8002
DEFAULT_MLFLOW_PORT = 5000
DEFAULT_S3_PORT = 5555
DEFAULT_GATEWAY_PORT = 8080
#: Seconds to wait for a started service to report healthy.
DEFAULT_START_TIMEOUT_S = 180.0

# ---------------------------------------------------------------------------- MLflow
#: MLflow tracking server backend; empty means SQLite under ``<home>/mlflow/mlflow.db``.
DEFAULT_MLFLOW_BACKEND_URI = ""
#: Tracking URI the clients use; empty means ``http://<host>:<mlflow_port>``.
DEFAULT_MLFLOW_TRACKING_URI = ""

# ---------------------------------------------------------------------------- Triton target
#: Highest ONNX IR version the target Triton release's ONNX Runtime loads (Triton 2.51 ships
#: ONNX Runtime 1.19, which supports IR 10; see ONNX Runtime's compatibility table).
DEFAULT_MAX_ONNX_IR_VERSION = 10
#: Highest default-domain opset the target ONNX Runtime implements (ORT 1.19: opset 21).
DEFAULT_MAX_ONNX_OPSET = 21
#: Seconds to wait for a model version to become READY after a load request.
DEFAULT_LOAD_TIMEOUT_S = 120.0

# ---------------------------------------------------------------------------- XCom discipline
#: Gateway reload mechanism: "local" signals NGINX on this host; "watcher" asks the gateway
#: container's reload watcher through ``<conf_dir>/reload.request`` (docker-compose).
DEFAULT_GATEWAY_RELOAD = "local"
#: Traffic router in front of Triton (``repository_sync.routing.router.ROUTERS`` names the choices).
DEFAULT_TRAFFIC_ROUTER = "nginx"

#: Largest serialised return value (bytes) a tritonflow task may push to XCom.
DEFAULT_MAX_XCOM_BYTES = 48 * 1024


# ---------------------------------------------------------------------------- repository_sync: canary
#: Canary traffic steps for the challenger, percent of requests, comma-separated.
DEFAULT_CANARY_STEPS = "5,25,50,100"
#: Seconds each canary step bakes before its analysis.
DEFAULT_CANARY_BAKE_S = 300.0
#: Fewest canary requests a step needs; fewer makes the step inconclusive, never a pass.
DEFAULT_CANARY_MIN_REQUESTS = 100
#: How many times an inconclusive step is extended (one more bake each) before the canary fails.
DEFAULT_CANARY_MAX_EXTENSIONS = 2
#: Highest canary error rate (failed / all requests, 0-1) a step may show.
DEFAULT_CANARY_MAX_ERROR_RATE = 0.01
#: Highest canary mean request latency (milliseconds, Triton's nv_inference_request_duration_us).
DEFAULT_CANARY_MAX_MEAN_LATENCY_MS = 1000.0
#: Highest ratio of canary to champion mean latency over the same step (dimensionless).
DEFAULT_CANARY_MAX_LATENCY_RATIO = 1.5
#: Smallest mean-latency difference (milliseconds, challenger minus champion) that lets the latency
#: ratio fail a canary step: a model answering in 2 ms had its live mean move from 1.83 to 2.90 ms on
#: a loaded host (ratio 1.59) with nothing wrong. 5 ms is 2.5 % of the 200 ms p99 red line of the
#: practitioners' serving dashboard (``shared/references``, notebook-to-production, section 4.3).
DEFAULT_CANARY_MIN_LATENCY_DELTA_MS = 5.0
#: Highest two-sample KS statistic between the challenger's live predictions and its own expected
#: predictions (shadow replay or mirrored live requests) on comparable inputs (0-1).
DEFAULT_CANARY_MAX_PREDICTION_KS = 0.2
#: Highest PSI between the challenger's live and expected predictions (0.25 = "significant
#: shift", Siddiqi 2006).
DEFAULT_CANARY_MAX_PREDICTION_PSI = 0.25
#: Seconds between two analyses during a step's bake; hard failures roll back at the first
#: analysis that sees them (the reference setup switches back 4.7 s after detection).
DEFAULT_CANARY_ANALYSIS_INTERVAL_S = 5.0
#: Seconds between two probes of a champion by the health sentinel (``champion_sentinel``).
DEFAULT_SENTINEL_INTERVAL_S = 10.0
#: Consecutive failed probes after which the sentinel rolls a champion back to previous_champion.
DEFAULT_SENTINEL_FAILURES = 3
#: Seconds a sentinel probe (one request with every golden sample) may take before it fails.
DEFAULT_SENTINEL_LATENCY_S = 2.0
#: Golden samples (rows of the champion's drift reference) sent in each sentinel probe.
DEFAULT_SENTINEL_SAMPLES = 8
#: Fewest challenger requests (or logged predictions) before an error rate, non-finite or constant
#: outputs roll back in the middle of a bake.
DEFAULT_CANARY_HARD_MIN_REQUESTS = 10
#: Confidence (0-1) of the canary's bounds: error-rate lower bound (Clopper-Pearson), KS/PSI
#: sampling margins and the quality interval.
DEFAULT_CANARY_CONFIDENCE = 0.95
#: Fewest labelled requests per version before the canary compares quality.
DEFAULT_CANARY_MIN_LABELS = 30
#: Quality metric compared when labels arrive during a canary (``auc`` or ``accuracy``).
DEFAULT_CANARY_QUALITY_METRIC = "auc"
#: Largest quality drop (metric units) of the challenger vs the champion tolerated at the upper
#: confidence bound; a bigger drop with confidence fails the step.
DEFAULT_CANARY_MAX_QUALITY_DROP = 0.02
#: Feature-space coverage: fewest challenger requests in every reference decile bin that live
#: traffic reaches, per important feature; fewer makes a step inconclusive (extended).
DEFAULT_CANARY_COVERAGE_MIN_REQUESTS = 5
#: Feature-space coverage: most important features checked (by the reference's importances;
#: all features when the reference has none; 0 = all features).
DEFAULT_CANARY_COVERAGE_FEATURES = 5
#: Live shadow: percent (1-100) of the champion's requests the gateway mirrors to the challenger.
DEFAULT_SHADOW_MIRROR_PERCENT = 10
#: Live shadow: seconds the mirror collects the challenger's outputs on live requests.
DEFAULT_SHADOW_LIVE_DURATION_S = 600.0
#: Live shadow: address the gateway reaches the mirror recorder at (the worker's host).
DEFAULT_SHADOW_MIRROR_HOST = "127.0.0.1"
#: Response header the gateway adds to name the model version that served a request.
DEFAULT_GATEWAY_RESPONSE_HEADER = "X-Tritonflow-Version"
#: Seconds a second promotion of the same model waits for the lock (0: fail at once).
DEFAULT_PROMOTION_LOCK_TIMEOUT_S = 0.0
#: SQLAlchemy URL of the coordination database (leases, watcher and retrain state, the versions each
#: model keeps loaded); empty means the drift history database (``TRITONFLOW_DRIFT_HISTORY_DB_URL``).
DEFAULT_COORDINATION_DB_URL = ""
#: Seconds a lease lives without a heartbeat; its holder renews it every third of that.
DEFAULT_LEASE_TTL_S = 60.0
#: Seconds a model-control operation (a Triton load/unload) waits for another one of the same model.
DEFAULT_MODEL_CONTROL_LOCK_TIMEOUT_S = 600.0
#: Memory a challenger needs, as a multiple of its model files' size (pre-flight estimate).
DEFAULT_PREFLIGHT_MEMORY_FACTOR = 2.0
#: Extra memory (MiB) the pre-flight keeps free beside the challenger estimate.
DEFAULT_PREFLIGHT_MEMORY_MARGIN_MIB = 512


# ---------------------------------------------------------------------------- model_registry
#: Highest ``ai.onnx.ml`` opset the target ONNX Runtime implements (ORT 1.19: ai.onnx.ml 4).
DEFAULT_MAX_ONNX_ML_OPSET = 4
#: The serving image the ONNX limits describe, quoted in every IR/opset refusal.
DEFAULT_TARGET_TRITON_RELEASE = "nvcr.io/nvidia/tritonserver:24.10-py3 (Triton 2.51, ONNX Runtime 1.19)"
#: Parity gate: absolute tolerance per output element (|onnx - source| <= atol + rtol * |source|).
DEFAULT_PARITY_ATOL = 1e-5
#: Parity gate: relative tolerance per output element (same formula as ``numpy.isclose``).
DEFAULT_PARITY_RTOL = 1e-4
#: Parity gate: smallest fraction (0-1) of rows whose classifier label must agree.
DEFAULT_PARITY_MIN_LABEL_AGREEMENT = 1.0
#: Fallback replica: build, gate and serve an INT8 ``<model>__fallback`` beside each published version.
DEFAULT_FALLBACK_ENABLED = True
#: Fallback parity gate: absolute tolerance per output element (looser: INT8 weights, dynamic
#: activations; same formula as the main gate). Recorded on the MLflow model version.
DEFAULT_FALLBACK_ATOL = 0.05
#: Fallback parity gate: relative tolerance per output element.
DEFAULT_FALLBACK_RTOL = 0.05
#: Fallback parity gate: smallest fraction (0-1) of rows whose classifier label must agree.
DEFAULT_FALLBACK_MIN_LABEL_AGREEMENT = 0.95
#: Seconds the gateway waits for the serving version's answer before retrying on the fallback.
DEFAULT_FALLBACK_TIMEOUT_S = 10.0
#: Rows in a validation sample built from an input example (example rows + seeded perturbations).
DEFAULT_VALIDATION_SAMPLE_ROWS = 64
#: Std of the seeded Gaussian perturbation, relative to each float column's scale (unitless).
DEFAULT_VALIDATION_PERTURBATION = 0.05
#: Max abs difference allowed between TorchScript and eager-eval outputs.
DEFAULT_TORCHSCRIPT_ATOL = 1e-5
#: Model Analyzer bounded search: candidate max_batch_size values (comma-separated ints).
DEFAULT_ANALYZER_MAX_BATCH_SIZES = "8,32"
#: Model Analyzer bounded search: candidate instance counts per group (comma-separated ints).
DEFAULT_ANALYZER_INSTANCE_COUNTS = "1"
#: Model Analyzer bounded search: dynamic batching max queue delays (microseconds, comma-separated).
DEFAULT_ANALYZER_QUEUE_DELAYS_US = "500"
#: Model Analyzer bounded search: client concurrencies (comma-separated ints).
DEFAULT_ANALYZER_CONCURRENCY = "4"
#: perf_analyzer measurement window (milliseconds, time_windows mode).
DEFAULT_ANALYZER_MEASUREMENT_MS = 1000
#: Latency constraint of the profiling objective: p99 latency at most this many milliseconds.
DEFAULT_ANALYZER_P99_LATENCY_MS = 100.0
#: A config whose throughput coefficient of variation across passes exceeds this is unstable.
DEFAULT_ANALYZER_STABILITY_CV = 0.1
#: Seconds a Model Analyzer ``profile`` run may take before it is stopped.
DEFAULT_ANALYZER_TIMEOUT_S = 600.0
#: Passes per top-ranked config that confirm Model Analyzer's ranking before a config is adopted
#: (perf_analyzer, interleaved; a config whose throughput CV exceeds analyzer_stability_cv or that
#: perf_analyzer could not stabilise is dropped).
DEFAULT_ANALYZER_CONFIRM_PASSES = 3
#: How many of Model Analyzer's best configs are confirmed with repeated passes.
DEFAULT_ANALYZER_CONFIRM_TOP = 2
#: Largest p99 latency regression (fraction, 0.10 = 10 %) a challenger may show against the champion,
#: on top of the measured noise band, before it is rejected (the practitioners' latency gate).
DEFAULT_MAX_P99_REGRESSION = 0.10
#: Smallest p99 latency regression (milliseconds, challenger median p99 minus champion's) that may
#: reject a challenger, whatever the ratio: on models answering in about a millisecond, a busy CPU
#: host moves p99 by fractions of a millisecond, and a +40 % ratio can be 0.6 ms of scheduling noise.
#: 1 ms is 0.5 % of the 200 ms p99 red line of the practitioners' serving dashboard
#: (``shared/references``, notebook-to-production, section 4.3).
DEFAULT_MIN_P99_REGRESSION_MS = 1.0
#: perf_analyzer passes per model of the p99 regression gate (interleaved, >= 3).
DEFAULT_PERF_GATE_PASSES = 3
#: perf_analyzer measurement window of the p99 regression gate (milliseconds).
DEFAULT_PERF_GATE_MEASUREMENT_MS = 1000
#: Fraction (0-1) of a GPU's free memory the instances of one model may plan to use.
DEFAULT_GPU_MEMORY_BUDGET_FRACTION = 0.8
#: Fraction (0-1) of available host memory the CPU instances of one model may plan to use.
DEFAULT_HOST_MEMORY_BUDGET_FRACTION = 0.5
#: Planned memory per model instance, as a multiple of the model file size (weights + arenas).
DEFAULT_INSTANCE_MEMORY_FACTOR = 2.0
#: Upper bound on instances of one model per device (or on the host for KIND_CPU).
DEFAULT_MAX_INSTANCE_COUNT = 4

# ---------------------------------------------------------------------------- plugins (Airflow)
#: HMAC secret shared with the MLflow webhook (empty: the receiver refuses every delivery).
DEFAULT_WEBHOOK_SECRET = ""
#: Seconds a webhook's X-MLflow-Timestamp may differ from now (Standard Webhooks uses 5 minutes).
DEFAULT_WEBHOOK_TOLERANCE_S = 300
#: URL that failure notifications are POSTed to as JSON (empty: log only).
DEFAULT_ALERT_WEBHOOK_URL = ""
#: Seconds to wait for the alert webhook to answer.
DEFAULT_ALERT_TIMEOUT_S = 10.0
#: YAML/JSON file mapping registry changes to DAG ids (empty: the built-in default mapping).
DEFAULT_EVENT_MAPPING_PATH = ""
#: Seconds between two polls of the MLflow registry by the registry watcher.
DEFAULT_REGISTRY_POLL_INTERVAL_S = 60.0
#: Base URL of the MLflow UI for extra links (empty: the resolved tracking URI).
DEFAULT_MLFLOW_UI_URL = ""
#: Triton HTTP base URL a browser reaches, for the "Triton model" extra link (empty: the URL the
#: task used, e.g. ``http://127.0.0.1:8000``; docker-compose sets ``http://localhost:8000``).
DEFAULT_TRITON_PUBLIC_URL = ""
#: URL of the Grafana serving dashboard for the "Grafana panel" extra link (empty: no such link);
#: the compose stack's is ``http://localhost:3000/d/tritonflow-triton``.
DEFAULT_GRAFANA_DASHBOARD_URL = ""


# ---------------------------------------------------------------------------- model_registry: shadow/retrain
#: Fewest labelled rows a shadow comparison needs; fewer is "inconclusive", never a win.
DEFAULT_SHADOW_MIN_LABELS = 200
#: Two-sided confidence level (0-1) of the paired bootstrap intervals of the shadow comparison.
DEFAULT_SHADOW_CONFIDENCE = 0.95
#: Improvement (primary-metric units, e.g. AUC points) the challenger must show at the lower bound.
DEFAULT_SHADOW_MARGIN = 0.01
#: Largest worsening (metric units) tolerated on a guardrail metric.
DEFAULT_SHADOW_GUARDRAIL_TOLERANCE = 0.02
#: Bootstrap resamples of the shadow comparison.
DEFAULT_SHADOW_N_BOOT = 1000
#: Champion counts as degraded when worse than its reference metric by more (metric units).
DEFAULT_SHADOW_DEGRADATION_TOLERANCE = 0.05
#: Champion counts as degraded below this primary metric value (NaN: check off).
DEFAULT_SHADOW_CHAMPION_FLOOR = float("nan")
#: Seconds after a successful retraining of a model before another one may start.
DEFAULT_RETRAIN_COOLDOWN_S = 6 * 3600.0
#: Seconds after which an unfinished retraining lock is treated as abandoned (crashed worker).
DEFAULT_RETRAIN_STALE_AFTER_S = 12 * 3600.0


# ---------------------------------------------------------------------------- drift_checks
#: Look-back of the dynamic drift threshold (days of hourly windows).
DEFAULT_DRIFT_HISTORY_WINDOW_DAYS = 30.0
#: Quantile of a distance statistic's history used as threshold (P95; p-values use 1 - q).
DEFAULT_DRIFT_QUANTILE = 0.95
#: Hourly windows needed before the dynamic threshold replaces the static one (windows).
DEFAULT_DRIFT_MIN_HISTORY_WINDOWS = 48
#: Rows of each side passed to Evidently's DataDriftPreset (rows).
DEFAULT_DRIFT_EVIDENTLY_SAMPLE_ROWS = 5000
#: SQLAlchemy URL of the drift history store; empty means SQLite at ``<home>/drift/history.db``.
DEFAULT_DRIFT_HISTORY_DB_URL = ""
#: What a window is compared with: ``training`` (the version's reference), ``trailing`` (the last
#: N days of served traffic) or ``seasonal`` (the same window one period earlier).
DEFAULT_DRIFT_REFERENCE_STRATEGY = "training"
#: Span of the ``trailing`` reference (days of served traffic).
DEFAULT_DRIFT_TRAILING_DAYS = 7.0
#: Period of the ``seasonal`` reference (hours; 168 = "the same hour last week").
DEFAULT_DRIFT_SEASONAL_PERIOD_HOURS = 168.0
#: How features weigh in the dataset verdict: ``importance`` (the model version's permutation
#: importance, stored with its reference at publish time) or ``uniform``.
DEFAULT_DRIFT_WEIGHTING = "importance"
#: Consecutive dataset-drift windows before a drift alert (windows).
DEFAULT_DRIFT_CONSECUTIVE_WINDOWS = 2
#: Sustained-drift run rule (``drift_checks.policy``): one feature alerts, whatever its weight, when
#: it is flagged in a window and had evidence (a statistic beyond its threshold) in
#: ``DEFAULT_DRIFT_SUSTAINED_EVIDENCE - 1`` of the ``DEFAULT_DRIFT_SUSTAINED_WINDOWS - 1`` windows
#: before: 4 of 5, the Western Electric / Nelson run rule (0 windows: rule off).
DEFAULT_DRIFT_SUSTAINED_WINDOWS = 5
DEFAULT_DRIFT_SUSTAINED_EVIDENCE = 4
#: Quiet time after a drift alert of a model for alerts naming no new feature (hours of logical
#: time: window starts, so replays and backfills behave like live runs).
DEFAULT_DRIFT_ALERT_COOLDOWN_HOURS = 24.0
#: A learned threshold never exceeds this multiple of the reference's own threshold (nor the
#: statistic's strong effect); a value above that ceiling is a strong effect that alerts at once.
DEFAULT_DRIFT_CEILING_FACTOR = 2.0
#: Largest window (rows) read whole and scored exactly; larger windows are streamed in record
#: batches into exact bin counts and KLL sketches (constant memory; ``drift_checks.summaries``).
DEFAULT_DRIFT_EXACT_MAX_ROWS = 200_000
#: KLL sketch size ``k`` of streamed windows (4096: stated rank error 9.6e-4, ~97 KB per feature).
DEFAULT_DRIFT_SKETCH_K = 4096
#: Rows per record batch when a window is streamed (memory per batch: rows x columns x 8 bytes).
DEFAULT_DRIFT_STREAM_BATCH_ROWS = 131_072
#: Most processes summarising a streamed window's files in parallel, the check's own included (0: one per CPU core).
DEFAULT_DRIFT_STREAM_WORKERS = 0
#: Who summarises a streamed window: ``local`` (this process and its workers) or ``spark``
#: (per-partition summaries computed by Spark, merged on the driver; ``drift_checks.spark``).
DEFAULT_DRIFT_ENGINE = "local"
#: Spark master URL of the ``spark`` drift engine (``local[N]`` runs Spark inside the task).
DEFAULT_SPARK_MASTER = "local[2]"
#: Inference-log root (folder or s3://bucket/prefix); empty means ``<home>/inference_logs``.
DEFAULT_INFERENCE_LOG_ROOT = ""


# ---------------------------------------------------------------------------- repository_sync: publish
#: PEM ECDSA private key used to sign model versions (OpenSSF model-signing); never logged.
DEFAULT_SIGNING_KEY_PATH = DEFAULT_HOME / "keys" / "model_signing.pem"
#: Folder of trusted PEM public keys (``*.pub``/``*.pem``); several allow key rotation.
DEFAULT_SIGNING_TRUSTED_KEYS_DIR = DEFAULT_HOME / "keys" / "trusted"
#: boto3 ``endpoint_url`` for an S3 repository; empty: the endpoint written in the s3:// URL.
DEFAULT_S3_ENDPOINT_URL = ""


# ---------------------------------------------------------------------------- tritonflow/pipelines: shadow/retrain
#: Hours of inference log a shadow evaluation replays when no drift window is given (hours).
DEFAULT_SHADOW_WINDOW_HOURS = 24.0
#: Hours after a window's end during which its labels may still arrive (labels read window).
DEFAULT_SHADOW_LABEL_LAG_HOURS = 72.0
#: Concurrent inference requests of a shadow replay (threads, one HTTP client each).
DEFAULT_SHADOW_REPLAY_CONCURRENCY = 4
#: Most logged rows a shadow replay sends (the most recent are kept; rows).
DEFAULT_SHADOW_MAX_REPLAY_ROWS = 100_000
#: Days of inference log (joined with labels) a retraining trains on (days).
DEFAULT_RETRAIN_WINDOW_DAYS = 30.0
#: Share (0-1) of the training window taken from the version's reference data.
DEFAULT_RETRAIN_MIX_REFERENCE_FRACTION = 0.0
#: Training entry point of models without their own (``module:function`` or ``project:<uri>``).
DEFAULT_RETRAIN_ENTRY_POINT = "model_registry.training:train_noaa"
#: Per-model entry points, a JSON object ``{"model": "module:function"}`` (empty: none).
DEFAULT_RETRAIN_ENTRY_POINTS = ""
#: Schedule of the ``retrain`` DAG (cron or preset such as ``@daily``; empty: none).
DEFAULT_RETRAIN_SCHEDULE = ""
#: Model the scheduled ``retrain`` runs retrain (empty: the model must be given as a param).
DEFAULT_RETRAIN_DEFAULT_MODEL = ""

# ---------------------------------------------------------------------------- tritonflow/pipelines: drift monitor
#: Registered models the hourly drift monitor checks, comma-separated; empty means every model
#: with a ``champion`` alias.
DEFAULT_MONITORED_MODELS = ""
#: Models one drift_monitor task instance checks (and records, decides) in turn (models): fewer,
#: larger task instances, since each costs seconds of process start-up on a small deployment.
DEFAULT_DRIFT_MODELS_PER_TASK = 10


# ---------------------------------------------------------------------------- tritonflow.runtime.airflow (local)
#: Metadata DB of the local Airflow deployment; empty: SQLite (WAL) under ``<home>/airflow``.
DEFAULT_AIRFLOW_DATABASE_URL = ""
#: API server / UI port of the local Airflow deployment (8080 is the gateway's).
DEFAULT_AIRFLOW_API_PORT = 8280
#: LocalExecutor task slots of the local Airflow deployment.
DEFAULT_AIRFLOW_PARALLELISM = 4
#: Ports the local Airflow's scheduler (task logs) and triggerer (trigger logs) serve logs on.
DEFAULT_AIRFLOW_WORKER_LOG_PORT = 8793
DEFAULT_AIRFLOW_TRIGGERER_LOG_PORT = 8794

# ---------------------------------------------------------------------------- tritonflow.demo (main job)
#: Weighted share (0-1) of flagged features that makes a window's dataset verdict ``drift``
#: (Evidently's default share 0.5; weights per ``TRITONFLOW_DRIFT_WEIGHTING``). A drift alert
#: needs it in ``TRITONFLOW_DRIFT_CONSECUTIVE_WINDOWS`` windows in a row, or one strong effect.
DEFAULT_DRIFT_DATASET_SHARE = 0.5
