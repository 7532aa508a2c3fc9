"""The prepared-reference cache: bit-identical to preparing again, never stale, never trusted when damaged."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from drift_checks import reference_cache, verdict
from drift_checks.history import HistoryStore
from drift_checks.inference_log import LogSchema
from drift_checks.reference import load_reference, save_reference
from drift_checks.reference_cache import prepared_training_reference
from drift_checks.verdict import CheckConfig, check_window, prepare_reference

SCHEMA = LogSchema({"x": "float", "y": "float", "gappy": "float", "empty": "float", "c": "category"})
T0 = dt.datetime(2024, 5, 1, 13, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)


def _frame(seed: int, n: int = 4000, shift: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    gappy = rng.normal(0, 1, n)
    gappy[::7], gappy[1::50], gappy[2::90] = np.nan, np.inf, -np.inf
    return pd.DataFrame({"x": rng.normal(shift, 1, n), "y": rng.integers(0, 5, n).astype(float),
                         "gappy": gappy, "empty": np.full(n, np.nan), "c": rng.choice(["a", "b", "c"], n)})


def _assert_same(a, b) -> None:
    """Two prepared references hold the same bytes (values, PSI bins) and the same counts."""
    assert list(a.numeric) == list(b.numeric) and a.categorical == b.categorical
    assert list(a.categorical) == list(b.categorical) and a.time_ordered == b.time_ordered
    assert (a.reference_id, a.importance) == (b.reference_id, b.importance)
    for col, s in a.numeric.items():
        t = b.numeric[col]
        assert s.values.dtype == t.values.dtype and s.values.tobytes() == t.values.tobytes()
        assert (s.n_rows, s.n_null, s.n_pos_inf, s.n_neg_inf) == (t.n_rows, t.n_null, t.n_pos_inf, t.n_neg_inf)
        if s.values.size:
            assert s.psi_bins.discrete == t.psi_bins.discrete
            assert s.psi_bins.edges.tobytes() == t.psi_bins.edges.tobytes()


@pytest.fixture
def stored(tmp_path):
    save_reference(str(tmp_path / "logs"), "m", 1, _frame(0), SCHEMA, importance={"x": 0.7, "y": 0.3})
    return tmp_path / "logs", tmp_path / "cache"


def test_a_cache_hit_equals_preparing_again_and_does_not_prepare(stored, monkeypatch):
    root, cache = stored
    ref = load_reference(str(root), "m", 1, with_profile=False)
    fresh = prepare_reference(ref.frame, ref.schema, reference_id=ref.reference_id, importance=ref.importance)
    miss = prepared_training_reference(ref, cache)
    assert len(list(cache.glob("*.npz"))) == 1
    _assert_same(miss, fresh)

    def boom(*a, **k):
        raise AssertionError("prepared again on a cache hit")

    monkeypatch.setattr(verdict, "prepare_reference", boom)
    hit = prepared_training_reference(load_reference(str(root), "m", 1, with_profile=False), cache)
    _assert_same(hit, fresh)
    assert hit.numeric["empty"].status == "all_null" and hit.numeric["gappy"].n_pos_inf > 0


def test_hourly_results_are_bit_identical_with_and_without_the_cache(stored, tmp_path):
    root, cache = stored
    ref = load_reference(str(root), "m", 1, with_profile=False)
    prepared_training_reference(ref, cache)  # fills the cache
    hit = prepared_training_reference(ref, cache)
    fresh = prepare_reference(ref.frame, ref.schema, reference_id=ref.reference_id, importance=ref.importance)
    cfg = CheckConfig(evidently_sample_rows=0)
    out = []
    for name, prepared in (("hit", hit), ("fresh", fresh)):
        h = HistoryStore(f"sqlite:///{tmp_path / f'{name}.db'}")
        try:
            out.append([check_window(model="m", frame=_frame(10 + i, 1500, 0.2 * i), start=T0 + i * HOUR,
                                     end=T0 + (i + 1) * HOUR, reference=prepared, history=h, config=cfg)
                        for i in range(3)])
            with h.engine.connect() as conn:  # every stored row, as stored
                out.append([tuple(r) for t in (h.stats, h.verdicts, h.series)
                            for r in conn.execute(sa.select(t).order_by(*t.c)).all()])
        finally:
            h.engine.dispose()
    assert json.dumps(out[0], sort_keys=True, default=str) == json.dumps(out[2], sort_keys=True, default=str)
    assert out[1] == out[3]


def test_a_rerecorded_reference_is_never_served_from_the_old_cache_file(stored):
    root, cache = stored
    prepared_training_reference(load_reference(str(root), "m", 1, with_profile=False), cache)
    save_reference(str(root), "m", 1, _frame(1, shift=3.0), SCHEMA)  # same version, new data
    ref = load_reference(str(root), "m", 1, with_profile=False)
    got = prepared_training_reference(ref, cache)
    _assert_same(got, prepare_reference(ref.frame, ref.schema, reference_id=ref.reference_id,
                                        importance=ref.importance))
    assert got.numeric["x"].values.mean() > 2.5 and len(list(cache.glob("*.npz"))) == 2


def test_a_sample_file_changed_behind_meta_json_is_not_served_stale(stored):
    root, cache = stored
    prepared_training_reference(load_reference(str(root), "m", 1, with_profile=False), cache)
    other = root.parent / "other"
    save_reference(str(other), "m", 1, _frame(2, shift=-3.0), SCHEMA)
    sample = root / "m" / "reference" / "v1" / "sample.parquet"
    sample.write_bytes((other / "m" / "reference" / "v1" / "sample.parquet").read_bytes())  # meta.json unchanged
    ref = load_reference(str(root), "m", 1, with_profile=False)
    got = prepared_training_reference(ref, cache)
    assert got.numeric["x"].values.mean() < -2.5
    _assert_same(got, prepare_reference(ref.frame, ref.schema, reference_id=ref.reference_id,
                                        importance=ref.importance))


def test_a_changed_schema_is_a_different_key(stored):
    root, cache = stored
    ref = load_reference(str(root), "m", 1, with_profile=False)
    prepared_training_reference(ref, cache)
    ref.schema = LogSchema({"x": "float", "y": "category"})
    got = prepared_training_reference(ref, cache)
    assert list(got.numeric) == ["x"] and list(got.categorical) == ["y"]
    assert got.categorical == prepare_reference(ref.frame, ref.schema).categorical


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_key"])
def test_a_damaged_cache_file_is_ignored_and_rewritten(stored, damage):
    root, cache = stored
    ref = load_reference(str(root), "m", 1, with_profile=False)
    prepared_training_reference(ref, cache)
    (path,) = cache.glob("*.npz")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "garbage":
        path.write_bytes(b"not an npz")
    else:  # a file of another reference at this key
        save_reference(str(root.parent / "o"), "m", 1, _frame(5, shift=9.0), SCHEMA)
        o = load_reference(str(root.parent / "o"), "m", 1, with_profile=False)
        prepared_training_reference(o, root.parent / "oc")
        (other,) = (root.parent / "oc").glob("*.npz")
        path.write_bytes(other.read_bytes())
    got = prepared_training_reference(ref, cache)
    _assert_same(got, prepare_reference(ref.frame, ref.schema, reference_id=ref.reference_id,
                                        importance=ref.importance))
    again = reference_cache._read(path, reference_cache.cache_key(ref.sample_sha256, ref.schema),
                                  list(got.numeric), list(got.categorical))
    assert again is not None  # rewritten


def test_no_digest_or_no_folder_means_no_cache(stored, tmp_path):
    root, cache = stored
    ref = load_reference(str(root), "m", 1, with_profile=False)
    prepared_training_reference(ref, None)
    ref.sample_sha256 = ""
    prepared_training_reference(ref, cache)
    assert not cache.exists()
    with pytest.raises(ValueError, match="sample_sha256"):
        reference_cache.cache_key("", SCHEMA)


def test_an_unwritable_cache_folder_still_gives_the_prepared_reference(stored, tmp_path):
    root, _ = stored
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ref = load_reference(str(root), "m", 1, with_profile=False)
    got = prepared_training_reference(ref, blocker / "cache")  # a file where a folder is needed
    _assert_same(got, prepare_reference(ref.frame, ref.schema, reference_id=ref.reference_id,
                                        importance=ref.importance))


def _hours(prepared, tmp_path, name: str) -> list:
    """Three hourly checks on ``prepared`` (a history of their own), as JSON text, and the stored rows."""
    h = HistoryStore(f"sqlite:///{tmp_path / f'{name}.db'}")
    try:
        out = [check_window(model="m", frame=_frame(10 + i, 48, 0.3 * i), start=T0 + i * HOUR,
                            end=T0 + (i + 1) * HOUR, reference=prepared, history=h,
                            config=CheckConfig(evidently_sample_rows=0)) for i in range(3)]
        with h.engine.connect() as conn:
            rows = [tuple(r) for t in (h.stats, h.verdicts, h.series)
                    for r in conn.execute(sa.select(t).order_by(*t.c)).all()]
    finally:
        h.engine.dispose()
    return [json.dumps(out, sort_keys=True, default=str), rows]


def test_a_stored_calibration_gives_the_same_hours_without_scoring_the_chunks_again(stored, tmp_path, monkeypatch):
    root, cache = stored
    ref = load_reference(str(root), "m", 1, with_profile=False)
    fresh = prepare_reference(ref.frame, ref.schema, reference_id=ref.reference_id, importance=ref.importance)
    expected = _hours(fresh, tmp_path, "fresh")  # no store: every calibration scored in memory
    first = _hours(prepared_training_reference(ref, cache), tmp_path, "first")  # scores and stores
    assert len(list(cache.glob("*.calibration-*.json"))) == 1  # one window size, quantile, statistics

    def boom(*a, **k):
        raise AssertionError("reference chunks scored again although their calibration was stored")

    monkeypatch.setattr(verdict, "calibrate_from_reference", boom)
    # a later hour's task process: a new prepared reference from the cache, the calibration from its file
    later = _hours(prepared_training_reference(load_reference(str(root), "m", 1, with_profile=False), cache),
                   tmp_path, "later")
    assert first == expected and later == expected
    summary = json.loads(later[0])[0]
    assert summary["false_alarm_budget"]["calibrated"] and summary["threshold_sources"]["reference"] > 0


@pytest.mark.parametrize("change", ["garbage", "other_key", "scoring_code"])
def test_a_damaged_or_outdated_calibration_file_is_scored_again(stored, tmp_path, monkeypatch, change):
    root, cache = stored
    ref = load_reference(str(root), "m", 1, with_profile=False)
    prepared_training_reference(ref, cache).calibration(48, 0.95)
    (path,) = cache.glob("*.calibration-*.json")
    if change == "garbage":
        path.write_text("{not json")
    elif change == "other_key":  # e.g. a file copied from another reference
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, "key": doc["key"].replace('"quantile": 0.95', '"quantile": 0.9')}))
    else:  # the code that scores chunks changed: another key, another file
        monkeypatch.setattr(reference_cache, "scoring_digest", lambda: "changed")
    scored = []
    real = verdict.calibrate_from_reference
    monkeypatch.setattr(verdict, "calibrate_from_reference", lambda *a, **k: scored.append(1) or real(*a, **k))
    got = prepared_training_reference(ref, cache).calibration(48, 0.95)
    assert scored == [1]
    fresh = prepare_reference(ref.frame, ref.schema).calibration(48, 0.95)
    assert got.values == fresh.values and got.n_chunks == fresh.n_chunks
    store = reference_cache.CalibrationStore(cache, reference_cache.cache_key(ref.sample_sha256, ref.schema))
    assert store.load((got.chunk_rows, 0.95, None)).values == fresh.values  # rewritten, readable again
