"""What the registry client speaks in: constants, reference parsing, frozen dataclasses, MLflow errors.

Shared by :mod:`model_registry.registry` (the client, the public entry point), the promotion lock
(:mod:`model_registry.registry_locks`), the promotion and rollback steps
(:mod:`model_registry.registry_promotion`) and the version clean-up
(:mod:`model_registry.registry_cleanup`). Nothing here talks to MLflow: the dataclasses are
immutable snapshots, :func:`parse_model_reference` checks a reference string, and
:func:`translate_mlflow_error` maps an MLflow exception to tritonflow's error hierarchy (a tooling failure is
:class:`~ground.exceptions.ServiceUnavailableError`, never a verdict on the model).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
from typing import Any, Mapping

from ground.exceptions import ConcurrencyError, DataError, RegistryError, ServiceUnavailableError

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
TAG_KEY_RE = re.compile(r"^[\w\-./ ]+$")


class Unchecked:
    """Sentinel type: promotion does not check which version is champion (lock only)."""

    def __repr__(self) -> str:  # pragma: no cover - trivial
        return "UNCHECKED"


#: Pass as ``expected_champion`` to serialise a promotion without a compare-and-set condition.
UNCHECKED = Unchecked()


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


def as_version(version: int | str, what: str = "version") -> int:
    """A model version number from user input.

    Args:
        version: ``3`` or ``"3"`` (surrounding spaces allowed).
        what: The argument's name, for the message.

    Returns:
        The version, an int >= 1.

    Raises:
        RegistryError: Not an integer >= 1.
    """
    try:
        v = int(str(version).strip())
    except (TypeError, ValueError):
        raise RegistryError(f"{what}={version!r} is not a model version number (expected an int >= 1)") from None
    if v < 1:
        raise RegistryError(f"{what}={version!r} is not a model version number (expected an int >= 1)")
    return v


def now_iso() -> str:
    """The current UTC time as ISO 8601 with milliseconds (``2025-03-01T10:00:00.000+00:00``)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def quote_filter_value(value: str) -> str:
    """``value`` escaped for a single-quoted string in an MLflow search filter (backslashes, quotes)."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def mlflow_error_code(exc: BaseException) -> str:
    """MLflow's ``error_code`` of ``exc`` (``"RESOURCE_DOES_NOT_EXIST"``, ...), '' when it has none."""
    return str(getattr(exc, "error_code", "") or "")


def is_not_found(exc: BaseException) -> bool:
    """True when MLflow says the model, version or alias does not exist.

    Args:
        exc: An exception raised by an MLflow client call.

    Returns:
        ``RESOURCE_DOES_NOT_EXIST``, or ``INVALID_PARAMETER_VALUE`` saying "not found" (an unknown
        alias).
    """
    code = mlflow_error_code(exc)
    if code == "RESOURCE_DOES_NOT_EXIST":
        return True
    # MLflow 3.17 reports an unknown alias as INVALID_PARAMETER_VALUE "... alias X not found".
    return code == "INVALID_PARAMETER_VALUE" and "not found" in str(exc).lower()


_TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED"}


def translate_mlflow_error(exc: BaseException, what: str) -> Exception:
    """Map an MLflow exception to tritonflow's hierarchy (message names the operation).

    Args:
        exc: What the MLflow call raised.
        what: The operation, first in the message (``"setting alias 'champion' of model 'm'"``).

    Returns:
        ``exc`` itself when it is already a data, service or concurrency error;
        :class:`ServiceUnavailableError` when MLflow did not answer (transient codes, connection
        errors); else :class:`RegistryError`.
    """
    if isinstance(exc, (DataError, ServiceUnavailableError, ConcurrencyError)):
        return exc
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if mlflow_error_code(exc) in _TRANSIENT_CODES or isinstance(exc, (ConnectionError, OSError)):
        return ServiceUnavailableError(f"{what}: MLflow did not answer ({msg})")
    if "Max retries exceeded" in msg or "Connection refused" in msg or "API request to" in msg:
        return ServiceUnavailableError(f"{what}: MLflow did not answer ({msg})")
    return RegistryError(f"{what}: {msg}")


# ---------------------------------------------------------------------------- signature helpers
def schema_to_tensors(schema: Any) -> tuple[tuple[TensorInfo, ...], str]:
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
