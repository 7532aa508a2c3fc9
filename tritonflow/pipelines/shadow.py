"""Shadow evaluation stages: champion vs challenger on replayed traffic, decided and recorded.

Plain Python (no Airflow); the ``shadow_evaluation`` DAG calls the stages in this order and
passes their small, JSON-serialisable returns through XCom (bulky data goes by reference):

1. :func:`resolve_versions` -- the champion (alias ``champion``) and the challenger (alias
   ``challenger`` or a version given), with the Triton name/version each is served under and the
   input columns of its MLflow signature.
2. :func:`ensure_challenger_published` -- a challenger missing from the Triton repository is
   published in-process through :mod:`tritonflow.pipelines.publish`.
3. :func:`replay` -- the logged inputs of a window of the inference log are sent to BOTH versions
   on Triton, in chunks of ``max_batch_size`` rows on a small thread pool (one HTTP client per
   thread: tritonclient's clients are not thread-safe). The champion is never unloaded; a
   challenger this stage loaded is unloaded again afterwards (only that version: the model is
   reloaded with the versions READY before). A challenger that fails to load or to answer raises
   :class:`~tritonflow.exceptions.ChallengerUnavailableError` with the reason. Both versions'
   scores are stored as Parquet under ``<settings.home>/shadow/<model>/<run>/``.
4. :func:`compare` -- the labels that arrived (inference-log labels joined by ``request_id``) and
   both score vectors go to :func:`model_registry.shadow.evaluate` (paired bootstrap, decision
   rule from the ``shadow_*`` settings plus overrides, the champion's reference metric from its
   ``tritonflow.reference_<metric>`` version tag). The evidence JSON and the Markdown report are
   written beside the predictions and recorded on BOTH model versions in MLflow (tags
   ``tritonflow.shadow.*`` and artifacts). The outcome (``promote_challenger``, ``retrain``,
   ``nothing``, ``inconclusive``) drives the DAG's branch.

Both :func:`replay` and the live mode (:func:`tritonflow.pipelines.shadow_live.live`: the gateway
mirrors a share of the champion's live requests to the challenger) also write the challenger's
*expected predictions* (:data:`EXPECTED_FILE`: its score and the inputs of every row):
:func:`compare` records them on the challenger's model version (artifact and tag
``tritonflow.shadow.expected_uri``) and passes their URI in ``canary_conf``, so the canary judges
the challenger against its own behaviour here rather than against the champion.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from tritonflow.checksums import sha256_file
from tritonflow.exceptions import (
    ChallengerUnavailableError,
    DataError,
    InferenceRequestError,
    RegistryError,
    ServiceUnavailableError,
    TransientError,
    WindowError,
)
from tritonflow.pipelines.loop_context import TRAINING_WINDOW_TAG, rejection
from tritonflow.settings import Settings, get_settings

#: Alias of the serving version.
CHAMPION_ALIAS = "champion"
#: Alias of the candidate version.
CHALLENGER_ALIAS = "challenger"
#: Folder under ``settings.home`` holding one sub-folder per shadow run.
SHADOW_DIR = "shadow"
#: File names inside a shadow run folder.
PREDICTIONS_FILE = "predictions.parquet"
EVIDENCE_FILE = "shadow_evidence.json"
REPORT_FILE = "shadow_report.md"
#: Prefix of the model-version tags a shadow evaluation writes.
SHADOW_TAG_PREFIX = "tritonflow.shadow."
#: Prefix of the reference-metric version tags written at training (``tritonflow.reference_auc``).
REFERENCE_TAG_PREFIX = "tritonflow.reference_"
#: Output preferred as the score (skl2onnx classifiers without ZipMap expose it, shape [N, C]).
PREFERRED_OUTPUT = "probabilities"
#: Module of the publish pipeline used for a challenger missing from the repository.
PUBLISH_MODULE = "tritonflow.pipelines.publish"
#: Columns of the predictions file (scores are positive-class probabilities or predictions).
PREDICTION_COLUMNS = ("request_id", "timestamp", "model_version", "champion_score",
                      "challenger_score")
#: The challenger's expected predictions (score and inputs per row), read by the canary.
EXPECTED_FILE = "challenger_expected.parquet"
#: Version tag (on the challenger) naming its expected-predictions artifact.
EXPECTED_TAG = SHADOW_TAG_PREFIX + "expected_uri"
#: Logged columns that are outputs, not inputs (names starting with these).
OUTPUT_PREFIXES = ("prediction", "probabilit", "score")
#: Triton datatypes the score output may have.
_FLOAT_TYPES = {"FP16", "FP32", "FP64"}


# ----------------------------------------------------------------------------- helpers
def _settings(settings: Settings | None) -> Settings:
    return settings if settings is not None else get_settings()


def _registry(settings: Settings):
    from model_registry.registry import RegistryClient

    return RegistryClient(settings.resolved_mlflow_tracking_uri)


def _endpoint(settings: Settings) -> str | None:
    return settings.s3_endpoint_url or None


def log_root(settings: Settings) -> str:
    """Inference-log root: ``settings.inference_log_root`` or ``<home>/inference_logs``."""
    return settings.inference_log_root or str(Path(settings.home) / "inference_logs")


def utc(value: Any, field: str):
    """Parse an ISO 8601 string or datetime to a UTC ``pandas.Timestamp`` (naive = UTC).

    Raises:
        WindowError: The value is not a timestamp (names the field and the value).
    """
    import pandas as pd

    try:
        ts = pd.Timestamp(value)
    except (TypeError, ValueError):
        raise WindowError(f"{field}={value!r} is not a timestamp (expected ISO 8601)") from None
    if ts is pd.NaT:
        raise WindowError(f"{field}={value!r} is not a timestamp (expected ISO 8601)")
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def trusted_keys_dir(settings: Settings) -> Path:
    """Folder of trusted public keys, by the publish pipeline's rule.

    ``settings.signing_trusted_keys_dir`` when configured (not the default), else
    ``<settings.home>/keys/trusted``, where a publish generates the pair on first use.
    """
    from tritonflow.settings import DEFAULT_SIGNING_TRUSTED_KEYS_DIR

    configured = Path(settings.signing_trusted_keys_dir)
    return configured if configured != DEFAULT_SIGNING_TRUSTED_KEYS_DIR else (
        Path(settings.home) / "keys" / "trusted")


def _triton_name(registered: str) -> str:
    try:
        from tritonflow.pipelines.publish import triton_model_name
    except ImportError:
        return registered
    return triton_model_name(registered)


def _reference_metrics(tags: Mapping[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in tags.items():
        if key.startswith(REFERENCE_TAG_PREFIX):
            try:
                f = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(f):
                out[key[len(REFERENCE_TAG_PREFIX):]] = f
    return out


def version_info(registry: Any, ref: Any) -> dict[str, Any]:
    """What the shadow stages need to know about one model version (JSON-serialisable).

    Args:
        registry: A :class:`model_registry.registry.RegistryClient`.
        ref: The :class:`model_registry.registry.ModelVersionRef`.

    Returns:
        ``{"version", "aliases", "run_id", "triton_model_name", "triton_model_version",
        "input_columns", "reference_metrics"}``. The Triton name/version come from the publish
        record tags (``tritonflow.triton_model_name``/``_version``), else the registered name and
        the MLflow version. ``input_columns`` are the signature's column names in order (empty for
        a tensor signature: the log's columns are then matched to input names).
    """
    io = registry.model_io(ref, require_signature=False)
    columns = [n for n in io.input_names if n] if io.input_kind == "columns" else []
    tags = dict(ref.tags)
    return {
        "version": int(ref.version),
        "aliases": list(ref.aliases),
        "run_id": ref.run_id,
        "triton_model_name": tags.get("tritonflow.triton_model_name") or _triton_name(ref.name),
        "triton_model_version": int(tags.get("tritonflow.triton_model_version") or ref.version),
        "input_columns": columns,
        "reference_metrics": _reference_metrics(tags),
    }


def _as_info(model: str, value: Any, settings: Settings, role: str) -> dict[str, Any]:
    """A version-info dict from :func:`resolve_versions`, or build one from a version/alias."""
    if isinstance(value, Mapping):
        missing = [k for k in ("version", "triton_model_name", "triton_model_version",
                               "input_columns") if k not in value]
        if missing:
            raise DataError(f"{role}={dict(value)!r} lacks keys {missing}; expected the dict "
                            "resolve_versions() returns, a version number or an alias")
        return dict(value)
    registry = _registry(settings)
    text = str(value).strip()
    ref = registry.get_version(model, int(text)) if text.isdigit() else registry.resolve_alias(model, text)
    return version_info(registry, ref)


# ----------------------------------------------------------------------------- 0. plan
def latest_drift_event(events: Any, model: str | None = None) -> dict[str, Any] | None:
    """The most recent drift event's ``extra`` among asset events (optionally for one model).

    Args:
        events: Iterable of asset events (objects with ``extra`` and ``timestamp``, as Airflow's
            ``triggering_asset_events`` values hold) or of plain ``extra`` mappings, in order.
        model: Keep only events whose ``extra["model"]`` is this model.

    Returns:
        The chosen ``extra`` (``model``, ``version``, ``features``, ``scores``, ``window_start``,
        ``window_end``...), or None when there is none.
    """
    chosen, chosen_key = None, None
    for i, event in enumerate(events or ()):
        extra = event if isinstance(event, Mapping) else getattr(event, "extra", None)
        if not isinstance(extra, Mapping) or not extra.get("model"):
            continue
        if model and extra.get("model") != model:
            continue
        stamp = getattr(event, "timestamp", None)
        key = (str(extra.get("window_end") or ""), str(stamp or ""), i)
        if chosen_key is None or key >= chosen_key:
            chosen, chosen_key = dict(extra), key
    return chosen


def evaluation_window(*, window_start: Any = None, window_end: Any = None,
                      window_hours: float | str | None = None, drift_event: Any = None,
                      settings: Settings | None = None, now: Any = None) -> dict[str, str]:
    """The replay window ``[start, end)`` of a shadow evaluation.

    Rules: ``end`` = ``window_end``, else the drift event's ``window_end``, else ``now`` (UTC).
    ``start`` = ``window_start``, else ``end - window_hours`` (default ``shadow_window_hours``),
    widened to the drift event's ``window_start`` when that is earlier (the replay always covers
    the drifted window, and enough traffic around it for labels to matter).

    Returns:
        ``{"window_start", "window_end"}`` as ISO 8601 UTC strings.

    Raises:
        WindowError: Unparseable bounds, ``end <= start`` or ``window_hours <= 0``.
    """
    import pandas as pd

    s = _settings(settings)
    event = json.loads(drift_event_json(drift_event) or "{}")
    if not isinstance(event, dict):
        event = {}
    if window_end not in (None, ""):
        end = utc(window_end, "window_end")
    elif event.get("window_end"):
        end = utc(event["window_end"], "drift_event.window_end")
    else:
        end = utc(now if now is not None else dt.datetime.now(dt.timezone.utc), "now")
    hours = float(s.shadow_window_hours if window_hours in (None, "") else window_hours)
    if not hours > 0:
        raise WindowError(f"window_hours={window_hours!r}; expected a positive number of hours")
    if window_start not in (None, ""):
        start = utc(window_start, "window_start")
    else:
        start = end - pd.Timedelta(hours=hours)
        if event.get("window_start"):
            start = min(start, utc(event["window_start"], "drift_event.window_start"))
    if end <= start:
        raise WindowError(f"window_end={end.isoformat()} is not after window_start="
                          f"{start.isoformat()}; expected start < end")
    return {"window_start": start.isoformat(), "window_end": end.isoformat()}


# ----------------------------------------------------------------------------- 1. resolve
def resolve_versions(model: str, challenger: int | str | None = None, *,
                     settings: Settings | None = None) -> dict[str, Any]:
    """Resolve the champion and the challenger of ``model`` in the MLflow registry.

    Args:
        model: Registered model name.
        challenger: A version number (``5`` or ``"5"``), an alias (``"challenger"``,
            ``"candidate"``), or None/``""`` for the alias ``challenger`` when it is set.
        settings: Settings (default: from the environment).

    Returns:
        ``{"model", "champion": info, "challenger": info | None, "notes": [...]}`` with each info
        as :func:`version_info` returns it. The challenger is None when no alias ``challenger`` is
        set, or when that alias names the champion itself (e.g. right after a promotion; noted).

    Raises:
        RegistryError: The model has no ``champion``, the given version/alias does not exist, or
            a challenger given explicitly is the champion.
        DataError: ``model`` is empty.
    """
    if not isinstance(model, str) or not model.strip():
        raise DataError(f"model={model!r}; expected a registered model name")
    s = _settings(settings)
    registry = _registry(s)
    champion = registry.champion(model)
    if champion is None:
        raise RegistryError(
            f"model {model!r} has no alias {CHAMPION_ALIAS!r}: a shadow evaluation compares a "
            "challenger with the serving champion (promote a version first)"
        )
    notes: list[str] = []
    given = None if challenger is None else str(challenger).strip()
    chal_ref = None
    if not given:
        if CHALLENGER_ALIAS in registry.aliases(model):
            chal_ref = registry.resolve_alias(model, CHALLENGER_ALIAS)
            if chal_ref.version == champion.version:
                notes.append(f"alias {CHALLENGER_ALIAS!r} names the champion v{champion.version}; "
                             "evaluating the champion alone")
                chal_ref = None
        else:
            notes.append(f"model {model!r} has no alias {CHALLENGER_ALIAS!r}; evaluating the "
                         "champion alone")
    else:
        chal_ref = (registry.get_version(model, int(given)) if given.isdigit()
                    else registry.resolve_alias(model, given))
        if chal_ref.version == champion.version:
            raise RegistryError(
                f"challenger={challenger!r} of model {model!r} is version {chal_ref.version}, "
                "which is the champion; expected a different version"
            )
    rejected = rejection(chal_ref.tags) if chal_ref is not None else ""
    if rejected and given and chal_ref is not None:  # rejected implies a challenger
        raise RegistryError(f"challenger={challenger!r} of model {model!r} is version {chal_ref.version}, "
                            f"{rejected}; a rejected version is never evaluated, published or promoted "
                            "(publish it again with model_publish once fixed)")
    if rejected and chal_ref is not None:
        notes.append(f"alias {CHALLENGER_ALIAS!r} names version {chal_ref.version}, {rejected}; "
                     "evaluating the champion alone")
        chal_ref = None
    return {
        "model": model,
        "champion": version_info(registry, champion),
        "challenger": None if chal_ref is None else version_info(registry, chal_ref),
        "notes": notes,
    }


# ----------------------------------------------------------------------------- 2. publish
def in_repository(settings: Settings, triton_name: str, triton_version: int) -> bool:
    """True when ``<name>/<version>/config.pbtxt.intended`` exists in the configured repository."""
    from repository_sync.layout import INTENDED_CONFIG_FILENAME
    from repository_sync.storage import open_repository

    storage = open_repository(settings.resolved_repository_uri, endpoint_url=_endpoint(settings))
    wanted = f"{triton_name}/{int(triton_version)}/{INTENDED_CONFIG_FILENAME}"
    return wanted in set(storage.list_paths())


def ensure_challenger_published(resolved: Mapping[str, Any], *, settings: Settings | None = None,
                                publish: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Publish the challenger through the publish pipeline unless it is in the repository already.

    The publish pipeline (:func:`tritonflow.pipelines.publish.publish`, all stages in this
    process: convert, parity gate, sign, push, verified load and smoke test, record) leaves the
    challenger READY beside the champion.

    Args:
        resolved: The return value of :func:`resolve_versions`.
        settings: Settings (default: from the environment).
        publish: The publish function (default :func:`tritonflow.pipelines.publish.publish`),
            called as ``publish("<model>/<version>", settings=settings, perf_gate_enabled=...)``
            (``settings.publish_perf_gate``; plus ``dataset_uri=`` for a retrained version).

    Returns:
        ``{"action": "no_challenger" | "already_in_repository" | "published", "model",
        "version", "triton_model_name", "triton_model_version", "publish": <its summary>}``.

    A challenger tagged ``rejected`` (by ``model_publish`` or an earlier shadow run) is refused,
    never published here. A retrained challenger is published with its training window
    (tag ``tritonflow.training_window_uri``) as dataset.

    Raises:
        RegistryError: The challenger was rejected (the stage and reason are named).
        DataError: The challenger is missing from the repository and the publish pipeline cannot
            be imported (the message says to publish it with the ``model_publish`` DAG first), or
            the publish pipeline refused the version (its own error).
    """
    s = _settings(settings)
    model = resolved["model"]
    chal = resolved.get("challenger")
    if not chal:
        return {"action": "no_challenger", "model": model, "version": None}
    name, version = chal["triton_model_name"], int(chal["triton_model_version"])
    base = {"model": model, "version": int(chal["version"]), "triton_model_name": name,
            "triton_model_version": version}
    registry = _registry(s)
    tags = dict(registry.get_version(model, int(chal["version"])).tags)  # fresh: rejected since resolve?
    rejected = rejection(tags)
    if rejected:
        raise RegistryError(f"challenger {model!r} v{chal['version']} was {rejected}; a version rejected by "
                            "one path is never published or promoted by another")
    if in_repository(s, name, version):
        return {"action": "already_in_repository", **base}
    # A retrained version is published with its training window (validation sample and drift
    # reference from real data, as model_publish does); without one it gets no drift reference.
    dataset = tags.get(TRAINING_WINDOW_TAG) or None
    if publish is None:
        try:
            module = importlib.import_module(PUBLISH_MODULE)
        except ImportError as exc:
            raise DataError(
                f"challenger {model!r} v{chal['version']} is not in the repository "
                f"{s.resolved_repository_uri!r} and the publish pipeline ({PUBLISH_MODULE}) cannot "
                f"be imported ({exc}); publish it with the model_publish DAG first"
            ) from exc
        publish = module.publish
    # The deployment's p99-gate switch (TRITONFLOW_PUBLISH_PERF_GATE) holds here too, as in model_publish.
    gate = {"perf_gate_enabled": bool(s.publish_perf_gate)}
    result = (publish(f"{model}/{int(chal['version'])}", dataset_uri=dataset, settings=s, **gate) if dataset
              else publish(f"{model}/{int(chal['version'])}", settings=s, **gate))
    if not in_repository(s, name, version):
        raise DataError(
            f"the publish pipeline returned for {model!r} v{chal['version']} but "
            f"{name}/{version} is not in the repository {s.resolved_repository_uri!r}"
        )
    return {"action": "published", **base, "publish": _small(result)}


