"""A model version's MLflow description in plain sentences, derived from its ``tritonflow.*`` tags.

Tags are for machines (JSON values, artifact URIs); a person opening the version page in the MLflow
UI reads the description, which MLflow renders as Markdown. :func:`version_description` rebuilds the
whole text from the tags and aliases each time, so it never disagrees with them and never grows
stale lines: a version published after an earlier rejection says "Published ...", not both.

Example output::

    **Serving as champion** (aliases: champion).

    - Published 2026-11-30 14:02 UTC by model_publish run `manual__2026-...`; Triton model
      `noaa_rain` version 3 in `/srv/models`.
    - Parity with the MLflow model: max abs difference 1.2e-07 over `probabilities`.
    - Config: 2 CPU instances, max batch 32, dynamic batching 500 us.
    - Signed by key `51c6a2...`; digest `9f0e...`.
    - Champion since 2026-11-30 14:05 UTC.
    - Last drift check: no drift (window starting 2026-11-30 13:00 UTC).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

#: Tag prefix every tritonflow tag starts with.
PREFIX = "tritonflow."


def _load(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def _mapping(value: Any) -> Mapping[str, Any]:
    """A decoded tag value when it is a JSON object, else ``{}`` (a hand-edited tag is skipped)."""
    return value if isinstance(value, Mapping) else {}


def _when(value: str | None) -> str:
    """``2026-11-30T14:02:11.123+00:00`` -> ``2026-11-30 14:02 UTC`` (unchanged when not ISO)."""
    if not value:
        return "?"
    text = str(value).replace("T", " ")
    return (text[:16] + " UTC") if len(text) >= 16 and text[4] == "-" else str(value)


def _config_sentence(summary: Mapping[str, Any]) -> str:
    parts = []
    for group in summary.get("instance_groups") or []:
        kind = str(group.get("kind", "")).replace("KIND_", "")
        count = int(group.get("count") or 1)
        parts.append(f"{count} {kind} instance{'s' if count != 1 else ''}")
    if summary.get("max_batch_size") is not None:
        parts.append(f"max batch {summary['max_batch_size']}")
    batching = summary.get("dynamic_batching")
    if isinstance(batching, Mapping):
        parts.append(f"dynamic batching {batching.get('max_queue_delay_us', 0)} us")
    elif summary:
        parts.append("no dynamic batching")
    backend = summary.get("backend")
    return ("Config: " + ", ".join(parts) + (f" ({backend})" if backend else "") + ".") if parts else ""


def _parity_sentence(parity: Mapping[str, Any]) -> str:
    worst_name, worst = "", None
    for output, errors in (parity or {}).items():
        value = (errors or {}).get("max_abs") if isinstance(errors, Mapping) else None
        if value is not None and (worst is None or float(value) > worst):
            worst_name, worst = output, float(value)
    if worst is None:
        return ""
    return f"Parity with the MLflow model: max abs difference {worst:.2g} over `{worst_name}`."


def _profile_sentence(profile: Mapping[str, Any]) -> str:
    """How the served config was chosen (tag ``tritonflow.profile``), ``""`` when unknown."""
    status = profile.get("status")
    if status == "profiled" and profile.get("best"):
        return (f"Config chosen by Model Analyzer ({profile['best']}): "
                f"{float(profile.get('throughput') or 0):.0f} inferences/s, p99 "
                f"{float(profile.get('p99_latency_ms') or 0):.1f} ms.")
    if status == "reused":
        confirmed = (profile.get("confirmation") or {}).get("status")
        return (f"Config reused from champion version {profile.get('champion_version')} (same flavour, tensors "
                f"and size; no new sweep)" + (f", p99 gate {confirmed}." if confirmed else "."))
    if status == "inconclusive":
        return ("Profiling inconclusive: no config could be measured stably (a busy host), so the "
                "generated config is served.")
    if status in ("skipped", "unavailable"):
        return f"Not profiled ({status}); the generated config is served."
    return ""


def _headline(status: str, alias_list: Sequence[str]) -> str:
    """The bold first line: the serving role when aliased, else the publish status."""
    if "champion" in alias_list:
        headline = "**Serving as champion**"
    elif "challenger" in alias_list:
        headline = "**Challenger**"
    elif status == "rejected":
        headline = "**Rejected**"
    elif status == "published":
        headline = "**Published, not serving**"
    else:
        headline = "**Not published by tritonflow yet**"
    if alias_list:
        headline += f" (aliases: {', '.join(alias_list)})"
    return headline


def _publish_lines(t: Mapping[str, Any]) -> list[str]:
    """Bullets about the publish: where it went, parity, config, profiling and signature."""
    where = f" in `{t['repository_uri']}`" if t.get("repository_uri") else ""
    run = f" by model_publish run `{t['publish_run_id']}`" if t.get("publish_run_id") else ""
    lines = [f"- Published {_when(t.get('published_at'))}{run}; Triton model "
             f"`{t.get('triton_model_name', '?')}` version {t.get('triton_model_version', '?')}{where}."]
    sentences = (_parity_sentence(_mapping(_load(t.get("parity_errors")))),
                 _config_sentence(_mapping(_load(t.get("config_summary")))),
                 _profile_sentence(_mapping(_load(t.get("profile")))))
    lines.extend("- " + sentence for sentence in sentences if sentence)
    if t.get("signature_key_id"):
        lines.append(f"- Signed by key `{t['signature_key_id'][:12]}`; digest "
                     f"`{str(t.get('signature_digest', ''))[:12]}`.")
    return lines


def _history_lines(t: Mapping[str, Any], status: str) -> list[str]:
    """Bullets about what happened after the publish: rejection, promotion, rollback, drift, canary."""
    lines = []
    if status == "rejected":
        reason = str(t.get("rejection_reason", "")).splitlines()[0][:300] if t.get("rejection_reason") else "?"
        lines.append(f"- Rejected {_when(t.get('rejected_at'))} at stage `{t.get('rejected_stage', '?')}`: "
                     f"{reason}")
    if t.get("promoted_at"):
        lines.append(f"- Champion since {_when(t['promoted_at'])}.")
    if t.get("demoted_at"):
        lines.append(f"- Replaced as champion {_when(t['demoted_at'])}.")
    if t.get("rolled_back_at"):
        to = f" to version {t['rolled_back_to']}" if t.get("rolled_back_to") else ""
        lines.append(f"- Rolled back{to} {_when(t['rolled_back_at'])}.")
    if t.get("drift.severity"):
        window = f" (window starting {_when(t.get('drift.window_start'))})" if t.get("drift.window_start") else ""
        lines.append(f"- Last drift check: {str(t['drift.severity']).replace('_', ' ')}{window}.")
    if t.get("canary_outcome"):
        lines.append(f"- Last canary: {t['canary_outcome']}.")
    return lines


def version_description(tags: Mapping[str, str], aliases: Sequence[str] = ()) -> str:
    """The Markdown description of a model version, rebuilt from its tags and aliases.

    Args:
        tags: The version's tags (``tritonflow.*`` ones are read, others ignored); JSON values are
            decoded.
        aliases: Aliases currently naming the version (``champion``, ``challenger``, ...).

    Returns:
        Markdown text: a headline (serving role or status) and one bullet per known fact
        (publish, parity, config, signature, promotion, rollback, last drift check, rejection).
        An empty-tag version gives a one-line "not published by tritonflow yet" text.
    """
    t = {k[len(PREFIX):]: v for k, v in tags.items() if k.startswith(PREFIX)}
    status = t.get("status", "")
    lines = [_headline(status, sorted(aliases)) + ".", ""]
    if status == "published" or t.get("published_at"):
        lines.extend(_publish_lines(t))
    lines.extend(_history_lines(t, status))
    lines.append("")
    lines.append("_Written by tritonflow from the `tritonflow.*` tags; details are in the tags and the "
                 "publish run's artifacts._")
    return "\n".join(lines)
