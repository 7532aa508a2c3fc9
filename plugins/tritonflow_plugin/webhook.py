"""FastAPI app receiving MLflow model-registry webhooks (mounted by the plugin).

MLflow 3.x signs each delivery (``mlflow/webhooks/delivery.py``) following the Standard Webhooks
conventions:

* headers ``X-MLflow-Delivery-Id`` (UUID), ``X-MLflow-Timestamp`` (Unix seconds) and
  ``X-MLflow-Signature`` = ``"v1," + base64(HMAC-SHA256(secret, f"{id}.{timestamp}.{body}"))``;
* body ``{"entity", "action", "timestamp", "data"}`` where ``data`` is the event payload
  (``mlflow.webhooks.types``).

The receiver (:func:`create_app`) refuses, with a logged reason and a 4xx answer:

* a missing/invalid signature or no configured secret (401),
* a timestamp outside ``Settings.webhook_tolerance_s`` (401) or a delivery id already handled
  (409) -- replay protection,
* a body that is not JSON, lacks fields or has wrong types (400).

Accepted ``model_version.created``, ``model_version_alias.created/deleted`` and
``model_version_tag.set`` events become :class:`~tritonflow_plugin.event_mapping.RegistryChange`
objects, mapped to DAGs by :mod:`tritonflow_plugin.event_mapping`. MLflow's payloads name a
version by its number alone, which a model deleted and registered again reuses: the receiver reads
the version's ``creation_timestamp`` from MLflow (:class:`VersionLookup`, one ``get_model_version``
per delivery) so that the change is the new version's, under the key the reconciler gives it too.
A delivery about a version that no longer exists is acknowledged as ``gone`` (nothing to start);
MLflow unreachable answers 502 (stored, not done: MLflow's retry or the reconciler acts on it).
Each action goes to a sink
(:class:`Sink`): :class:`DagRunSink`, one DAG run per delivery and mapped DAG, with the action's
conf. Other well-formed MLflow events are acknowledged and ignored (200).

Nothing lost, nothing doubled (:mod:`tritonflow_plugin.change_ledger`): every signed delivery is
stored in the shared coordination database (PostgreSQL in a deployment, never a host-local file)
before the receiver answers; the change is then decided under its change key, in the same
transaction that records it, and its runs get the change's run id. A change the registry watcher
(the reconciler) already acted on is acknowledged as a duplicate; a failure after storing answers
502, and MLflow's retry or the reconciler starts the same runs.

Why DAG runs and not asset events: Airflow's scheduler folds the asset events queued
for a DAG into one run and consumes only those written before the DAG was first queued; a second
delivery for the same DAG arriving while a run is being created (a version created, then its
alias set) either lands in the same run, which acts on one change, or waits unconsumed until some
later event. One run per delivery keeps every registry change a run of its own.

Register the webhook on MLflow (SQL backend) with ``tritonflow registry webhook register``
(:mod:`model_registry.webhooks`): it subscribes exactly
:data:`~tritonflow.registry_events.SUPPORTED_EVENTS` with ``TRITONFLOW_WEBHOOK_SECRET`` and says
which MLflow server variables an ``http`` or private-address receiver needs (MLflow refuses those
by default).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import json
import logging
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from ground.exceptions import DataError
from tritonflow.registry_events import (  # shared with the CLI
    ALIAS_DELETED,
    STATUS_PATH,
    SUPPORTED_EVENTS,
    WEBHOOK_PATH,
)
from tritonflow_plugin.champion_guard import ChampionGuard
from tritonflow_plugin.change_ledger import STARTED, ChangeLedger, change_run_id
from tritonflow_plugin.event_mapping import (
    Action,
    RegistryChange,
    Rule,
)

log = logging.getLogger(__name__)

# The header names and signature version are MLflow's (mlflow.webhooks.constants); repeated here
# so that importing this module does not import MLflow.
SIGNATURE_HEADER = "X-MLflow-Signature"
TIMESTAMP_HEADER = "X-MLflow-Timestamp"
DELIVERY_ID_HEADER = "X-MLflow-Delivery-Id"
SIGNATURE_VERSION = "v1"
#: Largest accepted body (bytes); MLflow registry payloads are a few hundred bytes.
MAX_BODY_BYTES = 256 * 1024


class WebhookRejected(DataError):
    """A webhook delivery was refused; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def sign(secret: str, delivery_id: str, timestamp: str, body: str) -> str:
    """MLflow's signature of a delivery: ``"v1," + base64(HMAC-SHA256(secret, id.ts.body))``.

    Same scheme as ``mlflow.webhooks.delivery._generate_hmac_signature``.
    """
    mac = hmac.new(secret.encode("utf-8"), f"{delivery_id}.{timestamp}.{body}".encode("utf-8"),
                   hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(mac).decode('ascii')}"