def _small(value: Any) -> Any:
    """A JSON-friendly summary of a publish result (dataclass, mapping or scalar)."""
    import dataclasses

    if hasattr(value, "to_dict"):
        value = value.to_dict()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        text = json.dumps(value, default=str, sort_keys=True)
    except (TypeError, ValueError):
        text = json.dumps(str(value))
    return json.loads(text) if len(text) <= 8000 else {"summary": text[:8000]}


# ----------------------------------------------------------------------------- 3. replay
class _Served:
    """What one version looks like on Triton: inputs, score output, batch size."""

    def __init__(self, control: Any, name: str, version: int) -> None:
        self.name, self.version = name, int(version)
        self.specs = control.input_specs(name, self.version)
        meta = control.client.get_model_metadata(name, str(self.version))
        outputs = [(o["name"], o["datatype"]) for o in meta["outputs"]]
        names = [n for n, _ in outputs]
        if PREFERRED_OUTPUT in names:
            self.output = PREFERRED_OUTPUT
        else:
            floats = [n for n, t in outputs if t in _FLOAT_TYPES]
            if not floats:
                raise DataError(f"model '{name}' version {version} has no floating-point output "
                                f"to score (outputs {outputs}); expected e.g. {PREFERRED_OUTPUT!r}")
            self.output = floats[0]
        self.max_batch = int(control.model_config(name).get("max_batch_size", 0))


