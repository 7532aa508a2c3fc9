"""What serves a model now: the gateway's traffic plan, MLflow's aliases, a running canary, the last decision.

Read by ``tritonflow status MODEL``. Every part is read on its own: a part that could not be read is
named in ``problems`` (what, and why) and the others are still shown.
"""

from __future__ import annotations

import json
from typing import Any

from tritonflow.pipelines.canary import CANARY_TAG_PREFIX, CanaryEnvironment, environment_or_default, triton_name
from tritonflow.pipelines.promotion_policy import APPROVAL_TAG_PREFIX, policy_from_tags
from tritonflow.pipelines.shadow import SHADOW_TAG_PREFIX


def _json(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return text


def running_canary(ref: Any) -> dict[str, Any] | None:
    """The canary started on version ``ref`` and not ended (its id and last analysed step), else ``None``."""
    tags = dict(ref.tags or {})
    canary_id = tags.get(CANARY_TAG_PREFIX + "latest")
    if not canary_id:
        return None
    prefix = f"{CANARY_TAG_PREFIX}{canary_id}."
    if prefix + "outcome" in tags:
        return None
    steps = sorted(k[len(prefix + "step."):] for k in tags if k.startswith(prefix + "step."))
    last = _json(tags[prefix + "step." + steps[-1]]) if steps else None
    waiting = [p for p in _pauses(tags, prefix) if not p.get("decision")]
    return {"version": ref.version, "canary_id": canary_id,
            "started": _json(tags.get(prefix + "started")),
            "step": steps[-1] if steps else None,
            "percent": last.get("percent") if isinstance(last, dict) else None,
            "waiting": waiting[-1] if waiting else None}


def _pauses(tags: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """The pauses (policy approve-steps) recorded under ``prefix``, in order (:mod:`.canary_pauses`)."""
    found = sorted(k for k in tags if k.startswith(prefix + "pause."))
    return [p for p in (_json(tags[k]) for k in found) if isinstance(p, dict)]


def decisions(ref: Any) -> list[dict[str, Any]]:
    """The decisions recorded on version ``ref`` (canary, step decision, shadow, approval, rejection), with times."""
    tags = dict(ref.tags or {})
    out = []
    canary_id = tags.get(CANARY_TAG_PREFIX + "latest")
    if canary_id and f"{CANARY_TAG_PREFIX}{canary_id}.outcome" in tags:
        prefix = f"{CANARY_TAG_PREFIX}{canary_id}."
        started = _json(tags.get(prefix + "started")) or {}
        out.append({"kind": "canary", "outcome": tags[prefix + "outcome"], "reason": tags.get(prefix + "reason"),
                    "at": started.get("started_at", "") if isinstance(started, dict) else "",
                    "policy": tags.get(prefix + "promotion_policy")})
    decided = [p for p in _pauses(tags, f"{CANARY_TAG_PREFIX}{canary_id}.") if p.get("decision")] if canary_id else []
    if decided:
        last = decided[-1]
        out.append({"kind": "step decision", "outcome": f"{last['decision']} at {last.get('percent')} %",
                    "by": last.get("by"), "at": last.get("at") or "", "policy": last.get("policy"),
                    "reason": last.get("note") or last.get("source")})
    if SHADOW_TAG_PREFIX + "outcome" in tags:
        out.append({"kind": "shadow", "outcome": tags[SHADOW_TAG_PREFIX + "outcome"],
                    "at": tags.get(SHADOW_TAG_PREFIX + "evaluated_at", ""),
                    "policy": tags.get(SHADOW_TAG_PREFIX + "promotion_policy")})
    if APPROVAL_TAG_PREFIX + "answer" in tags:
        out.append({"kind": "approval", "outcome": tags[APPROVAL_TAG_PREFIX + "answer"],
                    "by": tags.get(APPROVAL_TAG_PREFIX + "by"), "at": tags.get(APPROVAL_TAG_PREFIX + "at", ""),
                    "policy": tags.get(APPROVAL_TAG_PREFIX + "policy")})
    if tags.get("tritonflow.status") == "rejected":
        out.append({"kind": "rejection", "outcome": f"rejected at {tags.get('tritonflow.rejected_stage')}",
                    "reason": tags.get("tritonflow.rejection_reason"), "at": tags.get("tritonflow.rejected_at", "")})
    return [{**d, "version": ref.version} for d in out]


def serving_status(model: str, *, env: CanaryEnvironment | None = None) -> dict[str, Any]:
    """What serves ``model``: versions and weights, aliases, policy, running canary, last decision.

    Args:
        model: Registered model name.
        env: Where things are (default: the settings' local runtime).

    Returns:
        ``{"model", "triton_model", "aliases", "policy", "weights", "champion", "canary",
        "last_decision", "problems"}``; ``problems`` names each part that could not be read.
    """
    env = environment_or_default(env)
    out: dict[str, Any] = {"model": model, "triton_model": None, "aliases": {}, "policy": None, "weights": None,
                           "champion": None, "canary": None, "last_decision": None, "problems": []}
    problems = out["problems"]
    try:
        registry = env.registry()
        out["aliases"] = registry.aliases(model)
        versions = registry.versions(model)
    except Exception as exc:  # noqa: BLE001 - named in the answer
        problems.append(f"MLflow registry at {env.tracking_uri}: could not read model {model!r}: {exc}")
        return out
    try:
        out["policy"] = policy_from_tags(registry.model_tags(model), env.settings.promotion_policy)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"promotion policy of {model!r}: {exc}")
    if versions:
        out["triton_model"] = triton_name(max(versions, key=lambda r: r.version))
        try:
            plan = env.router().current_plan(out["triton_model"])
            if plan is not None:
                out["weights"] = {str(k): v for k, v in plan.weights.items()}
                out["champion"] = plan.champion
        except Exception as exc:  # noqa: BLE001
            problems.append(f"gateway traffic plan of Triton model {out['triton_model']!r} "
                            f"(router {env.settings.traffic_router}): {exc}")
    running = [c for c in (running_canary(r) for r in versions) if c]
    out["canary"] = running[-1] if running else None
    made = [d for r in versions for d in decisions(r)]
    out["last_decision"] = max(made, key=lambda d: str(d.get("at") or "")) if made else None
    return out


def format_status(status: dict[str, Any]) -> str:
    """``status`` (:func:`serving_status`) as lines for a person."""
    lines = [f"model {status['model']} (Triton model {status['triton_model'] or '?'}), "
             f"promotion policy {status['policy'] or '?'}"]
    weights = status["weights"]
    lines.append("serving: " + (", ".join(f"v{v} {w} %" for v, w in weights.items()) if weights
                                else "no traffic plan on the gateway"))
    aliases = status["aliases"]
    lines.append("aliases: " + (", ".join(f"{a}=v{v}" for a, v in sorted(aliases.items())) if aliases else "none"))
    canary = status["canary"]
    waiting = (canary or {}).get("waiting")
    lines.append(f"canary: v{canary['version']} running ({canary['canary_id']}), step {canary['step'] or 'none yet'}"
                 + (f" at {canary['percent']} %" if canary.get("percent") is not None else "")
                 + (f", waiting for a decision at pause {waiting.get('number')} ({waiting.get('verdict')}; "
                    f"tritonflow decide MODEL continue|hold|rollback)" if waiting else "")
                 if canary else "canary: none running")
    last = status["last_decision"]
    lines.append(f"last decision: {last['kind']} {last['outcome']} on v{last['version']} at {last['at'] or '?'}"
                 + (f" by {last['by']}" if last.get("by") else "")
                 + (f" (policy {last['policy']})" if last.get("policy") else "")
                 + (f": {last['reason']}" if last.get("reason") else "")
                 if last else "last decision: none recorded")
    lines += [f"could not read: {p}" for p in status["problems"]]
    return "\n".join(lines)


__all__ = ["decisions", "format_status", "running_canary", "serving_status"]
