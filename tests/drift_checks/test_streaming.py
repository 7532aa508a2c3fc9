"""Streamed windows: exact counts, sketch statistics within their stated bound, the same decisions."""

from __future__ import annotations

import datetime as dt
import os
import uuid

import numpy as np
import pandas as pd
import pytest

from drift_checks import statistics as st
from drift_checks.history import HistoryStore
from drift_checks.inference_log import InferenceLogWriter, LogSchema, read_window
from drift_checks.sketches import SketchSample, rank_error, retained_items
from drift_checks.streaming import open_window, stored_summary, stream_workers, summarize_window
from drift_checks.summaries import WindowSummary, summarize_frame
from drift_checks.verdict import check_window, prepare_reference
from ground.exceptions import WindowError

T0 = pd.Timestamp("2025-01-01T10:00", tz="UTC")
HOUR = pd.Timedelta(hours=1)
SCHEMA = LogSchema({"amount": "float", "items": "int", "channel": "category", "vip": "bool"})


def _reference(rng, n=60_000):
    frame = pd.DataFrame({"amount": rng.lognormal(3, 0.6, n), "items": rng.integers(0, 6, n),
                          "channel": rng.choice(["web", "app", "shop"], n, p=[0.5, 0.3, 0.2]),
                          "vip": rng.random(n) < 0.1})
    return prepare_reference(frame, SCHEMA, reference_id="v1:training:test")


def _window(rng, n, start=T0, shift=0.0):
    amount = rng.lognormal(3 + shift, 0.6, n)
    amount[::997] = np.nan
    amount[5] = np.inf
    return pd.DataFrame({
        "request_id": [uuid.uuid4().hex for _ in range(n)],
        "timestamp": start + pd.to_timedelta(np.sort(rng.uniform(0, 3599, n)), unit="s"),
        "model_version": 1, "amount": amount, "items": rng.integers(0, 7, n),
        "channel": rng.choice(["web", "app", "shop", "kiosk"], n, p=[0.5, 0.29, 0.2, 0.01]),
        "vip": rng.random(n) < 0.1})


def _decision(summary):
    return {k: summary[k] for k in ("status", "severity", "drift", "dataset_drift", "dataset_score",
                                     "alert_features")} | {
        "features": {f: (v["severity"], v["flagged"]) for f, v in summary["features"].items()},
        "contract": (summary["contract"]["status"], summary["contract"]["invalid_columns"],
                     [(w["column"], w["expectation"], w["observed"]) for w in summary["contract"]["warnings"]])}


def test_sketched_ks_and_wasserstein_stay_within_the_stated_bound_and_counts_are_exact():
    rng = np.random.default_rng(7)
    ref = _reference(rng)
    frame = _window(rng, 400_000, shift=0.01)
    summary = WindowSummary.from_bytes(summarize_frame(frame, ref, batch_rows=50_000).to_bytes())
    eps = rank_error(4096)
    for col in ("amount", "items"):
        cur = summary.numeric_sample(col)
        assert isinstance(cur, SketchSample) and cur.rank_error == pytest.approx(eps)
        exact = st.score_numeric(ref.numeric[col], st.prepare_numeric(frame[col]))
        sketched = st.score_numeric(ref.numeric[col], cur)
        assert sketched["psi"].value == exact["psi"].value  # exact bin counts
        d, d_hat = exact["ks_p_value"].extra["statistic"], sketched["ks_p_value"].extra["statistic"]
        assert abs(d_hat - d) <= sketched["ks_p_value"].extra["error_bound"] == pytest.approx(eps)
        w, w_hat = exact["wasserstein_normed"].value, sketched["wasserstein_normed"].value
        assert abs(w_hat - w) <= sketched["wasserstein_normed"].extra["error_bound"]
        assert (cur.n_null, cur.n_pos_inf) == (st.prepare_numeric(frame[col]).n_null,
                                               st.prepare_numeric(frame[col]).n_pos_inf)
    for col in ("channel", "vip"):
        assert summary.category_counts(col) == st.category_counts(frame[col])


