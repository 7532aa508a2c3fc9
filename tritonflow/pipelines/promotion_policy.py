"""A model's promotion policy, and the approval a person gives before its canary starts.

The policy is tag ``tritonflow.promotion_policy`` on the registered model in MLflow, else setting
``TRITONFLOW_PROMOTION_POLICY`` (default ``auto``):

* ``auto``: a shadow winner goes straight to its canary (the main job's policy);
* ``approve``: the ``canary_promotion`` DAG's ``approval`` task waits for a person before any
  traffic moves;
* ``approve-steps``: that approval, then a person decides at the end of each canary step's bake
  (continue, hold or roll back; :mod:`tritonflow.pipelines.canary_pauses`).

The answer of an approval, who gave it and when are tags ``tritonflow.approval.*`` on the
challenger's version; a rejection (or no answer before the timeout) also tags it rejected at stage
``approval``, the way other rejections are tagged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ground.exceptions import DataError
from ground.settings import Settings
from model_registry.registry.entities import TAG_PREFIX, now_iso
from tritonflow.pipelines.shadow import SHADOW_TAG_PREFIX, open_registry, settings_or_default

#: Registered-model tag naming the model's promotion policy.
POLICY_TAG = TAG_PREFIX + "promotion_policy"
#: Registered-model tag naming the Airflow users who answer its approvals (comma-separated).
OWNERS_TAG = TAG_PREFIX + "owners"
#: The policies a model may have.
POLICIES = ("auto", "approve", "approve-steps")
#: Policies under which a person approves before the canary.
APPROVAL_POLICIES = ("approve", "approve-steps")
#: Prefix of the model-version tags an approval writes.
APPROVAL_TAG_PREFIX = TAG_PREFIX + "approval."
#: ``tritonflow.rejected_stage`` of a version a person (or the approval's timeout) rejected.
APPROVAL_STAGE = "approval"


def parse_policy(value: Any, source: str) -> str:
    """``value`` as a promotion policy.

    Raises:
        DataError: ``value`` is not one of :data:`POLICIES` (the message names ``source``, the value
            and the expected values).
    """
    text = str(value).strip().lower()
    if text not in POLICIES:
        raise DataError(f"{source} is {value!r}; expected one of {', '.join(POLICIES)}")
    return text


def policy_from_tags(tags: Mapping[str, str], default: str) -> str:
    """The policy tag :data:`POLICY_TAG` in ``tags`` says, else ``default`` (the setting)."""
    value = tags.get(POLICY_TAG)
    if value is None or not str(value).strip():
        return parse_policy(default, "setting TRITONFLOW_PROMOTION_POLICY")
    return parse_policy(value, f"tag {POLICY_TAG}")


def promotion_policy(model: str, *, settings: Settings | None = None, registry: Any = None) -> str:
    """The promotion policy in force for ``model``: its MLflow tag, else the setting.

    Raises:
        DataError: The tag (or the setting) holds an unknown policy.
        RegistryError: The registered model does not exist.
    """
    settings = settings_or_default(settings)
    registry = registry or open_registry(settings)
    return policy_from_tags(registry.model_tags(model), settings.promotion_policy)


def approvers(model: str, *, settings: Settings | None = None, registry: Any = None) -> list[str]:
    """Airflow user ids assigned to ``model``'s approvals: tag :data:`OWNERS_TAG`, else the setting."""
    settings = settings_or_default(settings)
    registry = registry or open_registry(settings)
    raw = registry.model_tags(model).get(OWNERS_TAG) or settings.approval_owners
    return [u.strip() for u in str(raw).split(",") if u.strip()]


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _figures(tags: Mapping[str, str]) -> list[str]:
    """Markdown lines with the parity, p99 and shadow figures a version's tags hold."""
    lines = []
    parity = _json(tags.get(TAG_PREFIX + "parity_errors"))
    lines.append(f"* **Parity errors**: `{json.dumps(parity)}`" if parity is not None else "* **Parity**: not recorded")
    perf = _json(tags.get(TAG_PREFIX + "perf_gate"))
    if isinstance(perf, dict):
        lines.append(f"* **p99**: challenger {perf.get('challenger_p99_ms')} ms vs champion "
                     f"{perf.get('champion_p99_ms')} ms (perf gate {perf.get('status')}, noise band "
                     f"{perf.get('noise_band')})")
    else:
        lines.append("* **p99**: not recorded")
    outcome = tags.get(SHADOW_TAG_PREFIX + "outcome")
    if outcome:
        lines.append(f"* **Shadow**: {outcome} ({tags.get(SHADOW_TAG_PREFIX + 'verdict') or '?'}), window "
                     f"{tags.get(SHADOW_TAG_PREFIX + 'window') or '?'}, "
                     f"{tags.get(SHADOW_TAG_PREFIX + 'n_labelled') or '?'} labelled")
        evidence = tags.get(SHADOW_TAG_PREFIX + "evidence")
        if evidence:
            lines.append(f"  * evidence: `{evidence[:1500]}`")
        if tags.get(SHADOW_TAG_PREFIX + "report_uri"):
            lines.append(f"  * report: {tags[SHADOW_TAG_PREFIX + 'report_uri']}")
    else:
        lines.append("* **Shadow**: no shadow evaluation recorded")
    return lines


