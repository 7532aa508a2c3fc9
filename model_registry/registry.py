"""MLflow model-registry client of tritonflow, returning tritonflow's own frozen dataclasses.

What it does:

* **Resolve** a model reference to one model version: ``models:/<name>@<alias>``,
  ``models:/<name>/<version>``, ``<name>@<alias>``, ``<name>/<version>`` and legacy stages
  (``models:/<name>/Production``). A legacy stage resolves only if exactly one version holds it
  (the API default ``archive_existing_versions=False`` can leave two).
* **Read** the model's MLflow signature and input example (:class:`ModelIO`).
* **Write back** tags and artifacts on the model version, and the publish record
  (:meth:`RegistryClient.record_publish`, ``tritonflow.*`` tags).
* **Promote** by moving the ``champion`` alias in one call (an alias names exactly one version,
  so there are never two champions) and setting ``previous_champion`` on the old champion.
  Promotions of one model are serialised by a :class:`PromotionLock` (default :class:`DatabaseLock`, a
  lease in the shared coordination database) and the champion is re-read
  after the lock is acquired (compare-and-set). Every attempt, successful or not, is written to
  the audit trail: one registered-model tag ``tritonflow.audit.<attempt id>`` per attempt.
* **Roll back** only to the version ``previous_champion`` resolves to; a dangling or missing alias
  stops with a message naming the alias and the version. Never "latest".
* **Delete safely**: never a version holding an alias, in a legacy Production/Staging stage, or
  in the caller's set of deployed/READY versions.

Locking: the default :class:`DatabaseLock` is a lease in the shared coordination database
(:mod:`repository_sync.coordination`), like every other lock that guards what serves. Alternative
for setups without that database: MLflow's REST API offers no compare-and-set on aliases, but it does
offer one atomic test-and-set: ``create_registered_model`` fails with ``RESOURCE_ALREADY_EXISTS``
when the name exists (unique key of the ``registered_models`` table). :class:`RegistryLock` uses
that row as a lock-table entry, so promotions are serialised across Airflow workers on different
hosts with no extra service. A crashed holder leaves its lock model behind; it is never broken
automatically (breaking a lease safely needs a fencing token MLflow cannot check), the error names
the holder and the time it was taken, and :meth:`RegistryLock.force_release` is the operator's
tool.

MLflow's stage API is deprecated since MLflow 2.9 (it still works in 3.17 and warns with
``FutureWarning``); tritonflow uses stages only when asked (``use_stages=True``), always with
``archive_existing_versions=True``, followed by :meth:`RegistryClient.check_production_consistency`.

Heavy imports (``mlflow``) happen inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import re
import socket
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol

from tritonflow.exceptions import (
    ConcurrencyError,
    DataError,
    RegistryError,
    ServiceUnavailableError,
)

# ---------------------------------------------------------------------------- constants
#: Alias of the serving model version.
CHAMPION_ALIAS = "champion"
#: Alias of the version that served before the champion (the rollback target).
PREVIOUS_CHAMPION_ALIAS = "previous_champion"
#: Alias of a candidate version (set by retraining).
CHALLENGER_ALIAS = "challenger"
#: Legacy MLflow stages (deprecated since MLflow 2.9).
LEGACY_STAGES = ("None", "Staging", "Production", "Archived")
#: Prefix of every tag tritonflow writes.
TAG_PREFIX = "tritonflow."
#: Registered-model tag prefix of the promotion audit trail (one tag per attempt).
AUDIT_TAG_PREFIX = "tritonflow.audit."
#: Registered-model tag remembering the previous champion's version number, so that a missing
#: ``previous_champion`` alias can still be reported with the version it last named.
PREVIOUS_CHAMPION_TAG = "tritonflow.previous_champion_version"
#: Experiment holding one "publish" run per model version (artifacts written back by tritonflow).
DEFAULT_PUBLISH_EXPERIMENT = "tritonflow-publish"
#: Seconds a promotion waits for another promotion of the same model before failing.
DEFAULT_LOCK_TIMEOUT_S = 60.0
#: Seconds between two attempts to take a busy lock.
LOCK_POLL_INTERVAL_S = 0.1
#: Name prefix of the registered models :class:`RegistryLock` uses as lock-table rows.
LOCK_MODEL_PREFIX = "tritonflow-lock."
#: Longest model-version tag value MLflow 3.17 accepts (``MAX_MODEL_REGISTRY_TAG_VALUE_LENGTH``).
MAX_TAG_VALUE_LENGTH = 100_000

#: The reference forms :func:`parse_model_reference` accepts (quoted in errors).
ACCEPTED_FORMS = (
    "models:/<name>@<alias>",
    "models:/<name>/<version>",
    "models:/<name>/<stage>",
    "<name>@<alias>",
    "<name>/<version>",
    "<name>/<stage>",
)
_ALIAS_RE = re.compile(r"^[\w\-]+$")
_RESERVED_ALIAS_RE = re.compile(r"^[vV]\d+$")
_TAG_KEY_RE = re.compile(r"^[\w\-./ ]+$")


class _Unchecked:
    """Sentinel type: promotion does not check which version is champion (lock only)."""

    def __repr__(self) -> str:  # pragma: no cover - trivial
        return "UNCHECKED"


#: Pass as ``expected_champion`` to serialise a promotion without a compare-and-set condition.
UNCHECKED = _Unchecked()


# ---------------------------------------------------------------------------- dataclasses
@dataclasses.dataclass(frozen=True)
class ModelReference:
    """A parsed model reference: exactly one of ``version``, ``alias``, ``stage`` is set.

    Attributes:
        name: Registered model name.
        version: Version number, or None.
        alias: Alias name, or None.
        stage: Legacy stage (canonical capitalisation), or None.
        raw: The string that was parsed.
    """

    name: str
    version: int | None = None
    alias: str | None = None
    stage: str | None = None
    raw: str = ""

    @property
    def uri(self) -> str:
        """Canonical ``models:/`` URI of this reference."""
        if self.alias is not None:
            return f"models:/{self.name}@{self.alias}"
        return f"models:/{self.name}/{self.version if self.version is not None else self.stage}"


@dataclasses.dataclass(frozen=True)
class ModelVersionRef:
    """One MLflow model version, as read from the registry (immutable snapshot).

    Attributes:
        name: Registered model name.
        version: Version number (MLflow sends it as a string; here it is an int).
        run_id: Run that produced the model, or None.
        source: Source URI recorded at registration (``models:/m-...`` for MLflow 3 logged models).
        aliases: Aliases held by this version, sorted.
        tags: Model-version tags (a snapshot; changing it changes nothing in MLflow).
        stage: Legacy stage (``"None"`` when unused).
        status: MLflow registration status (``READY``, ``PENDING_REGISTRATION``, ...).
        description: Free-text description.
        model_id: MLflow 3 logged-model id, when MLflow reports it.
        created_ms: Creation time, milliseconds since the Unix epoch.
        updated_ms: Last update time, milliseconds since the Unix epoch.
    """

    name: str
    version: int
    run_id: str | None
    source: str
    aliases: tuple[str, ...] = ()
    tags: Mapping[str, str] = dataclasses.field(
        default_factory=dict, hash=False
    )
    stage: str = "None"
    status: str = "READY"
    description: str = ""
    model_id: str | None = None
    created_ms: int | None = None
    updated_ms: int | None = None

    @property
    def uri(self) -> str:
        """``models:/<name>/<version>``: the immutable reference to this version."""
        return f"models:/{self.name}/{self.version}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (small enough for an Airflow XCom)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["tags"] = dict(self.tags)
        d["aliases"] = list(self.aliases)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelVersionRef":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["tags"] = dict(d.get("tags") or {})
        d["aliases"] = tuple(d.get("aliases") or ())
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One input or output of a model signature.

    Attributes:
        name: Column or tensor name (None for an unnamed tensor spec).
        dtype: NumPy dtype name (``float64``, ``int64``, ``object`` for strings/bytes).
        shape: Shape with -1 for variable dims. A column-based input is a 1-D batch: ``(-1,)``.
        optional: True when the signature marks the column optional.
    """

    name: str | None
    dtype: str
    shape: tuple[int, ...]
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class ModelIO:
    """Inputs, outputs and input example of a model version, from its MLflow signature.

    Attributes:
        inputs: Input columns/tensors in signature order.
        outputs: Output columns/tensors (empty when the signature has no outputs).
        input_kind: ``"columns"`` (a column-based schema, e.g. a DataFrame) or ``"tensors"``.
        output_kind: Same for outputs (``"none"`` when the signature has no outputs).
        has_signature: False when the model was logged without a signature.
        input_example: The logged input example (``pandas.DataFrame``, ``numpy.ndarray`` or
            a dict of arrays), or None. Excluded from equality.
    """

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    input_kind: str
    output_kind: str
    has_signature: bool = True
    input_example: Any = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    @property
    def input_names(self) -> tuple[str | None, ...]:
        """Input names in order."""
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str | None, ...]:
        """Output names in order."""
        return tuple(t.name for t in self.outputs)


