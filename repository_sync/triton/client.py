"""Triton model-control client: verified load, wait for READY, unload, index, smoke inference.

Built on ``tritonclient.http`` against a Triton started with ``--model-control-mode=explicit``
(Triton "Model Management" and "Model Repository Extension" docs).

Loading:

* Before every load the version folder is verified against its OpenSSF model-signing signature with
  the trusted keys (for S3 a temporary local copy is downloaded and verified). An unsigned or
  tampered version is never sent to Triton.
* The config used is the version's signed ``config.pbtxt.intended`` (or one the caller passes),
  sent through the load API's ``config`` parameter, which overrides the on-disk ``config.pbtxt``
  for that load. Its ``version_policy`` is set to ``specific`` = the requested version plus the
  versions the model is meant to keep loaded (``keep_loaded=True``), so loading a challenger does
  not unload the champion. That set is desired state in the shared coordination database, changed
  under the model's ``model-control`` lease (:mod:`repository_sync.triton.model_control`), never a
  read-modify-write of what is READY: two tasks loading versions of one model at once both keep
  theirs. Triton applies one config per loaded model: the kept versions are reloaded with the new
  config if it differs; pass ``keep_loaded=False`` (or load under another model name) when that is
  not wanted.
* After the load call, READY is awaited with a timeout (``is_model_ready`` polled, the repository
  index consulted for the failure reason). On any failure -- refused load, timeout, failed smoke
  inference -- Triton is brought back to the desired set, which is unchanged. Nothing stays
  half-loaded.

Inputs: integer inputs are built from object/int columns value by value, never through
float, so ``9007199254740993`` (2**53 + 1) arrives exactly. A row with a missing or non-integer id
is not sent; it is reported in :attr:`SmokeResult.invalid_rows` and counted as an invalid request.

Input building (:func:`frame_to_inputs`, :func:`exact_integer`, :class:`InputSpec`) lives in
:mod:`repository_sync.triton.inputs` and is re-exported here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, TypeVar

import numpy as np

from ground.exceptions import (
    DataError,
    InferenceRequestError,
    ModelLoadError,
    ParityError,
    ServiceUnavailableError,
    SignatureVerificationError,
)
from ground.settings import DEFAULTS
from repository_sync.layout import INTENDED_CONFIG_FILENAME, VersionLayout, plan_version
from repository_sync.model_config import model_filename_for, parse_config
from repository_sync.signing import SignatureInfo, load_public_keys, verify_version
from repository_sync.storage.base import RepositoryStorage
from repository_sync.storage.open import open_repository
from repository_sync.triton.inputs import (
    FLOAT64_EXACT_INT_LIMIT,
    InputSpec,
    check_input_array,
    exact_integer,
    frame_to_inputs,
)

__all__ = [
    "DEFAULT_POLL_INTERVAL_S",
    "FLOAT64_EXACT_INT_LIMIT",
    "InputSpec",
    "SmokeResult",
    "TritonModelControl",
    "exact_integer",
    "frame_to_inputs",
]

#: Seconds between two READY polls.
DEFAULT_POLL_INTERVAL_S = 0.2

T = TypeVar("T")


@dataclasses.dataclass
class SmokeResult:
    """Outcome of a smoke inference.

    Attributes:
        outputs: Output name -> array for the rows sent (in sample order).
        rows_sent: Indices (sample positions) of the rows sent.
        invalid_rows: ``(position, reason)`` of rows refused before sending.
        max_abs_error: Output name -> max |served - expected| (when expected values were given).
    """

    outputs: dict[str, np.ndarray]
    rows_sent: list[int]
    invalid_rows: list[tuple[int, str]]
    max_abs_error: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def invalid_requests(self) -> int:
        """Number of rows refused as invalid requests."""
        return len(self.invalid_rows)

    def summary(self) -> dict:
        """Small JSON-serialisable summary (no arrays)."""
        return {
            "rows_sent": len(self.rows_sent),
            "invalid_requests": self.invalid_requests,
            "invalid_rows": [[i, r] for i, r in self.invalid_rows[:20]],
            "max_abs_error": self.max_abs_error,
        }


def coordination_store(coordination: Any, private_prefix: str) -> tuple[Any, str]:
    """The coordination store model control serialises on, and the prefix of its keys.

    Args:
        coordination: A ``CoordinationStore``, its database URL, or ``None`` for a store private to
            this process.
        private_prefix: Key prefix with a private store (the server(s) it guards); a shared store
            keys by model name alone, so every process and host agrees on the key.

    Returns:
        ``(store, key prefix)``.
    """
    from ground.coordination import CoordinationStore, private_store

    if coordination is None:
        return private_store(), private_prefix
    store = coordination if isinstance(coordination, CoordinationStore) else CoordinationStore(str(coordination))
    return store, ""


def repository_storage(repository: str | RepositoryStorage | None,
                       endpoint_url: str | None) -> RepositoryStorage | None:
    """The repository storage signatures are verified against (a URI is opened; ``None`` stays)."""
    if repository is None or isinstance(repository, RepositoryStorage):
        return repository
    return open_repository(repository, endpoint_url=endpoint_url)


def trusted_key_map(trusted_keys: Any) -> dict | None:
    """Trusted public keys by id, from a key folder/files or an existing mapping (``None``: none)."""
    if trusted_keys is None:
        return None
    return dict(trusted_keys) if isinstance(trusted_keys, Mapping) else load_public_keys(trusted_keys)


# --------------------------------------------------------------------------- client
class TritonModelControl:
    """Model-control and inference client for one Triton server (explicit model-control mode).

    Args:
        url: ``host:port`` of Triton's HTTP endpoint (as tritonclient expects it).
        repository: The repository Triton serves (folder, S3 URL or storage), used to verify
            signatures before loads. Required for :meth:`load`.
        trusted_keys: Public key folder/files, or the mapping from ``load_public_keys``.
        endpoint_url: boto3 endpoint for an S3 repository (must match its host:port).
        load_timeout_s: Default seconds to wait for READY (setting ``load_timeout_s``).
        poll_interval_s: Seconds between READY polls.
        coordination: The shared :class:`~ground.coordination.CoordinationStore` (or its
            URL) holding the model-control leases and desired versions. Default: a store private to
            this process (serialises its threads only; pipelines pass the shared one).
        needed_versions: ``name -> versions`` the registry needs loaded (e.g. from
            :func:`repository_sync.triton.model_control.registry_versions`); always kept loaded.
        holder: Who acts (dag/run/task), named when another task waits for the lease.
        lock_timeout_s: Seconds a load/unload waits for another one of the same model (default: the
            store's ``model_control_timeout_s``, i.e. ``TRITONFLOW_MODEL_CONTROL_LOCK_TIMEOUT_S``).
    """

    def __init__(
        self,
        url: str,
        *,
        repository: str | RepositoryStorage | None = None,
        trusted_keys: Any = None,
        endpoint_url: str | None = None,
        load_timeout_s: float = DEFAULTS.load_timeout_s,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        coordination: Any = None,
        needed_versions: Any = None,
        holder: str = "",
        lock_timeout_s: float | None = None,
    ):
        import tritonclient.http as httpclient

        self.url = url
        self.coordination, self._key_prefix = coordination_store(coordination, f"{url}/")
        self.needed_versions = needed_versions
        self.holder = holder
        if lock_timeout_s is None:
            lock_timeout_s = (getattr(self.coordination, "model_control_timeout_s", None)
                              or DEFAULTS.model_control_lock_timeout_s)
        self.lock_timeout_s = float(lock_timeout_s)
        self.load_timeout_s = float(load_timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        self.client = httpclient.InferenceServerClient(
            url=url, connection_timeout=30.0, network_timeout=max(60.0, self.load_timeout_s + 30.0)
        )
        self.storage = repository_storage(repository, endpoint_url)
        self._keys = trusted_key_map(trusted_keys)

    def coordination_key(self, name: str) -> str:
        """The lease/desired-state key of Triton model ``name`` (the model name on a shared store)."""
        return self._key_prefix + name

    def close(self) -> None:
        """Close the HTTP connections (Triton waits for open connections when it shuts down)."""
        with _suppress():
            self.client.close()

    def __enter__(self) -> "TritonModelControl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ small wrappers
    def _call(self, what: str, fn, *args, **kwargs):
        from tritonclient.utils import InferenceServerException

        try:
            return fn(*args, **kwargs)
        except InferenceServerException:
            raise
        except (ConnectionError, OSError) as exc:
            raise ServiceUnavailableError(f"Triton at {self.url} unreachable while {what}: {exc}") from exc

    def index(self) -> list[dict]:
        """Read Triton's repository index.

        Repository index: one dict per model version known to Triton (name, version, state,
        reason), including models not loaded.
        """
        return list(self._call("reading the repository index", self.client.get_model_repository_index))

    def ready_versions(self, name: str) -> list[int]:
        """Versions of ``name`` that are READY now (from the repository index)."""
        out = []
        for entry in self.index():
            if entry.get("name") == name and entry.get("state") == "READY" and entry.get("version"):
                out.append(int(entry["version"]))
        return sorted(set(out))

    def _reason(self, name: str, version: int) -> str:
        with _suppress():
            for entry in self.index():
                if entry.get("name") == name and str(entry.get("version", "")) in {str(version), ""}:
                    if entry.get("reason"):
                        return f"{entry.get('state')}: {entry['reason']}"
        return "no reason reported"

    def is_ready(self, name: str, version: int) -> bool:
        """Whether ``name`` version ``version`` is READY."""
        from tritonclient.utils import InferenceServerException

        try:
            return bool(self._call("checking readiness", self.client.is_model_ready, name, str(version)))
        except InferenceServerException:
            return False

    def wait_ready(self, name: str, version: int, timeout_s: float | None = None) -> float:
        """Poll until the version is READY.

        Returns:
            Seconds waited.

        Raises:
            ModelLoadError: Not READY within ``timeout_s`` (default ``load_timeout_s``); the
                message carries the state and reason from the repository index.
        """
        timeout_s = self.load_timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        while True:
            if self.is_ready(name, version):
                return time.monotonic() - start
            if time.monotonic() - start >= timeout_s:
                raise ModelLoadError(
                    f"model '{name}' version {version} not READY after {timeout_s:.1f} s "
                    f"({self._reason(name, version)})"
                )
            time.sleep(self.poll_interval_s)

    def unload(self, name: str) -> None:
        """Unload every version of ``name`` (no error if it is not loaded), under its lease.

        Versions the registry needs (``needed_versions``) stay loaded.
        """
        from repository_sync.triton.model_control import reconcile

        reconcile(self, name, exactly=())

    def unload_versions(self, name: str, versions: Sequence[int]) -> dict:
        """Unload ``versions`` of ``name`` and keep the other desired ones, in one request."""
        from repository_sync.triton.model_control import reconcile

        return reconcile(self, name, remove=[int(v) for v in versions])

    def model_config(self, name: str) -> dict:
        """The config Triton is serving ``name`` with (JSON dict)."""
        return self._call(f"reading the config of '{name}'", self.client.get_model_config, name)

    def input_specs(self, name: str, version: int) -> list[InputSpec]:
        """Inputs of a loaded version, per-row dims (batch axis removed when the model batches)."""
        meta = self._call("reading model metadata", self.client.get_model_metadata, name, str(version))
        batched = int(self.model_config(name).get("max_batch_size", 0)) > 0
        specs = []
        for item in meta["inputs"]:
            shape = tuple(int(d) for d in item["shape"])
            specs.append(InputSpec(item["name"], item["datatype"], shape[1:] if batched else shape))
        return specs

    # ------------------------------------------------------------------ verification
    def verify(self, name: str, version: int) -> tuple[SignatureInfo, bytes]:
        """Verify a version in the repository; return its signature info and intended config.

        Raises:
            SignatureVerificationError: Missing intended config or signature, untrusted key, or
                a modified/extra/missing file (named).
            DataError: No repository or trusted keys configured, or the version is absent.
        """
        if self.storage is None or self._keys is None:
            raise DataError(
                "verification before load needs the repository and trusted keys: pass repository= "
                "and trusted_keys= (TRITONFLOW_SIGNING_TRUSTED_KEYS_DIR)"
            )
        probe: VersionLayout = plan_version(name, version)
        with self.storage.local_version(probe) as local:
            intended = local / INTENDED_CONFIG_FILENAME
            if not intended.is_file():
                raise SignatureVerificationError(
                    f"{self.storage.version_uri(probe)}/{INTENDED_CONFIG_FILENAME} is missing: the "
                    "version was not published by tritonflow or is incomplete; refusing to load"
                )
            config_bytes = intended.read_bytes()
            try:
                filename = model_filename_for(parse_config(config_bytes, model_name=name))
            except Exception as exc:
                raise SignatureVerificationError(
                    f"{self.storage.version_uri(probe)}/{INTENDED_CONFIG_FILENAME} is unreadable "
                    f"({exc}); refusing to load"
                ) from None
            layout = plan_version(name, version, filename)
            info = verify_version(local, self._keys, signature_file=layout.signature_filename)
        return info, config_bytes

    # ------------------------------------------------------------------ load
    def load(
        self,
        name: str,
        version: int,
        config: Any = None,
        *,
        keep_loaded: bool = True,
        timeout_s: float | None = None,
        purpose: str = "serving",
    ) -> dict:
        """Verify, load and wait for READY; put the model back as it was on any failure.

        Args:
            name: Triton model name.
            version: Version to load (a folder in the repository).
            config: Config to load with (pbtxt, JSON, dict or ModelConfig); default: the version's
                signed ``config.pbtxt.intended``. Its version policy is replaced (see module doc).
            keep_loaded: Keep the model's desired versions loaded beside this one (else only it).
            timeout_s: Seconds to wait for READY (default ``load_timeout_s``).
            purpose: Why it is loaded (``serving``, ``evaluation``, ``canary``), recorded.

        Returns:
            ``{"model_name", "version", "versions", "signature_digest", "key_id", "load_s"}``;
            ``versions`` is the set the model keeps loaded (still true when this returns).

        Raises:
            SignatureVerificationError: The version (or a kept one) fails verification; nothing
                is sent to Triton.
            ModelLoadRefusedError: Triton refused the load (its message included).
            ModelLoadError: Not READY in time.
        """
        from repository_sync.triton.model_control import reconcile

        version = plan_version(name, version).version
        start = time.monotonic()
        if keep_loaded:
            done = reconcile(self, name, add=[version], config=config, config_version=version,
                             purpose=purpose, timeout_s=timeout_s)
        else:
            done = reconcile(self, name, exactly=[version], config=config, config_version=version,
                             purpose=purpose, timeout_s=timeout_s)
        return {
            "model_name": name,
            "version": version,
            "versions": done["versions"],
            "signature_digest": done["signatures"][str(version)],
            "key_id": done["key_ids"][str(version)],
            "load_s": round(time.monotonic() - start, 3),
        }

    # ------------------------------------------------------------------ inference
    def infer(
        self, name: str, version: int, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one inference request and return the outputs as numpy arrays.

        Args:
            name: Model name.
            version: Model version.
            inputs: Input name -> array with the batch axis first (when the model batches).
                Integer inputs must be integer arrays (never float).
            outputs: Output names to return (default: all from the model metadata).

        Raises:
            DataError: Missing input or a float array for an integer input.
            InferenceRequestError: Triton rejected the request (message included).

        Rows are sent in chunks of at most ``max_batch_size`` when the model batches.
        """
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException, np_to_triton_dtype

        specs = {s.name: s for s in self.input_specs(name, version)}
        missing = sorted(set(specs) - set(inputs))
        if missing:
            raise DataError(f"inputs {missing} of model '{name}' are missing; given {sorted(inputs)}")
        arrays = {n: check_input_array(spec, inputs[n]) for n, spec in specs.items()}
        if outputs is None:
            meta = self._call("reading model metadata", self.client.get_model_metadata, name, str(version))
            outputs = [o["name"] for o in meta["outputs"]]
        max_batch = int(self.model_config(name).get("max_batch_size", 0))
        n_rows = len(next(iter(arrays.values()))) if arrays else 0
        step = max_batch if max_batch > 0 else max(n_rows, 1)
        parts: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
        for start in range(0, max(n_rows, 1), step):
            chunk = {n: (a[start : start + step] if max_batch > 0 else a) for n, a in arrays.items()}
            req = []
            for input_name, arr in chunk.items():
                datatype = specs[input_name].datatype
                item = httpclient.InferInput(
                    input_name, list(arr.shape), datatype if datatype == "BYTES" else np_to_triton_dtype(arr.dtype)
                )
                item.set_data_from_numpy(arr, binary_data=True)
                req.append(item)
            out_req = [httpclient.InferRequestedOutput(o, binary_data=True) for o in outputs]
            try:
                result = self._call(
                    f"inferring on '{name}'", self.client.infer, name, req,
                    model_version=str(version), outputs=out_req,
                )
            except InferenceServerException as exc:
                raise InferenceRequestError(
                    f"inference on model '{name}' version {version} failed: {exc.message()}"
                ) from None
            for o in outputs:
                parts[o].append(result.as_numpy(o))
            if max_batch <= 0:
                break
        return {o: np.concatenate(v) if len(v) > 1 else v[0] for o, v in parts.items()}

    def smoke_test(
        self,
        name: str,
        version: int,
        sample: Any,
        expected: Mapping[str, np.ndarray] | None = None,
        *,
        atol: float = 1e-5,
        rtol: float = 1e-5,
    ) -> SmokeResult:
        """Send a sample through the served version and compare with expected outputs.

        Args:
            name: Model name.
            version: Model version (loaded).
            sample: ``pandas.DataFrame`` (rows refused when an id is missing/invalid) or a
                mapping input name -> array.
            expected: Output name -> array for every sample row (rows refused are skipped).
            atol: Absolute tolerance, as in ``numpy.isclose`` (|a-b| <= atol + rtol*|b|).
            rtol: Relative tolerance, as in ``numpy.isclose``.

        Returns:
            :class:`SmokeResult`.

        Raises:
            ParityError: An output differs; names the output, worst row, max absolute and relative
                error.
            DataError: No valid row to send, or bad sample.
        """
        if isinstance(sample, Mapping):
            arrays = dict(sample)
            n = len(next(iter(arrays.values()))) if arrays else 0
            invalid: list[tuple[int, str]] = []
            rows = list(range(n))
        else:
            arrays, rows, invalid = frame_to_inputs(sample, self.input_specs(name, version))
        if not rows:
            raise DataError(
                f"smoke test of model '{name}' version {version}: no valid row to send "
                f"({len(invalid)} invalid: {invalid[:5]})"
            )
        outputs = self.infer(name, version, arrays, list(expected) if expected else None)
        result = SmokeResult(outputs=outputs, rows_sent=rows, invalid_rows=invalid)
        for out_name, want in (expected or {}).items():
            want = np.asarray(want)[rows]
            got = outputs[out_name]
            if want.dtype.kind in "OSU" or got.dtype.kind in "OSU":  # string labels (BYTES)
                text = np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else str(v), otypes=[object])
                differ = text(got).reshape(len(rows), -1) != text(want).reshape(len(rows), -1)
                result.max_abs_error[out_name] = 0.0
                if differ.any():
                    bad_rows = np.flatnonzero(differ.any(axis=1))
                    raise ParityError(
                        f"smoke test of model '{name}' version {version}: output {out_name!r} (strings) "
                        f"differs from the source model in {bad_rows.size} of {len(rows)} rows; first row "
                        f"{rows[int(bad_rows[0])]}"
                    )
                continue
            if got.shape != want.shape:
                try:
                    got = got.reshape(want.shape)
                except ValueError:
                    raise ParityError(
                        f"output {out_name!r}: served shape {got.shape} != expected {want.shape}"
                    ) from None
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            result.max_abs_error[out_name] = float(diff.max()) if diff.size else 0.0
            bad = diff > atol + rtol * np.abs(want.astype(np.float64))
            if bad.any():
                per_row = diff.reshape(len(rows), -1).max(axis=1)
                worst = int(np.argmax(per_row))
                rel = diff / np.maximum(np.abs(want.astype(np.float64)), np.finfo(np.float64).tiny)
                raise ParityError(
                    f"smoke test of model '{name}' version {version}: output {out_name!r} differs "
                    f"from the source model in {int(bad.reshape(len(rows), -1).any(axis=1).sum())} of "
                    f"{len(rows)} rows; worst row {rows[worst]}; max abs error {float(diff.max()):.3g}, "
                    f"max rel error {float(rel.max()):.3g} (atol {atol}, rtol {rtol})"
                )
        return result

    def load_and_smoke_test(
        self,
        name: str,
        version: int,
        sample: Any,
        expected: Mapping[str, np.ndarray] | None = None,
        *,
        config: Any = None,
        keep_loaded: bool = True,
        timeout_s: float | None = None,
        atol: float = 1e-5,
        rtol: float = 1e-5,
    ) -> tuple[dict, SmokeResult]:
        """Load a version and smoke-test it, removing it again when the test fails.

        :meth:`load` then :meth:`smoke_test`; on a failed smoke test the version is removed
        from the desired set again (the others stay), then the error is raised.

        Returns:
            ``(load_info, smoke_result)``.
        """
        return load_then_smoke(self, name, version, config, keep_loaded=keep_loaded, timeout_s=timeout_s,
                               smoke=lambda: self.smoke_test(name, version, sample, expected, atol=atol, rtol=rtol))


