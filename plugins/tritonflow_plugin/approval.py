"""The approval before a canary: Airflow's ``ApprovalOperator``, skipped at once under policy ``auto``.

:class:`CanaryApprovalOperator` reads the resolved versions of its DAG run (task
``resolve_versions``) and the model's promotion policy
(:func:`tritonflow.pipelines.promotion_policy.promotion_policy`). Under ``auto``, for a no-op or a
dry run, it returns at once and the canary goes on as before. Under ``approve`` and
``approve-steps`` (whose canary then also pauses at each step: :mod:`tritonflow_plugin.step_decisions`)
it fills subject and body (parity, p99 and shadow figures, the drift event, links to both MLflow
versions), assigns the model's owners and waits on
the UI's Required Actions page (or ``/api/v2/hitl-details/...``) for at most
``TRITONFLOW_APPROVAL_TIMEOUT_H`` hours; no answer by then is a reject. The answer, who gave it and
when go on the challenger's MLflow version; a rejection tags it rejected (stage ``approval``) and
skips every task after this one.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param
from airflow.sdk.definitions.param import ParamsDict

log = logging.getLogger(__name__)

#: XCom key of the policy the approval task found.
POLICY_XCOM_KEY = "promotion_policy"
#: The approval form's free-text field (the CLI's ``--comment``), recorded as the answer's note.
COMMENT_PARAM = "comment"


def approval_needed(plan: dict, policy: str) -> bool:
    """Whether ``plan``'s canary waits for a person under ``policy`` (never for a no-op or dry run)."""
    from tritonflow.pipelines.promotion_policy import APPROVAL_POLICIES

    if policy not in APPROVAL_POLICIES:
        return False
    return not (plan.get("noop") or plan.get("dry_run") or plan.get("champion") == plan.get("challenger"))


def with_comment_param(params: Any) -> ParamsDict:
    """``params`` plus the form's **Comment** field (``source="task"``) unless it already has one.

    Inside a DAG, Airflow's operator metaclass has already put the DAG's own params (``source="dag"``)
    into ``params`` before ``__init__`` runs, and ``HITLOperator`` keeps only task params: the field
    must be added here with its source set, or the Required Actions form shows no Comment. It may
    be left empty (type ``null`` too), else the form would not let a person answer without one.
    """
    merged = params if isinstance(params, ParamsDict) else ParamsDict(params or {})
    if COMMENT_PARAM not in merged:
        merged.update({COMMENT_PARAM: Param(None, type=["null", "string"], title="Comment", source="task",
                                            description="Why (recorded on the MLflow version).")})
    return merged


class CanaryApprovalOperator(ApprovalOperator):
    """Approve or reject the start of a canary; a no-op unless the model's policy asks for a person.

    Args:
        plan_task_id: The task whose XCom holds the resolved versions.
        **kwargs: ``ApprovalOperator`` arguments; ``subject`` and ``defaults`` have defaults here
            (the subject is replaced at run time, the default answer is ``Reject``).
    """

    def __init__(self, *, plan_task_id: str = "resolve_versions", **kwargs: Any) -> None:
        kwargs.setdefault("subject", "Start the canary?")
        kwargs.setdefault("defaults", ApprovalOperator.REJECT)
        kwargs.setdefault("ignore_downstream_trigger_rules", True)
        kwargs["params"] = with_comment_param(kwargs.get("params"))
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id

    def _plan(self, context: Any) -> dict:
        return dict(context["ti"].xcom_pull(task_ids=self.plan_task_id) or {})

    def execute(self, context: Any) -> Any:
        """Return at once unless the policy asks for a person; else write the request and wait."""
        from ground.settings import get_settings
        from tritonflow.pipelines.promotion_policy import approval_request, approvers, promotion_policy
        from tritonflow_plugin.links import mlflow_base_url
        from tritonflow_plugin.loop import loop_context

        plan = self._plan(context)
        settings = get_settings()
        policy = promotion_policy(plan["model"], settings=settings)
        context["ti"].xcom_push(key=POLICY_XCOM_KEY, value=policy)
        if not approval_needed(plan, policy):
            log.info("promotion policy of %s is %s: no approval needed", plan["model"], policy)
            return {"policy": policy, "approval": "not required"}
        loop = loop_context(context)
        request = approval_request(plan, drift_event=loop.drift_event if loop else None,
                                   mlflow_url=mlflow_base_url(settings), settings=settings)
        self.subject, self.body = request["subject"], request["body"]
        users = approvers(plan["model"], settings=settings)
        self.assigned_users = [{"id": u, "name": u} for u in users] or None
        self.response_timeout = timedelta(hours=settings.approval_timeout_h)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Record the answer (or the timeout's reject) on the challenger, then approve or skip the rest."""
        from tritonflow.pipelines.promotion_policy import record_answer

        plan = self._plan(context)
        policy = context["ti"].xcom_pull(task_ids=self.task_id, key=POLICY_XCOM_KEY) or "approve"
        chosen = list(event.get("chosen_options") or [])
        approved = "error" not in event and chosen == [self.APPROVE]
        by = event.get("responded_by_user") or {}
        who = str(by.get("name") or by.get("id") or "") if isinstance(by, dict) else str(by)
        at: Any = event.get("responded_at")
        comment = str((event.get("params_input") or {}).get(COMMENT_PARAM) or "").strip()
        note = comment if who else "timed out: the default answer is reject"
        record_answer(plan["model"], plan["challenger"], approved=approved, by=who,
                      at=at.isoformat() if hasattr(at, "isoformat") else str(at or ""), policy=policy, note=note)
        return super().execute_complete(context, event)


__all__ = ["COMMENT_PARAM", "POLICY_XCOM_KEY", "CanaryApprovalOperator", "approval_needed", "with_comment_param"]
