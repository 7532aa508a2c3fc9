"""The typed context that crosses between the loop's DAGs (one conf, validated on arrival).

The loop is ``drift_monitor -> shadow_evaluation -> retrain -> model_publish -> shadow_evaluation
-> canary_promotion``; each hop is a fire-and-forget ``TriggerDagRunOperator``. Every such trigger
carries one :class:`LoopContext` under the conf key :data:`LOOP_CONF_KEY`, so the triggered run
gets the model, the version it acts on, the drift event and its window, the training-window
dataset and the expected predictions that the previous DAG knew, and never re-derives them from
the wall clock or from defaults.

The context is validated when the triggered run starts (:func:`parse_loop_context`): an unknown
key is refused naming the closest valid key, a wrong type names the field, the value and the
expected type. A conf's top-level keys are checked the same way against the triggered DAG's
params (:func:`check_conf_keys`), so ``{"profiles": false}`` fails naming ``profile`` instead of
being silently ignored.

Plain Python (pydantic), no Airflow import: the pipelines build contexts, the DAGs (through
``tritonflow_plugin.loop``) read them.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ground.exceptions import SettingsError

#: Conf key of the loop context in every DAG-to-DAG trigger.
LOOP_CONF_KEY = "loop"
#: Keys of a registry-event conf (``tritonflow_plugin.event_mapping.actions_for``), accepted at the
#: top level of a conf beside the params.
REGISTRY_EVENT_KEYS = ("model_name", "model_version", "alias", "stage", "registry_event", "then")
#: The loop's DAG ids (a context's ``triggered_by`` and ``then`` entries).
LOOP_DAGS = ("drift_monitor", "shadow_evaluation", "retrain", "model_publish", "canary_promotion")


#: Model-version tag of the publish outcome (``published`` / ``rejected``).
STATUS_TAG = "tritonflow.status"
#: Model-version tag of a retrained version's training window (Parquet URI, its lineage).
TRAINING_WINDOW_TAG = "tritonflow.training_window_uri"
#: Model-version tag of the change point a retraining after a confirmed shift found (ISO 8601):
#: its follow-up's window and the shadow decision's judged rows start there.
CHANGE_POINT_TAG = "tritonflow.change_point"


#: ``tritonflow.rejected_stage`` of a champion the health sentinel rolled back.
SENTINEL_STAGE = "sentinel"
#: ``tritonflow.rejected_stage`` of a challenger whose canary failed on its own figures.
CANARY_STAGE = "canary"
#: How a person lifts a rejection (said in every refusal of a rejected version).
OVERRIDE_HINT = (f"a person who judges the version good again deletes its MLflow tag {STATUS_TAG!r} "
                 "(the rejected_* tags may stay as history)")


def rejection(tags: Mapping[str, Any] | None) -> str:
    """Why a model version was rejected (``''`` when its outcome is not ``rejected``).

    A version rejected by one path (the ``model_publish`` DAG, a shadow evaluation's publish, the
    perf gate, the health sentinel's rollback, a failed canary) is never published or promoted by
    another: ``model_publish``, the shadow evaluation, its publish and the canary all check this
    first. Override: delete the version's tag ``tritonflow.status`` in MLflow (:data:`OVERRIDE_HINT`).
    """
    tags = dict(tags or {})
    if tags.get(STATUS_TAG) != "rejected":
        return ""
    return (f"rejected at stage {tags.get('tritonflow.rejected_stage') or '?'} "
            f"({tags.get('tritonflow.rejected_at') or 'time unknown'}): "
            f"{tags.get('tritonflow.rejection_reason') or 'no reason recorded'}")


def lasting_rejection(tags: Mapping[str, Any] | None) -> str:
    """:func:`rejection` when no publish can lift it (``''`` otherwise).

    The rule: a rejection at a stage of the publish pipeline
    (:data:`tritonflow.pipelines.publish_common.STAGES`: conversion, parity, perf gate, load...)
    judges a publish attempt, so a later successful publish of the version replaces it. A
    rejection by a judge of the served version (the health sentinel, a failed canary, or any stage
    not of the publish pipeline) lasts: ``model_publish`` refuses the version and no publish
    clears it; only a person does (:data:`OVERRIDE_HINT`).
    """
    from tritonflow.pipelines.publish_common import STAGES

    why = rejection(tags)
    return why if why and dict(tags or {}).get("tritonflow.rejected_stage") not in STAGES else ""


def refuse_lasting_rejection(tags: Mapping[str, Any] | None, what: str) -> None:
    """Refuse to publish a version rejected by the health sentinel or a canary.

    See :func:`lasting_rejection` for the rule (a publish-stage rejection is replaced by a
    successful publish; a sentinel or canary rejection is not).

    Args:
        tags: The model version's MLflow tags (``None``: no tags).
        what: How the refusal names the version (e.g. ``"models:/churn/3"``).

    Raises:
        RejectedVersionError: The version carries a lasting rejection (stage, time and reason named,
            and how a person lifts it).
    """
    from ground.exceptions import RejectedVersionError

    why = lasting_rejection(tags)
    if why:
        raise RejectedVersionError(f"{what} was {why}; a publish never lifts a rejection by the health sentinel "
                                   f"or a canary, so it is not published again: {OVERRIDE_HINT}")


def lift_hint(tags: Mapping[str, Any] | None) -> str:
    """How a version's rejection is lifted: a new publish (a publish-stage one), else only a person."""
    return OVERRIDE_HINT if lasting_rejection(tags) else "publish it again with model_publish once fixed"


def reject_after_rollback(registry: Any, model: str, version: int, stage: str, *, why: str) -> str:
    """Tag ``version`` rejected at ``stage`` after a judge of the served version rolled it back.

    Used by the health sentinel and the canary: without the tag the next shadow evaluation or
    canary promotes the same version again (ping-pong). The rollback stands whatever happens here:
    a failure to tag is logged as an error and returns ``''``.

    Args:
        registry: :class:`~model_registry.registry.RegistryClient`.
        model: Registered model name.
        version: The rolled-back model version.
        stage: ``tritonflow.rejected_stage`` (:data:`SENTINEL_STAGE` or :data:`CANARY_STAGE`).
        why: The rejection reason written on the version.

    Returns:
        ``why`` when tagged, ``''`` when tagging failed.
    """
    import logging

    log = logging.getLogger(__name__)
    try:
        registry.record_rejection(registry.get_version(model, version), why, stage)
    except Exception as exc:  # noqa: BLE001 - the rollback happened; say loudly what is missing
        log.error("%s v%s was rolled back (stage %s) but could not be tagged rejected (%s): a shadow "
                  "evaluation or canary may promote it again", model, version, stage, exc)
        return ""
    log.warning("%s v%s tagged rejected at stage %s; %s", model, version, stage, OVERRIDE_HINT)
    return why


def closest(key: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid key closest to ``key``, or ``''`` when none is close."""
    match = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


class LoopContext(BaseModel):
    """What one loop DAG hands to the next one it triggers.

    Attributes:
        model: Registered model name.
        version: The model version the triggered run acts on (the challenger to evaluate,
            publish or promote), as a string of digits; ``None`` when it has none yet (retrain).
        triggered_by: DAG id of the run that built the context.
        triggered_by_run: Run id of that run.
        reason: Why the run was triggered (``drift``, ``champion_degraded``, ...).
        drift_event: The drift asset event's extra that started the chain (``model``,
            ``version``, ``features``, ``scores``, ``window_start``, ``window_end``, ``severity``),
            or ``None`` for a chain not started by drift.
        window_start: Start of the evaluated window, ISO 8601 (default: the drift event's).
        window_end: End of the evaluated window, ISO 8601 (default: the drift event's); never
            replaced by the wall clock downstream.
        dataset_uri: The training-window dataset (Parquet) of a retrained version: the publish
            uses it as validation sample and drift reference.
        expected_predictions: URI of the challenger's expected predictions (shadow -> canary).
        then: DAG ids the triggered run starts after it succeeds (``model_publish``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=128)
    version: str | None = Field(default=None, pattern=r"^[1-9][0-9]*$")
    triggered_by: str = Field(min_length=1)
    triggered_by_run: str | None = None
    reason: str | None = None
    drift_event: dict[str, Any] | None = None
    window_start: str | None = None
    window_end: str | None = None
    dataset_uri: str | None = None
    expected_predictions: str | None = None
    then: tuple[str, ...] = ()

    @field_validator("version", mode="before")
    @classmethod
    def _version_str(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("drift_event", mode="before")
    @classmethod
    def _event_obj(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                return value  # pydantic names the field and the expected type
        return value

    @model_validator(mode="after")
    def _window_from_event(self) -> "LoopContext":
        event = self.drift_event or {}
        if event.get("model") not in (None, self.model):
            raise ValueError(f"drift_event.model={event.get('model')!r} differs from model={self.model!r}")
        for key in ("window_start", "window_end"):
            if getattr(self, key) is None and event.get(key):
                object.__setattr__(self, key, str(event[key]))
        return self

    def conf(self, **params: Any) -> dict[str, Any]:
        """The trigger conf: this context under :data:`LOOP_CONF_KEY`, plus DAG params."""
        return {LOOP_CONF_KEY: self.model_dump(mode="json", exclude_none=True), **params}

    def next(self, triggered_by: str, **changes: Any) -> "LoopContext":
        """This context handed on by ``triggered_by`` with ``changes`` (validated again)."""
        data = self.model_dump(exclude_none=True)
        data.update({k: v for k, v in changes.items()})
        data["triggered_by"] = triggered_by
        return LoopContext.model_validate(data)


def _base(value: Any) -> dict[str, Any]:
    ctx = parse_loop_context(value) if value else None
    return ctx.model_dump(exclude_none=True) if ctx is not None else {}


def publish_handoff(summary: Mapping[str, Any], *, triggered_by: str = "model_publish",
                    run_id: str | None = None) -> dict[str, Any]:
    """Build the conf ``model_publish`` hands to its ``then`` DAGs.

    The conf ``model_publish`` hands to its ``then`` DAGs: the published version plus the
    context it arrived with (drift event, window, training window, reason).

    Args:
        summary: :func:`tritonflow.pipelines.publish_record.record`'s summary plus ``loop`` (the run's
            validated context, or ``None``).
        triggered_by: The DAG handing over (``triggered_by`` of the new context).
        run_id: The handing-over DAG run's id (``triggered_by_run``).

    Returns:
        The conf, a :class:`LoopContext` as a dict.
    """
    base = _base(summary.get("loop"))
    base.pop("then", None)
    base.update(model=summary["model"], version=str(summary["version"]), triggered_by=triggered_by,
                triggered_by_run=run_id)
    base.setdefault("reason", "published")
    return LoopContext.model_validate(base).conf()


def retrain_handoff(model: str, version: Any, *, reason: str, drift_event: Any = None, window_start: Any = None,
                    window_end: Any = None, dataset_uri: str | None = None, run_id: str | None = None,
                    then: tuple[str, ...] = ("shadow_evaluation",)) -> dict[str, Any]:
    """Build the conf ``retrain`` hands to ``model_publish``.

    The conf ``retrain`` hands to ``model_publish``: the new version, its training window as
    ``dataset_uri`` (validation sample and drift reference from real data) and the drift event.
    """
    return LoopContext(model=model, version=str(version), triggered_by="retrain", triggered_by_run=run_id,
                       reason=reason, drift_event=drift_event or None,
                       window_start=None if window_start is None else str(window_start),
                       window_end=None if window_end is None else str(window_end),
                       dataset_uri=dataset_uri or None, then=tuple(then)).conf()


def shadow_handoffs(request: Mapping[str, Any], decision: Mapping[str, Any], *,
                    run_id: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(canary conf, retrain conf) of a shadow evaluation's outcome, each a loop context.

    Args:
        request: The run's plan (``model``, ``window_start``, ``window_end``, ``drift_event``,
            ``loop``: the context it arrived with).
        decision: :func:`tritonflow.pipelines.shadow_compare.compare`'s result (``challenger``,
            ``canary_conf.expected_predictions``, ``retrain_conf.reason``).
        run_id: The shadow evaluation run's id (``triggered_by_run``).
    """
    base = _base(request.get("loop"))
    for key in ("then", "version", "expected_predictions", "reason"):
        base.pop(key, None)
    event = request.get("drift_event") or base.get("drift_event") or None
    base.update(model=decision.get("model") or request["model"], triggered_by="shadow_evaluation",
                triggered_by_run=run_id, drift_event=event, window_start=request.get("window_start"),
                window_end=request.get("window_end"))
    canary_in = dict(decision.get("canary_conf") or {})
    canary = None
    if decision.get("challenger") is not None:
        canary = LoopContext.model_validate({
            **base, "version": str(decision["challenger"]), "reason": "shadow_promote_challenger",
            "expected_predictions": canary_in.get("expected_predictions")}).conf()
    retrain = LoopContext.model_validate({
        **base, "reason": (decision.get("retrain_conf") or {}).get("reason") or "shadow_retrain",
        "dataset_uri": None}).conf()
    return canary or {}, retrain


def parse_loop_context(value: Any) -> LoopContext | None:
    """Validate the loop context of a conf (``None`` when the run carries none).

    Raises:
        SettingsError: An unknown key (naming the closest valid key), a wrong type or value (naming
            the field, the value and what is expected), or not an object.
    """
    if value is None:
        return None
    if isinstance(value, LoopContext):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise SettingsError(f"conf.{LOOP_CONF_KEY}={value[:200]!r} is not JSON; expected an object "
                                f"with keys among {sorted(LoopContext.model_fields)}") from None
    if not isinstance(value, Mapping):
        raise SettingsError(f"conf.{LOOP_CONF_KEY}={value!r} is a {type(value).__name__}; expected an object")
    valid = set(LoopContext.model_fields)
    unknown = sorted(set(value) - valid)
    if unknown:
        raise SettingsError("; ".join(f"conf.{LOOP_CONF_KEY}.{k} is not a loop context key{closest(k, valid)}"
                                      for k in unknown) + f"; expected keys among {sorted(valid)}")
    try:
        return LoopContext.model_validate(dict(value))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ())) or "(context)"
            problems.append(f"conf.{LOOP_CONF_KEY}.{where}={err.get('input')!r}: {err.get('msg')}")
        raise SettingsError("; ".join(problems)) from None


def check_conf_keys(conf: Mapping[str, Any], params: Iterable[str], dag_id: str) -> None:
    """Refuse top-level conf keys that are neither params, the loop context nor registry-event keys.

    Raises:
        SettingsError: Names each unknown key, the closest valid key and the DAG.
    """
    names = set(params)
    valid = names | {LOOP_CONF_KEY} | set(REGISTRY_EVENT_KEYS)
    unknown = sorted(set(conf) - valid)
    if unknown:
        # a person types param names: the closest param first, else the closest other key
        raise SettingsError("; ".join(f"conf key {k!r} is not a parameter of DAG {dag_id!r}"
                                      f"{closest(k, names) or closest(k, valid)}"
                                      for k in unknown) + f"; expected keys among {sorted(valid)}")


__all__ = ["CANARY_STAGE", "CHANGE_POINT_TAG", "LOOP_CONF_KEY", "LOOP_DAGS", "LoopContext", "OVERRIDE_HINT",
           "REGISTRY_EVENT_KEYS", "SENTINEL_STAGE", "STATUS_TAG", "TRAINING_WINDOW_TAG", "check_conf_keys",
           "closest", "lasting_rejection", "lift_hint", "parse_loop_context", "publish_handoff",
           "refuse_lasting_rejection", "reject_after_rollback", "rejection", "retrain_handoff", "shadow_handoffs"]
