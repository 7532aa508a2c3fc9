"""Health sentinel of champions, as plain functions; the ``champion_sentinel`` DAG calls them.

* :func:`golden_set` -- before a sentinel starts: the champion version, its Triton name, golden
  samples (evenly spread rows of its drift reference, turned into request tensors with the served
  version's input specs) and the output ranges seen at validation (tag
  :data:`~tritonflow.pipelines.publish_record.OUTPUT_RANGE_TAG`, written at publish by
  :func:`~tritonflow.pipelines.publish_record.output_ranges`). A version published
  before that tag existed gets the ranges of its own answers to the golden samples when the
  sentinel starts (noted in ``source``; finite and non-constant answers only).
* :func:`sentinel_rollback` -- after ``unhealthy``: the same path as the ``canary_rollback`` DAG
  (:func:`tritonflow.pipelines.canary_rollback.manual_rollback`: gateway 100 % to ``previous_champion``
  first, then aliases), only while the judged version is still the champion, records why on
  the MLflow model versions (``tritonflow.sentinel.*``) and tags the rolled-back version rejected
  (stage ``sentinel``) so nothing promotes it again until a person lifts it.
* :func:`reload_serving` -- after ``unloaded`` (Triton answers but does not hold the champion, e.g.
  restarted empty): loads back the model's desired versions from the shared record, verified.
* :func:`monitored_models` -- registered models holding a ``champion`` alias.

Nothing here imports Airflow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from ground.exceptions import DataError, RegistryError, WindowError
from tritonflow.pipelines.publish_record import OUTPUT_RANGE_TAG, output_ranges, reference_root  # written at publish

log = logging.getLogger(__name__)

#: Prefix of the sentinel's tags on MLflow model versions.
SENTINEL_TAG_PREFIX = "tritonflow.sentinel."


def _spread_rows(frame, n: int):
    if len(frame) <= n:
        return frame.reset_index(drop=True)
    idx = np.unique(np.linspace(0, len(frame) - 1, n).round().astype(int))
    return frame.iloc[idx].reset_index(drop=True)


def golden_set(model: str, *, env: Any = None, samples: int | None = None) -> dict[str, Any]:
    """The golden set of ``model``'s champion (:class:`repository_sync.sentinel.GoldenSet` as a dict).

    A champion Triton does not hold (restarted empty) is loaded back first, with the model's
    recorded desired set (as :func:`reload_serving`): its input specs come from Triton.

    Args:
        model: Registered model name.
        env: :class:`~tritonflow.pipelines.canary.CanaryEnvironment` (default: from settings).
        samples: Golden samples (default ``TRITONFLOW_SENTINEL_SAMPLES``).

    Raises:
        DataError: The model has no champion, no stored reference, or no usable reference row.
        RegistryError / ServiceUnavailableError: MLflow or Triton unreachable or refusing.
    """
    from drift_checks.reference import load_reference
    from repository_sync.sentinel import GoldenSet
    from repository_sync.triton.client import frame_to_inputs
    from tritonflow.pipelines.canary import environment_or_default, triton_name

    env = environment_or_default(env)
    n = int(samples or env.settings.sentinel_samples)
    if n < 1:
        raise DataError(f"TRITONFLOW_SENTINEL_SAMPLES={n}: expected at least 1 golden sample")
    registry = env.registry()
    champion = registry.champion(model)
    if champion is None:
        raise DataError(f"model {model!r} has no 'champion' alias: nothing for the sentinel to watch")
    name = triton_name(champion)
    try:
        ref = load_reference(reference_root(env.settings), model, champion.version,
                             endpoint_url=env.endpoint_url, with_profile=False, with_times=False)
    except WindowError as exc:
        raise DataError(f"no golden samples for {model!r} v{champion.version}: {exc}") from None
    with env.triton() as tc:
        if int(champion.version) not in tc.ready_versions(name):  # e.g. Triton restarted empty
            _load_back(tc, name, champion.version, env)
        specs = tc.input_specs(name, champion.version)
        inputs, rows, invalid = frame_to_inputs(_spread_rows(ref.frame.dropna(), n), specs)
        if not rows:
            raise DataError(f"no golden samples for {model!r} v{champion.version}: every reference row "
                            f"was refused ({invalid[:3]})")
        source = f"{len(rows)} rows of reference {ref.uri}"
        try:
            ranges = json.loads((champion.tags or {}).get(OUTPUT_RANGE_TAG) or "{}")
            source += f"; ranges from tag {OUTPUT_RANGE_TAG}"
        except ValueError:
            ranges = {}
        if not ranges:
            answers = output_ranges(tc.infer(name, champion.version, inputs))
            ranges = {k: v for k, v in answers.items() if v[0] < v[1]}
            source += "; no validation range recorded: ranges of the champion's answers at sentinel start"
    golden = GoldenSet.from_arrays(model, name, champion.version, inputs, ranges, source=source)
    return golden.to_dict()


def monitored_models(env: Any = None) -> list[str]:
    """Registered models holding a ``champion`` alias, sorted."""
    from model_registry.registry.entities import CHAMPION_ALIAS
    from tritonflow.pipelines.canary import environment_or_default

    env = environment_or_default(env)
    client = env.registry().client
    names = []
    for rm in client.search_registered_models(max_results=1000):
        if CHAMPION_ALIAS in (rm.aliases or {}):
            names.append(rm.name)
    return sorted(names)


def sentinel_rollback(outcome: Mapping[str, Any], *, holder: str = "", env: Any = None) -> dict[str, Any]:
    """Roll the judged champion back to ``previous_champion`` after an ``unhealthy`` outcome.

    The path is the ``canary_rollback`` DAG's (:func:`~tritonflow.pipelines.canary_rollback.manual_rollback`)
    with ``expected_champion`` = the judged version: when a promotion or a rollback already moved
    ``champion``, nothing changes (``skipped``). The outcome (reason, failed probes) is recorded
    on both MLflow model versions. The rolled-back version (never the target, never on a skip) is
    tagged ``tritonflow.status = rejected`` at stage ``sentinel``
    (:meth:`~model_registry.registry.RegistryClient.record_rejection`), so no shadow evaluation,
    canary or ``model_publish`` puts it back (:func:`~tritonflow.pipelines.loop_context.lasting_rejection`);
    a person overrides by deleting the version's tag ``tritonflow.status`` in MLflow.

    Args:
        outcome: :meth:`repository_sync.sentinel.SentinelOutcome.to_dict` with status ``unhealthy``.
        holder: Who rolls back (written in the promotion lock).
        env: Canary environment (default: from settings).

    Returns:
        ``manual_rollback``'s result (or ``{"skipped": ...}``) plus ``reason`` and, after a rollback,
        ``rejected`` (the rejection reason tagged; ``''`` when tagging failed, logged as an error).

    Raises:
        DataError: ``outcome`` is not an unhealthy outcome.
        RegistryError: No rollback target (``previous_champion`` missing or dangling).
    """
    from tritonflow.pipelines.canary import environment_or_default, record_tags
    from tritonflow.pipelines.canary_rollback import manual_rollback

    if outcome.get("status") != "unhealthy":
        raise DataError(f"sentinel outcome status={outcome.get('status')!r}: expected 'unhealthy'")
    env = environment_or_default(env)
    model, version = str(outcome["model"]), int(outcome["version"])
    reason = str(outcome.get("reason") or f"health sentinel: version {version} unhealthy")
    result = manual_rollback(model, reason, holder=holder, unload_rolled_back=True,
                             expected_champion=version, env=env)
    if result.get("skipped"):
        log.warning("sentinel rollback of %s v%s skipped: %s", model, version, result["skipped"])
        return result | {"reason": reason}
    failed = list(outcome.get("failed") or [])
    tags = {SENTINEL_TAG_PREFIX + "rolled_back_at": _now(),
            SENTINEL_TAG_PREFIX + "reason": reason,
            SENTINEL_TAG_PREFIX + "failed_probes": json.dumps(failed, sort_keys=True)[:4900],
            SENTINEL_TAG_PREFIX + "from": str(version),
            SENTINEL_TAG_PREFIX + "to": str(result.get("rolled_back_to"))}
    registry = env.registry()
    from tritonflow.pipelines.loop_context import SENTINEL_STAGE, reject_after_rollback

    rejected = reject_after_rollback(
        registry, model, version, SENTINEL_STAGE,
        why=f"health sentinel rolled version {version} back to version {result.get('rolled_back_to')}: {reason}")
    for v in {version, int(result["rolled_back_to"])}:
        try:
            record_tags(registry, model, v, tags)
        except RegistryError as exc:  # the rollback happened; a missing tag is only a weaker record
            log.warning("sentinel record on %s v%s failed: %s", model, v, exc)
    return result | {"reason": reason, "rejected": rejected}


def reload_serving(outcome: Mapping[str, Any], *, holder: str = "", env: Any = None) -> dict[str, Any]:
    """Load back the versions Triton forgot after an ``unloaded`` outcome (e.g. Triton restarted).

    Sends the model's desired set, as the last model-control change recorded it in the shared
    database (:func:`repository_sync.triton.model_control.reconcile` with nothing added or
    removed), under the model-control lease, with every signature verified again; retried while
    Triton does not answer yet (:func:`~repository_sync.triton.model_control.when_triton_answers`).
    Nothing is rolled back and no version is judged: a version Triton does not hold says nothing
    about the model.

    Args:
        outcome: :meth:`repository_sync.sentinel.SentinelOutcome.to_dict` with status ``unloaded``.
        holder: Who reloads (written in the model-control lease).
        env: Canary environment (default: from settings).

    Returns:
        ``{"model", "triton_model", "versions", "before", "reason"}``.

    Raises:
        DataError: ``outcome`` is not an unloaded outcome.
        SignatureVerificationError, ModelLoadRefusedError, ModelLoadError, ServiceUnavailableError:
            as :func:`~repository_sync.triton.model_control.reconcile`.
    """
    from tritonflow.pipelines.canary import environment_or_default

    if outcome.get("status") != "unloaded":
        raise DataError(f"sentinel outcome status={outcome.get('status')!r}: expected 'unloaded'")
    env = environment_or_default(env)
    name = str(outcome["triton_model"])
    with env.triton() as tc:
        if holder:
            tc.holder = holder
        done = _load_back(tc, name, outcome.get("version"), env)
    return {"model": outcome["model"], "triton_model": name, "versions": done["versions"],
            "before": done["before"], "reason": str(outcome.get("reason") or "")}


def _load_back(tc: Any, name: str, version: Any, env: Any) -> dict[str, Any]:
    """The model's recorded desired set sent again (``reconcile`` adding nothing), while Triton restarts."""
    from repository_sync.triton.model_control import reconcile, when_triton_answers

    done = when_triton_answers(lambda: reconcile(tc, name), timeout_s=env.settings.start_timeout_s)
    log.warning("sentinel: Triton model %s did not hold v%s; loaded back %s", name, version, done["versions"])
    return done


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def models_from_events(extras: list[Mapping[str, Any]]) -> list[str]:
    """Models whose champion changed, from CHAMPION_CHANGED events' ``extra`` (``changed`` false skipped)."""
    return sorted({str(e["model"]) for e in extras if e and e.get("model") and e.get("changed", True)})


__all__ = ["OUTPUT_RANGE_TAG", "golden_set", "models_from_events", "monitored_models", "output_ranges",
           "reload_serving", "sentinel_rollback"]
