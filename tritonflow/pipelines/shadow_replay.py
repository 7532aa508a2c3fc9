"""Shadow replay: a window of logged inputs sent to the champion and the challenger on Triton.

Stage 3 of the shadow evaluation (:mod:`tritonflow.pipelines.shadow` describes the sequence).
:func:`replay` sends the logged inputs of a window of the inference log to BOTH versions on
Triton, in chunks of ``max_batch_size`` rows on a small thread pool (one HTTP client per thread:
tritonclient's clients are not thread-safe). The champion is never unloaded; a challenger this
stage loaded is unloaded again afterwards (only that version: the model is reloaded with the
versions READY before). A challenger that fails to load or to answer raises
:class:`~ground.exceptions.ChallengerUnavailableError` with the reason. Both versions' scores
(per-class probabilities for a multi-class model, :mod:`tritonflow.pipelines.shadow_classes`)
are stored as Parquet (:data:`PREDICTION_COLUMNS`) under ``<settings.home>/shadow/<model>/<run>/``.

Both :func:`replay` and the live mode (:func:`tritonflow.pipelines.shadow_live.live`) also write
the challenger's *expected predictions* (:func:`write_expected`, :data:`EXPECTED_FILE`: its score
and the inputs of every row), which :func:`tritonflow.pipelines.shadow_compare.compare` records on
the challenger's model version for the canary.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ground.checksums import sha256_file
from ground.exceptions import (
    ChallengerUnavailableError,
    DataError,
    InferenceRequestError,
    ServiceUnavailableError,
    TransientError,
    WindowError,
)
from ground.settings import Settings
from tritonflow.pipelines import shared_work
from tritonflow.pipelines.publish_common import s3_endpoint
from tritonflow.pipelines.shadow import (
    VersionInfo,
    as_version_info,
    log_root,
    settings_or_default,
    trusted_keys_dir,
    utc,
)
from tritonflow.pipelines.shadow_classes import (
    EXPECTED_PREFIX,
    align,
    check_pair,
    class_columns,
    class_labels_of,
    is_multiclass,
    predictions_frame,
)

#: Folder under ``settings.home`` holding one sub-folder per shadow run.
SHADOW_DIR = "shadow"
#: Predictions file inside a shadow run folder.
PREDICTIONS_FILE = "predictions.parquet"
#: Output preferred as the score (skl2onnx classifiers without ZipMap expose it, shape [N, C]).
PREFERRED_OUTPUT = "probabilities"
#: Columns of the predictions file (scores are positive-class probabilities or predictions).
PREDICTION_COLUMNS = ("request_id", "timestamp", "model_version", "champion_score",
                      "challenger_score")
#: The challenger's expected predictions (score and inputs per row), read by the canary.
EXPECTED_FILE = "challenger_expected.parquet"
#: Logged columns that are outputs, not inputs (names starting with these).
OUTPUT_PREFIXES = ("prediction", "probabilit", "score")
#: Triton datatypes the score output may have.
_FLOAT_TYPES = {"FP16", "FP32", "FP64"}


# ----------------------------------------------------------------------------- 3. replay
class ServedVersion:
    """What one version looks like on Triton: inputs, score output, batch size.

    Args:
        control: A :class:`repository_sync.triton.client.TritonModelControl` (its ``client`` too).
        name: Triton model name.
        version: Model version (loaded).

    Attributes:
        name, version: As given.
        specs: The version's input specs (``control.input_specs``).
        output: The output scored: ``probabilities`` when served, else the first floating-point one.
        max_batch: The model config's ``max_batch_size`` (0: no batching).

    Raises:
        DataError: The version has no floating-point output to score.
    """

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
    """Positive-class scores ``(n,)``, or ``[n, C]`` class probabilities when ``C > 2``."""
    a = np.asarray(array, dtype=np.float64)
    if a.ndim == 2 and a.shape[1] > 2:
        return a
    if a.ndim == 2 and a.shape[1] == 2:
        return a[:, 1]
    if a.ndim == 2 and a.shape[1] == 1:
        return a[:, 0]
    if a.ndim == 1:
        return a
    raise DataError(f"{where}: output shape {a.shape}; expected (n,), (n, 1), (n, 2) scores or (n, C) "
                    "class probabilities")


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


def _infer_chunk(pool: _ClientPool, served: ServedVersion, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
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


def _replay_one(executor: ThreadPoolExecutor, pool: _ClientPool, served: ServedVersion,
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


def _inputs(frame: Any, info: Mapping[str, Any], served: ServedVersion, role: str):
    """Request arrays for ``served`` from the logged rows (signature columns, in order)."""
    from repository_sync.triton.client import frame_to_inputs

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


def new_run_dir(settings: Settings, model: str) -> Path:
    """A new folder for one shadow run's files: ``<home>/shadow/<model>/<UTC stamp>-<8 hex>`` (created)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(settings.home) / SHADOW_DIR / model / f"{stamp}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_expected(run_dir: Path, rows: Any, scores: np.ndarray, info: Mapping[str, Any],
                   source: str, class_columns: Sequence[str] = ()) -> dict[str, Any]:
    """Write the challenger's expected predictions.

    Write the challenger's expected predictions: ``request_id``, ``timestamp``,
    ``expected_score``, ``source`` and the inputs of each row (the signature's columns, else the
    log's numeric columns that are not outputs). For ``[n, C]`` class probabilities
    (``C > 2``), ``expected_score`` is the arg-max class index and each class ``c`` has its
    column ``expected.<class_columns[c]>`` (the canary compares it with the same-named logged
    output column, :mod:`tritonflow.pipelines.shadow_classes`).

    Returns:
        ``{"expected_uri", "expected_sha256", "expected_rows"}``.
    """
    import pandas as pd

    from repository_sync.canary.checks import EXPECTED_SCORE_COLUMN

    columns = [c for c in (info.get("input_columns") or []) if c in rows.columns]
    if not columns:
        columns = [c for c in rows.columns
                   if c not in ("request_id", "timestamp", "model_version")
                   and not str(c).lower().startswith(OUTPUT_PREFIXES)
                   and pd.api.types.is_numeric_dtype(rows[c])]
    frame = pd.DataFrame({
        "request_id": rows["request_id"].astype(str).to_numpy(),
        "timestamp": pd.to_datetime(rows["timestamp"], utc=True).to_numpy(),
        EXPECTED_SCORE_COLUMN: (np.argmax(scores, axis=1).astype(np.float64) if is_multiclass(scores)
                                else np.asarray(scores, dtype=np.float64)),
        "source": source,
    })
    if is_multiclass(scores):
        if len(class_columns) != scores.shape[1]:
            raise DataError(f"class_columns={list(class_columns)} for {scores.shape[1]} classes; "
                            "expected one name per probability column")
        for c, name in enumerate(class_columns):
            frame[f"{EXPECTED_PREFIX}{name}"] = scores[:, c]
    for c in columns:
        frame[c] = pd.to_numeric(rows[c], errors="coerce").to_numpy(dtype=np.float64)
    path = Path(run_dir) / EXPECTED_FILE
    frame.to_parquet(path, index=False)
    return {"expected_uri": str(path), "expected_sha256": sha256_file(path), "expected_rows": len(frame)}


