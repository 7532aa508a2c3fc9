"""The model version's MLflow description is rebuilt from its tags, in plain sentences."""

import json

from model_registry.description import version_description


def _tags(**values):
    return {f"tritonflow.{k}": (v if isinstance(v, str) else json.dumps(v)) for k, v in values.items()}


def test_a_champion_is_described_with_its_publish_parity_config_signature_and_last_drift_check():
    text = version_description(_tags(
        status="published", published_at="2026-11-30T14:02:11.5+00:00", publish_run_id="abc123",
        triton_model_name="noaa_rain", triton_model_version="3", repository_uri="/srv/models",
        parity_errors={"probabilities": {"max_abs": 1.2e-7}}, signature_key_id="51c6a2ffee0011",
        signature_digest="sha256:9f0e", promoted_at="2026-11-30T14:05:00+00:00",
        config_summary={"max_batch_size": 32, "instance_groups": [{"kind": "KIND_CPU", "count": 1}]},
        **{"drift.severity": "no_drift", "drift.window_start": "2026-11-30T13:00:00+00:00"},
    ), ["champion"])
    assert text.splitlines()[0] == "**Serving as champion** (aliases: champion)."
    assert "- Published 2026-11-30 14:02 UTC by model_publish run `abc123`; Triton model `noaa_rain` version 3" in text
    assert "- Config: 1 CPU instance, max batch 32, no dynamic batching." in text
    assert "- Champion since 2026-11-30 14:05 UTC." in text
    assert "- Last drift check: no drift (window starting 2026-11-30 13:00 UTC)." in text
    assert "Signed by key `51c6a2ffee00`" in text


def test_how_the_served_config_was_chosen_is_said_in_words():
    def described(profile):
        return version_description(_tags(status="published", profile=profile), [])

    assert ("- Config chosen by Model Analyzer (m_config_1): 812 inferences/s, p99 3.4 ms."
            in described({"status": "profiled", "best": "m_config_1", "throughput": 812.4, "p99_latency_ms": 3.42}))
    assert "- Profiling inconclusive: no config could be measured stably" in described(
        {"status": "inconclusive", "reason": "..."})
    assert "- Not profiled (skipped); the generated config is served." in described({"status": "skipped"})
    assert ("- Config reused from champion version 3 (same flavour, tensors and size; no new sweep), p99 gate "
            "passed." in described({"status": "reused", "champion_version": 3, "confirmation": {"status": "passed"}}))


def test_a_version_without_tritonflow_tags_says_so_and_ignores_other_tags():
    text = version_description({"owner": "ml-team"}, [])
    assert text.startswith("**Not published by tritonflow yet**.")
    assert "owner" not in text and "ml-team" not in text


def test_a_tag_that_is_not_json_is_shown_as_text_not_an_error():
    text = version_description(_tags(status="published", parity_errors="n/a", config_summary="n/a"), [])
    assert text.startswith("**Published, not serving**")
