"""Reading and writing model versions in the MLflow registry, and the promotion audit trail.

:class:`RegistryClientBase` holds the ``mlflow.MlflowClient`` and everything that does not move an
alias: resolving references, reading signatures and input examples, writing ``tritonflow.*`` tags,
artifacts and the publish record, and the audit trail every promotion, rollback and deletion
attempt writes. :class:`model_registry.registry.RegistryClient` adds promotion
(:mod:`model_registry.registry.promotion`) and clean-up (:mod:`model_registry.registry.cleanup`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping

from ground.exceptions import ConcurrencyError, DataError, RegistryError
from model_registry.registry.entities import (
    AUDIT_TAG_PREFIX,
    CHAMPION_ALIAS,
    DEFAULT_PUBLISH_EXPERIMENT,
    MAX_TAG_VALUE_LENGTH,
    TAG_KEY_RE,
    AuditEntry,
    ModelIO,
    ModelReference,
    ModelVersionRef,
    PublishRecord,
    as_version,
    is_not_found,
    mlflow_error_code,
    now_iso,
    parse_model_reference,
    quote_filter_value,
    schema_to_tensors,
    translate_mlflow_error,
)
from model_registry.registry.locks import DEFAULT_LOCK_TIMEOUT_S, DatabaseLock, PromotionLock

#: What MLflow's store answers when another writer inserted the same new tag first (SQLite, PostgreSQL, MySQL).
_TAG_INSERT_RACE = re.compile(r"UNIQUE constraint failed|duplicate key value|Duplicate entry|IntegrityError")


@contextlib.contextmanager
def pinned_mlflow_uris(tracking_uri: str) -> Iterator[None]:
    """Point MLflow's fluent API (runs, ``log_model``, ``models:/`` loading) and its registry at ``tracking_uri``.

    Both the tracking and the registry URI are pinned: an inherited ``MLFLOW_REGISTRY_URI`` (another
    tool's, a stale one) would otherwise send registrations to another server. ``mlflow.set_*_uri``
    also write ``MLFLOW_TRACKING_URI``/``MLFLOW_REGISTRY_URI`` into ``os.environ``, which every child
    process would inherit; the previous values are restored as they were, *unset* included
    (calling ``set_registry_uri(get_registry_uri())`` would pin the resolved default instead).

    Args:
        tracking_uri: The MLflow server (it is the model registry too).
    """
    import mlflow
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    prev_t, prev_r = tracking_utils._tracking_uri, registry_utils._registry_uri
    env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    try:
        yield
    finally:
        # also resets MLflow's tracer/client caches; MLflow types its private _tracking_uri as None only
        mlflow.set_tracking_uri(prev_t)  # type: ignore[arg-type]  # None unsets it (the original state)
        registry_utils._registry_uri = prev_r
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

class RegistryClientBase:
    """The MLflow client, reading, writing and the audit trail; see :class:`model_registry.registry.RegistryClient`."""

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
        v = as_version(version)
        try:
            return self._to_ref(self.client.get_model_version(name, str(v)))
        except Exception as exc:  # noqa: BLE001
            if is_not_found(exc):
                raise RegistryError(f"model {name!r} has no version {v} (deleted or never registered)") from None
            raise translate_mlflow_error(exc, f"reading model {name!r} version {v}") from exc

    def _registered_model(self, name: str) -> Any:
        """MLflow's registered model ``name``; RegistryError when it does not exist."""
        try:
            rm = self.client.get_registered_model(name)
        except Exception as exc:  # noqa: BLE001
            if is_not_found(exc):
                raise RegistryError(f"registered model {name!r} does not exist") from None
            raise translate_mlflow_error(exc, f"reading registered model {name!r}") from exc
        return rm

    def aliases(self, name: str) -> dict[str, int]:
        """Alias -> version of registered model ``name`` (as MLflow stores them).

        Raises:
            RegistryError: The registered model does not exist.
        """
        rm = self._registered_model(name)
        return {a: int(v) for a, v in (rm.aliases or {}).items()}

    def model_tags(self, name: str) -> dict[str, str]:
        """Tags of registered model ``name`` (not of its versions).

        Raises:
            RegistryError: The registered model does not exist.
        """
        return dict(self._registered_model(name).tags or {})

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
            mvs = self.client.search_model_versions(f"name='{quote_filter_value(name)}'")
        except Exception as exc:  # noqa: BLE001
            raise translate_mlflow_error(exc, f"listing versions of model {name!r}") from exc
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
            raise translate_mlflow_error(exc, f"locating artifacts of {ref.uri}") from exc
        with tempfile.TemporaryDirectory(prefix="tritonflow-mlmodel-") as tmp:
            try:
                mlflow.artifacts.download_artifacts(
                    artifact_uri=f"{location.rstrip('/')}/MLmodel", dst_path=tmp, tracking_uri=self.tracking_uri
                )
                model = Model.load(os.path.join(tmp, "MLmodel"))
            except Exception as exc:  # noqa: BLE001
                raise translate_mlflow_error(exc, f"reading MLmodel of {ref.uri} at {location}") from exc
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
        inputs, in_kind = schema_to_tensors(signature.inputs)
        outputs, out_kind = schema_to_tensors(signature.outputs)
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
            raise translate_mlflow_error(exc, f"reading the input example of {ref.uri}") from exc

    # ------------------------------------------------------------------ writing
    def set_version_tags(self, ref: ModelVersionRef, tags: Mapping[str, Any]) -> dict[str, str]:
        """Set tags on a model version; non-string values are written as JSON.

        Returns:
            The tags as written (key -> string value).

        A write that loses the race with another writer of the same new tag (two publishes of one
        version at once) is written again, once: the tag exists by then, so it is an update.

        Raises:
            RegistryError: A key is invalid or a value longer than :data:`MAX_TAG_VALUE_LENGTH`
                (names the key and the length), or MLflow refused the write.
            ServiceUnavailableError: MLflow did not answer.
        """
        written: dict[str, str] = {}
        for key, value in tags.items():
            if not isinstance(key, str) or not TAG_KEY_RE.match(key) or len(key) > 250:
                raise RegistryError(f"tag key {key!r} must be 1-250 of letters, digits, '_-./ '")
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
            if len(text) > MAX_TAG_VALUE_LENGTH:
                raise RegistryError(
                    f"tag {key!r} of {ref.uri}: value is {len(text)} characters, MLflow accepts at "
                    f"most {MAX_TAG_VALUE_LENGTH}; log it as an artifact instead"
                )
            written[key] = text
        for key, text in written.items():
            for attempt in (1, 2):
                try:
                    self.client.set_model_version_tag(ref.name, str(ref.version), key, text)
                    break
                except Exception as exc:  # noqa: BLE001
                    # Two writers of one new tag at once (two publishes of one version): MLflow's
                    # store inserts for both and the loser hits the unique key. The tag exists
                    # now, so writing it again is an update.
                    if attempt == 1 and _TAG_INSERT_RACE.search(str(exc)):
                        continue
                    raise translate_mlflow_error(exc, f"setting tag {key!r} on {ref.uri}") from exc
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
            raise translate_mlflow_error(exc, f"updating the description of {ref.uri}") from exc
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
            if mlflow_error_code(exc) == "RESOURCE_ALREADY_EXISTS":
                exp_id = self.client.get_experiment_by_name(self.publish_experiment).experiment_id
            else:
                raise translate_mlflow_error(exc, f"opening experiment {self.publish_experiment!r}") from exc
        filt = (f"tags.`tritonflow.model_name` = '{quote_filter_value(ref.name)}' and "
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
            raise translate_mlflow_error(exc, f"creating the publish run of {ref.uri}") from exc

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
            raise translate_mlflow_error(exc, f"logging {p} for {ref.uri}") from exc
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
        tv = as_version(record.triton_model_version, "PublishRecord.triton_model_version")
        tags = {
            "tritonflow.repository_uri": record.repository_uri,
            "tritonflow.triton_model_name": record.triton_model_name,
            "tritonflow.triton_model_version": str(tv),
            "tritonflow.signature_digest": record.signature_digest,
            "tritonflow.signature_key_id": record.signature_key_id,
            "tritonflow.parity_errors": {k: dict(v) for k, v in record.parity_errors.items()},
            "tritonflow.config_summary": dict(record.config_summary),
            "tritonflow.timings_s": {k: round(float(v), 6) for k, v in record.timings_s.items()},
            "tritonflow.published_at": now_iso(),
            "tritonflow.status": "published",
        }
        return self.set_version_tags(ref, tags)

    def record_rejection(self, ref: ModelVersionRef, reason: str, stage: str) -> dict[str, str]:
        """Tag a model version rejected: ``tritonflow.status = rejected`` plus stage, reason and time.

        Written by the publish pipeline (``stage`` = its stage), the health sentinel's rollback
        (``sentinel``) and a failed canary (``canary``); a rejected version is never promoted.
        """
        return self.set_version_tags(ref, {
            "tritonflow.status": "rejected",
            "tritonflow.rejected_stage": stage,
            "tritonflow.rejection_reason": reason[:MAX_TAG_VALUE_LENGTH],
            "tritonflow.rejected_at": now_iso(),
        })

    # ------------------------------------------------------------------ audit trail
    def _audit(self, name: str, attempt_id: str, record: Mapping[str, Any]) -> None:
        try:
            self.client.set_registered_model_tag(
                name, AUDIT_TAG_PREFIX + attempt_id, json.dumps(record, sort_keys=True, default=str)
            )
        except Exception as exc:  # noqa: BLE001
            raise translate_mlflow_error(exc, f"writing audit record {attempt_id} of model {name!r}") from exc

    def audit_log(self, name: str) -> list[AuditEntry]:
        """Every promotion/rollback/delete attempt recorded for model ``name``, oldest first."""
        try:
            tags = dict(self.client.get_registered_model(name).tags or {})
        except Exception as exc:  # noqa: BLE001
            raise translate_mlflow_error(exc, f"reading the audit trail of model {name!r}") from exc
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
                               "started_at": now_iso(), "outcome": "pending", **fields}
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
            rec["finished_at"] = now_iso()
            self._audit(name, attempt_id, rec)