def test_a_window_the_sketch_holds_whole_scores_bit_for_bit_like_the_exact_path(tmp_path):
    rng = np.random.default_rng(1)
    ref = _reference(rng)
    frame = _window(rng, 3000, shift=0.3)
    summary = summarize_frame(frame, ref, batch_rows=700)
    for col in ("amount", "items"):
        assert not isinstance(summary.numeric_sample(col), SketchSample)
        exact = st.score_numeric(ref.numeric[col], st.prepare_numeric(frame[col]))
        streamed = st.score_numeric(ref.numeric[col], summary.numeric_sample(col))
        assert {k: r.to_dict() for k, r in exact.items()} == {k: r.to_dict() for k, r in streamed.items()}
    out = [check_window(model="m", frame=f, start=T0, end=T0 + HOUR, reference=ref,
                        history=HistoryStore(f"sqlite:///{tmp_path / name}.db"))
           for name, f in (("exact", frame), ("streamed", summary))]
    assert _decision(out[0]) == _decision(out[1]) and out[0]["severity"] != "ok"
    assert out[0]["features"]["amount"]["statistics"] == out[1]["features"]["amount"]["statistics"]


def test_large_window_decisions_match_the_exact_path(tmp_path):
    rng = np.random.default_rng(2)
    ref = _reference(rng)
    for i, shift in enumerate((0.0, 0.2)):
        frame = _window(rng, 150_000, start=T0 + i * HOUR, shift=shift)
        out = [check_window(model="m", frame=f, start=T0 + i * HOUR, end=T0 + (i + 1) * HOUR, reference=ref,
                            history=HistoryStore(f"sqlite:///{tmp_path / name}.db"))
               for name, f in (("exact", frame), ("streamed", summarize_frame(frame, ref)))]
        assert _decision(out[0]) == _decision(out[1])
    assert out[1]["features"]["amount"]["severity"] != "ok"  # the shifted window is seen