def verify_signature(secret: str, delivery_id: str, timestamp: str, body: str, header: str) -> None:
    """Check ``header`` against the expected signature (constant-time).

    ``header`` may hold several space-separated ``v1,<sig>`` entries (Standard Webhooks secret
    rotation); one match is enough.

    Raises:
        WebhookRejected: 401 when no entry matches or none uses version ``v1``.
    """
    expected = sign(secret, delivery_id, timestamp, body)
    candidates = [c for c in header.split() if c.startswith(f"{SIGNATURE_VERSION},")]
    if not candidates:
        raise WebhookRejected(401, f"{SIGNATURE_HEADER} has no '{SIGNATURE_VERSION},' signature")
    if not any(hmac.compare_digest(c, expected) for c in candidates):
        raise WebhookRejected(401, f"{SIGNATURE_HEADER} does not match the payload and secret")


def check_timestamp(timestamp: str, now: float, tolerance_s: float) -> None:
    """Refuse a delivery timestamp that is not an integer or is too far from ``now``.

    Raises:
        WebhookRejected: 401 with the skew in seconds and the tolerance.
    """
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        raise WebhookRejected(401, f"{TIMESTAMP_HEADER}={timestamp!r}: expected Unix seconds") from None
    skew = abs(now - ts)
    if skew > tolerance_s:
        raise WebhookRejected(
            401, f"{TIMESTAMP_HEADER}={ts} is {skew:.0f} s from now: expected within {tolerance_s:.0f} s"
        )


