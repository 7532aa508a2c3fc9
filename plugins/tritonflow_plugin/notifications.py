"""Failure notifications for tritonflow DAGs.

:class:`TritonflowFailureNotifier` always logs the failure (DAG, task, run, try, error) and, when
``Settings.alert_webhook_url`` (``TRITONFLOW_ALERT_WEBHOOK_URL``) or the ``webhook_url`` argument is
set, POSTs the same facts as JSON to that URL (Slack/Teams/Alertmanager-compatible receivers take
a JSON body with a ``text`` field). A failing webhook is logged, never raised, so the alert path
cannot mask the task failure.

Usage::

    default_args = {"on_failure_callback": TritonflowFailureNotifier()}
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from airflow.sdk import BaseNotifier

log = logging.getLogger(__name__)


def failure_message(context: Mapping[str, Any]) -> dict[str, Any]:
    """Return the JSON-serialisable facts of a failure from an Airflow callback context.

    Returns:
        ``{"text", "dag_id", "task_id", "run_id", "try_number", "logical_date", "error",
        "log_url"}``; missing facts are ``None``.
    """
    ti = context.get("ti") or context.get("task_instance")
    dag = context.get("dag")
    dag_id = getattr(ti, "dag_id", None) or getattr(dag, "dag_id", None)
    task_id = getattr(ti, "task_id", None)
    run_id = getattr(ti, "run_id", None) or context.get("run_id")
    error = context.get("exception") or context.get("reason")
    logical_date: Any = context.get("logical_date")
    msg = {
        "dag_id": dag_id,
        "task_id": task_id,
        "run_id": run_id,
        "try_number": getattr(ti, "try_number", None),
        "logical_date": logical_date.isoformat() if hasattr(logical_date, "isoformat") else logical_date,
        "error": f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error,
        "log_url": getattr(ti, "log_url", None),
    }
    where = f"{dag_id}.{task_id}" if task_id else f"{dag_id}"
    msg["text"] = f"tritonflow: {where} failed (run {run_id}): {msg['error']}"
    return msg


def post_json(url: str, body: Mapping[str, Any], timeout_s: float) -> int:
    """POST ``body`` as JSON to ``url``; return the HTTP status code.

    Raises:
        OSError / urllib.error.URLError: the receiver is unreachable (callers log it).
    """
    import urllib.request

    req = urllib.request.Request(
        url,
        data=json.dumps(body, default=str).encode("utf-8"),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (configured URL)
        return resp.status


class TritonflowFailureNotifier(BaseNotifier):
    """Log every failure and post it to a webhook when one is configured.

    Args:
        webhook_url: Receiver URL (default ``Settings.alert_webhook_url``; empty: log only).
        timeout_s: Seconds to wait for the receiver (default ``Settings.alert_timeout_s``).
    """

    template_fields = ("webhook_url",)

    def __init__(self, webhook_url: str | None = None, timeout_s: float | None = None) -> None:
        super().__init__()
        self.webhook_url = webhook_url
        self.timeout_s = timeout_s
        #: Last message sent (for inspection in tests and logs).
        self.last_message: dict[str, Any] | None = None

    def notify(self, context: Any) -> None:
        """Log the failure, then post it if a webhook URL is configured."""
        from ground.settings import get_settings

        settings = get_settings()
        url = self.webhook_url if self.webhook_url is not None else settings.alert_webhook_url
        timeout = self.timeout_s if self.timeout_s is not None else settings.alert_timeout_s
        message = failure_message(context)
        self.last_message = message
        log.error("%s", message["text"])
        if not url:
            return
        try:
            status = post_json(url, message, timeout)
        except Exception as exc:  # the alert must never hide the original failure
            log.error("failure notification to %s failed: %s", url, exc)
            return
        if status >= 400:
            log.error("failure notification to %s answered HTTP %s", url, status)
