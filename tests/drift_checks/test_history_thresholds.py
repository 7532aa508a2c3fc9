"""History store (SQLite, PostgreSQL) and dynamic P95 thresholds."""

import datetime as dt
import math
import uuid

import numpy as np
import pytest

from drift_checks.history import HistoryStore, StatisticRow
from drift_checks.thresholds import ThresholdPolicy, resolve_thresholds, weighted_score
from ground.exceptions import SettingsError

T0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
        yield s
        s.engine.dispose()
        return
    try:
        s = HistoryStore(PG_URL, table_prefix=f"t{uuid.uuid4().hex[:10]}_")
    except Exception as exc:  # pragma: no cover - PostgreSQL not reachable here
        pytest.skip(f"PostgreSQL at {PG_URL} not reachable: {exc}")
    yield s
    s.drop()


def _fill(store, n_hours, values, model="m", feature="f", statistic="psi"):
    store.bulk_load({"model": model, "feature": feature, "statistic": statistic,
                     "hour": T0 + dt.timedelta(hours=i), "value": float(values[i])}
                    for i in range(n_hours))


def test_rerunning_an_hour_replaces_its_values_never_duplicates(store):
    for value in (0.3, 0.7):
        store.record_hour("m", T0, status="ok", n_rows=10,
                          statistics=[StatisticRow("f", "psi", value)], verdicts={"f": ("ok", False)})
    assert store.values("m", "f", "psi") == [(T0.replace(tzinfo=None), 0.7)]
    assert store.window("m", T0)["status"] == "ok"


def test_nan_and_inf_never_enter_the_history(store):
    stored = store.record_hour("m", T0, status="ok", n_rows=10, statistics=[
        StatisticRow("f", "psi", math.nan), StatisticRow("f", "ks_p_value", math.inf),
        StatisticRow("f", "wasserstein_normed", 0.2)])
    assert stored == 1 and store.values("m", "f", "psi") == []


def test_p95_of_distances_and_p5_of_p_values_over_the_window(store):
    rng = np.random.default_rng(0)
    psi, pv = rng.uniform(0.12, 0.2, 100), rng.uniform(0.0, 0.04, 100)  # inside floor and ceiling
    _fill(store, 100, psi)
    _fill(store, 100, pv, statistic="ks_p_value")
    now = T0 + dt.timedelta(hours=100)
    thr = resolve_thresholds(store, "m", now, [("f", "psi"), ("f", "ks_p_value")],
                             ThresholdPolicy(min_history=48))
    assert thr[("f", "psi")].source == "dynamic" and thr[("f", "psi")].n_history == 100
    assert thr[("f", "psi")].value == pytest.approx(np.quantile(psi, 0.95), rel=1e-9)
    assert thr[("f", "ks_p_value")].value == pytest.approx(np.quantile(pv, 0.05), rel=1e-9)
    assert thr[("f", "ks_p_value")].quantile == pytest.approx(0.05)


def test_static_fallback_until_min_history_and_window_excludes_old_and_current_hours(store):
    _fill(store, 47, np.full(47, 0.5))
    thr = resolve_thresholds(store, "m", T0 + dt.timedelta(hours=47), [("f", "psi")])
    assert thr[("f", "psi")].source == "static" and thr[("f", "psi")].value == 0.1
    # 2-day look-back from hour 100 sees hours 52..99 only (none of the 47 old ones)
    _fill(store, 101, np.r_[np.full(47, 0.5), np.full(54, 0.15)])
    thr = resolve_thresholds(store, "m", T0 + dt.timedelta(hours=100), [("f", "psi")],
                             ThresholdPolicy(window_days=2, min_history=48))
    assert thr[("f", "psi")].n_history == 48 and thr[("f", "psi")].value == pytest.approx(0.15)


def test_previous_flags_read_back_in_hour_order(store):
    for h, flag in [(0, True), (1, False), (2, True)]:
        store.record_hour("m", T0 + dt.timedelta(hours=h), status="ok", n_rows=1,
                          verdicts={"f": ("warning" if flag else "ok", flag)})
    assert store.previous_flags("m", ["f"], T0 + dt.timedelta(hours=3), 3) == {"f": [True, False, True]}


def test_weighted_dataset_score_and_bad_weights():
    assert weighted_score({"a": True, "b": False}, {"a": 3.0}) == pytest.approx(0.75)
    assert weighted_score({}) == 0.0
    with pytest.raises(SettingsError, match="weight of feature 'a'"):
        weighted_score({"a": True}, {"a": float("nan")})
    with pytest.raises(SettingsError, match="quantile"):
        ThresholdPolicy(quantile=1.5)