def test_backtest_streamed_engine_gives_the_exact_decisions_on_the_noaa_replay(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from drift_quality import DAYS_PER_WINDOW, _champion_importance, _ts

    from drift_checks.backtest import run_backtest
    from drift_checks.verdict import CheckConfig
    from ground.settings import Settings
    from model_registry.datasets import FEATURE_COLUMNS, load_noaa

    noaa, features = load_noaa(), list(FEATURE_COLUMNS)
    docs = {e: run_backtest(noaa[["day", *features]], time_column="day", time_unit="D", out_dir=tmp_path / e,
                            reference_range=(_ts(0), _ts(11328)), window=str(DAYS_PER_WINDOW),
                            importance=_champion_importance(noaa.iloc[:11328], features),
                            config=CheckConfig.from_settings(Settings.from_env({})), replay_end=_ts(12480),
                            html_report=False, engine=e) for e in ("exact", "streamed")}
    keys = ("status", "severity", "alert", "alert_features", "dataset_drift", "dataset_score", "drifted")
    assert [{k: w[k] for k in keys} for w in docs["exact"]["windows"]] == \
           [{k: w[k] for k in keys} for w in docs["streamed"]["windows"]]
    assert docs["streamed"]["summary"]["alert_windows"] == [15]


def _log(tmp_path, rng, n_files=3, rows=20_000):
    writer = InferenceLogWriter(str(tmp_path / "logs"), "m", SCHEMA)
    for _ in range(n_files):
        writer.write(_window(rng, rows))
    return str(tmp_path / "logs")


def test_streaming_the_log_equals_reading_it_whole_with_one_or_two_workers(tmp_path):
    rng = np.random.default_rng(3)
    ref = _reference(rng)
    root = _log(tmp_path, rng)
    frame = read_window(root, "m", T0, T0 + HOUR, SCHEMA).frame
    scan = open_window(root, "m", T0, T0 + HOUR, SCHEMA)
    assert scan.n_rows == len(frame) == 60_000 and len(scan.files) == 3
    assert stream_workers(scan, 4, 2) == 1  # 60,000 x 4 values: not worth a second process
    assert stream_workers(scan, 4, 2, min_values_per_worker=1) == 2
    for workers in (1, 2):  # 2: this process and a forked worker, each claiming files
        summary = summarize_window(scan, ref, workers=workers, batch_rows=8192, min_values_per_worker=1)
        assert summary.n_rows == len(frame) and summary.files == scan.files
        for col in ("amount", "items"):
            exact = st.bin_counts(st.prepare_numeric(frame[col]).values, ref.numeric[col].psi_bins)
            np.testing.assert_array_equal(summary.numeric[col].counts, exact)
            assert summary.facts[col].n_null == int(frame[col].isna().sum())
        assert summary.category_counts("channel") == st.category_counts(frame["channel"])


def test_streamed_log_refuses_bad_files_with_the_readers_messages(tmp_path):
    rng = np.random.default_rng(4)
    root = _log(tmp_path, rng, n_files=1, rows=100)
    bad = _window(rng, 10).assign(items=[True] * 10)  # booleans are no integers (text would be read)
    InferenceLogWriter(root, "m", LogSchema({**SCHEMA.features, "items": "bool"})).write(bad)
    with pytest.raises(WindowError) as exact:
        read_window(root, "m", T0, T0 + HOUR, SCHEMA)
    with pytest.raises(WindowError) as streamed:
        open_window(root, "m", T0, T0 + HOUR, SCHEMA)
    assert str(streamed.value) == str(exact.value) and "'items'" in str(streamed.value)
    with pytest.raises(WindowError, match="naive"):
        open_window(root, "m", dt.datetime(2025, 1, 1), T0 + HOUR, SCHEMA)


def test_a_stored_summary_makes_reruns_decide_from_the_same_sketches_until_new_files_arrive(tmp_path):
    rng = np.random.default_rng(5)
    ref = _reference(rng)
    root = _log(tmp_path, rng, n_files=2, rows=30_000)
    scan = open_window(root, "m", T0, T0 + HOUR, SCHEMA)
    calls = []

    def compute():
        calls.append(1)
        return summarize_window(scan, ref, workers=1)

    first, computed = stored_summary(scan, ref, compute)
    again, recomputed = stored_summary(scan, ref, compute)
    assert computed and not recomputed and len(calls) == 1
    assert again.to_bytes() == first.to_bytes()
    results = [st.score_numeric(ref.numeric["amount"], s.numeric_sample("amount"))["ks_p_value"].value
               for s in (first, again)]
    assert results[0] == results[1]
    InferenceLogWriter(root, "m", SCHEMA).write(_window(rng, 500))
    scan2 = open_window(root, "m", T0, T0 + HOUR, SCHEMA)
    newer, computed = stored_summary(scan2, ref, lambda: summarize_window(scan2, ref, workers=1))
    assert computed and newer.n_rows == 60_500


def test_arrow_batches_give_the_facts_counts_and_values_of_the_pandas_path():
    import pyarrow as pa

    from drift_checks.inference_log import arrow_to_pandas
    from drift_checks.summaries import WindowSummarizer, bins_of

    rng = np.random.default_rng(8)
    schema = LogSchema({"amount": "float", "small": "float", "gone": "float", "items": "int", "channel": "category"})
    ref = prepare_reference(pd.DataFrame({"amount": rng.normal(0, 1, 5000), "small": rng.normal(0, 1, 5000),
                                          "gone": rng.normal(0, 1, 5000), "items": rng.integers(0, 6, 5000),
                                          "channel": rng.choice(["a", "b"], 5000)}), schema)
    n = 3000
    amount = rng.normal(0.1, 1, n)
    amount[[3, 700, 2999]] = [np.inf, -np.inf, np.nan]
    batch = pa.record_batch({
        "amount": pa.array(amount, mask=np.arange(n) % 501 == 0),        # Arrow nulls and NaN
        "small": pa.array(rng.normal(0, 1, n).astype("float32")),
        "gone": pa.array(np.full(n, np.nan)),                              # every value null
        "items": pa.array(rng.integers(0, 7, n), mask=np.arange(n) % 97 == 0),
        "channel": pa.array(rng.choice(["a", "b", "c"], n))})
    sides = []
    for as_frame in (False, True):
        acc = WindowSummarizer(schema, bins_of(ref))
        for lo in range(0, n, 1000):
            part = batch.slice(lo, 1000)
            acc.add(arrow_to_pandas(part) if as_frame else part)  # the old path: pandas first
        sides.append(acc.result())
    arrow, frame = sides
    assert arrow.n_rows == frame.n_rows == n
    assert {c: f.to_json() for c, f in arrow.facts.items()} == {c: f.to_json() for c, f in frame.facts.items()}
    assert arrow.facts["small"].dtype == np.dtype("float32") and arrow.facts["gone"].vmin is None
    assert arrow.facts["amount"].vmax == np.inf and arrow.facts["amount"].n_null == 7
    for col in ("amount", "small", "items"):
        a, f = arrow.numeric_sample(col), frame.numeric_sample(col)  # n <= k: every value, exactly
        assert (a.n_rows, a.n_null, a.n_pos_inf, a.n_neg_inf) == (f.n_rows, f.n_null, f.n_pos_inf, f.n_neg_inf)
        np.testing.assert_array_equal(a.values, f.values)
        np.testing.assert_array_equal(arrow.numeric[col].counts, frame.numeric[col].counts)
    assert arrow.category_counts("channel") == frame.category_counts("channel")


@pytest.mark.parametrize("order", ["random", "ascending", "descending"])
def test_sketches_fed_in_sorted_runs_stay_within_the_stated_rank_error(order):
    from drift_checks.sketches import new_sketch, update_sketch

    rng = np.random.default_rng(9)
    k, eps = 256, rank_error(256)  # a small k: many compactions, a bound the test can see
    worst = 0.0
    for _ in range(10):
        x = rng.lognormal(0, 1, 300_001)
        x = {"random": x, "ascending": np.sort(x), "descending": np.sort(x)[::-1]}[order]
        sketch = new_sketch(k)
        for lo in range(0, x.size, 65_536):  # record batches; the last leaves a partial run
            update_sketch(sketch, x[lo:lo + 65_536])
        exact = np.sort(x)
        assert sketch.n == x.size and (sketch.get_min_value(), sketch.get_max_value()) == (exact[0], exact[-1])
        probes = exact[np.linspace(0, x.size - 1, 2001).astype(int)]
        true = np.searchsorted(exact, probes, side="right") / x.size
        worst = max(worst, float(np.max(np.abs(np.array(sketch.get_cdf(list(probes)))[:-1] - true))))
    assert 0 < worst <= eps


@pytest.mark.parametrize(("k", "first", "second"), [(4096, 500_000, 500_000), (200, 777, 4_097), (8, 777, 4_097),
                                                    (4096, 3_000, 0), (200, 150, 0)])
def test_retained_items_are_the_sketchs_own_ranks_merged_or_not(k, first, second):
    from drift_checks.sketches import new_sketch, update_sketch

    rng = np.random.default_rng(11)
    sketch = new_sketch(k)
    update_sketch(sketch, rng.normal(size=first))
    if second:  # a small sketch absorbing a compacted one (DataSketches 5.2's iterator misweighs some)
        other = new_sketch(k)
        update_sketch(other, rng.normal(size=second))
        sketch.merge(other)
    items, weights = retained_items(sketch)
    assert items.size == sketch.num_retained and int(weights.sum()) == sketch.n
    probes = np.linspace(-2.5, 2.5, 41)
    ranks = np.array([weights[items <= x].sum() for x in probes]) / sketch.n
    np.testing.assert_allclose(ranks, [sketch.get_rank(x) for x in probes], rtol=0, atol=1e-12)
    pairs = list(sketch)
    if sum(w for _, w in pairs) == sketch.n:  # where the iterator is right: the same (item, weight) pairs
        assert sorted(zip(items.tolist(), weights.tolist(), strict=True)) == sorted(pairs)


def test_a_failure_in_the_checks_own_process_stops_the_forked_workers(tmp_path, monkeypatch):
    import time

    import drift_checks.streaming as streaming

    rng = np.random.default_rng(12)
    ref = _reference(rng)
    root = _log(tmp_path, rng, n_files=6, rows=2_000)
    scan = open_window(root, "m", T0, T0 + HOUR, SCHEMA)
    real, parent, seen = streaming._summarize, os.getpid(), tmp_path / "seen"
    seen.mkdir()

    def slow(units):  # the forked worker: 0.5 s per file, each recorded
        for i, unit in enumerate(units):
            (seen / f"{os.getpid()}-{i}").touch()
            time.sleep(0.5)
            yield unit

    def failing(units, *args, **kwargs):  # this process fails on its first file
        if os.getpid() == parent:
            next(iter(units))
            raise OSError("disk gone")
        return real(slow(units), *args, **kwargs)

    monkeypatch.setattr(streaming, "_summarize", failing)
    with pytest.raises(OSError, match="disk gone"):
        summarize_window(scan, ref, workers=2, min_values_per_worker=1)
    assert len(list(seen.iterdir())) <= 2  # not the 5 files left: the worker stopped (or never started one)