@dataclasses.dataclass(frozen=True)
class PublishRecord:
    """What a publish delivered, recorded on the model version.

    Attributes:
        repository_uri: Triton model repository (folder or ``s3://...``).
        triton_model_name: Model name in the repository.
        triton_model_version: Numeric version folder in the repository.
        signature_digest: Digest of the model-signing signature (e.g. ``sha256:...``).
        signature_key_id: Id of the signing key (never the key itself).
        parity_errors: Per output: e.g. ``{"max_abs": 1e-7, "max_rel": 2e-6, "label_agreement": 1.0}``.
        config_summary: Chosen ``config.pbtxt`` summary (max batch size, instances, kind, ...).
        timings_s: Seconds per publish stage (``{"convert": 1.2, "push": 0.3, ...}``).
    """

    repository_uri: str
    triton_model_name: str
    triton_model_version: int
    signature_digest: str
    signature_key_id: str
    parity_errors: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    config_summary: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    timings_s: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PromotionResult:
    """Outcome of :meth:`RegistryClient.promote` or :meth:`RegistryClient.rollback`.

    Attributes:
        name: Registered model name.
        champion: Version that holds ``champion`` afterwards.
        previous_champion: Version that holds ``previous_champion`` afterwards (None if none).
        changed: False when the requested version already was champion.
        attempt_id: Key suffix of this attempt's audit tag.
    """

    name: str
    champion: int
    previous_champion: int | None
    changed: bool
    attempt_id: str


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    """One promotion/rollback/delete attempt from the audit trail.

    Attributes:
        attempt_id: ``<unix ns>-<random>``; sorts by start time.
        action: ``promote``, ``rollback`` or ``delete``.
        outcome: ``pending``, ``promoted``, ``unchanged``, ``conflict``, ``lock_timeout``,
            ``rolled_back``, ``deleted``, ``refused`` or ``failed``.
        record: The full JSON record.
    """

    attempt_id: str
    action: str
    outcome: str
    record: Mapping[str, Any] = dataclasses.field(hash=False)


@dataclasses.dataclass(frozen=True)
class GcPlan:
    """Which versions of a model a garbage collection would delete, and why the rest stay.

    Attributes:
        name: Registered model name.
        delete: Versions safe to delete, ascending.
        keep: Version -> reason it is kept (alias, deployed, stage, newest).
    """

    name: str
    delete: tuple[int, ...]
    keep: Mapping[int, str] = dataclasses.field(hash=False)


# ---------------------------------------------------------------------------- parsing
def _accepted() -> str:
    return ", ".join(ACCEPTED_FORMS)


