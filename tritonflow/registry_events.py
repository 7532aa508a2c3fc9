"""The vocabulary of MLflow registry events: the kinds of change, the webhook events, the receiver's path.

Shared by the plugin's receiver and mapping (:mod:`tritonflow_plugin.webhook`,
:mod:`tritonflow_plugin.event_mapping`), which sit above ``tritonflow``, and by the CLI
(``tritonflow registry webhook register`` subscribes exactly :data:`SUPPORTED_EVENTS` at
:data:`URL_PREFIX` + :data:`WEBHOOK_PATH`), which must not import the plugin. Plain constants: no
import of the project, of MLflow or of Airflow.
"""

from __future__ import annotations

#: Kinds of registry change (a :class:`tritonflow_plugin.event_mapping.RegistryChange`'s ``kind``).
VERSION_CREATED = "version_created"
ALIAS_SET = "alias_set"
ALIAS_DELETED = "alias_deleted"
TAG_SET = "tag_set"
#: A stage transition: seen by the registry watcher only (open-source MLflow sends no webhook for it).
STAGE_CHANGED = "stage_changed"
CHANGE_KINDS = (VERSION_CREATED, ALIAS_SET, ALIAS_DELETED, TAG_SET, STAGE_CHANGED)

#: Path of the webhook receiver inside the app the plugin mounts.
WEBHOOK_PATH = "/webhooks/mlflow"
#: Path of the receiver's delivery status (what it received, deduped and started) in the same app.
STATUS_PATH = "/webhooks/status"
#: URL prefix the plugin mounts the receiver's app under (on the Airflow api-server).
URL_PREFIX = "/tritonflow"

#: The MLflow webhook events the receiver maps: ``(entity, action) -> (change kind, required data
#: fields)``; the CLI subscribes a webhook to exactly these (``"<entity>.<action>"``).
SUPPORTED_EVENTS: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("model_version", "created"): (VERSION_CREATED, ("name", "version")),
    ("model_version_alias", "created"): (ALIAS_SET, ("name", "alias", "version")),
    ("model_version_alias", "deleted"): (ALIAS_DELETED, ("name", "alias")),
    ("model_version_tag", "set"): (TAG_SET, ("name", "version", "key", "value")),
}

__all__ = ["ALIAS_DELETED", "ALIAS_SET", "CHANGE_KINDS", "STAGE_CHANGED", "STATUS_PATH", "SUPPORTED_EVENTS", "TAG_SET",
           "URL_PREFIX", "VERSION_CREATED", "WEBHOOK_PATH"]