def parse_delivery(body: str) -> RegistryChange | None:
    """Parse an MLflow webhook body into a registry change.

    Returns:
        The change, or ``None`` for a well-formed event tritonflow does not act on.

    Raises:
        WebhookRejected: 400 naming the field that is missing or has the wrong type.
    """
    try:
        doc = json.loads(body)
    except (ValueError, TypeError) as exc:
        raise WebhookRejected(400, f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WebhookRejected(400, f"body is {type(doc).__name__}: expected a JSON object")
    for key in ("entity", "action", "data"):
        if key not in doc:
            raise WebhookRejected(400, f"body lacks field {key!r}: expected entity, action, data")
    entity, action, data = doc["entity"], doc["action"], doc["data"]
    if not isinstance(entity, str) or not isinstance(action, str):
        raise WebhookRejected(400, f"entity={entity!r}, action={action!r}: expected strings")
    if not isinstance(data, dict):
        raise WebhookRejected(400, f"data is {type(data).__name__}: expected a JSON object")
    if (entity, action) not in SUPPORTED_EVENTS:
        return None
    kind, required = SUPPORTED_EVENTS[(entity, action)]
    for key in required:
        value = data.get(key)
        if not isinstance(value, str) or (key != "value" and not value):
            raise WebhookRejected(
                400, f"data.{key}={value!r} in {entity}.{action}: expected a non-empty string"
            )
    return RegistryChange(
        kind=kind,
        model=data["name"],
        version=data.get("version"),
        alias=data.get("alias"),
        tag_key=data.get("key"),
        tag_value=data.get("value"),
        source="webhook",
    )


class VersionLookup:
    """A model version's creation time, read from MLflow: what tells a reused version number apart.

    Args:
        tracking_uri: MLflow URI (default ``Settings.resolved_mlflow_tracking_uri``, read at the first call).
    """

    def __init__(self, tracking_uri: str | None = None) -> None:
        self.tracking_uri = tracking_uri
        self._client: Any = None

    def __call__(self, model: str, version: str) -> int | None:
        """The ``creation_timestamp`` (Unix ms) of version ``version`` of ``model``; ``None`` when it does not exist.

        Raises:
            mlflow.exceptions.MlflowException: MLflow cannot be read (unreachable, refused).
        """
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        if self._client is None:
            uri = self.tracking_uri or _settings().resolved_mlflow_tracking_uri
            self._client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        try:
            mv = self._client.get_model_version(model, version)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return int(mv.creation_timestamp or 0)  # 0: a store that keeps no creation time (as the reconciler reads it)


def identify(change: RegistryChange, versions: Callable[[str, str], int | None]) -> RegistryChange | None:
    """``change`` with its version's creation time (``version_created_ms``), as the reconciler sees it.

    Returns:
        The change (unchanged when it names no version: an alias deletion), or ``None`` when its
        version no longer exists (deleted after the change, or with its model).

    Raises:
        Exception: whatever ``versions`` raises (MLflow unreachable).
    """
    if change.kind == ALIAS_DELETED or not change.version:
        return change
    created = versions(change.model, change.version)
    return None if created is None else dataclasses.replace(change, version_created_ms=created)


class DeliveryStore(ChangeLedger):
    """The receiver's store: deliveries and the changes acted on, in the shared coordination DB.

    Args:
        path: SQLAlchemy URL or SQLite file of the coordination database, or a
            :class:`~ground.coordination.CoordinationStore` (default: the shared store of the settings).
    """

    def __init__(self, path: Any = None) -> None:
        super().__init__(path)

    def claim(self, delivery_id: str, now: float | None = None) -> bool:
        """Store ``delivery_id`` (empty body); ``False`` when it was already stored."""
        return self.store_delivery(delivery_id, "", now) is None


class Sink(Protocol):
    """Where mapped actions go."""

    def deliver(self, action: Action, run_id: str) -> str:
        """Start ``action`` as run ``run_id``; return a short description of what was created."""


class DagRunSink:
    """Create a DAG run of ``action.dag_id`` with the action's conf and the change's run id.

    The run id is the change's (:func:`~tritonflow_plugin.change_ledger.change_run_id`), so an
    MLflow retry, or the reconciler, finding a change whose run was already created (the receiver
    failed after it) finds that run instead of creating a second.
    """

    def deliver(self, action: Action, run_id: str) -> str:
        """Trigger the DAG run.

        Raises:
            DataError: the DAG does not exist in the metadata DB.
        """
        from airflow.api.common.trigger_dag import trigger_dag
        from airflow.exceptions import DagNotFound, DagRunAlreadyExists
        from airflow.utils.types import DagRunTriggeredByType
        from sqlalchemy.exc import IntegrityError

        try:
            run = trigger_dag(
                action.dag_id,
                triggered_by=DagRunTriggeredByType.REST_API,
                run_id=run_id,
                conf=action.conf,
                note=f"MLflow registry {action.conf['registry_event']['kind']}",
            )
        except DagNotFound as exc:
            raise DataError(f"dag_id={action.dag_id!r} not found: expected a parsed DAG ({exc})") from None
        except DagRunAlreadyExists:
            return f"dag run {run_id} of {action.dag_id} (already created for this change)"
        except IntegrityError as exc:  # the other path inserted it between trigger_dag's check and insert
            if run_id not in str(exc):
                raise
            return f"dag run {run_id} of {action.dag_id} (created meanwhile for this change)"
        return f"dag run {getattr(run, 'run_id', run_id)} of {action.dag_id}"


def _settings():
    from ground.settings import get_settings

    return get_settings()


def _admit(raw: bytes, headers: Mapping[str, str], *, secret: str | None, tolerance_s: float | None,
           clock: Callable[[], float]) -> tuple[RegistryChange | None, str]:
    """Check one delivery (size, secret, headers, signature, timestamp, payload).

    Args:
        raw: The request body.
        headers: The request headers.
        secret: HMAC secret (``None``: ``Settings.webhook_secret``).
        tolerance_s: Accepted clock skew in seconds (``None``: ``Settings.webhook_tolerance_s``).
        clock: Unix time now.

    Returns:
        ``(change, body)``: the registry change (``None``: a well-formed event that is not mapped)
        and the body as text.

    Raises:
        WebhookRejected: The delivery is refused (its HTTP status and reason).
    """
    delivery_id = headers.get(DELIVERY_ID_HEADER, "")
    if len(raw) > MAX_BODY_BYTES:
        raise WebhookRejected(413, f"body has {len(raw)} bytes: expected at most {MAX_BODY_BYTES}")
    settings = None
    key = secret
    if key is None:
        settings = _settings()
        key = settings.webhook_secret
    if not key:
        raise WebhookRejected(401, "no webhook secret configured (TRITONFLOW_WEBHOOK_SECRET)")
    for name in (DELIVERY_ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER):
        if not headers.get(name):
            raise WebhookRejected(401 if name == SIGNATURE_HEADER else 400, f"header {name} is missing")
    try:
        body = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WebhookRejected(400, "body is not UTF-8") from None
    timestamp = headers[TIMESTAMP_HEADER]
    verify_signature(key, delivery_id, timestamp, body, headers[SIGNATURE_HEADER])
    tol = tolerance_s
    if tol is None:
        tol = (settings or _settings()).webhook_tolerance_s
    check_timestamp(timestamp, clock(), tol)
    return parse_delivery(body), body


def _store(ledger: ChangeLedger, delivery_id: str, body: str, now: float) -> None:
    """Store the delivery before anything is acknowledged; refuse a replay of a finished one.

    Raises:
        WebhookRejected: 409 when this delivery id was already handled to the end.
    """
    before = ledger.store_delivery(delivery_id, body, now)
    if before == "done":
        raise WebhookRejected(409, f"{DELIVERY_ID_HEADER}={delivery_id} was already received (replay)")
    if before is not None:
        log.info("MLflow webhook delivery %s: stored before (%s), processing it again", delivery_id, before)


def _deliver(change: RegistryChange, delivery_id: str, rules: Sequence[Rule] | None, sink: Sink | None,
             ledger: ChangeLedger, guard: ChampionGuard) -> Any:
    """Decide ``change`` in the ledger, start its mapped runs if they may not exist yet; the response.

    A change another path (or an earlier delivery) already started is a duplicate (200, no run).
    A sink failure answers 502 with what was done before it; the delivery stays stored and the
    change ``claimed``, so MLflow's retry or the reconciler starts it (the same run ids).
    """
    from tritonflow_plugin.event_mapping import load_mapping

    recorded = ledger.record(change, delivery_id=delivery_id)
    if recorded.status == STARTED:
        ledger.finish_delivery(delivery_id, "done", recorded.key, outcome="duplicate")
        log.info("MLflow webhook delivery %s: change %s already acted on", delivery_id, recorded.key)
        return {"status": "duplicate", "delivery_id": delivery_id, "change_key": recorded.key}
    change = recorded.change
    target = sink or DagRunSink()
    done: list[dict[str, str]] = []
    try:
        actions = guard.actions(change, rules if rules is not None else load_mapping(), ledger)
        for action in actions:
            run_id = change_run_id(recorded.key, action.dag_id, change.kind)
            action = Action(action.dag_id, {**action.conf, "delivery_id": delivery_id}, action.then)
            done.append({"dag_id": action.dag_id, "run_id": run_id, "result": target.deliver(action, run_id)})
        ledger.mark_started(recorded.key, [d["run_id"] for d in done])
        ledger.finish_delivery(delivery_id, "done", recorded.key, outcome="started")
    except Exception as exc:
        log.error("MLflow webhook delivery %s: delivering actions failed: %s", delivery_id, exc)
        return JSONResponse(
            status_code=502, content={"detail": f"delivering actions failed: {exc}", "done": done}
        )
    log.info("MLflow webhook delivery %s: %s -> %s", delivery_id, change, done)
    return {"status": "accepted", "delivery_id": delivery_id, "change": change.to_dict(), "actions": done}


def _gone(change: RegistryChange, delivery_id: str, ledger: ChangeLedger) -> dict[str, str]:
    """Acknowledge a delivery whose version no longer exists: nothing to start, nothing to retry."""
    ledger.finish_delivery(delivery_id, "done", outcome="gone")
    log.info("MLflow webhook delivery %s: version %s of %s no longer exists", delivery_id, change.version,
             change.model)
    return {"status": "gone", "delivery_id": delivery_id,
            "detail": f"version {change.version} of {change.model!r} does not exist in MLflow: nothing to start"}


def _event_of(body: str) -> str:
    try:
        doc = json.loads(body or "{}")
        return f"{doc.get('entity')}.{doc.get('action')}"
    except (ValueError, AttributeError):
        return ""


def delivery_status(ledger: ChangeLedger, limit: int = 20) -> dict[str, Any]:
    """What the receiver received, deduped and started, and what the reconciler found.

    Returns:
        ``{"deliveries": {"total", "last": [{"delivery_id", "event", "received_at", "status",
        "outcome", "change_key"}]}, "changes": {"total", "last": [{"change_key", "kind", "model",
        "version", "alias", "source", "status", "runs", "previous", "at"}]}, "reconciler":
        {"polled_at": {consumer: time}, "found": [the last changes it saw first], "unstarted":
        [change keys decided but never started]}}``; newest first, times in Unix seconds.
    """
    from tritonflow_plugin.change_ledger import CHANGES, CLAIMED, DELIVERIES
    from tritonflow_plugin.registry_watcher import SeenStateStore

    deliveries = [{"delivery_id": k, "event": _event_of(v.get("body", "")), "received_at": v.get("received_at"),
                   "status": v.get("status"), "outcome": v.get("outcome"), "change_key": v.get("change_key")}
                  for k, v, _ in ledger.latest(DELIVERIES, limit)]
    changes = []
    for key, value, _ in ledger.latest(CHANGES, max(limit, 200)):
        change = value.get("change") or {}
        changes.append({"change_key": key, **{f: change.get(f) for f in ("kind", "model", "version", "alias",
                                                                         "source")},
                        "status": value.get("status"), "runs": value.get("runs", []),
                        "previous": value.get("previous"), "at": value.get("at")})
    polled = {k: t for k, _, t in ledger.latest(SeenStateStore.SCOPE, 100)}
    return {
        "deliveries": {"total": ledger.count(DELIVERIES), "last": deliveries},
        "changes": {"total": ledger.count(CHANGES), "last": changes[:limit]},
        "reconciler": {"polled_at": polled, "found": [c for c in changes if c["source"] == "watcher"][:limit],
                       "unstarted": [c["change_key"] for c in changes if c["status"] == CLAIMED]},
    }


#: The DAG whose run readers may read the delivery status.
STATUS_DAG_ID = "registry_events"


async def airflow_run_reader(request: Request) -> None:
    """Airflow's own check, as its REST API makes it: a logged-in user who may read ``registry_events`` runs.

    The JWT comes from ``Authorization: Bearer`` or the UI's session cookie (Airflow's ``get_user``).

    Raises:
        fastapi.HTTPException: 401 without a token, 403 with an invalid one or no permission.
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import get_user, requires_access_dag
    from fastapi.security import HTTPAuthorizationCredentials

    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if token else None
    user = await get_user(request, None, credentials)
    requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=STATUS_DAG_ID)(request, user)


def create_app(
    *,
    secret: str | None = None,
    tolerance_s: float | None = None,
    rules: Sequence[Rule] | None = None,
    sink: Sink | None = None,
    deliveries: DeliveryStore | None = None,
    clock: Callable[[], float] = time.time,
    champion_guard: ChampionGuard | None = None,
    status_auth: Callable[..., Any] | None = None,
    versions: Callable[[str, str], int | None] | None = None,
):
    """Build the FastAPI app serving ``POST /webhooks/mlflow``, ``GET /webhooks/status`` and ``GET /health``.

    ``GET /webhooks/status`` (:func:`delivery_status`, ``?limit=``) needs what Airflow's REST API
    needs to read ``registry_events`` runs (``status_auth``, default :func:`airflow_run_reader`).

    Every argument defaults to settings (read per request, so a changed secret applies without
    a restart): ``Settings.webhook_secret``, ``Settings.webhook_tolerance_s``, the mapping of
    ``Settings.event_mapping_path``, :class:`DagRunSink`, :class:`DeliveryStore`,
    :class:`~tritonflow_plugin.champion_guard.ChampionGuard` (an out-of-band ``champion`` move
    goes through the gates), :class:`VersionLookup` (``versions(model, version)``: the version's
    creation time in Unix ms, ``None`` when it does not exist).

    Responses: 200 ``{"status": "accepted", "actions": [...]}`` or ``{"status": "ignored"}``;
    ``{"status": "duplicate"}`` for a change already acted on; ``{"status": "gone"}`` for a change of
    a version that no longer exists; 4xx ``{"detail": reason}``; 502 when MLflow could not be read or
    a sink failed (the delivery stays stored, not done, so MLflow's retry is processed).
    """
    app = FastAPI(title="tritonflow MLflow webhook receiver", docs_url=None, redoc_url=None)
    guard = champion_guard or ChampionGuard()
    lookup = versions or VersionLookup()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(STATUS_PATH, dependencies=[Depends(status_auth or airflow_run_reader)])
    def status(limit: int = 20) -> Any:
        if not 1 <= limit <= 500:
            return JSONResponse(status_code=400, content={"detail": f"limit={limit}: expected 1 to 500"})
        return delivery_status(deliveries or DeliveryStore(), limit)

    @app.post(WEBHOOK_PATH)
    async def receive(request: Request) -> Any:
        raw = await request.body()
        delivery_id = request.headers.get(DELIVERY_ID_HEADER, "")
        try:
            change, body = _admit(raw, request.headers, secret=secret, tolerance_s=tolerance_s, clock=clock)
            ledger = deliveries or DeliveryStore()
            _store(ledger, delivery_id, body, clock())
        except WebhookRejected as exc:
            log.warning("MLflow webhook delivery %r refused (%s): %s", delivery_id, exc.status, exc.reason)
            return JSONResponse(status_code=exc.status, content={"detail": exc.reason})
        if change is None:
            ledger.finish_delivery(delivery_id, "done", outcome="ignored")
            log.info("MLflow webhook delivery %s ignored (event not mapped)", delivery_id)
            return {"status": "ignored", "delivery_id": delivery_id}
        try:  # off the event loop: MLflow's client retries while MLflow restarts
            identified = await asyncio.to_thread(identify, change, lookup)
        except Exception as exc:
            log.error("MLflow webhook delivery %s: reading version %s of %s failed: %s", delivery_id,
                      change.version, change.model, exc)
            return JSONResponse(status_code=502, content={
                "detail": f"reading version {change.version} of {change.model!r} from MLflow failed: {exc}"})
        if identified is None:
            return _gone(change, delivery_id, ledger)
        return _deliver(identified, delivery_id, rules, sink, ledger, guard)

    return app