def parse_model_reference(ref: str) -> ModelReference:
    """Parse a model reference string.

    Accepted forms: ``models:/<name>@<alias>``, ``models:/<name>/<version>``,
    ``models:/<name>/<stage>``, and the same without ``models:/``. Stages are matched
    case-insensitively against :data:`LEGACY_STAGES`. ``latest`` is refused: tritonflow always
    publishes an explicit version or alias so that a run is reproducible.

    Args:
        ref: The reference, e.g. ``"models:/churn@champion"`` or ``"churn/3"``.

    Returns:
        The parsed :class:`ModelReference`.

    Raises:
        RegistryError: The string matches no accepted form; the message names the string and
            lists the accepted forms.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise RegistryError(f"model reference {ref!r} is empty; expected one of: {_accepted()}")
    raw = ref
    body = ref.strip()
    if body.startswith("models:/"):
        body = body[len("models:/"):]
    elif "://" in body or body.startswith(("runs:", "models:")):
        raise RegistryError(
            f"model reference {raw!r} has an unsupported scheme; expected one of: {_accepted()}"
        )

    def bad(why: str) -> RegistryError:
        return RegistryError(f"model reference {raw!r}: {why}; expected one of: {_accepted()}")

    if "@" in body:
        name, _, alias = body.partition("@")
        if not name or "/" in name or ":" in name:
            raise bad(f"model name {name!r} is empty or contains '/' or ':'")
        if not alias or not _ALIAS_RE.match(alias) or "@" in alias:
            raise bad(f"alias {alias!r} must be letters, digits, '_' or '-'")
        if alias.lower() == "latest" or _RESERVED_ALIAS_RE.match(alias):
            raise bad(f"alias {alias!r} is reserved by MLflow; name an explicit alias")
        return ModelReference(name=name, alias=alias, raw=raw)
    parts = body.split("/")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise bad("no version, alias or stage given")
    name, sel = parts
    if ":" in name:
        raise bad(f"model name {name!r} contains ':'")
    if sel.isdigit():
        version = int(sel)
        if version < 1:
            raise bad(f"version {sel!r} must be a positive integer")
        return ModelReference(name=name, version=version, raw=raw)
    stages = {s.lower(): s for s in LEGACY_STAGES}
    if sel.lower() in stages and sel.lower() != "none":
        return ModelReference(name=name, stage=stages[sel.lower()], raw=raw)
    if sel.lower() == "latest":
        raise bad("'latest' is refused: name an explicit version or alias")
    raise bad(f"{sel!r} is neither a version number nor a stage ({', '.join(LEGACY_STAGES[1:])})")


def _as_version(version: int | str, what: str = "version") -> int:
    try:
        v = int(str(version).strip())
    except (TypeError, ValueError):
        raise RegistryError(f"{what}={version!r} is not a model version number (expected an int >= 1)") from None
    if v < 1:
        raise RegistryError(f"{what}={version!r} is not a model version number (expected an int >= 1)")
    return v


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _error_code(exc: BaseException) -> str:
    return str(getattr(exc, "error_code", "") or "")


def _is_not_found(exc: BaseException) -> bool:
    code = _error_code(exc)
    if code == "RESOURCE_DOES_NOT_EXIST":
        return True
    # MLflow 3.17 reports an unknown alias as INVALID_PARAMETER_VALUE "... alias X not found".
    return code == "INVALID_PARAMETER_VALUE" and "not found" in str(exc).lower()


_TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED"}


def _translate(exc: BaseException, what: str) -> Exception:
    """Map an MLflow exception to tritonflow's hierarchy (message names the operation)."""
    if isinstance(exc, (DataError, ServiceUnavailableError, ConcurrencyError)):
        return exc
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if _error_code(exc) in _TRANSIENT_CODES or isinstance(exc, (ConnectionError, OSError)):
        return ServiceUnavailableError(f"{what}: MLflow did not answer ({msg})")
    if "Max retries exceeded" in msg or "Connection refused" in msg or "API request to" in msg:
        return ServiceUnavailableError(f"{what}: MLflow did not answer ({msg})")
    return RegistryError(f"{what}: {msg}")


# ---------------------------------------------------------------------------- locks
class PromotionLock(Protocol):
    """Serialises registry changes (promotion, rollback, deletion) of one registered model."""

    def hold(self, name: str, timeout_s: float) -> contextlib.AbstractContextManager[None]:
        """Context manager holding the lock of model ``name``.

        Raises:
            ConcurrencyError: Not acquired within ``timeout_s`` seconds; names the holder.
        """
        ...


def _holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class DatabaseLock:
    """Lease of purpose ``alias`` in the shared coordination database (the default lock).

    Serialises alias moves of one model across processes and hosts (PostgreSQL in production); a
    crashed holder's lease expires after ``lease_ttl_s`` (see :mod:`repository_sync.coordination`).
    Distinct from the ``promotion`` lease a canary holds around the whole promotion, so a canary
    may promote inside it.

    Args:
        store: A ``CoordinationStore``, its URL, or ``None`` for the one the settings name.
    """

    PURPOSE = "alias"

    def __init__(self, store: Any = None) -> None:
        self._store = store

    def store(self) -> Any:
        """The coordination store used."""
        from repository_sync.coordination import CoordinationStore, coordination_store

        if self._store is None:
            self._store = coordination_store()
        elif not isinstance(self._store, CoordinationStore):
            self._store = CoordinationStore(str(self._store))
        return self._store

    @contextlib.contextmanager
    def hold(self, name: str, timeout_s: float) -> Iterator[None]:
        """Hold the lock of ``name``; see :meth:`PromotionLock.hold`."""
        with self.store().hold(self.PURPOSE, name, holder=_holder_id(), timeout_s=timeout_s,
                               what=f"alias move (promotion) of model {name!r}"):
            yield


class RegistryLock:
    """Lock-table lock kept in the MLflow registry itself (see the module docstring).

    Taking the lock creates registered model ``tritonflow-lock.<name>``; MLflow refuses a second
    creation with ``RESOURCE_ALREADY_EXISTS`` (unique key), which makes it an atomic test-and-set
    shared by every worker that reaches the tracking server. Releasing deletes it.

    Args:
        client: An ``mlflow.MlflowClient``.
    """

    def __init__(self, client: Any) -> None:
        self.client = client

    @staticmethod
    def lock_name(name: str) -> str:
        """Registered-model name used as the lock row of model ``name``."""
        return LOCK_MODEL_PREFIX + name

    def _holder(self, name: str) -> str:
        try:
            rm = self.client.get_registered_model(self.lock_name(name))
        except Exception:
            return "unknown (lock released meanwhile)"
        tags = dict(rm.tags or {})
        return f"{tags.get('tritonflow.lock.holder', 'unknown')} since {tags.get('tritonflow.lock.since', '?')}"

    @contextlib.contextmanager
    def hold(self, name: str, timeout_s: float) -> Iterator[None]:
        """Hold the lock of ``name``; see :meth:`PromotionLock.hold`."""
        lock = self.lock_name(name)
        holder = _holder_id()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.create_registered_model(
                    lock,
                    tags={"tritonflow.lock.holder": holder, "tritonflow.lock.since": _now_iso()},
                    description=f"tritonflow promotion lock of {name!r}; deleted on release.",
                )
                break
            except Exception as exc:  # noqa: BLE001 - classify below
                if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise _translate(exc, f"taking promotion lock {lock!r}") from exc
                if time.monotonic() >= deadline:
                    raise ConcurrencyError(
                        f"model {name!r}: another promotion holds registry lock {lock!r} "
                        f"({self._holder(name)}); waited {timeout_s:.1f} s. If that holder "
                        f"crashed, release it with RegistryLock.force_release({name!r})"
                    ) from None
                time.sleep(LOCK_POLL_INTERVAL_S)
        try:
            yield
        finally:
            try:
                self.client.delete_registered_model(lock)
            except Exception as exc:  # noqa: BLE001
                raise _translate(exc, f"releasing promotion lock {lock!r}") from exc

    def force_release(self, name: str) -> bool:
        """Delete a stale lock of ``name`` (operator action). Returns True if one existed."""
        try:
            self.client.delete_registered_model(self.lock_name(name))
            return True
        except Exception as exc:  # noqa: BLE001
            if _is_not_found(exc):
                return False
            raise _translate(exc, f"releasing promotion lock of {name!r}") from exc


