"""Decisions at a canary's pauses (promotion policy ``approve-steps``): one Required Actions request per pause.

The canary stays one task (``canary``): it holds the model's promotion lease for the whole canary
and keeps checking the challenger while a pause waits. Airflow enables the answer buttons of a
Required Actions request only while its task instance is *deferred* or *awaiting input* (a running
task's request shows disabled buttons), and keeps one request per task instance, whose subject and
body a second ask cannot change. So each pause is asked by a task of its own:
:class:`StepDecisionOperator`, mapped over the pause numbers the canary may reach
(:func:`pause_numbers`: steps x (1 + extensions), none unless the policy is ``approve-steps``).

Each ``step_decision`` task waits in the triggerer (:class:`PauseOpenedTrigger`, no worker slot)
until the canary opens its pause in the coordination database
(:mod:`tritonflow.pipelines.canary_pauses`), then writes its request (the automatic verdict and its
checks, the options, the default and its time) and parks, awaiting input. The answer (the UI's
**Continue** / **Hold** / **Roll back**, or ``tritonflow decide``) is written to the pause, where the
canary reads it within one analysis interval; no answer by the pause's deadline takes the default.
A task whose pause is never reached (the canary ended before) is skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator

from tritonflow.pipelines.canary_pauses import PAUSE_TASK_ID
from tritonflow_plugin.approval import COMMENT_PARAM, with_comment_param

try:  # The trigger needs Airflow core (the triggerer); the DAG side only needs the class path.
    from airflow.triggers.base import BaseTrigger, TriggerEvent
except ImportError:  # pragma: no cover - core not installed (task-SDK-only worker)
    BaseTrigger = object  # type: ignore[assignment,misc]
    TriggerEvent = None  # type: ignore[assignment,misc]

#: Seconds between two looks of a waiting task at the coordination database.
POLL_S = 3.0


def pause_numbers(plan: dict, policy: str, steps: int, max_extensions: int) -> list[int]:
    """The pause numbers of ``plan``'s canary: ``1..steps x (1 + max_extensions)`` under ``approve-steps``.

    None for another policy, a no-op, a dry run, or a challenger that is the champion (no canary).
    """
    from tritonflow.pipelines.canary_pauses import pause_slots

    if policy != "approve-steps" or plan.get("noop") or plan.get("dry_run") \
            or plan.get("champion") == plan.get("challenger"):
        return []
    return list(range(1, pause_slots(steps, max_extensions) + 1))


class PauseOpenedTrigger(BaseTrigger):
    """Wait until pause ``number`` of ``key`` opens, or the canary ends, or ``until`` passes.

    Args:
        url: The coordination database URL.
        key: The run's pause key (``<dag_id>/<run_id>``).
        number: The pause's number.
        poll_s: Seconds between two looks.
        until: Unix time after which the wait ends as if the canary had ended (``None``: never).
    """

    def __init__(self, url: str, key: str, number: int, poll_s: float = POLL_S, until: float | None = None) -> None:
        super().__init__()
        self.url, self.key, self.number, self.poll_s, self.until = url, key, int(number), float(poll_s), until

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and kwargs, as the triggerer stores them."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"url": self.url, "key": self.key, "number": self.number, "poll_s": self.poll_s, "until": self.until})

    def _state(self) -> str:
        from ground.coordination import CoordinationStore
        from tritonflow.pipelines.canary_pauses import pause_status

        return pause_status(CoordinationStore(self.url), self.key, self.number)["state"]

    async def run(self) -> AsyncIterator[Any]:
        """Yield ``{"state": "open" | "closed" | "ended"}`` once the pause is no longer ``waiting``."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                state = await asyncio.to_thread(self._state)
            except Exception as exc:  # database unreachable: keep waiting, never a decision
                self.log.warning("pause %s of %s: could not read its state (%s); still waiting",
                                 self.number, self.key, exc)
                continue
            if state == "waiting" and self.until is not None and time.time() > self.until:
                state = "ended"
            if state != "waiting":
                yield TriggerEvent({"state": state})
                return


