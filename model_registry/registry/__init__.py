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

Locking: :class:`DatabaseLock` is a lease in the shared coordination database
(:mod:`ground.coordination`), like every other lock that guards what serves: promotions of one
model are serialised across Airflow workers on different hosts, and a crashed holder's lease
expires (fencing tokens make a late write fail).

MLflow's stage API is deprecated since MLflow 2.9 (it still works in 3.17 and warns with
``FutureWarning``); tritonflow uses stages only when asked (``use_stages=True``), always with
``archive_existing_versions=True``, followed by :meth:`RegistryClient.check_production_consistency`.

Heavy imports (``mlflow``) happen inside functions so that importing this module stays cheap.

Layout: :mod:`model_registry.registry.entities` (constants, reference parsing, dataclasses, MLflow
error mapping), :mod:`model_registry.registry.locks` (the promotion locks),
:mod:`model_registry.registry.client` (reading, writing, audit trail),
:mod:`model_registry.registry.promotion` (promotion and rollback) and
:mod:`model_registry.registry.cleanup` (safe deletion). Import the public names from here.
"""

from __future__ import annotations

from model_registry.registry.cleanup import CleanupMixin
from model_registry.registry.entities import (
    ACCEPTED_FORMS,
    AUDIT_TAG_PREFIX,
    CHALLENGER_ALIAS,
    CHAMPION_ALIAS,
    DEFAULT_PUBLISH_EXPERIMENT,
    LEGACY_STAGES,
    MAX_TAG_VALUE_LENGTH,
    PREVIOUS_CHAMPION_ALIAS,
    PREVIOUS_CHAMPION_TAG,
    TAG_PREFIX,
    UNCHECKED,
    AuditEntry,
    GcPlan,
    ModelIO,
    ModelReference,
    ModelVersionRef,
    PromotionResult,
    PublishRecord,
    TensorInfo,
    parse_model_reference,
)
from model_registry.registry.locks import (
    DEFAULT_LOCK_TIMEOUT_S,
    LOCK_POLL_INTERVAL_S,
    DatabaseLock,
    PromotionLock,
)
from model_registry.registry.promotion import PromotionMixin

__all__ = [
    "ACCEPTED_FORMS",
    "AUDIT_TAG_PREFIX",
    "AuditEntry",
    "CHALLENGER_ALIAS",
    "CHAMPION_ALIAS",
    "DEFAULT_LOCK_TIMEOUT_S",
    "DEFAULT_PUBLISH_EXPERIMENT",
    "DatabaseLock",
    "GcPlan",
    "LEGACY_STAGES",
    "LOCK_POLL_INTERVAL_S",
    "MAX_TAG_VALUE_LENGTH",
    "ModelIO",
    "ModelReference",
    "ModelVersionRef",
    "PREVIOUS_CHAMPION_ALIAS",
    "PREVIOUS_CHAMPION_TAG",
    "PromotionLock",
    "PromotionResult",
    "PublishRecord",
    "RegistryClient",
    "TAG_PREFIX",
    "TensorInfo",
    "UNCHECKED",
    "parse_model_reference",
]


class RegistryClient(PromotionMixin, CleanupMixin):
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
