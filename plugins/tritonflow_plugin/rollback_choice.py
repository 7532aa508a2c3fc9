"""The version a manual rollback goes to, chosen by a person: Airflow's ``HITLOperator``.

The ``canary_rollback`` form names a version (field *Roll back to version*) or leaves it empty for
``previous_champion``. With the box *Choose from the signed versions* ticked and no version named,
:class:`RollbackChoiceOperator` lists the model's published, signed versions on the UI's *Required
Actions* page (:func:`tritonflow.pipelines.canary_rollback.rollback_choices`: newest first,
``previous_champion`` preselected, versions rejected by the sentinel marked) and waits for a
person to pick one; no answer within the timeout takes the preselected ``previous_champion``. The
choices are read when the task runs, never when the DAG file is parsed. Otherwise the task returns
at once with the form's version (``None``: ``previous_champion``).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator

#: XCom key under which the offered choices are kept, so the answer can be checked after the wait.
CHOICES_XCOM_KEY = "rollback_choices"
#: The option the operator is built with; replaced by the model's versions when it runs.
PLACEHOLDER = "previous_champion"


def model_of(context: Any) -> str:
    """The model the run rolls back: field *Model*, else the registry event's model."""
    from tritonflow_plugin.registry_watcher import registry_conf_from_context

    params = context["params"]
    return (params.get("model") or registry_conf_from_context(context).get("model_name") or "").strip()


class RollbackChoiceOperator(HITLOperator):
    """Pick the rollback's version among the signed ones; at once when the form decided.

    Returns (XCom): ``{"version": int | None, "chosen_by": "form" | user name | "timeout"}``.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("subject", "Roll back to which version?")
        kwargs.setdefault("options", [PLACEHOLDER])
        super().__init__(**kwargs)

    def execute(self, context: Any) -> Any:
        """Return the form's version, or offer the signed versions and wait for a person."""
        from tritonflow.pipelines.canary_rollback import rollback_choices

        params = context["params"]
        if params.get("to_version") is not None or not params.get("choose_version"):
            return {"version": params.get("to_version"), "chosen_by": "form"}
        model = model_of(context)
        choices = rollback_choices(model)
        self.options = choices["options"]
        self.defaults = [choices["default"]] if choices["default"] else None
        self.subject = f"Roll {model} back to which version?"
        self.body = choice_body(model, choices["rows"], params.get("reason") or "")
        context["ti"].xcom_push(key=CHOICES_XCOM_KEY, value=self.options)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """The chosen version (the preselected ``previous_champion`` when nobody answered in time)."""
        from tritonflow.pipelines.canary_rollback import version_of_choice

        self.options = list(context["ti"].xcom_pull(task_ids=self.task_id, key=CHOICES_XCOM_KEY) or self.options)
        answer = super().execute_complete(context, event)
        by = answer.get("responded_by_user") or {}
        who = str(by.get("name") or by.get("id") or "") if isinstance(by, dict) else str(by or "")
        return {"version": version_of_choice(answer["chosen_options"][0]), "chosen_by": who or "timeout"}


def choice_body(model: str, rows: list[dict[str, Any]], reason: str) -> str:
    """The request's Markdown: the reason, then one line per signed version."""
    lines = [f"Rollback of **{model}** requested: {reason or '(no reason given)'}", "",
             "| version | aliases | published | rejected |", "|---|---|---|---|"]
    for r in rows:
        why = (r.get("rejection_reason") or "")[:120].replace("|", "/")
        rejected = f"at {r['rejected_stage']}: {why}" if r["rejected_stage"] else ""
        lines.append(f"| v{r['version']} | {', '.join(r['aliases']) or ''} | {r.get('published_at') or ''} "
                     f"| {rejected} |")
    lines += ["", "The signature of the version you pick is verified again before any traffic moves."]
    return "\n".join(lines)


__all__ = ["CHOICES_XCOM_KEY", "RollbackChoiceOperator", "choice_body", "model_of"]
