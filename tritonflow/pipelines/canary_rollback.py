"""Manual rollback of a model to a signed version, by default its ``previous_champion`` (the ``canary_rollback`` DAG).

:func:`manual_rollback` resolves the rollback target: the version asked for, which tritonflow must
have published and signed, else the ``previous_champion`` alias (refusing, with the alias and the
version named, when it dangles); it re-verifies the target's signature,
makes sure it is loaded, routes 100 % to it, then moves the alias back and unloads the
rolled-back version. The health sentinel (:mod:`tritonflow.pipelines.sentinel`) takes the same
path. The automatic rollback of a failed canary step is :func:`repository_sync.canary.runner.rollback`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ground.exceptions import DataError, RegistryError
from model_registry.registry.entities import CHAMPION_ALIAS, PREVIOUS_CHAMPION_ALIAS
from tritonflow.pipelines.canary import (
    DEFAULT_LIVE_TIMEOUT_S,
    CanaryEnvironment,
    default_holder,
    environment_or_default,
    live_applier,
    record_tags,
    triton_name,
)
from tritonflow.pipelines.canary_loading import unload_version


def manual_rollback(model: str, reason: str, *, use_stages: bool = False, holder: str = "",
                    unload_rolled_back: bool = True, expected_champion: int | None = None,
                    to_version: int | str | None = None, env: CanaryEnvironment | None = None) -> dict[str, Any]:
    """Roll ``model`` back to ``to_version``, else its ``previous_champion`` (the Airflow UI's manual rollback).

    Order: resolve the rollback target (never "latest"; a dangling or missing alias stops here
    with the alias and the version named) -> re-verify its signature and make sure it is
    loaded -> gateway 100 % to it (and live) -> alias ``champion`` moves back (``previous_champion``
    is cleared so a second rollback stops) -> the rolled-back version is unloaded.

    Args:
        model: Registered model name.
        reason: Why (recorded in the audit trail and on both versions); must not be empty.
        use_stages: Also move the legacy stages.
        holder: Who rolls back, written in the promotion lock.
        unload_rolled_back: Unload the version rolled back from once traffic left it.
        to_version: The version to roll back to: one tritonflow published and signed
            (:meth:`~model_registry.registry.RegistryClient.signed_version`); ``None``: ``previous_champion``.
        expected_champion: Roll back only while ``champion`` still names this version (the
            health sentinel passes the version it judged; read under the promotion lock, so a
            promotion that finished meanwhile is never undone). Otherwise nothing changes and the
            result holds ``skipped``.
        env: Where the systems are (default: from settings).

    Returns:
        ``{"model", "triton_model", "rolled_back_from", "rolled_back_to", "signature", "weights",
        "unloaded"}``.

    Raises:
        RegistryError: No resolvable rollback target (names alias and version), ``to_version``
            is not a published, signed version, or it already is the champion.
        ConcurrencyError: A promotion of the model is in progress (names the holder).
        SignatureVerificationError: The target's files fail verification; nothing changed.
    """
    from repository_sync.locks import promotion_lock
    from repository_sync.routing.traffic_plan import TrafficPlan

    if not reason or not str(reason).strip():
        raise DataError("reason='' is empty: expected why the model is rolled back")
    env = environment_or_default(env)
    registry = env.registry()
    with promotion_lock(model, settings=env.settings, holder=holder or default_holder(),
                        timeout_s=env.settings.promotion_lock_timeout_s):
        current = registry.aliases(model).get(CHAMPION_ALIAS)
        if expected_champion is not None and current != int(expected_champion):
            return {"model": model, "skipped": f"champion is version {current}, not {int(expected_champion)}: "
                    "nothing rolled back", "rolled_back_from": None, "rolled_back_to": None}
        target = registry.rollback_target(model, to_version)  # refuses, naming alias or version
        if to_version is not None and current == target.version:
            raise RegistryError(f"rollback of model {model!r} to version {target.version} refused: it already "
                                "is the champion")
        name = triton_name(target)
        with env.triton() as tc:
            info, _ = tc.verify(name, target.version)  # re-verified before any load
            from repository_sync.triton.model_control import reconcile

            reconcile(tc, name, add=[target.version], config_version=target.version)
        plan = TrafficPlan.single(name, target.version, name=f"{name}:manual-rollback")
        live_applier(env.router(), env.gateway_url, DEFAULT_LIVE_TIMEOUT_S)(plan)
        registry.rollback(model, use_stages=use_stages, reason=reason,
                          version=None if to_version is None else target.version)
        unloaded = False
        if unload_rolled_back and current is not None and current != target.version:
            unload_version(env, name, current, keep_config_of=target.version)
            unloaded = True
        record = {"tritonflow.rollback.at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "tritonflow.rollback.reason": reason,
                  "tritonflow.rollback.from": str(current), "tritonflow.rollback.to": str(target.version)}
        record_tags(registry, model, target.version, record)
        if current is not None and current != target.version:
            with contextlib.suppress(RegistryError):
                record_tags(registry, model, current, record)
    return {"model": model, "triton_model": name, "rolled_back_from": current,
            "rolled_back_to": target.version, "signature": info.signature_digest,
            "weights": {str(target.version): 100}, "unloaded": unloaded}


def _label(row: dict[str, Any], previous: int | None, champion: int | None) -> str:
    notes = []
    if row["version"] == previous:
        notes.append("previous_champion")
    if row["version"] == champion:
        notes.append("champion now")
    if row.get("rejected_stage") == "sentinel":
        notes.append("rejected by the sentinel")
    elif row.get("rejected_stage"):
        notes.append(f"rejected at {row['rejected_stage']}")
    return f"v{row['version']}" + (f" ({', '.join(notes)})" if notes else "")


def rollback_choices(model: str, *, env: CanaryEnvironment | None = None) -> dict[str, Any]:
    """What a person may roll ``model`` back to: its published, signed versions, labelled.

    Returns:
        ``{"options": [label, ...], "default": label of previous_champion or None, "rows": [...]}``,
        newest first, without the champion; a label starts with ``v<version>`` and marks
        ``previous_champion`` and versions rejected by the sentinel (or at another stage).

    Raises:
        RegistryError: The model has no published, signed version other than its champion.
    """
    registry = environment_or_default(env).registry()
    aliases = registry.aliases(model)
    champion, previous = aliases.get(CHAMPION_ALIAS), aliases.get(PREVIOUS_CHAMPION_ALIAS)
    rows = [r for r in reversed(registry.signed_versions(model)) if r["version"] != champion]
    if not rows:
        raise RegistryError(f"model {model!r} has no published, signed version to roll back to besides its "
                            f"champion (version {champion})")
    labels = [_label(r, previous, champion) for r in rows]
    default = next((lab for r, lab in zip(rows, labels, strict=True) if r["version"] == previous), None)
    return {"options": labels, "default": default, "rows": rows}


def version_of_choice(label: str) -> int:
    """The version a :func:`rollback_choices` label names (``"v3 (previous_champion)"`` -> 3).

    Raises:
        DataError: ``label`` does not start with ``v<version>``.
    """
    import re

    match = re.match(r"^v(\d+)\b", str(label).strip())
    if not match:
        raise DataError(f"rollback choice {label!r}: expected a label starting with v<version>, e.g. 'v3'")
    return int(match.group(1))


__all__ = ["manual_rollback", "rollback_choices", "version_of_choice"]