class StepDecisionOperator(HITLOperator):
    """Ask a person at one pause of the run's canary: continue, hold or roll back.

    Args:
        number: The pause's number (mapped: one task per pause the canary may reach).
        wait_until_s: Seconds after the task starts that it stops waiting for its pause (the
            canary task's longest run).
        **kwargs: ``HITLOperator`` arguments; ``subject`` and ``options`` have defaults here
            (both are replaced by the pause's when it opens).
    """

    def __init__(self, *, number: int, wait_until_s: float, **kwargs: Any) -> None:
        from tritonflow.pipelines.canary_pauses import OPTION_LABELS

        kwargs.setdefault("subject", "Canary pause")
        kwargs.setdefault("options", list(OPTION_LABELS.values()))
        kwargs["params"] = with_comment_param(kwargs.get("params"))
        super().__init__(**kwargs)
        self.number = number
        self.wait_until_s = wait_until_s

    def _key(self, context: Any) -> str:
        from tritonflow.pipelines.canary_pauses import pause_key

        ti = context["ti"]
        return pause_key(ti.dag_id, ti.run_id)

    def execute(self, context: Any) -> Any:
        """Ask at once when the pause is open; else wait for it in the triggerer."""
        from ground.coordination import coordination_store, database_url
        from ground.settings import get_settings

        settings = get_settings()
        self._ask_or_skip(context, coordination_store(settings))
        self.defer(trigger=PauseOpenedTrigger(database_url(settings), self._key(context), self.number,
                                              until=time.time() + self.wait_until_s),
                   method_name="pause_opened")

    def pause_opened(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """The trigger fired: ask when the pause is open, else skip (the canary ended, or decided it)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from ground.coordination import coordination_store

        self._ask_or_skip(context, coordination_store())
        raise AirflowSkipException(f"pause {self.number}: not opened when the wait ended")

    def _ask_or_skip(self, context: Any, store: Any) -> None:
        """Ask (parks: raises) when the pause is open; skip (raises) when decided or ended; else return."""
        from airflow.sdk.exceptions import AirflowSkipException

        from tritonflow.pipelines.canary_pauses import pause_status

        status = pause_status(store, self._key(context), self.number)
        if status["state"] == "open":
            self._ask(context, status["pause"], status["row"])
        if status["state"] == "closed":
            decision = status["pause"]["decision"]
            raise AirflowSkipException(f"pause {self.number} was decided before anyone was asked: "
                                       f"{decision['decision']} ({decision['source']})")
        if status["state"] == "ended":
            raise AirflowSkipException(f"pause {self.number} not reached: the canary ended "
                                       f"({status['row'].get('ended') or 'never started'})")

    def _ask(self, context: Any, pause: dict[str, Any], row: dict[str, Any]) -> None:
        """Write the pause's request (verdict, checks, options, default, deadline) and park."""
        from ground.settings import get_settings
        from tritonflow.pipelines.canary_pauses import OPTION_LABELS, pause_request
        from tritonflow.pipelines.promotion_policy import approvers
        from tritonflow_plugin.links import mlflow_base_url

        settings = get_settings()
        request = pause_request(pause, model=row["model"], challenger=row["challenger"],
                                champion=row.get("champion"), mlflow_url=mlflow_base_url(settings))
        self.subject, self.body = request["subject"], request["body"]
        self.options = [OPTION_LABELS[d] for d in pause["options"]]
        self.defaults = [OPTION_LABELS[pause["default"]]]
        users = approvers(row["model"], settings=settings)
        self.assigned_users = [{"id": u, "name": u} for u in users] or None
        # a little after the canary's own deadline: the canary takes the default first
        self.response_timeout = timedelta(seconds=max(1.0, float(pause["deadline"]) - time.time() + 10.0))
        super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Write the answer (or the timeout's default) to the pause; the canary applies it."""
        from ground.coordination import coordination_store
        from tritonflow.pipelines.canary_pauses import LABEL_DECISIONS, answer_pause

        super().execute_complete(context, event)  # validates the options and the form
        chosen = list(event.get("chosen_options") or [])
        decision = LABEL_DECISIONS.get(chosen[0]) if chosen else None
        by = event.get("responded_by_user") or {}
        who = str(by.get("name") or by.get("id") or "") if isinstance(by, dict) else str(by)
        at: Any = event.get("responded_at")
        comment = str((event.get("params_input") or {}).get(COMMENT_PARAM) or "").strip()
        out = answer_pause(coordination_store(), self._key(context), self.number, str(decision),
                           by=who, at=at.isoformat() if hasattr(at, "isoformat") else str(at or ""), note=comment)
        if out["taken"]:
            self.log.info("pause %s: %s by %s", self.number, decision, who or "nobody (the default)")
        else:
            self.log.warning("pause %s: the answer %s by %s was not applied: %s", self.number, decision,
                             who or "nobody", out["why"])
        return {"pause": self.number, "decision": decision, "by": who or "nobody", **out}


__all__ = ["PAUSE_TASK_ID", "POLL_S", "PauseOpenedTrigger", "StepDecisionOperator", "pause_numbers"]
