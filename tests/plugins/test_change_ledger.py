"""The change ledger: retention (what no path needs any more goes, what a path may still need stays), re-sends."""

from __future__ import annotations

import time

import pytest

from tritonflow.registry_events import ALIAS_SET, STAGE_CHANGED, TAG_SET, VERSION_CREATED
from tritonflow_plugin.change_ledger import CHANGES, DELIVERIES, SLOTS, ChangeLedger
from tritonflow_plugin.event_mapping import RegistryChange

DAY = 86400.0


@pytest.fixture()
def ledger(tmp_path):
    return ChangeLedger(tmp_path / "coordination.db")


def champion_to(version: str) -> RegistryChange:
    return RegistryChange(kind=ALIAS_SET, model="fraud", version=version, alias="champion")


def test_prune_drops_started_changes_and_done_deliveries_and_keeps_what_a_path_still_needs(ledger):
    started = ledger.record(champion_to("1"), delivery_id="d-started")
    ledger.mark_started(started.key, ["run-1"])
    claimed = ledger.record(RegistryChange(kind=VERSION_CREATED, model="fraud", version="2"))  # runs never seen
    ledger.store_delivery("d-started", "{}")
    ledger.finish_delivery("d-started", "done", started.key, outcome="started")
    ledger.store_delivery("d-received", "{}")  # the receiver failed after storing: MLflow retries it

    assert ledger.prune(30 * DAY) == {"changes": 0, "deliveries": 0}  # nothing is old yet
    pruned = ledger.prune(30 * DAY, now=time.time() + 31 * DAY)

    assert pruned == {"changes": 1, "deliveries": 1}
    assert ledger.change(started.key) is None and ledger.delivery("d-started") is None
    assert ledger.change(claimed.key)["status"] == "claimed"
    assert ledger.delivery("d-received")["status"] == "received"
    assert ledger.count(SLOTS) == 2 and ledger.count(CHANGES) == 1 and ledger.count(DELIVERIES) == 1


def test_after_pruning_the_next_move_is_numbered_on_and_knows_the_previous_champion(ledger):
    first = ledger.record(champion_to("1"))
    ledger.mark_started(first.key, [])
    ledger.prune(DAY, now=time.time() + 2 * DAY)

    again = ledger.record(champion_to("1"))  # the same move seen late by the other path
    moved = ledger.record(champion_to("2"))

    assert not again.new and again.key == first.key
    assert moved.new and moved.key.endswith("|2") and moved.previous == "1"


@pytest.mark.parametrize("retain_s", [0, -1.0, float("nan")])
def test_prune_refuses_a_retention_that_is_not_positive(ledger, retain_s):
    with pytest.raises(ValueError, match=r"retain_s=.*expected a positive number of seconds"):
        ledger.prune(retain_s)


def test_a_version_number_reused_by_a_new_model_is_a_new_change_on_every_slot_and_the_same_one_again_is_not(ledger):
    """A model deleted and created again numbers its versions from 1 again: its version 1 is not the old one."""
    def on(created_ms: int, kind: str, **fields) -> RegistryChange:
        return RegistryChange(kind=kind, model="fraud", version="1", version_created_ms=created_ms, **fields)

    old = [ledger.record(on(1000, kind, **fields)) for kind, fields in [
        (VERSION_CREATED, {}), (ALIAS_SET, {"alias": "champion"}), (TAG_SET, {"tag_key": "k", "tag_value": "v"}),
        (STAGE_CHANGED, {"stage": "Production"})]]
    for recorded in old:
        ledger.mark_started(recorded.key, [])
    again = [ledger.record(on(1000, r.change.kind, alias=r.change.alias, tag_key=r.change.tag_key,
                              tag_value=r.change.tag_value, stage=r.change.stage)) for r in old]
    new = [ledger.record(on(2000, r.change.kind, alias=r.change.alias, tag_key=r.change.tag_key,
                            tag_value=r.change.tag_value, stage=r.change.stage)) for r in old]

    assert [(r.new, r.key) for r in again] == [(False, r.key) for r in old]  # the same change, seen twice
    assert all(r.new and r.status == "claimed" for r in new)  # the new model's version 1: new changes
    assert {r.key for r in new}.isdisjoint({r.key for r in old})
    moved = next(r for r in new if r.change.kind == ALIAS_SET)
    assert moved.previous == "1" and moved.change.previous_version == "1"  # the version it replaced, as a number


def _due(ledger, resend_after_s: float, now: float) -> list[str]:
    return sorted(str(c.change_key) for c in ledger.unstarted(resend_after_s, now=now))


def test_a_sent_change_is_due_again_after_the_grace_period_until_its_runs_are_confirmed(ledger):
    sent = ledger.record(champion_to("1"))
    failed = ledger.record(RegistryChange(kind=VERSION_CREATED, model="fraud", version="2"))  # never sent
    t, both = time.time(), sorted([sent.key, failed.key])
    assert _due(ledger, 60, now=t) == both  # not sent yet: due at once

    ledger.mark_sent([sent.key, failed.key], now=t)
    assert _due(ledger, 60, now=t + 59) == []  # its event may still be on its way to a run
    assert _due(ledger, 60, now=t + 60) == both
    ledger.mark_sent([sent.key], now=t + 60)  # sent again: the grace period starts again
    ledger.mark_started(failed.key, ["run-2"])
    assert _due(ledger, 60, now=t + 119) == []
    assert _due(ledger, 60, now=t + 120) == [sent.key]

    ledger.mark_started(sent.key, ["run-1"])
    ledger.mark_started(sent.key, ["run-1", "run-1b"])  # a later run confirms it too: runs are kept
    ledger.mark_sent([sent.key], now=t + 200)  # a send recorded late changes nothing
    assert _due(ledger, 60, now=t + 10_000) == []
    assert ledger.change(sent.key)["runs"] == ["run-1", "run-1b"]
    assert ledger.change(sent.key)["status"] == "started"
