"""Failure and missed-deadline notifications for tritonflow DAGs.

:class:`TritonflowFailureNotifier` always logs the failure (DAG, task, run, try, error) and, when
``Settings.alert_webhook_url`` (``TRITONFLOW_ALERT_WEBHOOK_URL``) or the ``webhook_url`` argument is
set, POSTs the same facts as JSON to that URL (Slack/Teams/Alertmanager-compatible receivers take
a JSON body with a ``text`` field). A failing webhook is logged, never raised, so the alert path
cannot mask the task failure. The same notifier is the callback of the runs' deadline alerts
(:mod:`tritonflow_plugin.deadlines`): it then reports the run that overran, in the triggerer.

Usage::

    default_args = {"on_failure_callback": TritonflowFailureNotifier()}
    deadline = DeadlineAlert(..., callback=AsyncCallback(TritonflowFailureNotifier, kwargs={"expected": "..."}))
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


def deadline_message(context: Mapping[str, Any], expected: str) -> dict[str, Any]:
    """The JSON-serialisable facts of a missed deadline from a deadline alert's context.

    Args:
        context: ``{"dag_run": {...}, "deadline": {"id", "deadline_time"}}`` as Airflow's deadline
            alert hands it to its callback.
        expected: How the run's expected time was computed (``run_deadlines.expected_run``).

    Returns:
        ``{"text", "dag_id", "run_id", "state", "deadline", "expected"}``; missing facts are ``None``.
    """
    run = dict(context.get("dag_run") or {})
    deadline = dict(context.get("deadline") or {})
    when: Any = deadline.get("deadline_time")
    msg = {"dag_id": run.get("dag_id"), "run_id": run.get("dag_run_id") or run.get("run_id"),
           "state": run.get("state"), "deadline": when.isoformat() if hasattr(when, "isoformat") else when,
           "expected": expected}
    msg["text"] = (f"tritonflow: run {msg['run_id']} of {msg['dag_id']} overran its deadline {msg['deadline']} "
                   f"(state {msg['state']}; expected {expected})")
    return msg


class TritonflowFailureNotifier(BaseNotifier):
    """Log every failure (or missed deadline) and post it to a webhook when one is configured.

    As a task's ``on_failure_callback`` it reports the failure; as the callback of a deadline alert
    (``AsyncCallback(TritonflowFailureNotifier, kwargs={"expected": ...})``, run in the triggerer)
    it reports the run that overran.

    Args:
        webhook_url: Receiver URL (default ``Settings.alert_webhook_url``; empty: log only).
        timeout_s: Seconds to wait for the receiver (default ``Settings.alert_timeout_s``).
        expected: For a deadline alert: how the run's expected time was computed.
        context: The deadline alert's context (Airflow passes it).
    """

    template_fields = ("webhook_url",)

    def __init__(self, webhook_url: str | None = None, timeout_s: float | None = None, expected: str = "",
                 context: Any = None) -> None:
        super().__init__(context)
        self.webhook_url = webhook_url
        self.timeout_s = timeout_s
        self.expected = expected
        #: Last message sent (for inspection in tests and logs).
        self.last_message: dict[str, Any] | None = None

    def notify(self, context: Any) -> None:
        """Log the failure, then post it if a webhook URL is configured."""
        self.send(failure_message(context))

    async def async_notify(self, context: Any) -> None:
        """Log the missed deadline, then post it if a webhook URL is configured (off the event loop).

        A run that had already failed is not reported again: Airflow keeps a deadline until the
        run succeeds, and the failure was reported when it happened.
        """
        import asyncio

        message = deadline_message(context, self.expected)
        if message["state"] == "failed":
            log.info("run %s of %s failed before its deadline: its failure was reported then", message["run_id"],
                     message["dag_id"])
            return
        await asyncio.to_thread(self.send, message)

    def send(self, message: dict[str, Any]) -> None:
        """Log ``message["text"]`` as an error and post ``message`` to the webhook; never raises."""
        from ground.settings import get_settings

        settings = get_settings()
        url = self.webhook_url if self.webhook_url is not None else settings.alert_webhook_url
        timeout = self.timeout_s if self.timeout_s is not None else settings.alert_timeout_s
        self.last_message = message
        kind = "deadline" if "expected" in message else "failure"
        log.error("%s", message["text"])
        if not url:
            return
        try:
            status = post_json(url, message, timeout)
        except Exception as exc:  # the alert must never hide the original failure
            log.error("%s notification to %s failed: %s", kind, url, exc)
            return
        if status >= 400:
            log.error("%s notification to %s answered HTTP %s", kind, url, status)
