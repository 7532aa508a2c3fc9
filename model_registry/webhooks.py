"""tritonflow's webhook on an MLflow server: register it idempotently, list, test, explain refusals.

Backs ``tritonflow registry webhook register|list|test``. Every function takes the
``mlflow.MlflowClient`` (pointed at the MLflow *server*: webhooks need its SQL store), the
receiver URL, the secret and the events as arguments; nothing is read from settings here.

MLflow 3 refuses, at creation and again at every delivery, webhook URLs whose scheme is not in
``MLFLOW_WEBHOOK_ALLOWED_SCHEMES`` (default ``https``) or whose host resolves to a loopback,
private or link-local address unless ``MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true``. Both are variables
of the MLflow server process, not of the client. :func:`explain_refusal` turns MLflow's refusal into
what fixes it (:data:`SERVER_VARIABLES`, and the trade-off) and :class:`WebhookRefusedError`
carries that text.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import urllib.parse
from typing import Any, Sequence

from ground.exceptions import DataError, RegistryError, ServiceUnavailableError

#: Name tritonflow gives its webhook (MLflow: letters, digits, ``.``, ``_``, ``-``).
DEFAULT_WEBHOOK_NAME = "tritonflow"
#: Description stored with the webhook.
DESCRIPTION = "tritonflow: registry changes start the mapped Airflow DAGs"
#: MLflow server variables that let it deliver to an ``http`` receiver on a private address.
SERVER_VARIABLES = {
    "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
    "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
    "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": "<a Fernet key, the same on every restart and worker>",
}
#: Fragments of MLflow's messages (``mlflow.utils.validation._validate_webhook_url``,
#: ``mlflow.webhooks.ssrf``) -> which server variable lifts the check.
_REFUSALS = (
    ("Invalid webhook URL scheme", "MLFLOW_WEBHOOK_ALLOWED_SCHEMES"),
    ("must not resolve to a non-public IP address", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS"),
    ("is not a public IP address", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS"),
)


class WebhookRefusedError(DataError):
    """MLflow refused a webhook URL (its SSRF rules); the message says which fix applies."""


@dataclasses.dataclass(frozen=True)
class Registration:
    """What :func:`register_webhook` did.

    Attributes:
        webhook: The MLflow webhook now in place (``mlflow.entities.webhook.Webhook``).
        created: ``True`` when it was created, ``False`` when an existing one was updated.
        removed: Ids of further webhooks for the same URL that were deleted (each would have
            delivered every change once more, starting the DAGs twice).
    """

    webhook: Any
    created: bool
    removed: tuple[str, ...] = ()


def check_receiver_url(url: str) -> str:
    """Return ``url`` stripped, or refuse one MLflow could never deliver to.

    Raises:
        DataError: not ``http(s)://host/...``; the message names the value and the expectation.
    """
    value = (url or "").strip()
    parsed = urllib.parse.urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise DataError(f"receiver url={url!r} is invalid: expected http(s)://host[:port]/tritonflow/webhooks/mlflow")
    return value


def _private_host(url: str) -> bool:
    """True when the URL's host is, or resolves to, a non-global address (or cannot be resolved)."""
    host = urllib.parse.urlparse(url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return True
    return any(not ipaddress.ip_address(str(a).split("%")[0]).is_global for a in addresses)


def explain_refusal(url: str, message: str) -> str | None:
    """Say why MLflow refused ``url`` and what fixes it, or ``None`` if ``message`` is no SSRF refusal.

    Args:
        url: The receiver URL MLflow refused.
        message: MLflow's error text (from an exception or a test result).
    """
    if not any(fragment in message for fragment, _ in _REFUSALS):
        return None
    needed = {var for fragment, var in _REFUSALS if fragment in message}
    if urllib.parse.urlparse(url).scheme == "http" and _private_host(url):
        needed.add("MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS")  # the next check MLflow would fail
    needed.add("MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY")
    lines = "\n".join(f"      {var}={SERVER_VARIABLES[var]}" for var in SERVER_VARIABLES if var in needed)
    return (
        f"MLflow refused the webhook URL {url}: {message.strip()}\n"
        "MLflow checks webhook URLs on its server, at creation and at every delivery; two fixes:\n"
        "  1. receiver inside the cluster or on loopback: set on the MLflow *server* process, then restart it:\n"
        f"{lines}\n"
        "     Trade-off: this turns off MLflow's SSRF protection for every webhook of that server; whoever may\n"
        "     create webhooks there can make it POST to loopback, private addresses and cloud metadata\n"
        "     endpoints (169.254.169.254), and http sends the signed payloads in clear. Only for a server\n"
        "     whose API is reachable by trusted users only. The key keeps stored webhook secrets readable\n"
        "     after a restart (without it MLflow draws a new key per process and deliveries fail).\n"
        "  2. keep the protection: serve the receiver over https on a public DNS name (a TLS proxy in front\n"
        "     of the Airflow api-server) and pass --url https://<public-name>/tritonflow/webhooks/mlflow."
    )


def _refused(url: str, exc: Exception, call: str) -> Exception:
    """The tritonflow error for an exception of an MLflow webhook call."""
    from mlflow.exceptions import MlflowException

    text = getattr(exc, "message", None) or str(exc)
    explained = explain_refusal(url, text)
    if explained:
        return WebhookRefusedError(explained)
    if isinstance(exc, MlflowException):
        return RegistryError(f"MLflow refused {call} for url={url!r}: {text}")
    return ServiceUnavailableError(f"MLflow did not answer {call} for url={url!r}: {type(exc).__name__}: {text}")


def list_webhooks(client: Any) -> list[Any]:
    """Every webhook of the MLflow server (all pages), oldest first.

    Raises:
        ServiceUnavailableError: MLflow did not answer.
    """
    out: list[Any] = []
    token = None
    try:
        while True:
            page = client.list_webhooks(max_results=100, page_token=token)
            out.extend(page)
            token = page.token
            if not token:
                break
    except Exception as exc:  # noqa: BLE001 - connection errors and MLflow errors alike
        raise _refused("", exc, "list_webhooks") from None
    return sorted(out, key=lambda w: (w.creation_timestamp, w.webhook_id))


def webhooks_for(client: Any, url: str) -> list[Any]:
    """The webhooks of the server whose URL is exactly ``url``, oldest first."""
    return [w for w in list_webhooks(client) if w.url == url]


def register_webhook(client: Any, url: str, secret: str, events: Sequence[str], *,
                     name: str = DEFAULT_WEBHOOK_NAME) -> Registration:
    """Create, or update in place, the one webhook delivering ``events`` to ``url`` signed with ``secret``.

    Idempotent: the oldest webhook already naming ``url`` is updated (name, events, secret,
    status ``ACTIVE``); any further one for that URL is deleted, since each would start the DAGs
    once more per change.

    Args:
        client: ``mlflow.MlflowClient`` of the MLflow server.
        url: The receiver (``.../tritonflow/webhooks/mlflow``).
        secret: HMAC secret the receiver verifies (``TRITONFLOW_WEBHOOK_SECRET``).
        events: ``entity.action`` strings (the receiver's mapped events).
        name: Webhook name.

    Raises:
        DataError: empty secret or events, or a malformed URL.
        WebhookRefusedError: MLflow refused the URL; the message says what fixes it.
        RegistryError: MLflow refused for another reason (message quoted).
    """
    url = check_receiver_url(url)
    if not secret:
        raise DataError("webhook secret is empty: expected TRITONFLOW_WEBHOOK_SECRET or --secret "
                        "(the receiver refuses unsigned deliveries)")
    if not events:
        raise DataError("events=[]: expected at least one entity.action event")
    existing = webhooks_for(client, url)
    try:
        if not existing:
            hook = client.create_webhook(name=name, url=url, events=list(events), description=DESCRIPTION,
                                         secret=secret, status="ACTIVE")
            return Registration(webhook=hook, created=True)
        first, *extra = existing
        hook = client.update_webhook(first.webhook_id, name=name, url=url, events=list(events),
                                     description=DESCRIPTION, secret=secret, status="ACTIVE")
        for other in extra:
            client.delete_webhook(other.webhook_id)
    except Exception as exc:  # noqa: BLE001 - MLflow refusals and connection errors are both translated
        raise _refused(url, exc, "create_webhook" if not existing else "update_webhook") from None
    return Registration(webhook=hook, created=False, removed=tuple(w.webhook_id for w in extra))


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """The receiver's answer to MLflow's test delivery.

    Attributes:
        webhook_id: Webhook tested.
        url: Its URL.
        event: Event whose example payload MLflow sent.
        success: MLflow's verdict (an answer below 400).
        status: HTTP status the receiver answered (``None`` when MLflow could not send).
        body: The receiver's answer body.
        error: MLflow's error text when it could not send (with the fix when it is a refusal).
    """

    webhook_id: str
    url: str
    event: str
    success: bool
    status: int | None
    body: str
    error: str


def probe_webhook(client: Any, event: str, *, url: str | None = None, webhook_id: str | None = None) -> ProbeResult:
    """Have MLflow send its example payload of ``event`` to the webhook for ``url`` (or ``webhook_id``).

    MLflow signs it with the stored secret, so a 200 from the receiver proves URL, secret and
    server settings together. The example payload names model ``example_model`` version 1: a
    mapped event starts its DAGs for that model, hence the CLI's default ``model_version_tag.set``.

    Raises:
        DataError: neither ``url`` nor ``webhook_id``, or ``event`` is no MLflow event.
        RegistryError: no webhook for ``url``, or MLflow refused the call.
    """
    from mlflow.entities.webhook import WebhookEvent
    from mlflow.exceptions import MlflowException

    try:
        mlflow_event = WebhookEvent.from_str(event)  # type: ignore[arg-type]  # checked right here
    except (MlflowException, ValueError) as exc:
        raise DataError(f"event={event!r} is invalid: expected MLflow's entity.action ({exc})") from None
    if webhook_id is None:
        if not url:
            raise DataError("probe_webhook: expected url or webhook_id")
        found = webhooks_for(client, check_receiver_url(url))
        if not found:
            raise RegistryError(f"no MLflow webhook has url={url!r}: expected one made by "
                                "'tritonflow registry webhook register' (or pass --id)")
        webhook_id, url = found[0].webhook_id, found[0].url
    try:
        if url is None:
            url = client.get_webhook(webhook_id).url
        result = client.test_webhook(webhook_id, event=mlflow_event)
    except Exception as exc:  # noqa: BLE001
        raise _refused(url or "", exc, "test_webhook") from None
    error = result.error_message or ""
    return ProbeResult(webhook_id=webhook_id, url=url or "", event=event, success=bool(result.success),
                       status=result.response_status, body=result.response_body or "",
                       error=(explain_refusal(url or "", error) or error) if error else "")


def describe(hook: Any) -> dict[str, Any]:
    """JSON form of an MLflow webhook (no secret)."""
    return {"id": hook.webhook_id, "name": hook.name, "url": hook.url, "status": str(hook.status),
            "events": [str(e) for e in hook.events]}
