"""Pauses of a canary under promotion policy ``approve-steps``: the runner's decisions at the end of
each step's bake, asked and answered through the real pause board (a SQLite coordination database).

The canary is driven with scripted Triton metrics and a clock that the runner's sleeps advance
(tests/repository_sync/test_canary.py's ``Scripted``); a "person" answers through
:func:`answer_pause`, as the Airflow task that asks on the Required Actions page does, when the
runner has waited at an open pause for a given number of its analyses.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from ground.coordination import CoordinationStore
from repository_sync.canary.analysis import FAIL, INCONCLUSIVE, PASS
from repository_sync.canary.pauses import PauseDecision, offered
from repository_sync.canary.policy import CanaryPolicy
from repository_sync.canary.runner import run_canary
from tests.repository_sync.test_canary import MODEL, Scripted
from tritonflow.pipelines.canary_pauses import (
    PauseBoard,
    answer_pause,
    checks_summary,
    pause_request,
    pause_slots,
    pause_status,
)

KEY = "canary_promotion/manual__1"
#: Two steps, 10 s bakes, analyses every 5 s and no hard-check looks between them (the person
#: counts the runner's sleeps), one extension (or hold) per step.
POLICY = CanaryPolicy(steps=(50, 100), bake_s=10, min_requests=100, max_extensions=1, max_error_rate=0.01,
                      max_mean_latency_ms=50, max_latency_ratio=1.5, analysis_interval_s=5,
                      hard_check_interval_s=0)
TIMEOUT_S = 60.0


class Person(Scripted):
    """Scripted metrics, a clock its sleeps advance, and a person who answers open pauses.

    Args:
        answers: One ``(decision, after)`` per pause, in order: answer ``decision`` once the
            runner has slept ``after`` times at that pause (``None``: never answer).
        fail_from_sleep: From this sleep on, every request of the challenger fails.
    """

    def __init__(self, store, answers, canary_per_bake=600, fail_from_sleep=None):
        super().__init__(canary_per_bake=canary_per_bake)
        self.store, self.answers, self.now, self.sleeps = store, list(answers), 1000.0, 0
        self.fail_from_sleep, self.waited = fail_from_sleep, {}
        self.refused: list[dict] = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        super().sleep(seconds)
        self.now += seconds
        self.sleeps += 1
        if self.fail_from_sleep is not None and self.sleeps >= self.fail_from_sleep:
            self.failure += self.per_bake
        for number in range(1, 20):
            status = pause_status(self.store, KEY, number)
            if status["state"] != "open":
                continue
            self.waited[number] = self.waited.get(number, 0) + 1
            decision, after = self.answers[number - 1] if number <= len(self.answers) else (None, None)
            if decision is not None and self.waited[number] == after:
                out = answer_pause(self.store, KEY, number, decision, by="alice", note=f"pause {number}")
                if not out["taken"]:
                    self.refused.append(out)


@pytest.fixture
def store(tmp_path):
    return CoordinationStore(f"sqlite:///{tmp_path / 'coordination.db'}")


def board_for(store, slots=None, recorded=None):
    slots = pause_slots(2, 1) if slots is None else slots
    board = PauseBoard(store, KEY, slots=slots, timeout_s=TIMEOUT_S, clock=lambda: 0.0,
                       record=(recorded.append if recorded is not None else None), tag_prefix="c.")
    board.start(model=MODEL, challenger=7, champion=6, canary_id="c1")
    return board


def drive(person: Person, board, policy=POLICY):
    return run_canary(model=MODEL, champion=6, challenger=7, policy=policy, apply_plan=person.apply,
                      scrape_metrics=person.scrape, unload_challenger=person.unload, sleep=person.sleep,
                      clock=person.clock, pauses=board)


def test_a_person_continues_at_each_pause_and_the_challenger_is_promoted(store):
    recorded: list[dict] = []
    person = Person(store, [("continue", 1), ("continue", 2)])
    result = drive(person, board_for(store, recorded=recorded))
    assert result.outcome == "promoted"
    assert [(d["percent"], d["decision"], d["by"], d["source"]) for d in result.decisions] == [
        (50, "continue", "alice", "person"), (100, "continue", "alice", "person")]
    # each pause is tagged when it opens (waiting) and again with what was decided, who and when
    tags = [json.loads(v) for r in recorded for v in r.values()]
    assert [(t["number"], t["decision"]) for t in tags] == [(1, None), (1, "continue"), (2, None), (2, "continue")]
    assert tags[1]["by"] == "alice" and tags[1]["at"] and tags[1]["policy"] == "approve-steps"
    assert tags[1]["verdict"] == PASS and tags[1]["options"] == ["continue", "hold", "rollback"]


def test_hold_bakes_the_step_again_then_pauses_again_and_hold_is_no_longer_offered(store):
    person = Person(store, [("hold", 1), ("continue", 1), ("continue", 1)])
    result = drive(person, board_for(store))
    assert result.outcome == "promoted"
    assert [(d["percent"], d["attempt"], d["decision"]) for d in result.decisions] == [
        (50, 1, "hold"), (50, 2, "continue"), (100, 1, "continue")]
    assert [(s.percent, s.attempt, s.verdict) for s in result.steps] == [
        (50, 1, PASS), (50, 2, PASS), (100, 1, PASS)]
    row = pause_status(store, KEY, 2)["row"]
    assert row["pauses"]["2"]["options"] == ["continue", "rollback"]  # the one extension is used
    assert row["pauses"]["1"]["options"] == ["continue", "hold", "rollback"]


def test_roll_back_now_rolls_back_gateway_first_and_names_who_decided(store):
    person = Person(store, [("rollback", 2)])
    result = drive(person, board_for(store))
    assert result.outcome == "rolled_back"
    assert "rolled back at its pause by alice: pause 1" in result.reason
    assert person.events[-2:] == [("apply", {6: 100}), ("unload",)]
    assert result.steps[-1].verdict == PASS  # a person's rollback is no verdict on the challenger
    assert pause_status(store, KEY, 1)["state"] == "closed"


def test_nobody_answers_a_passed_step_continues_after_the_timeout(store):
    person = Person(store, [])
    result = drive(person, board_for(store))
    assert result.outcome == "promoted"
    assert [(d["decision"], d["source"], d["by"]) for d in result.decisions] == [
        ("continue", "timeout", ""), ("continue", "timeout", "")]
    waits = [s for s in person.events if s[0] == "sleep"]
    assert sum(s[1] for s in waits) == pytest.approx(2 * (POLICY.bake_s + TIMEOUT_S))


def test_a_check_failing_while_waiting_rolls_back_at_once_without_waiting_for_anyone(store):
    person = Person(store, [], fail_from_sleep=4)  # 2 naps bake step 1; failures start while it waits
    result = drive(person, board_for(store))
    assert result.outcome == "rolled_back"
    assert "failed while waiting at its pause" in result.reason and "error rate" in result.reason
    (decision,) = result.decisions
    assert decision["decision"] == "rollback" and decision["source"] == "check"
    assert person.now - 1000.0 < POLICY.bake_s + TIMEOUT_S  # well before the pause's timeout
    assert result.steps[-1].verdict == FAIL  # judged: the challenger failed a check
    late = answer_pause(store, KEY, 1, "continue", by="bob")
    assert not late["taken"] and "already decided: rollback (check" in late["why"]


def test_a_failed_verdict_rolls_back_without_any_pause(store):
    person = Person(store, [])
    person.fail_per_bake = 50
    result = drive(person, board_for(store))
    assert result.outcome == "rolled_back" and result.decisions == []
    assert pause_status(store, KEY, 1)["state"] == "waiting"


def test_an_inconclusive_step_pauses_with_hold_as_its_default_then_fails_past_its_extension(store):
    person = Person(store, [], canary_per_bake=2)  # 2 requests a nap (waits too): 100 are needed
    result = drive(person, board_for(store))
    assert result.outcome == "rolled_back"
    ((step, decision),) = [(d["percent"], d) for d in result.decisions]
    assert step == 50 and decision["verdict"] == INCONCLUSIVE
    assert decision["decision"] == "hold" and decision["source"] == "timeout"
    assert [s.verdict for s in result.steps] == [INCONCLUSIVE, FAIL]
    assert "still inconclusive after 1 extension" in result.reason


def test_a_pause_past_the_last_slot_takes_its_default_at_once(store):
    person = Person(store, [("hold", 1)])
    result = drive(person, board_for(store, slots=1))
    assert [(d["pause"], d["decision"], d["source"]) for d in result.decisions] == [
        (1, "hold", "person"), (None, "continue", "no pause left"), (None, "continue", "no pause left")]


def test_answers_are_refused_when_not_offered_not_open_or_after_the_canary_ended(store):
    board = board_for(store)
    analysis = dataclasses.make_dataclass("A", [])()
    analysis.to_dict = lambda: {"step": 2, "percent": 100, "attempt": 2, "verdict": PASS, "reasons": [],
                                "thresholds": {}}
    assert not answer_pause(store, KEY, 1, "continue", by="alice")["taken"]  # not open yet
    number = board.open(analysis, ("continue", "rollback"), "continue")
    assert number == 1 and pause_status(store, KEY, 1)["state"] == "open"
    refused = answer_pause(store, KEY, 1, "hold", by="alice")
    assert not refused["taken"] and "offered: continue, rollback" in refused["why"]
    assert not answer_pause(store, KEY, 1, "promote", by="alice")["taken"]
    board.end("aborted")
    ended = answer_pause(store, KEY, 1, "continue", by="alice")
    assert not ended["taken"] and "ended (aborted)" in ended["why"]
    assert pause_status(store, KEY, 2)["state"] == "ended"


def test_the_question_shows_the_verdict_its_checks_the_options_and_the_default():
    a = {"step": 1, "percent": 25, "attempt": 1, "verdict": PASS, "canary_requests": 240.0,
         "canary_error_rate": 0.0, "canary_mean_latency_ms": 3.5, "latency_ratio": 1.1,
         "predictions_nonfinite": 0, "prediction_ks": 0.05, "coverage_ratio": 0.9,
         "thresholds": POLICY.thresholds(), "reasons": ["quality not compared (no label arrived)"]}
    rows = checks_summary(a)
    assert {"check": "challenger requests", "value": "240", "limit": ">= 100"} in rows
    pause = {"step": 1, "percent": 25, "attempt": 1, "verdict": PASS, "checks": rows, "reasons": a["reasons"],
             "options": ["continue", "hold", "rollback"], "default": "continue", "deadline_iso": "2026-01-01T10:00:00"}
    request = pause_request(pause, model="iris", challenger=7, champion=6)
    assert request["subject"] == "Canary of iris v7 at 25 %: pass (Continue / Hold / Roll back)?"
    body = request["body"]
    assert "**Automatic verdict: pass**" in body and "| challenger requests | 240 | >= 100 |" in body
    assert "default: **Continue**" in body and "quality not compared" in body


@pytest.mark.parametrize(("passed", "left", "options", "default"), [
    (True, True, ("continue", "hold", "rollback"), "continue"),
    (True, False, ("continue", "rollback"), "continue"),
    (False, True, ("continue", "hold", "rollback"), "hold"),
])
def test_continue_is_the_default_only_after_a_passed_verdict(passed, left, options, default):
    assert offered(passed, left) == (options, default)


def test_a_decision_names_one_of_the_three():
    with pytest.raises(ValueError, match="expected one of continue, hold, rollback"):
        PauseDecision("promote")
