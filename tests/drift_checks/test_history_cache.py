"""The P95 lookup served from the per-series cache gives exactly the statistics table's quantiles."""

import datetime as dt
import uuid

import numpy as np
import pytest

from drift_checks.history import HistoryStore, StatisticRow

T0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
REF = "v1:training:abc"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}", cache_days=10)
        yield s
        s.engine.dispose()
        return
    try:
        s = HistoryStore(PG_URL, table_prefix=f"t{uuid.uuid4().hex[:10]}_", cache_days=10)
    except Exception as exc:  # pragma: no cover - PostgreSQL not reachable here
        pytest.skip(f"PostgreSQL at {PG_URL} not reachable: {exc}")
    yield s
    s.drop()


def _table_only(store, model, before, days, wanted, ref=REF):
    """The same lookup with the cache emptied (the statistics table's answer)."""
    import sqlalchemy as sa

    with store.engine.begin() as conn:
        saved = conn.execute(sa.select(store.series)).mappings().all()
        conn.execute(sa.delete(store.series))
    try:
        return store.quantiles(model, before, days, wanted, reference_id=ref, taught_only=True)
    finally:
        with store.engine.begin() as conn:
            if saved:
                conn.execute(store.series.insert(), [dict(r) for r in saved])


def _record(store, hour_i, values, taught=True, ref=REF, model="m"):
    store.record_hour(model, T0 + dt.timedelta(hours=hour_i), status="ok", n_rows=10, reference_id=ref,
                      statistics=[StatisticRow(f, s, v, taught=taught) for (f, s), v in values.items()])


def test_cached_p95_equals_the_table_through_reruns_untaught_hours_other_references_and_backfills(store):
    rng = np.random.default_rng(3)
    keys = [("a", "psi"), ("a", "ks_p_value"), ("b", "psi")]
    wanted = {("a", "psi"): 0.95, ("a", "ks_p_value"): 0.05, ("b", "psi"): 0.95}
    for h in range(300):  # 12.5 days: more than the 10-day cache
        if h % 50 == 0 or h == 299:  # judged against another reference first, then rerun against REF
            _record(store, h, {("a", "psi"): 9.0}, ref="v2:training:zzz")
        if h != 299:
            _record(store, h, {k: float(rng.gamma(2, 0.05)) for k in keys}, taught=h % 7 != 3)
    _record(store, 290, {k: 5.0 for k in keys})  # a rerun replaces the hour's values
    _record(store, 291, {k: 7.0 for k in keys}, taught=False)  # a rerun that no longer teaches
    for before_h, days in ((300, 7), (300, 10), (250, 3), (300, 12.0), (120, 30)):
        before = T0 + dt.timedelta(hours=before_h)
        cached = store.quantiles("m", before, days, wanted, reference_id=REF, taught_only=True)
        assert cached == _table_only(store, "m", before, days, wanted)
        assert set(cached) == set(wanted) and all(n > 0 for _, n in cached.values())
    other = store.quantiles("m", T0 + dt.timedelta(hours=300), 10, {("a", "psi"): 0.95},
                            reference_id="v2:training:zzz", taught_only=True)
    assert other == {("a", "psi"): (9.0, 1)}  # only hour 299 is still judged against it
    assert other == _table_only(store, "m", T0 + dt.timedelta(hours=300), 10, {("a", "psi"): 0.95},
                                ref="v2:training:zzz")
    # a backfill of an hour older than the cache reaches the table, still exact
    _record(store, 5, {k: 3.0 for k in keys})
    before = T0 + dt.timedelta(hours=100)
    assert (store.quantiles("m", before, 30, wanted, reference_id=REF, taught_only=True)
            == _table_only(store, "m", before, 30, wanted))


def test_bulk_loaded_history_and_a_store_without_cache_rows_give_the_same_thresholds(store):
    rng = np.random.default_rng(5)
    vals = rng.gamma(2, 0.02, 200)
    store.bulk_load({"model": "m", "reference_id": REF, "feature": "f", "statistic": "psi",
                     "hour": T0 + dt.timedelta(hours=i), "value": float(v)} for i, v in enumerate(vals))
    before = T0 + dt.timedelta(hours=200)
    wanted = {("f", "psi"): 0.95}
    got = store.quantiles("m", before, 5, wanted, reference_id=REF, taught_only=True)
    assert got[("f", "psi")] == (float(np.quantile(vals[80:], 0.95, method="linear")), 120)
    assert got == _table_only(store, "m", before, 5, wanted)
    # cache rows lost (a database from before the cache): the first recorded hour rebuilds them
    import sqlalchemy as sa

    with store.engine.begin() as conn:
        conn.execute(sa.delete(store.series))
    _record(store, 200, {("f", "psi"): 0.5})
    before = T0 + dt.timedelta(hours=201)
    got = store.quantiles("m", before, 5, wanted, reference_id=REF, taught_only=True)
    assert got[("f", "psi")] == (float(np.quantile(np.append(vals[81:], 0.5), 0.95, method="linear")), 120)


def test_an_hours_rows_against_its_season_are_kept_and_cached_apart_from_its_own_references(store):
    """One hour stores its statistics against its reference and, under the season's id, against its
    season (the season-matched run rule); each series answers only for its own reference."""
    season = REF + ":seasonal"
    for h in range(40):
        store.record_hour("m", T0 + dt.timedelta(hours=h), status="ok", n_rows=10, reference_id=REF,
                          statistics=[StatisticRow("a", "psi", 0.1 + h / 1000),
                                      StatisticRow("a", "psi", 5.0 + h, reference_id=season)])
    wanted = {("a", "psi"): 0.5}
    before = T0 + dt.timedelta(hours=40)
    for ref, expected in ((REF, 0.1195), (season, 24.5)):
        cached = store.quantiles("m", before, 10, wanted, reference_id=ref, taught_only=True)
        assert cached == _table_only(store, "m", before, 10, wanted, ref=ref)
        assert cached[("a", "psi")][1] == 40 and cached[("a", "psi")][0] == pytest.approx(expected)