def approval_request(plan: Mapping[str, Any], *, drift_event: Any = None, mlflow_url: str = "",
                     settings: Settings | None = None, registry: Any = None) -> dict[str, str]:
    """Subject and Markdown body of the approval before ``plan``'s canary.

    Args:
        plan: The ``canary_promotion`` DAG's resolved versions (``model``, ``champion``, ``challenger``).
        drift_event: The drift event that started the loop, if any.
        mlflow_url: MLflow UI base URL for the links (empty: no links).
        settings: The settings (default: :func:`ground.settings.get_settings`).
        registry: A :class:`model_registry.registry.RegistryClient` (default: on the settings' MLflow).

    Returns:
        ``{"subject": ..., "body": ...}``.
    """
    registry = registry or open_registry(settings_or_default(settings))
    model, champion, challenger = plan["model"], plan["champion"], plan["challenger"]
    tags = dict(registry.get_version(model, challenger).tags)
    lines = [f"Canary of **{model}** version **{challenger}** against champion version **{champion}**.", "",
             *_figures(tags)]
    lines.append(f"* **Drift event**: `{json.dumps(drift_event, default=str)[:1000]}`" if drift_event
                 else "* **Drift event**: none (not started by a drift alert)")
    if mlflow_url:
        from urllib.parse import quote

        base = f"{mlflow_url.rstrip('/')}/#/models/{quote(str(model), safe='')}/versions/"
        lines.append(f"* MLflow: [challenger v{challenger}]({base}{challenger}) · "
                     f"[champion v{champion}]({base}{champion})")
    lines += ["", "No answer before the timeout rejects the challenger."]
    return {"subject": f"Start the canary of {model} v{challenger}?", "body": "\n".join(lines)}


def record_answer(model: str, version: int | str, *, approved: bool, by: str = "", at: str = "",
                  policy: str = "approve", note: str = "", registry: Any = None,
                  settings: Settings | None = None) -> dict[str, str]:
    """Write an approval's answer on the challenger's version; a rejection also tags it rejected.

    Args:
        model: Registered model name.
        version: The challenger's version.
        approved: The answer.
        by: Who answered (empty: nobody, e.g. the timeout).
        at: When (ISO time; empty: now).
        policy: The policy in force.
        note: Why: the answer's comment, or ``"timed out"`` when nobody answered.
        registry: A :class:`model_registry.registry.RegistryClient` (default: on the settings' MLflow).
        settings: The settings (default: :func:`ground.settings.get_settings`).

    Returns:
        The tags written.
    """
    from tritonflow.pipelines.publish_common import reject_version

    registry = registry or open_registry(settings_or_default(settings))
    ref = registry.get_version(model, version)
    answer = "approved" if approved else "rejected"
    tags = {APPROVAL_TAG_PREFIX + "answer": answer, APPROVAL_TAG_PREFIX + "by": by or "nobody",
            APPROVAL_TAG_PREFIX + "at": at or now_iso(), APPROVAL_TAG_PREFIX + "policy": policy}
    if note:
        tags[APPROVAL_TAG_PREFIX + "note"] = note
    written = registry.set_version_tags(ref, tags)
    if not approved:
        why = f"canary not approved ({note or 'rejected'}) by {by or 'nobody'}"
        reject_version(registry, ref, DataError(why), APPROVAL_STAGE)
    return written


__all__ = ["APPROVAL_POLICIES", "APPROVAL_STAGE", "APPROVAL_TAG_PREFIX", "OWNERS_TAG", "POLICIES", "POLICY_TAG",
           "approval_request", "approvers", "parse_policy", "policy_from_tags", "promotion_policy", "record_answer"]
