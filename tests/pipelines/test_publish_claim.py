"""One publish per version: the claim in the shared coordination database (no other service).

The claim is what makes a second publish of a version wait for the first and return its record
instead of converting and profiling again. These tests drive it with the real store (SQLite under
the test's home, shared by threads and processes alike) and real stage functions decorated with
:func:`claimed_stage`; the end-to-end publishes are in ``test_publish_once.py``.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import make_settings
from tritonflow.pipelines import publish_claim
from tritonflow.pipelines.publish_claim import JOINED_KEY, claimed_stage, read_claim, take_or_join


def _state(attempt: str, model: str = "churn", version: int = 3) -> dict:
    return {"model": model, "version": version, "staging_attempt": attempt}


@pytest.fixture
def settings(tmp_path):
    return make_settings(tmp_path / "home", publish_claim_ttl_s=3.0)


def test_the_first_attempt_claims_the_version_and_a_second_one_joins_its_record(settings):
    calls: list[str] = []

    @claimed_stage()
    def convert(state, *, settings=None):
        calls.append(("convert", state["staging_attempt"]))
        time.sleep(0.5)
        return {**state, "converted": True}

    @claimed_stage(last=True)
    def record(state, *, settings=None):
        calls.append(("record", state["staging_attempt"]))
        return {"model": state["model"], "version": state["version"], "status": "published",
                "by": state["staging_attempt"]}

    first = convert(_state("A"), settings=settings)
    assert read_claim(settings, "churn", 3)["status"] == "running"
    results: dict[str, dict] = {}
    waiter = threading.Thread(target=lambda: results.update(B=record(convert(_state("B"), settings=settings),
                                                                      settings=settings)))
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive()  # B waits while A holds the version
    results["A"] = record(first, settings=settings)
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert calls == [("convert", "A"), ("record", "A")]  # B converted nothing
    assert results["B"] == {**results["A"], "joined_attempt": "A"}
    claim = read_claim(settings, "churn", 3)
    assert claim["status"] == "published" and claim["attempt"] == "A" and claim["summary"] == results["A"]


def test_a_publish_started_after_the_last_one_ended_claims_the_version_anew(settings):
    @claimed_stage(last=True)
    def record(state, *, settings=None):
        return {"by": state["staging_attempt"]}

    assert record(_state("A"), settings=settings) == {"by": "A"}
    assert record(_state("B"), settings=settings) == {"by": "B"}  # a deliberate re-run is not joined
    assert read_claim(settings, "churn", 3)["attempt"] == "B"


def test_a_failed_stage_frees_the_version_at_once_and_the_waiting_publish_does_the_work(settings):
    @claimed_stage()
    def convert(state, *, settings=None):
        if state["staging_attempt"] == "A":
            raise ValueError("parity failed")
        return {**state, "converted": True}

    with pytest.raises(ValueError, match="parity failed"):
        convert(_state("A"), settings=settings)
    claim = read_claim(settings, "churn", 3)
    assert claim["status"] == "failed" and "parity failed" in claim["reason"]
    t0 = time.monotonic()
    out = convert(_state("B"), settings=settings)
    assert out["converted"] and JOINED_KEY not in out and time.monotonic() - t0 < 2.0
    assert read_claim(settings, "churn", 3)["attempt"] == "B"


def test_a_claim_whose_holder_stopped_renewing_it_is_taken_over_after_its_ttl(settings):
    take_or_join(_state("A"), settings)  # A's process died between two stages: no heartbeat any more
    t0 = time.monotonic()
    out = take_or_join(_state("B"), settings)
    waited = time.monotonic() - t0
    assert JOINED_KEY not in out and settings.publish_claim_ttl_s - 0.5 <= waited < 10
    assert read_claim(settings, "churn", 3)["attempt"] == "B"
    # A's next stage finds the version taken over and waits for B rather than working beside it
    results: dict = {}
    late = threading.Thread(target=lambda: results.update(A=take_or_join(_state("A"), settings)))
    late.start()
    time.sleep(0.5)
    publish_claim.finish_claim(out, settings, {"by": "B"})
    late.join(timeout=30)
    assert results["A"][JOINED_KEY] == {"by": "B", "joined_attempt": "B"}


def test_a_running_stage_renews_its_claim_so_a_long_stage_is_not_taken_over(settings):
    @claimed_stage()
    def long_profile(state, *, settings=None):
        time.sleep(settings.publish_claim_ttl_s * 2)
        return {**state, "profiled": True}

    holder = threading.Thread(target=lambda: long_profile(_state("A"), settings=settings))
    holder.start()
    time.sleep(0.3)
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(B=take_or_join(_state("B"), settings)))
    waiter.start()
    holder.join(timeout=30)
    time.sleep(1.0)
    assert waiter.is_alive()  # A renewed past its ttl and still holds the version (running, between stages)
    assert read_claim(settings, "churn", 3)["attempt"] == "A"
    waiter.join(timeout=30)  # A never finishes: its claim goes stale and B takes over
    assert JOINED_KEY not in got["B"] and read_claim(settings, "churn", 3)["attempt"] == "B"


def test_a_state_without_an_attempt_is_not_claimed_and_other_versions_are_independent(settings):
    assert take_or_join({"model": "churn", "version": 3}, settings) == {"model": "churn", "version": 3}
    assert read_claim(settings, "churn", 3) is None
    take_or_join(_state("A", version=3), settings)
    t0 = time.monotonic()
    assert JOINED_KEY not in take_or_join(_state("B", version=4), settings)
    assert time.monotonic() - t0 < 2.0
