"""FastAPI app receiving MLflow model-registry webhooks (mounted by the plugin).

MLflow 3.x signs each delivery (``mlflow/webhooks/delivery.py``) following the Standard Webhooks
conventions:

* headers ``X-MLflow-Delivery-Id`` (UUID), ``X-MLflow-Timestamp`` (Unix seconds) and
  ``X-MLflow-Signature`` = ``"v1," + base64(HMAC-SHA256(secret, f"{id}.{timestamp}.{body}"))``;
* body ``{"entity", "action", "timestamp", "data"}`` where ``data`` is the event payload
  (``mlflow.webhooks.types``).

The receiver (:func:`create_app`) refuses, with a logged reason and a 4xx answer:

* a missing/invalid signature or no configured secret (401),
* a timestamp outside ``Settings.webhook_tolerance_s`` (401) or a delivery id already accepted
  (409) -- replay protection; accepted ids are kept in SQLite under ``Settings.home``,
* a body that is not JSON, lacks fields or has wrong types (400).

Accepted ``model_version.created``, ``model_version_alias.created/deleted`` and
``model_version_tag.set`` events become :class:`~tritonflow_plugin.event_mapping.RegistryChange`
objects, mapped to DAGs by :mod:`tritonflow_plugin.event_mapping`; each action goes to a sink
(:class:`Sink`): :class:`DagRunSink`, one DAG run per delivery and mapped DAG, with the action's
conf. Other well-formed MLflow events are acknowledged and ignored (200).

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

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ground.exceptions import DataError
from tritonflow.registry_events import SUPPORTED_EVENTS, WEBHOOK_PATH  # shared with the CLI
from tritonflow_plugin.event_mapping import (
    Action,
    RegistryChange,
    Rule,
    actions_for,
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
#: File name of the accepted-delivery store under ``Settings.home``.
DELIVERY_STORE_FILE = "webhook_deliveries.sqlite"


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


class DeliveryStore:
    """Delivery ids already accepted, in SQLite, so replays are refused across restarts.

    Args:
        path: SQLite file (default ``<Settings.home>/webhook_deliveries.sqlite``).
        retention_s: Ids older than this are pruned (older deliveries fail the timestamp check).
    """

    def __init__(self, path: str | Path | None = None, retention_s: float = 3600.0) -> None:
        if path is None:
            from ground.settings import get_settings

            path = get_settings().home / DELIVERY_STORE_FILE
        self.path = Path(path)
        self.retention_s = retention_s

    @contextlib.contextmanager
    def _connect(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS delivery (delivery_id TEXT PRIMARY KEY, received_at REAL NOT NULL)"
            )
            yield conn
        finally:
            conn.close()

    def claim(self, delivery_id: str, now: float | None = None) -> bool:
        """Record ``delivery_id``; ``False`` when it was already recorded (a replay)."""
        now = time.time() if now is None else now
        with self._connect() as conn:
            conn.execute("DELETE FROM delivery WHERE received_at < ?", (now - self.retention_s,))
            try:
                conn.execute("INSERT INTO delivery VALUES (?, ?)", (delivery_id, now))
            except sqlite3.IntegrityError:
                return False
        return True

    def release(self, delivery_id: str) -> None:
        """Forget ``delivery_id`` (its actions failed, so MLflow's retry must be accepted)."""
        with self._connect() as conn:
            conn.execute("DELETE FROM delivery WHERE delivery_id = ?", (delivery_id,))


class Sink(Protocol):
    """Where mapped actions go."""

    def deliver(self, action: Action, delivery_id: str) -> str:
        """Start ``action``; return a short description of what was created."""


class DagRunSink:
    """Create a DAG run of ``action.dag_id`` with the action's conf (run id per delivery).

    The run id is ``registry__<delivery id>``, so an MLflow retry of a delivery whose run was
    already created (the receiver failed after it) finds that run instead of creating a second.
    """

    def deliver(self, action: Action, delivery_id: str) -> str:
        """Trigger the DAG run.

        Raises:
            DataError: the DAG does not exist in the metadata DB.
        """
        from airflow.api.common.trigger_dag import trigger_dag
        from airflow.exceptions import DagNotFound, DagRunAlreadyExists
        from airflow.utils.types import DagRunTriggeredByType

        run_id = f"registry__{delivery_id}"
        try:
            run = trigger_dag(
                action.dag_id,
                triggered_by=DagRunTriggeredByType.REST_API,
                run_id=run_id,
                conf={**action.conf, "delivery_id": delivery_id},
                note=f"MLflow registry {action.conf['registry_event']['kind']}",
            )
        except DagNotFound as exc:
            raise DataError(f"dag_id={action.dag_id!r} not found: expected a parsed DAG ({exc})") from None
        except DagRunAlreadyExists:
            return f"dag run {run_id} of {action.dag_id} (already created for this delivery)"
        return f"dag run {getattr(run, 'run_id', run_id)} of {action.dag_id}"


def _settings():
    from ground.settings import get_settings

    return get_settings()


def _admit(raw: bytes, headers: Mapping[str, str], *, secret: str | None, tolerance_s: float | None,
           deliveries: DeliveryStore | None,
           clock: Callable[[], float]) -> tuple[RegistryChange | None, DeliveryStore]:
    """Check one delivery (size, secret, headers, signature, timestamp, replay) and claim its id.

    Args:
        raw: The request body.
        headers: The request headers.
        secret: HMAC secret (``None``: ``Settings.webhook_secret``).
        tolerance_s: Accepted clock skew in seconds (``None``: ``Settings.webhook_tolerance_s``).
        deliveries: Accepted-delivery store (``None``: a :class:`DeliveryStore` under ``Settings.home``).
        clock: Unix time now.

    Returns:
        ``(change, store)``: the registry change (``None``: a well-formed event that is not mapped)
        and the store the delivery id was claimed in.

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
    now = clock()
    check_timestamp(timestamp, now, tol)
    change = parse_delivery(body)
    store = deliveries or DeliveryStore(retention_s=max(2 * tol, 60))
    if not store.claim(delivery_id, now):
        raise WebhookRejected(409, f"{DELIVERY_ID_HEADER}={delivery_id} was already received (replay)")
    return change, store


def _deliver(change: RegistryChange, delivery_id: str, rules: Sequence[Rule] | None, sink: Sink | None,
             store: DeliveryStore) -> Any:
    """Hand each mapped action of ``change`` to the sink; the response to the delivery.

    A sink failure releases the delivery id (MLflow's retry is then accepted) and answers 502 with
    what was done before it.
    """
    from tritonflow_plugin.event_mapping import load_mapping

    actions = actions_for(change, rules if rules is not None else load_mapping())
    target = sink or DagRunSink()
    done: list[dict[str, str]] = []
    try:
        for action in actions:
            # Two rules may start the same DAG for one delivery: each gets its own run id.
            same_dag = len([d for d in done if d["dag_id"] == action.dag_id])
            key = f"{delivery_id}.{same_dag + 1}" if same_dag else delivery_id
            done.append({"dag_id": action.dag_id, "result": target.deliver(action, key)})
    except Exception as exc:
        store.release(delivery_id)
        log.error("MLflow webhook delivery %s: delivering actions failed: %s", delivery_id, exc)
        return JSONResponse(
            status_code=502, content={"detail": f"delivering actions failed: {exc}", "done": done}
        )
    log.info("MLflow webhook delivery %s: %s -> %s", delivery_id, change, done)
    return {"status": "accepted", "delivery_id": delivery_id, "change": change.to_dict(), "actions": done}


def create_app(
    *,
    secret: str | None = None,
    tolerance_s: float | None = None,
    rules: Sequence[Rule] | None = None,
    sink: Sink | None = None,
    deliveries: DeliveryStore | None = None,
    clock: Callable[[], float] = time.time,
):
    """Build the FastAPI app serving ``POST /webhooks/mlflow`` and ``GET /health``.

    Every argument defaults to settings (read per request, so a changed secret applies without
    a restart): ``Settings.webhook_secret``, ``Settings.webhook_tolerance_s``, the mapping of
    ``Settings.event_mapping_path``, :class:`DagRunSink`, :class:`DeliveryStore`.

    Responses: 200 ``{"status": "accepted", "actions": [...]}`` or ``{"status": "ignored"}``;
    4xx ``{"detail": reason}``; 502 when a sink failed (the delivery id is released so MLflow's
    retry is accepted).
    """
    app = FastAPI(title="tritonflow MLflow webhook receiver", docs_url=None, redoc_url=None)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(WEBHOOK_PATH)
    async def receive(request: Request) -> Any:
        raw = await request.body()
        delivery_id = request.headers.get(DELIVERY_ID_HEADER, "")
        try:
            change, store = _admit(raw, request.headers, secret=secret, tolerance_s=tolerance_s,
                                   deliveries=deliveries, clock=clock)
        except WebhookRejected as exc:
            log.warning("MLflow webhook delivery %r refused (%s): %s", delivery_id, exc.status, exc.reason)
            return JSONResponse(status_code=exc.status, content={"detail": exc.reason})
        if change is None:
            log.info("MLflow webhook delivery %s ignored (event not mapped)", delivery_id)
            return {"status": "ignored", "delivery_id": delivery_id}
        return _deliver(change, delivery_id, rules, sink, store)

    return app