def load_then_smoke(control: Any, name: str, version: int, config: Any, *, keep_loaded: bool,
                    timeout_s: float | None, smoke: Callable[[], T]) -> tuple[dict, T]:
    """Load a version through ``control``, then run its smoke test; a failed test unloads it again.

    The version is removed from the model's desired set after a failed smoke test unless it was
    desired before (then another caller needs it loaded). Used by one server
    (:class:`TritonModelControl`) and by every replica (``TritonReplicaSet``) alike.

    Args:
        control: A model-control client (``load``, ``coordination``, ``coordination_key``).
        name: Triton model name.
        version: The version to load.
        config: The config to load it with (``None``: the repository's).
        keep_loaded: Keep the other loaded versions.
        timeout_s: READY timeout (``None``: the client's).
        smoke: The smoke test; raises on a failed test.

    Returns:
        ``(load_info, what smoke returned)``.

    Raises:
        Whatever the load or the smoke test raised.
    """
    from repository_sync.triton.model_control import desired_versions, reconcile

    was_desired = int(version) in desired_versions(control.coordination, control.coordination_key(name))
    info = control.load(name, version, config, keep_loaded=keep_loaded, timeout_s=timeout_s)
    try:
        return info, smoke()
    except BaseException:
        if not was_desired:
            with _suppress():
                reconcile(control, name, remove=[int(version)])
        raise


class _suppress:
    """Swallow exceptions during best-effort cleanup (the original error is what matters)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], Exception)
