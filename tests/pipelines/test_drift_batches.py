"""Batches of models per drift task (tritonflow.pipelines.drift_batches): one model's failure never
stops the others, and the failures are named at the end."""

from __future__ import annotations

import pytest

from ground.exceptions import WindowError
from ground.settings import Settings
from tritonflow.pipelines import drift_batches as batches

HOUR = ("2025-03-01T00:00:00+00:00", "2025-03-01T01:00:00+00:00")


def _summary(model: str, status: str = "ok", drift: bool = False) -> dict:
    return {"model": model, "model_version": 1, "window_start": HOUR[0], "window_end": HOUR[1], "status": status,
            "severity": "drift" if drift else "ok", "drift": drift, "dataset_score": 0.9 if drift else 0.1,
            "alert_features": ["temperature"] if drift else [],
            "features": {"temperature": {"severity": "drift" if drift else "ok",
                                         "statistics": {"psi": {"value": 0.7 if drift else 0.01}}}},
            "alerts": ([{"kind": "data_quality", "column": "temperature",
                         "expectation": "expect_column_values_to_not_be_null", "observed": 1.0}]
                       if status == "contract_failed" else []),
            "artefacts": {}}


def test_a_raising_model_becomes_a_failure_entry_and_the_others_still_run():
    seen = []

    def run(item):
        seen.append(item["model"])
        if item["model"] == "b":
            raise WindowError("log file b/part-0.parquet is not Parquet")
        if item["model"] == "c":
            raise ConnectionError("history DB refused the connection")
        return {"model": item["model"], "done": True}

    out = batches.for_each("check", [{"model": m, "version": 1} for m in "abcd"], run)
    assert seen == ["a", "b", "c", "d"]
    assert [e.get("done") for e in out] == [True, None, None, True]
    assert out[1] == {"model": "b", "model_version": 1, "status": "failed", "stage": "check",
                      "error": "WindowError: log file b/part-0.parquet is not Parquet", "data_error": True}
    assert out[2]["data_error"] is False and batches.is_failure(out[2]) and not batches.is_failure(out[0])
    # an error that may pass retries the batch while tries are left; bad data never does
    with pytest.raises(batches.BatchRetryError, match="c: ConnectionError"):
        batches.retry_if_transient(out, "check", last_try=False)
    batches.retry_if_transient(out, "check", last_try=True)  # last try: kept as failure entries
    batches.retry_if_transient([out[0], out[1]], "check", last_try=False)  # bad data only: no retry


def test_problems_name_each_failed_model_and_the_stage_whose_result_is_missing():
    targets = [[{"model": "a", "version": 1}, {"model": "b", "version": 1}], [{"model": "c", "version": 2}]]
    checked = [[_summary("a", drift=True),
                batches.failure("b", 1, "check", WindowError("bad file"))]]  # batch 2's check task failed
    found = batches.problems(targets, checked, {"record": [[{"model": "a", "run_id": "r"}]], "decide": [[]]},
                             events=[])
    assert [f["model"] for f in found] == ["a", "b", "c"]
    assert found[0]["problems"] == [
        "decide: no result (the decide task of its batch failed; see its log)",
        "drift_event: the drift alert's asset event was not emitted (see the drift_event task)"]
    assert found[1] == {"model": "b", "version": 1, "problems": ["check: WindowError: bad file"], "data_error": True}
    assert found[2]["problems"][0].startswith("check: no result") and found[2]["data_error"] is False
    with pytest.raises(batches.ModelsFailedError, match=r"3 of 3 monitored model\(s\) failed .*b \(check: "
                                                         r"WindowError: bad file\)"):
        batches.raise_problems(found, 3, *HOUR)


def test_a_broken_contract_is_a_problem_and_an_alerting_model_needs_its_event():
    targets = [[{"model": "a", "version": 1}, {"model": "b", "version": 1}]]
    checked = [[_summary("a", status="contract_failed"), _summary("b", drift=True)]]
    (extra,) = batches.alert_events(checked)  # a failed contract is never a drift event
    assert extra["model"] == "b" and extra["scores"]["temperature"] == {"psi": 0.7}
    done = {"record": [[{"model": "a"}, {"model": "b"}]], "decide": [[{"model": "a"}, {"model": "b"}]]}
    (found,) = batches.problems(targets, checked, done, events=[extra])
    assert found["model"] == "a" and found["data_error"] is True
    assert "temperature: expect_column_values_to_not_be_null" in found["problems"][0]
    assert batches.raise_problems([], 2) == {"models": 2, "failed": 0}


def test_each_summary_of_a_batch_gets_a_share_of_the_xcom_limit():
    s = Settings.from_env({"TRITONFLOW_MAX_XCOM_BYTES": "49152"})
    assert batches.per_model_settings(s, 1) is s
    assert batches.per_model_settings(s, 10).max_xcom_bytes == int(49152 * 0.9) // 10
    assert batches.per_model_settings(s, 1000).max_xcom_bytes == batches.MIN_SUMMARY_BYTES
    assert batches.flatten([[1, None, 2], None, 3]) == [1, 2, 3]
