"""Decisions at a canary's pauses (promotion policy ``approve-steps``): one Required Actions request per pause.

The canary stays one task (``canary``): it holds the model's promotion lease for the whole canary
and keeps checking the challenger while a pause waits. Airflow enables the answer buttons of a
Required Actions request only while its task instance is *deferred* or *awaiting input* (a running
task's request shows disabled buttons), and keeps one request per task instance, whose subject and
body a second ask cannot change. So each pause is asked by a task of its own:
:class:`StepDecisionOperator`, mapped over the pause numbers the canary may reach
(:func:`pause_numbers`: steps x (1 + extensions), none unless the policy is ``approve-steps``).

Each ``step_decision`` task waits in the triggerer (:class:`PauseTrigger`, no worker slot) until the
canary opens its pause in the coordination database (:mod:`tritonflow.pipelines.canary_pauses`),
then writes its request (the automatic verdict and its checks, the options, the default and its
time) and defers again, so that the UI enables its buttons. A person's answer (the UI's
**Continue** / **Hold** / **Roll back**, or ``tritonflow decide``) resumes the task, which writes it to
the pause, where the canary reads it within one analysis interval. When the canary decides first
(the pause's timeout takes the default, or a check fails while it waits), the trigger writes that
decision as the request's response (nobody's), so the page shows no stale question and the run ends
with its canary. A task whose pause is never reached (the canary ended before) is skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

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


class PauseTrigger(BaseTrigger):
    """Wait for pause ``number`` of ``key`` to open (``wait_for="opened"``) or to be decided (``"decided"``).

    Args:
        url: The coordination database URL.
        key: The run's pause key (``<dag_id>/<run_id>``).
        number: The pause's number.
        wait_for: ``"opened"``: fire once the pause is no longer waiting to open (``{"state"}``);
            ``"decided"``: fire with a person's answer to the task's request (the request's response,
            as Airflow's own HITL trigger reports it), or once the canary decided the pause without
            it (the decision is then written as the request's response) or ended.
        ti_id: The asking task instance (``"decided"`` only).
        poll_s: Seconds between two looks.
        until: Unix time after which the wait ends as if the canary had ended (``None``: never).
    """

    def __init__(self, url: str, key: str, number: int, wait_for: str = "opened", ti_id: str | None = None,
                 poll_s: float = POLL_S, until: float | None = None) -> None:
        super().__init__()
        self.url, self.key, self.number, self.wait_for = url, key, int(number), wait_for
        self.ti_id, self.poll_s, self.until = ti_id, float(poll_s), until

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and kwargs, as the triggerer stores them."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"url": self.url, "key": self.key, "number": self.number, "wait_for": self.wait_for,
                 "ti_id": self.ti_id, "poll_s": self.poll_s, "until": self.until})

    def _status(self) -> dict[str, Any]:
        from ground.coordination import CoordinationStore
        from tritonflow.pipelines.canary_pauses import pause_status

        status = pause_status(CoordinationStore(self.url), self.key, self.number)
        if status["state"] in ("waiting", "open") and self.until is not None and time.time() > self.until:
            status["state"] = "ended"
        return {"state": status["state"], "decision": (status["pause"] or {}).get("decision")}

    async def _response(self) -> dict[str, Any] | None:
        """The response of the task's request, when one was given (the trigger's own included)."""
        from airflow.sdk.execution_time.hitl import get_hitl_detail_content_detail
        from asgiref.sync import sync_to_async

        resp = await sync_to_async(get_hitl_detail_content_detail)(ti_id=UUID(str(self.ti_id)))
        if not (resp.response_received and resp.chosen_options):
            return None
        by = resp.responded_by_user
        return {"chosen_options": list(resp.chosen_options), "params_input": resp.params_input or {},
                "responded_at": resp.responded_at,
                "responded_by_user": {"id": by.id, "name": by.name} if by is not None else None}

    async def _decided_by_the_canary(self, decision: dict[str, Any]) -> dict[str, Any]:
        """Write the canary's decision as the request's response (nobody's); the event to resume with."""
        from airflow.sdk.execution_time.hitl import update_hitl_detail_response
        from asgiref.sync import sync_to_async

        from tritonflow.pipelines.canary_pauses import OPTION_LABELS

        try:
            await sync_to_async(update_hitl_detail_response)(
                ti_id=UUID(str(self.ti_id)), chosen_options=[OPTION_LABELS[decision["decision"]]],
                params_input={COMMENT_PARAM: None})
        except Exception as exc:  # answered meanwhile: that answer is late, the canary's decision stands
            self.log.warning("pause %s of %s: could not record the canary's decision on the request: %s",
                             self.number, self.key, exc)
        return {"pause_state": "closed", "decision": decision}

    async def run(self) -> AsyncIterator[Any]:
        """Poll the request's response (``decided``) and the pause until one of them says what happened."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                if self.wait_for == "decided":
                    response = await self._response()
                    if response is not None:
                        yield TriggerEvent(response)
                        return
                status = await asyncio.to_thread(self._status)
            except Exception as exc:  # database or API unreachable: keep waiting, never a decision
                self.log.warning("pause %s of %s: could not read its state (%s); still waiting",
                                 self.number, self.key, exc)
                continue
            if self.wait_for == "opened" and status["state"] != "waiting":
                yield TriggerEvent({"state": status["state"]})
                return
            if self.wait_for == "decided" and status["state"] == "closed":
                yield TriggerEvent(await self._decided_by_the_canary(status["decision"]))
                return
            if self.wait_for == "decided" and status["state"] == "ended":
                yield TriggerEvent({"pause_state": "ended"})
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
        self.defer(trigger=PauseTrigger(database_url(settings), self._key(context), self.number,
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
        """Write the pause's request (verdict, checks, options, default, deadline) and defer until answered.

        Deferred rather than parked (Airflow 3.3's *awaiting input*): the trigger also sees the
        canary decide the pause without an answer, and then ends the request and the task.
        """
        from airflow.providers.standard.operators import hitl as hitl_operators

        from ground.coordination import database_url
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
        ti_id = context["task_instance"].id
        hitl_operators.upsert_hitl_detail(ti_id=ti_id, options=self.options, subject=self.subject, body=self.body,
                                          defaults=self.defaults, multiple=False, params=self.serialized_params,
                                          assigned_users=self.assigned_users)
        self.log.info("pause %s asked: %s", self.number, self.subject)
        # the canary decides at its deadline; a minute later a canary that is gone ends the wait
        self.defer(trigger=PauseTrigger(database_url(settings), self._key(context), self.number, wait_for="decided",
                                        ti_id=str(ti_id), until=float(pause["deadline"]) + 60.0),
                   method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Write a person's answer to the pause (the canary applies it), or end with the canary's decision."""
        from airflow.sdk.exceptions import AirflowSkipException

        from ground.coordination import coordination_store
        from tritonflow.pipelines.canary_pauses import LABEL_DECISIONS, answer_pause

        if event.get("pause_state") == "closed":
            decided = event["decision"]
            self.log.info("pause %s: the canary decided %s (%s) before anyone answered", self.number,
                          decided["decision"], decided.get("source"))
            return {"pause": self.number, "decision": decided["decision"], "by": "nobody", "taken": False,
                    "why": f"decided by the canary ({decided.get('source')}: {decided.get('note') or ''})"}
        if event.get("pause_state") == "ended":
            raise AirflowSkipException(f"pause {self.number}: the canary ended before it was decided")
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


__all__ = ["PAUSE_TASK_ID", "POLL_S", "PauseTrigger", "StepDecisionOperator", "pause_numbers"]