def _scores(array: np.ndarray, where: str) -> np.ndarray:
    a = np.asarray(array, dtype=np.float64)
    if a.ndim == 2 and a.shape[1] == 2:
        return a[:, 1]
    if a.ndim == 2 and a.shape[1] == 1:
        return a[:, 0]
    if a.ndim == 1:
        return a
    raise DataError(f"{where}: output shape {a.shape}; expected (n,), (n, 1) or (n, 2) scores")


class _ClientPool:
    """One ``tritonclient.http.InferenceServerClient`` per worker thread."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def get(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            import tritonclient.http as httpclient

            client = httpclient.InferenceServerClient(
                url=self.url, connection_timeout=30.0, network_timeout=self.timeout_s)
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def close(self) -> None:
        for client in self._all:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - best-effort cleanup
                pass


def _infer_chunk(pool: _ClientPool, served: _Served, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    req = []
    for spec in served.specs:
        arr = arrays[spec.name]
        dtype = spec.datatype if spec.datatype == "BYTES" else np_to_triton_dtype(arr.dtype)
        item = httpclient.InferInput(spec.name, list(arr.shape), dtype)
        item.set_data_from_numpy(arr, binary_data=True)
        req.append(item)
    out = [httpclient.InferRequestedOutput(served.output, binary_data=True)]
    try:
        result = pool.get().infer(served.name, req, model_version=str(served.version), outputs=out)
    except InferenceServerException as exc:
        raise InferenceRequestError(
            f"inference on model '{served.name}' version {served.version} failed: {exc.message()}"
        ) from None
    except (ConnectionError, OSError) as exc:
        raise ServiceUnavailableError(f"Triton at {pool.url} unreachable: {exc}") from exc
    return result.as_numpy(served.output)


def _replay_one(executor: ThreadPoolExecutor, pool: _ClientPool, served: _Served,
                arrays: Mapping[str, np.ndarray], n_rows: int) -> list[Any]:
    step = served.max_batch if served.max_batch > 0 else max(n_rows, 1)
    futures = []
    for start in range(0, n_rows, step):
        chunk = {k: v[start:start + step] for k, v in arrays.items()}
        futures.append(executor.submit(_infer_chunk, pool, served, chunk))
    return futures


def _gather(futures: list[Any], where: str) -> np.ndarray:
    parts = [_scores(f.result(), where) for f in futures]
    return np.concatenate(parts) if parts else np.empty(0)


def _inputs(frame: Any, info: Mapping[str, Any], served: _Served, role: str):
    """Request arrays for ``served`` from the logged rows (signature columns, in order)."""
    from repository_sync.triton_client import frame_to_inputs

    columns = list(info.get("input_columns") or [])
    if columns:
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise WindowError(f"{role} v{info['version']} needs input columns {missing} that the "
                              f"inference log lacks; it has {list(frame.columns)}")
        source = frame.loc[:, columns]
    else:
        names = [s.name for s in served.specs]
        missing = [n for n in names if n not in frame.columns]
        if missing:
            raise WindowError(f"{role} v{info['version']} has a tensor signature with inputs "
                              f"{names}; the inference log lacks columns {missing}")
        source = frame.loc[:, names]
    return frame_to_inputs(source.reset_index(drop=True), served.specs)


def _run_dir(settings: Settings, model: str) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(settings.home) / SHADOW_DIR / model / f"{stamp}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_expected(run_dir: Path, rows: Any, scores: np.ndarray, info: Mapping[str, Any],
                   source: str) -> dict[str, Any]:
    """Write the challenger's expected predictions.

    Write the challenger's expected predictions: ``request_id``, ``timestamp``,
    ``expected_score``, ``source`` and the inputs of each row (the signature's columns, else the
    log's numeric columns that are not outputs).

    Returns:
        ``{"expected_uri", "expected_sha256", "expected_rows"}``.
    """
    import pandas as pd

    from repository_sync.canary_checks import EXPECTED_SCORE_COLUMN

    columns = [c for c in (info.get("input_columns") or []) if c in rows.columns]
    if not columns:
        columns = [c for c in rows.columns
                   if c not in ("request_id", "timestamp", "model_version")
                   and not str(c).lower().startswith(OUTPUT_PREFIXES)
                   and pd.api.types.is_numeric_dtype(rows[c])]
    frame = pd.DataFrame({
        "request_id": rows["request_id"].astype(str).to_numpy(),
        "timestamp": pd.to_datetime(rows["timestamp"], utc=True).to_numpy(),
        EXPECTED_SCORE_COLUMN: np.asarray(scores, dtype=np.float64),
        "source": source,
    })
    for c in columns:
        frame[c] = pd.to_numeric(rows[c], errors="coerce").to_numpy(dtype=np.float64)
    path = Path(run_dir) / EXPECTED_FILE
    frame.to_parquet(path, index=False)
    return {"expected_uri": str(path), "expected_sha256": sha256_file(path), "expected_rows": len(frame)}


def replay(model: str, champion: Any, challenger: Any, window_start: Any, window_end: Any, *,
           settings: Settings | None = None, max_rows: int | None = None,
           concurrency: int | None = None) -> dict[str, Any]:
    """Replay a window of logged inputs through the champion and the challenger on Triton.

    Args:
        model: Registered model name (also the inference log's model folder).
        champion: The champion's info from :func:`resolve_versions`, or its version number.
        challenger: The challenger's info, its version/alias, or None (champion alone).
        window_start: Start of the window, inclusive (ISO 8601 or datetime; naive = UTC).
        window_end: End of the window, exclusive.
        settings: Settings: Triton HTTP URL, repository and trusted keys (for verified loads),
            inference-log root, ``shadow_replay_concurrency``, ``shadow_max_replay_rows``.
        max_rows: Most rows replayed, the most recent kept (default ``shadow_max_replay_rows``).
        concurrency: Concurrent requests (default ``shadow_replay_concurrency``).

    Returns:
        ``{"model", "uri", "sha256", "bytes", "rows", "invalid_rows", "window_start",
        "window_end", "champion", "challenger", "outputs", "champion_loaded",
        "challenger_loaded", "challenger_unloaded", "seconds", "mode"}``; ``uri`` is the Parquet
        file of :data:`PREDICTION_COLUMNS` (``challenger_score`` NaN without a challenger); with a
        challenger also ``"expected_uri"``, ``"expected_sha256"``, ``"expected_rows"``
        (:func:`write_expected`).

    Raises:
        WindowError: Bad bounds, no logged row in the window, or the log lacks input columns.
        ChallengerUnavailableError: The challenger failed to load or to answer; the champion was
            left loaded and the challenger unloaded if this call loaded it.
        InferenceRequestError: The champion refused a request.
        TransientError: Triton did not answer or a load timed out (retry later).
    """
    import pandas as pd

    from drift_checks.inference_log import read_window
    from repository_sync.triton_client import TritonModelControl

    s = _settings(settings)
    t0 = time.monotonic()
    start, end = utc(window_start, "window_start"), utc(window_end, "window_end")
    if end <= start:
        raise WindowError(f"window_end={end.isoformat()} is not after window_start="
                          f"{start.isoformat()}; expected start < end")
    champ = _as_info(model, champion, s, "champion")
    chal = None if challenger in (None, "") else _as_info(model, challenger, s, "challenger")
    # read only where a challenger exists (loaded, replayed): never the empty default
    chal_info: dict[str, Any] = chal if chal is not None else {}
    max_rows = int(s.shadow_max_replay_rows if max_rows is None else max_rows)
    workers = int(s.shadow_replay_concurrency if concurrency is None else concurrency)
    if max_rows < 1 or workers < 1:
        raise DataError(f"max_rows={max_rows}, concurrency={workers}; expected both >= 1")

    root = log_root(s)
    window = read_window(root, model, start.to_pydatetime(), end.to_pydatetime(),
                         endpoint_url=_endpoint(s))
    if window.empty:
        raise WindowError(f"inference log of model {model!r} under {root} has no record in "
                          f"[{start.isoformat()}, {end.isoformat()}); nothing to replay")
    frame = window.frame
    if len(frame) > max_rows:
        frame = frame.iloc[-max_rows:]
    frame = frame.reset_index(drop=True)

    from repository_sync.coordination import coordination_store

    control = TritonModelControl(s.triton_http_url, repository=s.resolved_repository_uri,
                                 trusted_keys=str(trusted_keys_dir(s)),
                                 endpoint_url=_endpoint(s), load_timeout_s=s.load_timeout_s,
                                 coordination=coordination_store(s), holder=f"shadow_evaluation/{model}")
    cname, cver = champ["triton_model_name"], int(champ["triton_model_version"])
    champion_loaded = challenger_loaded = challenger_unloaded = False
    pool = _ClientPool(s.triton_http_url, max(60.0, s.load_timeout_s))
    try:
        if cver not in control.ready_versions(cname):
            control.load(cname, cver, keep_loaded=True)  # the champion must serve anyway
            champion_loaded = True
        before: list[int] = []
        if chal is not None:
            xname, xver = chal["triton_model_name"], int(chal["triton_model_version"])
            before = control.ready_versions(xname)
            if xver not in before:
                try:
                    control.load(xname, xver, keep_loaded=True, purpose="evaluation")
                except TransientError:
                    raise
                except DataError as exc:
                    raise ChallengerUnavailableError(
                        f"challenger {model!r} v{chal['version']} (Triton '{xname}' version {xver}) "
                        f"could not be loaded: {exc}; the champion v{champ['version']} is untouched"
                    ) from exc
                challenger_loaded = True
        try:
            served_c = _Served(control, cname, cver)
            served_x = None
            if chal is not None:
                try:
                    served_x = _Served(control, chal["triton_model_name"],
                                       int(chal["triton_model_version"]))
                except Exception as exc:  # noqa: BLE001
                    raise ChallengerUnavailableError(
                        f"challenger {model!r} v{chal['version']} did not describe itself: {exc}"
                    ) from exc
            arrays_c, rows_c, bad_c = _inputs(frame, champ, served_c, "champion")
            rows = rows_c
            bad = dict(bad_c)
            if served_x is not None:
                arrays_x, rows_x, bad_x = _inputs(frame, chal_info, served_x, "challenger")
                bad.update(dict(bad_x))
                rows = sorted(set(rows_c) & set(rows_x))
                arrays_x = {k: v[np.searchsorted(rows_x, rows)] for k, v in arrays_x.items()}
            arrays_c = {k: v[np.searchsorted(rows_c, rows)] for k, v in arrays_c.items()}
            if not rows:
                raise WindowError(f"none of the {len(frame)} logged rows of {model!r} is valid "
                                  f"input (first problems: {sorted(bad.items())[:5]})")
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shadow-replay") as ex:
                fut_c = _replay_one(ex, pool, served_c, arrays_c, len(rows))
                fut_x = (_replay_one(ex, pool, served_x, arrays_x, len(rows))
                         if served_x is not None else [])
                scores_c = _gather(fut_c, f"champion v{champ['version']}")
                try:
                    scores_x = (_gather(fut_x, f"challenger v{chal_info['version']}")
                                if served_x is not None else None)
                except TransientError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    raise ChallengerUnavailableError(
                        f"challenger {model!r} v{chal_info['version']} did not answer: {exc}; the "
                        f"champion v{champ['version']} is untouched"
                    ) from exc
        except BaseException as exc:
            if challenger_loaded:
                try:
                    control.unload_versions(chal_info["triton_model_name"], [int(chal_info["triton_model_version"])])
                    challenger_unloaded = True
                except Exception as cleanup:  # noqa: BLE001 - keep the original error
                    exc.add_note(f"unloading the challenger failed too: {cleanup}")
            raise
        if challenger_loaded:
            control.unload_versions(chal_info["triton_model_name"], [int(chal_info["triton_model_version"])])
            challenger_unloaded = True
        control.wait_ready(cname, cver)  # the champion still serves
    finally:
        pool.close()
        control.close()

    out = frame.iloc[rows]
    predictions = pd.DataFrame({
        "request_id": out["request_id"].astype(str).to_numpy(),
        "timestamp": out["timestamp"].to_numpy(),
        "model_version": out["model_version"].to_numpy() if "model_version" in out else -1,
        "champion_score": scores_c,
        "challenger_score": scores_x if scores_x is not None else np.full(len(rows), np.nan),
    })
    predictions["timestamp"] = pd.to_datetime(predictions["timestamp"], utc=True)
    run_dir = _run_dir(s, model)
    path = run_dir / PREDICTIONS_FILE
    predictions.to_parquet(path, index=False)
    expected = (write_expected(run_dir, out, scores_x, chal_info, "shadow_replay")
                if scores_x is not None else {})
    return {
        **expected,
        "mode": "replay",
        "model": model,
        "uri": str(path),
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "rows": len(rows),
        "invalid_rows": len(frame) - len(rows),
        "window_start": start.isoformat(),
        "window_end": end.isoformat(),
        "champion": champ,
        "challenger": chal,
        "outputs": {"champion": served_c.output,
                    "challenger": served_x.output if served_x is not None else None},
        "champion_loaded": champion_loaded,
        "challenger_loaded": challenger_loaded,
        "challenger_unloaded": challenger_unloaded,
        "seconds": round(time.monotonic() - t0, 3),
    }


# ----------------------------------------------------------------------------- 4. compare
def drift_event_json(event: Any) -> str:
    """A drift event (asset-event extra mapping or JSON string) as compact JSON; ``""`` if none.

    Raises:
        DataError: A string that is not JSON, or a value that cannot be serialised.
    """
    if event in (None, "", {}):
        return ""
    if isinstance(event, str):
        try:
            event = json.loads(event)
        except ValueError:
            raise DataError(f"drift_event={event[:200]!r} is not JSON; expected the drift "
                            "asset event's extra (a JSON object)") from None
    try:
        return json.dumps(event, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError) as exc:
        raise DataError(f"drift_event cannot be serialised ({exc}); expected a JSON object") from None


def _label_column(labels: Any, label_column: str | None) -> str | None:
    candidates = [c for c in labels.columns if c not in ("request_id", "timestamp")]
    if label_column:
        if label_column not in candidates and len(labels):
            raise DataError(f"label_column={label_column!r} is not in the labels' columns "
                            f"{candidates}; expected one of them")
        return label_column
    if not candidates:
        return None
    if len(candidates) > 1:
        raise DataError(f"labels have several columns {candidates}; pass label_column= to pick "
                        "the one the metrics use")
    return candidates[0]


def _read_predictions(replayed: Mapping[str, Any]):
    import pandas as pd

    for key in ("model", "uri", "window_start", "window_end", "champion"):
        if key not in replayed:
            raise DataError(f"replayed lacks key {key!r}; expected the dict replay() returns")
    path = Path(replayed["uri"])
    if not path.is_file():
        raise DataError(f"predictions file {str(path)!r} does not exist (expected replay()'s output; "
                        "is settings.home shared by the workers?)")
    if replayed.get("sha256") and sha256_file(path) != replayed["sha256"]:
        raise DataError(f"predictions file {path} has changed since replay (sha256 differs); "
                        "expected the file replay() wrote")
    return pd.read_parquet(path)


def compare(replayed: Mapping[str, Any], *, settings: Settings | None = None,
            label_column: str | None = None, labels_until: Any = None,
            rule_overrides: Mapping[str, Any] | None = None,
            drift_event: Any = None, record: bool = True) -> dict[str, Any]:
    """Join the labels, decide with :func:`model_registry.shadow.evaluate`, record on both versions.

    Labels are read from the inference log's label partitions for arrivals in
    ``[window_start, labels_until)`` (default ``window_end + shadow_label_lag_hours``) and joined
    by ``request_id``; rows without a label count as unlabelled (fewer than ``min_labels`` is
    ``inconclusive``, never a win).

    Args:
        replayed: The return value of :func:`replay`.
        settings: Settings (``shadow_*`` rule fields, MLflow URI, inference-log root).
        label_column: The label column (default: the labels' only non-key column).
        labels_until: End of the label arrival window (ISO 8601/datetime).
        rule_overrides: :class:`model_registry.shadow.DecisionRule` fields that win over the
            settings (e.g. ``{"min_labels": 50, "confidence": 0.99, "margin": 0.02}``); None values
            are ignored.
        drift_event: The drift event that caused the evaluation (mapping or JSON string),
            passed on in ``retrain_conf``.
        record: Record the decision on the model versions in MLflow (tags and artifacts).

    Returns:
        ``{"model", "outcome", "verdict", "champion_degraded", "reasons", "n_rows", "n_labelled",
        "champion", "challenger", "primary", "evidence_uri", "report_uri", "recorded",
        "canary_conf", "retrain_conf"}``: ``champion``/``challenger`` are version numbers,
        ``primary`` the primary metric's comparison (None without one), ``canary_conf`` and
        ``retrain_conf`` the confs of the DAGs the outcome triggers.

    Raises:
        DataError: The predictions file is missing or changed, labels are ambiguous or invalid,
            or a rule override is out of range.
        WindowError: A label file is malformed.
    """
    import pandas as pd

    from drift_checks.inference_log import join_labels, read_labels
    from model_registry.shadow import DecisionRule, evaluate

    s = _settings(settings)
    model = replayed["model"]
    preds = _read_predictions(replayed)
    champ = replayed["champion"]
    chal = replayed.get("challenger")
    start = utc(replayed["window_start"], "window_start")
    end = utc(replayed["window_end"], "window_end")
    until = (end + pd.Timedelta(hours=float(s.shadow_label_lag_hours)) if labels_until in (None, "")
             else utc(labels_until, "labels_until"))
    if until <= start:
        raise WindowError(f"labels_until={until.isoformat()} is not after window_start="
                          f"{start.isoformat()}")
    labels = read_labels(log_root(s), model, start.to_pydatetime(), until.to_pydatetime(),
                         endpoint_url=_endpoint(s))
    column = _label_column(labels, label_column)
    if column is not None and column in labels.columns:
        joined = join_labels(preds, labels[["request_id", "timestamp", column]])
        y = pd.to_numeric(joined[column], errors="coerce").to_numpy(dtype=np.float64)
    else:
        joined, y = preds, None
    overrides = {k: v for k, v in dict(rule_overrides or {}).items() if v is not None}
    rule = DecisionRule.from_settings(s, **overrides)
    reference = (champ.get("reference_metrics") or {}).get(rule.primary_metric)
    challenger_scores = None if chal is None else joined["challenger_score"].to_numpy(np.float64)
    decision = evaluate(y, joined["champion_score"].to_numpy(np.float64), challenger_scores,
                        rule=rule, champion_reference=reference)

    champ_v = int(champ["version"])
    chal_v = None if chal is None else int(chal["version"])
    evidence = {
        **decision.evidence(),
        "model": model,
        "champion_version": champ_v,
        "challenger_version": chal_v,
        "window_start": start.isoformat(),
        "window_end": end.isoformat(),
        "labels_until": until.isoformat(),
        "label_column": column,
        "predictions_uri": replayed["uri"],
        "predictions_sha256": replayed.get("sha256"),
        "evaluated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    run_dir = Path(replayed["uri"]).parent
    evidence_path = run_dir / EVIDENCE_FILE
    report_path = run_dir / REPORT_FILE
    evidence_path.write_text(json.dumps(evidence, sort_keys=True, indent=2, allow_nan=False))
    report = decision.report_markdown(
        champion_label=f"{model} v{champ_v} (champion)",
        challenger_label=(f"{model} v{chal_v} (challenger)" if chal_v is not None else "no challenger"),
    )
    report += (f"\nWindow: {start.isoformat()} .. {end.isoformat()} (labels arrived until "
               f"{until.isoformat()}); predictions: `{replayed['uri']}`.\n")
    report_path.write_text(report)

    recorded: dict[str, Any] = {}
    expected_path = replayed.get("expected_uri") if chal_v is not None else None
    if expected_path and replayed.get("expected_sha256") and Path(expected_path).is_file() \
            and sha256_file(expected_path) != replayed["expected_sha256"]:
        raise DataError(f"expected predictions {expected_path} changed since they were written "
                        "(sha256 differs)")
    if record:
        recorded = _record(s, model, evidence, evidence_path, report_path, champ_v, chal_v,
                           run_dir.name, expected_path)
    expected_ref = (recorded.get("challenger") or {}).get("expected_uri") or expected_path
    primary = decision.comparisons.get(rule.primary_metric)
    primary_dict = None
    if primary is not None:
        primary_dict = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                        for k, v in primary.__dict__.items()}
    outcome = decision.outcome.value
    return {
        "model": model,
        "outcome": outcome,
        "verdict": decision.verdict.value,
        "champion_degraded": decision.champion_degraded,
        "reasons": list(decision.reasons),
        "n_rows": decision.n_rows,
        "n_labelled": decision.n_labelled,
        "champion": champ_v,
        "challenger": chal_v,
        "primary": primary_dict,
        "evidence_uri": str(evidence_path),
        "report_uri": str(report_path),
        "recorded": recorded,
        "canary_conf": {"model": model, "challenger": None if chal_v is None else str(chal_v),
                        **({"expected_predictions": expected_ref} if expected_ref else {})},
        "retrain_conf": {
            "model": model,
            "reason": "champion_degraded" if decision.champion_degraded else "shadow_" + outcome,
            "drift_event": drift_event_json(drift_event),
        },
    }


def _record(settings: Settings, model: str, evidence: Mapping[str, Any], evidence_path: Path,
            report_path: Path, champion: int, challenger: int | None, run_name: str,
            expected_path: str | None = None) -> dict[str, Any]:
    """Record the shadow decision on the champion and challenger versions.

    Tags and artifacts of the decision on the champion and the challenger versions (and the
    challenger's expected predictions on the challenger, tag :data:`EXPECTED_TAG`).
    """
    registry = _registry(settings)
    compact = json.dumps(evidence, sort_keys=True, separators=(",", ":"), allow_nan=False)
    out: dict[str, Any] = {}
    roles = [("champion", champion, challenger)]
    if challenger is not None:
        roles.append(("challenger", challenger, champion))
    for role, version, other in roles:
        ref = registry.get_version(model, version)
        artifact_path = f"shadow/{run_name}"
        evidence_uri = registry.log_version_artifact(ref, evidence_path, artifact_path)
        report_uri = registry.log_version_artifact(ref, report_path, artifact_path)
        tags = {
            SHADOW_TAG_PREFIX + "outcome": evidence["outcome"],
            SHADOW_TAG_PREFIX + "verdict": evidence["verdict"],
            SHADOW_TAG_PREFIX + "role": role,
            SHADOW_TAG_PREFIX + "compared_with": "" if other is None else str(other),
            SHADOW_TAG_PREFIX + "window": f"{evidence['window_start']}/{evidence['window_end']}",
            SHADOW_TAG_PREFIX + "n_labelled": str(evidence["n_labelled"]),
            SHADOW_TAG_PREFIX + "evaluated_at": evidence["evaluated_at"],
            SHADOW_TAG_PREFIX + "evidence": compact,
            SHADOW_TAG_PREFIX + "evidence_uri": evidence_uri,
            SHADOW_TAG_PREFIX + "report_uri": report_uri,
        }
        out[role] = {"version": version, "evidence_uri": evidence_uri, "report_uri": report_uri,
                     "run_id": registry.publish_run_id(ref)}  # the run holding the files above
        if role == "challenger" and expected_path:
            expected_uri = registry.log_version_artifact(ref, expected_path, artifact_path)
            tags[EXPECTED_TAG] = expected_uri
            out[role]["expected_uri"] = expected_uri
        registry.set_version_tags(ref, tags)
    return out


__all__ = [
    "CHALLENGER_ALIAS", "CHAMPION_ALIAS", "EXPECTED_FILE", "EXPECTED_TAG", "PREDICTION_COLUMNS",
    "SHADOW_TAG_PREFIX", "compare", "write_expected",
    "ensure_challenger_published", "in_repository", "log_root", "replay", "resolve_versions",
    "version_info",
]