# ---------------------------------------------------------------------------- the client
class RegistryClient:
    """tritonflow's MLflow registry client (``mlflow.MlflowClient`` inside).

    Args:
        tracking_uri: MLflow tracking URI (default: MLflow's own resolution, i.e.
            ``MLFLOW_TRACKING_URI``). Settings give it as ``Settings.resolved_mlflow_tracking_uri``.
        registry_uri: Registry URI (default: the tracking URI).
        lock: How promotions are serialised (default :class:`DatabaseLock`: the shared database).
        lock_timeout_s: Seconds to wait for another promotion of the same model.
        publish_experiment: Experiment of the per-version publish runs that hold artifacts.
        actor: Who acts (recorded in the audit trail); default ``<host>:<pid>``.
        client: An existing ``MlflowClient`` to use instead of building one.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        registry_uri: str | None = None,
        *,
        lock: PromotionLock | None = None,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        publish_experiment: str = DEFAULT_PUBLISH_EXPERIMENT,
        actor: str | None = None,
        client: Any = None,
    ) -> None:
        if client is None:
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)
        self.client = client
        self.tracking_uri = tracking_uri or client.tracking_uri
        self.lock: PromotionLock = lock if lock is not None else DatabaseLock()
        self.lock_timeout_s = float(lock_timeout_s)
        self.publish_experiment = publish_experiment
        self.actor = actor or f"{socket.gethostname()}:{os.getpid()}"

    # ------------------------------------------------------------------ reading
    def _to_ref(self, mv: Any) -> ModelVersionRef:
        return ModelVersionRef(
            name=mv.name,
            version=int(mv.version),
            run_id=mv.run_id or None,
            source=mv.source or "",
            aliases=tuple(sorted(mv.aliases or ())),
            tags=dict(mv.tags or {}),
            stage=mv.current_stage or "None",
            status=str(mv.status or ""),
            description=mv.description or "",
            model_id=getattr(mv, "model_id", None),
            created_ms=mv.creation_timestamp,
            updated_ms=mv.last_updated_timestamp,
        )

    def get_version(self, name: str, version: int | str) -> ModelVersionRef:
        """Read one model version.

        Raises:
            RegistryError: The model or version does not exist (message names both).
            ServiceUnavailableError: MLflow did not answer.
        """
        v = _as_version(version)
        try:
            return self._to_ref(self.client.get_model_version(name, str(v)))
        except Exception as exc:  # noqa: BLE001
            if _is_not_found(exc):
                raise RegistryError(f"model {name!r} has no version {v} (deleted or never registered)") from None
            raise _translate(exc, f"reading model {name!r} version {v}") from exc

    def aliases(self, name: str) -> dict[str, int]:
        """Alias -> version of registered model ``name`` (as MLflow stores them).

        Raises:
            RegistryError: The registered model does not exist.
        """
        try:
            rm = self.client.get_registered_model(name)
        except Exception as exc:  # noqa: BLE001
            if _is_not_found(exc):
                raise RegistryError(f"registered model {name!r} does not exist") from None
            raise _translate(exc, f"reading registered model {name!r}") from exc
        return {a: int(v) for a, v in (rm.aliases or {}).items()}

    def resolve_alias(self, name: str, alias: str) -> ModelVersionRef:
        """The version alias ``alias`` of model ``name`` names.

        Raises:
            RegistryError: The alias is not set, or names a version that no longer exists
                (a dangling alias); the message names the alias and the version.
        """
        known = self.aliases(name)
        if alias not in known:
            raise RegistryError(f"model {name!r} has no alias {alias!r} (aliases: {sorted(known) or 'none'})")
        try:
            return self.get_version(name, known[alias])
        except RegistryError:
            raise RegistryError(
                f"alias {alias!r} of model {name!r} points to version {known[alias]}, which no "
                f"longer exists (dangling alias)"
            ) from None

    def versions(self, name: str) -> list[ModelVersionRef]:
        """All versions of model ``name``, ascending by version number, with their aliases."""
        try:
            mvs = self.client.search_model_versions(f"name='{_quote(name)}'")
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"listing versions of model {name!r}") from exc
        # search_model_versions does not fill in aliases: take them from the registered model.
        by_version: dict[int, list[str]] = {}
        for alias, v in (self.aliases(name) if mvs else {}).items():
            by_version.setdefault(v, []).append(alias)
        refs = (dataclasses.replace(r, aliases=tuple(sorted(by_version.get(r.version, ()))))
                for r in (self._to_ref(mv) for mv in mvs))
        return sorted(refs, key=lambda r: r.version)

    def resolve(self, reference: str | ModelReference) -> ModelVersionRef:
        """Resolve a model reference (see :func:`parse_model_reference`) to one model version.

        A legacy stage resolves only when exactly one version holds it.

        Raises:
            RegistryError: Bad reference (names it and the accepted forms), unknown model,
                version or alias, or a stage held by 0 or several versions.
        """
        ref = reference if isinstance(reference, ModelReference) else parse_model_reference(reference)
        if ref.version is not None:
            return self.get_version(ref.name, ref.version)
        if ref.alias is not None:
            return self.resolve_alias(ref.name, ref.alias)
        return self._single_in_stage(ref.name, ref.stage or "Production")

    def _single_in_stage(self, name: str, stage: str, expected: int | None = None) -> ModelVersionRef:
        holders = [r for r in self.versions(name) if r.stage == stage]
        if len(holders) != 1:
            found = ", ".join(str(r.version) for r in holders) or "none"
            raise RegistryError(
                f"model {name!r} must have exactly one version in stage {stage!r}, found "
                f"{len(holders)} (versions: {found}); fix with promote(..., use_stages=True), "
                f"which archives the others"
            )
        if expected is not None and holders[0].version != expected:
            raise RegistryError(
                f"model {name!r}: stage {stage!r} holds version {holders[0].version}, expected {expected}"
            )
        return holders[0]

    def check_production_consistency(self, name: str, expected_version: int | None = None) -> ModelVersionRef:
        """Fail loudly unless exactly one version of ``name`` is in legacy stage Production.

        Args:
            name: Registered model name.
            expected_version: When given, that version must be the one in Production.

        Returns:
            The single Production version.

        Raises:
            RegistryError: 0 or more than 1 Production versions (names them), or not the
                expected one. Source of the rule: mlflow/mlflow#6414, #3016.
        """
        return self._single_in_stage(name, "Production", expected_version)

    def champion(self, name: str) -> ModelVersionRef | None:
        """The version holding ``champion``, or None when no alias is set.

        Raises:
            RegistryError: The alias dangles (names alias and version).
        """
        if CHAMPION_ALIAS not in self.aliases(name):
            return None
        return self.resolve_alias(name, CHAMPION_ALIAS)

    def model_io(self, reference: str | ModelVersionRef, *, require_signature: bool = True) -> ModelIO:
        """Read a model version's MLflow signature and input example.

        Only ``MLmodel`` and the input-example file are downloaded, from the version's storage
        location (``MlflowClient.get_model_version_download_uri``).

        Args:
            reference: A :class:`ModelVersionRef` or any reference :meth:`resolve` accepts.
            require_signature: Raise when the model has no signature (default). Pass False when
                the caller brings its own schema; the result then has ``has_signature=False``.

        Returns:
            :class:`ModelIO` (column inputs get shape ``(-1,)``, tensor specs keep theirs).

        Raises:
            RegistryError: No signature while required, or MLmodel cannot be read.
        """
        import mlflow
        from mlflow.models import Model

        ref = reference if isinstance(reference, ModelVersionRef) else self.resolve(reference)
        try:
            location = self.client.get_model_version_download_uri(ref.name, str(ref.version))
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"locating artifacts of {ref.uri}") from exc
        with tempfile.TemporaryDirectory(prefix="tritonflow-mlmodel-") as tmp:
            try:
                mlflow.artifacts.download_artifacts(
                    artifact_uri=f"{location.rstrip('/')}/MLmodel", dst_path=tmp, tracking_uri=self.tracking_uri
                )
                model = Model.load(os.path.join(tmp, "MLmodel"))
            except Exception as exc:  # noqa: BLE001
                raise _translate(exc, f"reading MLmodel of {ref.uri} at {location}") from exc
            signature = model.signature
            if signature is None:
                if require_signature:
                    raise RegistryError(
                        f"{ref.uri} was logged without a signature; log it with "
                        f"signature=mlflow.models.infer_signature(X, model.predict(X)) or pass an "
                        f"explicit input/output schema"
                    )
                return ModelIO((), (), "none", "none", has_signature=False,
                               input_example=self._load_example(model, location, tmp, ref))
            example = self._load_example(model, location, tmp, ref)
        inputs, in_kind = _schema_to_tensors(signature.inputs)
        outputs, out_kind = _schema_to_tensors(signature.outputs)
        return ModelIO(inputs, outputs, in_kind, out_kind, True, example)

    def _load_example(self, model: Any, location: str, tmp: str, ref: ModelVersionRef) -> Any:
        import mlflow

        info = model.saved_input_example_info
        if not info:
            return None
        try:
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"{location.rstrip('/')}/{info['artifact_path']}", dst_path=tmp,
                tracking_uri=self.tracking_uri,
            )
            return model.load_input_example(tmp)
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"reading the input example of {ref.uri}") from exc

    # ------------------------------------------------------------------ writing
    def set_version_tags(self, ref: ModelVersionRef, tags: Mapping[str, Any]) -> dict[str, str]:
        """Set tags on a model version; non-string values are written as JSON.

        Returns:
            The tags as written (key -> string value).

        Raises:
            RegistryError: A key is invalid or a value longer than :data:`MAX_TAG_VALUE_LENGTH`
                (names the key and the length).
        """
        written: dict[str, str] = {}
        for key, value in tags.items():
            if not isinstance(key, str) or not _TAG_KEY_RE.match(key) or len(key) > 250:
                raise RegistryError(f"tag key {key!r} must be 1-250 of letters, digits, '_-./ '")
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
            if len(text) > MAX_TAG_VALUE_LENGTH:
                raise RegistryError(
                    f"tag {key!r} of {ref.uri}: value is {len(text)} characters, MLflow accepts at "
                    f"most {MAX_TAG_VALUE_LENGTH}; log it as an artifact instead"
                )
            written[key] = text
        for key, text in written.items():
            try:
                self.client.set_model_version_tag(ref.name, str(ref.version), key, text)
            except Exception as exc:  # noqa: BLE001
                raise _translate(exc, f"setting tag {key!r} on {ref.uri}") from exc
        if any(key.startswith("tritonflow.") for key in written):
            self.refresh_description(ref)
        return written

    def refresh_description(self, ref: ModelVersionRef) -> str:
        """Rewrite the version's MLflow description from its tags and aliases (plain sentences).

        Called after every ``tritonflow.*`` tag write, so the version page in the MLflow UI always
        says what the tags say (:func:`model_registry.description.version_description`).

        Returns:
            The description written.

        Raises:
            RegistryError: MLflow refused the read or the update.
        """
        from model_registry.description import version_description

        try:
            mv = self.client.get_model_version(ref.name, str(ref.version))
            text = version_description(dict(mv.tags or {}), list(getattr(mv, "aliases", None) or []))
            if (mv.description or "") != text:
                self.client.update_model_version(ref.name, str(ref.version), description=text)
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"updating the description of {ref.uri}") from exc
        return text

    def publish_run_id(self, ref: ModelVersionRef) -> str:
        """Id of the publish run of ``ref`` in :attr:`publish_experiment` (created if missing).

        The run is tagged ``tritonflow.model_name`` / ``tritonflow.model_version`` so the same run
        is found again; it keeps the training run untouched.
        """
        try:
            exp = self.client.get_experiment_by_name(self.publish_experiment)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(self.publish_experiment)
        except Exception as exc:  # noqa: BLE001
            if _error_code(exc) == "RESOURCE_ALREADY_EXISTS":
                exp_id = self.client.get_experiment_by_name(self.publish_experiment).experiment_id
            else:
                raise _translate(exc, f"opening experiment {self.publish_experiment!r}") from exc
        filt = (f"tags.`tritonflow.model_name` = '{_quote(ref.name)}' and "
                f"tags.`tritonflow.model_version` = '{ref.version}'")
        try:
            runs = self.client.search_runs([exp_id], filter_string=filt, max_results=1,
                                           order_by=["attributes.start_time ASC"])
            if runs:
                return runs[0].info.run_id
            run = self.client.create_run(
                exp_id, run_name=f"{ref.name}-v{ref.version}-publish",
                tags={"tritonflow.model_name": ref.name, "tritonflow.model_version": str(ref.version),
                      "tritonflow.model_uri": ref.uri},
            )
            self.client.set_terminated(run.info.run_id)
            return run.info.run_id
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"creating the publish run of {ref.uri}") from exc

    def log_version_artifact(self, ref: ModelVersionRef, local_path: str | os.PathLike[str],
                             artifact_path: str | None = None) -> str:
        """Log a file or folder against a model version and tag the version with its URI.

        The artifact goes to the version's publish run (:meth:`publish_run_id`); the version gets
        tag ``tritonflow.artifact.<artifact_path>/<file name>`` = full artifact URI and
        ``tritonflow.publish_run_id``.

        Returns:
            The artifact URI.

        Raises:
            DataError: ``local_path`` does not exist.
        """
        p = Path(local_path)
        if not p.exists():
            raise DataError(f"local_path={str(p)!r} does not exist (expected a file or folder to log)")
        run_id = self.publish_run_id(ref)
        try:
            if p.is_dir():
                self.client.log_artifacts(run_id, str(p), artifact_path)
            else:
                self.client.log_artifact(run_id, str(p), artifact_path)
            base = self.client.get_run(run_id).info.artifact_uri.rstrip("/")
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"logging {p} for {ref.uri}") from exc
        rel = "/".join(x for x in (artifact_path, p.name) if x)
        uri = f"{base}/{rel}"
        key = "tritonflow.artifact." + re.sub(r"[^\w\-./ ]", "_", rel)[:200]
        self.set_version_tags(ref, {key: uri, "tritonflow.publish_run_id": run_id})
        return uri

    def record_publish(self, ref: ModelVersionRef, record: PublishRecord) -> dict[str, str]:
        """Write a publish record on the model version as ``tritonflow.*`` tags.

        Tags: ``repository_uri``, ``triton_model_name``, ``triton_model_version``,
        ``signature_digest``, ``signature_key_id``, ``parity_errors`` (JSON), ``config_summary``
        (JSON), ``timings_s`` (JSON), ``published_at`` (ISO-8601 UTC), ``status`` = ``published``.

        Returns:
            The tags written.

        Raises:
            RegistryError: A field is empty or the Triton version is not a positive int.
        """
        for field in ("repository_uri", "triton_model_name", "signature_digest", "signature_key_id"):
            if not str(getattr(record, field) or "").strip():
                raise RegistryError(f"PublishRecord.{field} is empty (expected a non-empty string)")
        tv = _as_version(record.triton_model_version, "PublishRecord.triton_model_version")
        tags = {
            "tritonflow.repository_uri": record.repository_uri,
            "tritonflow.triton_model_name": record.triton_model_name,
            "tritonflow.triton_model_version": str(tv),
            "tritonflow.signature_digest": record.signature_digest,
            "tritonflow.signature_key_id": record.signature_key_id,
            "tritonflow.parity_errors": {k: dict(v) for k, v in record.parity_errors.items()},
            "tritonflow.config_summary": dict(record.config_summary),
            "tritonflow.timings_s": {k: round(float(v), 6) for k, v in record.timings_s.items()},
            "tritonflow.published_at": _now_iso(),
            "tritonflow.status": "published",
        }
        return self.set_version_tags(ref, tags)

    def record_rejection(self, ref: ModelVersionRef, reason: str, stage: str) -> dict[str, str]:
        """Tag a model version as rejected by the publish pipeline."""
        return self.set_version_tags(ref, {
            "tritonflow.status": "rejected",
            "tritonflow.rejected_stage": stage,
            "tritonflow.rejection_reason": reason[:MAX_TAG_VALUE_LENGTH],
            "tritonflow.rejected_at": _now_iso(),
        })

    # ------------------------------------------------------------------ audit trail
    def _audit(self, name: str, attempt_id: str, record: Mapping[str, Any]) -> None:
        try:
            self.client.set_registered_model_tag(
                name, AUDIT_TAG_PREFIX + attempt_id, json.dumps(record, sort_keys=True, default=str)
            )
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"writing audit record {attempt_id} of model {name!r}") from exc

    def audit_log(self, name: str) -> list[AuditEntry]:
        """Every promotion/rollback/delete attempt recorded for model ``name``, oldest first."""
        try:
            tags = dict(self.client.get_registered_model(name).tags or {})
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"reading the audit trail of model {name!r}") from exc
        out = []
        for key, value in tags.items():
            if key.startswith(AUDIT_TAG_PREFIX):
                rec = json.loads(value)
                out.append(AuditEntry(key[len(AUDIT_TAG_PREFIX):], rec.get("action", ""),
                                      rec.get("outcome", ""), rec))
        return sorted(out, key=lambda e: (int(e.attempt_id.split("-")[0]), e.attempt_id))

    @contextlib.contextmanager
    def _attempt(self, name: str, action: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Audit one attempt: written as ``pending`` first, then with its outcome."""
        attempt_id = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"
        rec: dict[str, Any] = {"attempt_id": attempt_id, "action": action, "actor": self.actor,
                               "started_at": _now_iso(), "outcome": "pending", **fields}
        self._audit(name, attempt_id, rec)
        try:
            yield rec
        except ConcurrencyError as exc:
            if rec["outcome"] == "pending":
                rec["outcome"] = "lock_timeout"
            rec["error"] = str(exc)
            raise
        except Exception as exc:
            if rec["outcome"] == "pending":
                rec["outcome"] = "refused" if isinstance(exc, DataError) else "failed"
            rec["error"] = str(exc)
            raise
        finally:
            rec["finished_at"] = _now_iso()
            self._audit(name, attempt_id, rec)

    # ------------------------------------------------------------------ promotion
    def _set_alias(self, name: str, alias: str, version: int) -> None:
        try:
            self.client.set_registered_model_alias(name, alias, str(version))
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"setting alias {alias!r} of model {name!r} to version {version}") from exc

    def _transition_production(self, name: str, version: int) -> None:
        with warnings.catch_warnings():
            # Stages are deprecated since MLflow 2.9 (FutureWarning); used only on request.
            warnings.simplefilter("ignore", FutureWarning)
            try:
                self.client.transition_model_version_stage(
                    name, str(version), "Production", archive_existing_versions=True
                )
            except Exception as exc:  # noqa: BLE001
                raise _translate(exc, f"moving model {name!r} version {version} to stage Production") from exc

    def promote(self, name: str, version: int | str, *, expected_champion: int | None | _Unchecked = UNCHECKED,
                use_stages: bool = False, reason: str = "") -> PromotionResult:
        """Make ``version`` the champion of model ``name``.

        Under the model's :class:`PromotionLock`, the champion is re-read (compare-and-set),
        ``previous_champion`` is moved to the old champion, then ``champion`` is moved to
        ``version`` in one call; the version numbers are also kept in registered-model tag
        :data:`PREVIOUS_CHAMPION_TAG`. With ``use_stages`` the version also goes to Production
        with ``archive_existing_versions=True`` and exactly one Production version is checked.
        The attempt is recorded in the audit trail whatever happens.

        Args:
            name: Registered model name.
            version: Version to promote (must exist and be READY).
            expected_champion: The champion the caller decided against (e.g. the one a canary
                compared with; None = "no champion yet"). If another promotion changed it in the
                meantime, this one fails instead of overwriting. :data:`UNCHECKED` skips the check.
            use_stages: Also maintain the legacy Production/Archived stages.
            reason: Free text for the audit trail.

        Returns:
            :class:`PromotionResult`.

        Raises:
            ConcurrencyError: The lock was not acquired in time, or the champion is no longer
                ``expected_champion`` (names both versions).
            RegistryError: The version does not exist or is not READY, or the stage check failed.
        """
        v = _as_version(version)
        exp = None if isinstance(expected_champion, _Unchecked) else expected_champion
        with self._attempt(name, "promote", requested_version=v, reason=reason, use_stages=use_stages,
                           expected_champion="unchecked" if isinstance(expected_champion, _Unchecked) else exp) as rec:
            with self.lock.hold(name, self.lock_timeout_s):
                rec["lock_acquired_at"] = _now_iso()
                target = self.get_version(name, v)
                if target.status != "READY":
                    raise RegistryError(f"model {name!r} version {v} has status {target.status!r}, expected 'READY'")
                aliases = self.aliases(name)  # re-read under the lock: compare-and-set
                current = aliases.get(CHAMPION_ALIAS)
                rec["observed_champion"] = current
                if not isinstance(expected_champion, _Unchecked) and current != exp:
                    rec["outcome"] = "conflict"
                    raise ConcurrencyError(
                        f"model {name!r}: champion is version {current}, not the expected version "
                        f"{exp}; another promotion ran meanwhile, so version {v} was not promoted"
                    )
                previous = aliases.get(PREVIOUS_CHAMPION_ALIAS)
                changed = current != v
                if changed:
                    if current is not None:
                        self._set_alias(name, PREVIOUS_CHAMPION_ALIAS, current)
                        self.client.set_registered_model_tag(name, PREVIOUS_CHAMPION_TAG, str(current))
                        previous = current
                    self._set_alias(name, CHAMPION_ALIAS, v)  # one step: the alias moves
                    now = _now_iso()
                    self.set_version_tags(target, {"tritonflow.promoted_at": now,
                                                   "tritonflow.promotion_attempt": rec["attempt_id"],
                                                   "tritonflow.replaced_version": str(current or "")})
                    if current is not None:
                        with contextlib.suppress(RegistryError):
                            self.set_version_tags(self.get_version(name, current), {"tritonflow.demoted_at": now})
                if use_stages:
                    self._transition_production(name, v)
                    self.check_production_consistency(name, expected_version=v)
                rec["outcome"] = "promoted" if changed else "unchanged"
                rec["champion"], rec["previous_champion"] = v, previous
        return PromotionResult(name, v, previous, changed, rec["attempt_id"])

    def rollback_target(self, name: str) -> ModelVersionRef:
        """The version ``previous_champion`` names: the only rollback target.

        Never falls back to "latest" or any other version.

        Raises:
            RegistryError: The alias is not set, or names a deleted version; the message names the
                alias and the version it (last) named, from the alias or from tag
                :data:`PREVIOUS_CHAMPION_TAG`.
        """
        known = self.aliases(name)
        if PREVIOUS_CHAMPION_ALIAS in known:
            v = known[PREVIOUS_CHAMPION_ALIAS]
            try:
                ref = self.get_version(name, v)
            except RegistryError:
                raise RegistryError(
                    f"rollback of model {name!r} stopped: alias {PREVIOUS_CHAMPION_ALIAS!r} points to "
                    f"version {v}, which no longer exists; not falling back to another version. "
                    f"Choose an explicit version and promote it."
                ) from None
            if ref.status != "READY":
                raise RegistryError(
                    f"rollback of model {name!r} stopped: alias {PREVIOUS_CHAMPION_ALIAS!r} names version "
                    f"{v} with status {ref.status!r}, expected 'READY'"
                )
            return ref
        try:
            recorded = dict(self.client.get_registered_model(name).tags or {}).get(PREVIOUS_CHAMPION_TAG)
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"reading registered model {name!r}") from exc
        if recorded:
            exists = True
            try:
                self.get_version(name, recorded)
            except RegistryError:
                exists = False
            state = "was deleted" if not exists else "still exists but no longer holds the alias"
            raise RegistryError(
                f"rollback of model {name!r} stopped: alias {PREVIOUS_CHAMPION_ALIAS!r} cannot be "
                f"resolved; it last named version {recorded}, which {state}. Not falling back to "
                f"another version: promote an explicit version instead."
            )
        raise RegistryError(
            f"rollback of model {name!r} stopped: alias {PREVIOUS_CHAMPION_ALIAS!r} is not set and no "
            f"previous champion was recorded; not falling back to another version."
        )

    def rollback(self, name: str, *, use_stages: bool = False, reason: str = "") -> PromotionResult:
        """Move ``champion`` back to the :meth:`rollback_target` (under the lock, audited).

        The rolled-back version is tagged ``tritonflow.rolled_back_at``; ``previous_champion`` is
        removed so that a second rollback stops instead of re-promoting the bad version.

        Raises:
            RegistryError: No resolvable rollback target (see :meth:`rollback_target`).
            ConcurrencyError: Lock not acquired in time.
        """
        with self._attempt(name, "rollback", reason=reason) as rec:
            with self.lock.hold(name, self.lock_timeout_s):
                target = self.rollback_target(name)
                current = self.aliases(name).get(CHAMPION_ALIAS)
                rec.update(observed_champion=current, requested_version=target.version)
                self._set_alias(name, CHAMPION_ALIAS, target.version)
                try:
                    self.client.delete_registered_model_alias(name, PREVIOUS_CHAMPION_ALIAS)
                    self.client.delete_registered_model_tag(name, PREVIOUS_CHAMPION_TAG)
                except Exception as exc:  # noqa: BLE001
                    raise _translate(exc, f"clearing {PREVIOUS_CHAMPION_ALIAS!r} of model {name!r}") from exc
                if current is not None and current != target.version:
                    with contextlib.suppress(RegistryError):
                        self.set_version_tags(self.get_version(name, current),
                                              {"tritonflow.rolled_back_at": _now_iso(),
                                               "tritonflow.rolled_back_to": str(target.version)})
                if use_stages:
                    self._transition_production(name, target.version)
                    self.check_production_consistency(name, expected_version=target.version)
                rec.update(outcome="rolled_back", champion=target.version)
        return PromotionResult(name, target.version, None, current != target.version, rec["attempt_id"])

    # ------------------------------------------------------------------ deletion
    def _keep_reason(self, ref: ModelVersionRef, aliases: Mapping[str, int], deployed: set[int]) -> str | None:
        held = sorted(a for a, v in aliases.items() if v == ref.version)
        if held:
            return f"holds alias {', '.join(repr(a) for a in held)}"
        if ref.version in deployed:
            return "deployed or READY in Triton"
        if ref.stage in ("Production", "Staging"):
            return f"in stage {ref.stage!r}"
        return None

    def plan_garbage_collection(self, name: str, deployed_versions: set[int | str] | frozenset[int | str],
                                keep_latest: int = 1) -> GcPlan:
        """Plan which versions of ``name`` may be deleted.

        A version is kept when it holds any alias, is in ``deployed_versions`` (deployed or READY
        in Triton, as the caller knows it), is in stage Production/Staging, or is one of the
        newest ``keep_latest`` versions.

        Args:
            name: Registered model name.
            deployed_versions: Versions deployed or READY in Triton (ints or numeric strings).
            keep_latest: How many of the newest versions to keep regardless (>= 0).

        Raises:
            RegistryError: ``keep_latest`` < 0 or a deployed version is not a number.
        """
        if keep_latest < 0:
            raise RegistryError(f"keep_latest={keep_latest!r} must be >= 0")
        deployed = {_as_version(v, "deployed_versions item") for v in deployed_versions}
        aliases = self.aliases(name)
        versions = self.versions(name)
        newest = {r.version for r in versions[len(versions) - keep_latest:]} if keep_latest else set()
        keep: dict[int, str] = {}
        delete: list[int] = []
        for r in versions:
            why = self._keep_reason(r, aliases, deployed)
            if why is None and r.version in newest:
                why = f"one of the newest {keep_latest}"
            if why:
                keep[r.version] = why
            else:
                delete.append(r.version)
        return GcPlan(name, tuple(delete), keep)

    def safe_delete_version(self, name: str, version: int | str,
                            deployed_versions: set[int | str] | frozenset[int | str] = frozenset()) -> None:
        """Delete one model version unless something still needs it.

        Checked under the model's lock, right before the delete: the version must hold no alias,
        not be in ``deployed_versions`` and not be in stage Production/Staging. Audited.

        Raises:
            RegistryError: The version is still needed (the message names the reason) or missing.
            ConcurrencyError: Lock not acquired in time.
        """
        v = _as_version(version)
        deployed = {_as_version(x, "deployed_versions item") for x in deployed_versions}
        with self._attempt(name, "delete", requested_version=v) as rec:
            with self.lock.hold(name, self.lock_timeout_s):
                ref = self.get_version(name, v)
                why = self._keep_reason(ref, self.aliases(name), deployed)
                if why:
                    raise RegistryError(f"refusing to delete model {name!r} version {v}: it {why}")
                try:
                    self.client.delete_model_version(name, str(v))
                except Exception as exc:  # noqa: BLE001
                    raise _translate(exc, f"deleting model {name!r} version {v}") from exc
                rec["outcome"] = "deleted"

    def apply_garbage_collection(self, plan: GcPlan,
                                 deployed_versions: set[int | str] | frozenset[int | str]) -> list[int]:
        """Delete the versions of ``plan`` with :meth:`safe_delete_version` (each re-checked).

        Returns:
            Versions deleted. A version that became needed since planning is skipped.
        """
        done = []
        for v in plan.delete:
            try:
                self.safe_delete_version(plan.name, v, deployed_versions)
                done.append(v)
            except RegistryError:
                continue
        return done


# ---------------------------------------------------------------------------- signature helpers
def _schema_to_tensors(schema: Any) -> tuple[tuple[TensorInfo, ...], str]:
    """Convert an MLflow ``Schema`` to :class:`TensorInfo` items and its kind."""
    if schema is None:
        return (), "none"
    import numpy as np

    out = []
    if schema.is_tensor_spec():
        for spec in schema.inputs:
            out.append(TensorInfo(spec.name, np.dtype(spec.type).name, tuple(int(d) for d in spec.shape),
                                  not getattr(spec, "required", True)))
        return tuple(out), "tensors"
    for spec in schema.inputs:
        try:
            dtype = np.dtype(spec.type.to_numpy()).name
        except Exception:  # noqa: BLE001 - Array/Object/Map column types
            dtype = "object"
        out.append(TensorInfo(spec.name, dtype, (-1,), not getattr(spec, "required", True)))
    return tuple(out), "columns"
