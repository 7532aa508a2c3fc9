"""The compose demo's summary parts that need no Docker: the lease holders per host."""

from __future__ import annotations

import socket
import time

from ground.coordination import MODEL_CONTROL, PROMOTION, CoordinationStore
from tritonflow.demo.stack import lease_holders


def test_lease_holders_lists_each_lease_with_its_host_and_counts_per_host(tmp_path):
    store = CoordinationStore(f"sqlite:///{tmp_path / 'coordination.db'}", ttl_s=30.0)
    with store.hold(MODEL_CONTROL, "noaa_rain", holder="model_publish/run_1/load"):
        time.sleep(0.05)
    with store.hold(PROMOTION, "noaa_rain", holder="canary_promotion/run_2/canary"):
        with store.hold(MODEL_CONTROL, "noaa_rain", holder="canary_promotion/run_2/canary"):
            pass
    lost = store.acquire(PROMOTION, "other_model", holder="canary_promotion/run_3/canary")
    lost.stop_heartbeat()  # never released: a killed worker's lease
    held = lease_holders(store.lease_history(purposes=(MODEL_CONTROL, PROMOTION)))
    host = socket.gethostname()
    assert [(x["purpose"], x["name"], x["holder"], x["host"]) for x in held["leases"]] == [
        (MODEL_CONTROL, "noaa_rain", "model_publish/run_1/load", host),
        (PROMOTION, "noaa_rain", "canary_promotion/run_2/canary", host),
        (MODEL_CONTROL, "noaa_rain", "canary_promotion/run_2/canary", host),
        (PROMOTION, "other_model", "canary_promotion/run_3/canary", host),
    ]
    assert held["leases"][0]["held_s"] >= 0.05
    assert held["leases"][-1]["held_s"] is None and held["leases"][-1]["released_at"] is None
    assert held["per_host"] == {MODEL_CONTROL: {host: 2}, PROMOTION: {host: 2}}


def test_lease_holders_of_no_history_is_empty():
    assert lease_holders([]) == {"leases": [], "per_host": {}}