@dataclasses.dataclass(frozen=True)
class _ReplayWindow:
    """What a replay sends: the versions, the window's bounds, its logged rows and the concurrency."""

    model: str
    champ: VersionInfo
    chal: VersionInfo | None
    start: Any  # pandas.Timestamp, UTC
    end: Any
    frame: Any  # pandas.DataFrame of the logged rows replayed, index 0..n-1
    workers: int

    @property
    def chal_info(self) -> Mapping[str, Any]:
        """The challenger's info; read only where a challenger exists (never the empty default)."""
        return self.chal if self.chal is not None else {}


@dataclasses.dataclass(frozen=True)
class _Answers:
    """Both versions' answers to the replayed rows (``scores_x`` ``None`` without a challenger)."""

    served_c: ServedVersion
    served_x: ServedVersion | None
    rows: list[int]
    scores_c: np.ndarray
    scores_x: np.ndarray | None


@dataclasses.dataclass
class _Loads:
    """What the replay loaded and unloaded on Triton."""

    champion_loaded: bool = False
    challenger_loaded: bool = False
    challenger_unloaded: bool = False


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
        (:func:`write_expected`); for ``[N, C]`` class probabilities (``C > 2``) also
        ``"class_labels"`` (the champion's class order from its ONNX file, None when unknown) and
        ``"class_columns"`` (the per-class output column names), and the predictions file holds
        per-class columns (:mod:`tritonflow.pipelines.shadow_classes`).

    Raises:
        WindowError: Bad bounds, no logged row in the window, or the log lacks input columns.
        ChallengerUnavailableError: The challenger failed to load or to answer; the champion was
            left loaded and the challenger unloaded if this call loaded it.
        InferenceRequestError: The champion refused a request.
        DataError: The two versions answer different output shapes or classes.
        TransientError: Triton did not answer or a load timed out (retry later).
    """
    s = settings_or_default(settings)
    t0 = time.monotonic()
    window = _replay_window(model, champion, challenger, window_start, window_end, s, max_rows, concurrency)
    answers, loads = _replay_on_triton(window, s)
    return {**_write_replay(window, s, answers, loads), "seconds": round(time.monotonic() - t0, 3)}


def _replay_window(model: str, champion: Any, challenger: Any, window_start: Any, window_end: Any,
                   s: Settings, max_rows: int | None, concurrency: int | None) -> _ReplayWindow:
    """Check the bounds and the versions, and read the window's most recent ``max_rows`` logged rows."""
    from drift_checks.inference_log import read_window

    start, end = utc(window_start, "window_start"), utc(window_end, "window_end")
    if end <= start:
        raise WindowError(f"window_end={end.isoformat()} is not after window_start="
                          f"{start.isoformat()}; expected start < end")
    champ = as_version_info(model, champion, s, "champion")
    chal = None if challenger in (None, "") else as_version_info(model, challenger, s, "challenger")
    rows_cap = int(s.shadow_max_replay_rows if max_rows is None else max_rows)
    workers = int(s.shadow_replay_concurrency if concurrency is None else concurrency)
    if rows_cap < 1 or workers < 1:
        raise DataError(f"max_rows={rows_cap}, concurrency={workers}; expected both >= 1")

    root = log_root(s)
    logged = read_window(root, model, start.to_pydatetime(), end.to_pydatetime(), endpoint_url=s3_endpoint(s))
    if logged.empty:
        raise WindowError(f"inference log of model {model!r} under {root} has no record in "
                          f"[{start.isoformat()}, {end.isoformat()}); nothing to replay")
    frame = logged.frame
    if len(frame) > rows_cap:
        frame = frame.iloc[-rows_cap:]
    return _ReplayWindow(model, champ, chal, start, end, frame.reset_index(drop=True), workers)


def _replay_on_triton(window: _ReplayWindow, s: Settings) -> tuple[_Answers, _Loads]:
    """Load what is missing, send the rows to both versions, unload the challenger this call loaded.

    The champion is never unloaded. On any failure the challenger this call loaded is unloaded
    (a failure to do so is added to the error as a note) and the error propagates.
    """
    from ground.coordination import coordination_store
    from repository_sync.triton.replicas import triton_control

    control = triton_control(s, None, repository=s.resolved_repository_uri,
                             trusted_keys=str(trusted_keys_dir(s)),
                             endpoint_url=s3_endpoint(s), load_timeout_s=s.load_timeout_s,
                             coordination=coordination_store(s), holder=f"shadow_evaluation/{window.model}")
    cname, cver = window.champ["triton_model_name"], int(window.champ["triton_model_version"])
    chal_info = window.chal_info
    done = _Loads()
    pool = _ClientPool(s.triton_http_url, max(60.0, s.load_timeout_s))
    try:
        _load_for_replay(control, window, done)
        try:
            answers = _send_both(control, pool, window)
        except BaseException as exc:
            if done.challenger_loaded:
                try:
                    control.unload_versions(chal_info["triton_model_name"], [int(chal_info["triton_model_version"])])
                    done.challenger_unloaded = True
                except Exception as cleanup:  # noqa: BLE001 - keep the original error
                    exc.add_note(f"unloading the challenger failed too: {cleanup}")
            raise
        if done.challenger_loaded:
            control.unload_versions(chal_info["triton_model_name"], [int(chal_info["triton_model_version"])])
            done.challenger_unloaded = True
        control.wait_ready(cname, cver)  # the champion still serves
    finally:
        pool.close()
        control.close()
    return answers, done


def _load_for_replay(control: Any, window: _ReplayWindow, done: _Loads) -> None:
    """Load the champion (it must serve anyway) and the challenger when not READY; noted in ``done``.

    Raises:
        ChallengerUnavailableError: Triton refused the challenger (the champion is untouched).
        TransientError: Triton did not answer or a load timed out.
    """
    champ, chal, model = window.champ, window.chal, window.model
    cname, cver = champ["triton_model_name"], int(champ["triton_model_version"])
    if cver not in control.ready_versions(cname):
        control.load(cname, cver, keep_loaded=True)
        done.champion_loaded = True
    if chal is None:
        return
    xname, xver = chal["triton_model_name"], int(chal["triton_model_version"])
    if xver in control.ready_versions(xname):
        return
    try:
        control.load(xname, xver, keep_loaded=True, purpose="evaluation")
    except TransientError:
        raise
    except DataError as exc:
        raise ChallengerUnavailableError(
            f"challenger {model!r} v{chal['version']} (Triton '{xname}' version {xver}) "
            f"could not be loaded: {exc}; the champion v{champ['version']} is untouched"
        ) from exc
    done.challenger_loaded = True


def _send_both(control: Any, pool: _ClientPool, window: _ReplayWindow) -> _Answers:
    """Both versions' scores for the logged rows valid input for both.

    Raises:
        WindowError: No logged row is valid input. ChallengerUnavailableError: The challenger did
            not describe itself or did not answer. InferenceRequestError: The champion refused a
            request.
    """
    champ, chal, chal_info, model = window.champ, window.chal, window.chal_info, window.model
    served_c = ServedVersion(control, champ["triton_model_name"], int(champ["triton_model_version"]))
    served_x = None
    if chal is not None:
        try:
            served_x = ServedVersion(control, chal["triton_model_name"],
                                                     int(chal["triton_model_version"]))
        except Exception as exc:  # noqa: BLE001
            raise ChallengerUnavailableError(
                f"challenger {model!r} v{chal['version']} did not describe itself: {exc}"
            ) from exc
    rows, arrays_c, arrays_x = _common_inputs(window, served_c, served_x)
    with ThreadPoolExecutor(max_workers=window.workers, thread_name_prefix="shadow-replay") as ex:
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
    return _Answers(served_c, served_x, rows, scores_c, scores_x)


def _common_inputs(window: _ReplayWindow, served_c: ServedVersion, served_x: ServedVersion | None
                   ) -> tuple[list[int], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(rows, champion arrays, challenger arrays)``: the logged rows valid input for both versions.

    Raises:
        WindowError: The log lacks input columns, or no row is valid input.
    """
    frame = window.frame
    arrays_c, rows_c, bad_c = _inputs(frame, window.champ, served_c, "champion")
    rows = rows_c
    bad = dict(bad_c)
    arrays_x: dict[str, np.ndarray] = {}
    if served_x is not None:
        arrays_x, rows_x, bad_x = _inputs(frame, window.chal_info, served_x, "challenger")
        bad.update(dict(bad_x))
        rows = sorted(set(rows_c) & set(rows_x))
        arrays_x = {k: v[np.searchsorted(rows_x, rows)] for k, v in arrays_x.items()}
    arrays_c = {k: v[np.searchsorted(rows_c, rows)] for k, v in arrays_c.items()}
    if not rows:
        raise WindowError(f"none of the {len(frame)} logged rows of {window.model!r} is valid "
                          f"input (first problems: {sorted(bad.items())[:5]})")
    return rows, arrays_c, arrays_x


def _write_replay(window: _ReplayWindow, s: Settings, answers: _Answers, loads: _Loads) -> dict[str, Any]:
    """Check the pairs, write the predictions and the expected predictions; the replay's summary."""
    model, frame, rows, chal_info = window.model, window.frame, answers.rows, window.chal_info
    served_c, served_x, scores_c, scores_x = answers.served_c, answers.served_x, answers.scores_c, answers.scores_x
    out = frame.iloc[rows]
    check_pair(scores_c, scores_x, f"model {model!r}")
    multi: dict[str, Any] = {}
    columns: list[str] = []
    if is_multiclass(scores_c):  # per-class columns, classes in the champion's order
        labels_c = class_labels_of(s, window.champ)
        if scores_x is not None:
            scores_x = align(labels_c, class_labels_of(s, chal_info), scores_x, f"model {model!r}")
        logged = [c for c in frame.columns if str(c).lower().startswith(OUTPUT_PREFIXES)]
        columns = class_columns(logged, scores_c.shape[1], served_c.output)
        multi = {"class_labels": labels_c, "class_columns": columns}
    predictions = predictions_frame(out, scores_c, scores_x)
    run_dir = new_run_dir(s, model)
    path = run_dir / PREDICTIONS_FILE
    predictions.to_parquet(path, index=False)
    expected = (write_expected(run_dir, out, scores_x, chal_info, "shadow_replay", columns)
                if scores_x is not None else {})
    shared_work.share(s, run_dir)  # compare and the canary may run on another worker
    return {
        **expected,
        **multi,
        "mode": "replay",
        "model": model,
        "uri": str(path),
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "rows": len(rows),
        "invalid_rows": len(frame) - len(rows),
        "window_start": window.start.isoformat(),
        "window_end": window.end.isoformat(),
        "champion": window.champ,
        "challenger": window.chal,
        "outputs": {"champion": served_c.output,
                    "challenger": served_x.output if served_x is not None else None},
        "champion_loaded": loads.champion_loaded,
        "challenger_loaded": loads.challenger_loaded,
        "challenger_unloaded": loads.challenger_unloaded,
    }


__all__ = [
    "EXPECTED_FILE", "OUTPUT_PREFIXES", "PREDICTIONS_FILE", "PREDICTION_COLUMNS", "ServedVersion", "new_run_dir",
    "replay", "write_expected",
]
