"""whylogs profiles: profiled once, stored, merged repeatability and hysteresis."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from drift_checks import profiles
from drift_checks.numeric_statistics import prepare_numeric
from drift_checks.statistics import score_numeric

H = dt.datetime(2024, 5, 1, 13, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def same_lognormal_latency_frames():
    ref = pd.DataFrame({"latency_ms": np.random.default_rng(42).lognormal(3.0, 0.6, 60_000)})
    cur = pd.DataFrame({"latency_ms": np.random.default_rng(7).lognormal(3.0, 0.6, 600_000)})
    return ref, cur


def test_each_hour_is_profiled_once_and_rescoring_stored_profiles_is_identical(tmp_path, same_lognormal_latency_frames):
    ref, cur = same_lognormal_latency_frames
    uri, created = profiles.profile_hour(str(tmp_path), "lat", H, cur)
    again_uri, again_created = profiles.profile_hour(str(tmp_path), "lat", H, cur)
    assert created and not again_created and uri == again_uri
    ref_key = "lat/reference.bin"
    from drift_checks.storage import Store

    store = Store(str(tmp_path))
    profiles.write_profile(store, ref_key, profiles.profile_frame(ref))
    scores = [profiles.score_profiles(profiles.read_profile(store, ref_key),
                                      profiles.load_hour_profile(str(tmp_path), "lat", H))["latency_ms"]
              for _ in range(2)]
    assert scores[0] == scores[1]
    assert scores[0]["drift_category"] in ("NO_DRIFT", "POSSIBLE_DRIFT")


def test_exact_statistics_decide_no_drift_identically_on_every_rerun(same_lognormal_latency_frames):
    ref, cur = same_lognormal_latency_frames
    runs = [score_numeric(prepare_numeric(ref.latency_ms), prepare_numeric(cur.latency_ms)) for _ in range(3)]
    assert all({k: v.to_dict() for k, v in r.items()} == {k: v.to_dict() for k, v in runs[0].items()}
               for r in runs)
    assert runs[0]["ks_p_value"].value == pytest.approx(0.248, abs=0.01)
    assert runs[0]["ks_p_value"].value > 0.05 and runs[0]["psi"].value < 0.1


def test_possible_drift_alone_never_alerts():
    assert not profiles.hysteresis_alert(["NO_DRIFT", "POSSIBLE_DRIFT"])
    assert not profiles.hysteresis_alert(["POSSIBLE_DRIFT", "NO_DRIFT", "POSSIBLE_DRIFT"])
    assert profiles.hysteresis_alert(["POSSIBLE_DRIFT", "POSSIBLE_DRIFT"])
    assert profiles.hysteresis_alert(["NO_DRIFT", "DRIFT"])


def test_hourly_profiles_merge_into_a_daily_profile(tmp_path):
    rng = np.random.default_rng(0)
    for h in range(3):
        profiles.profile_hour(str(tmp_path), "m", H + dt.timedelta(hours=h),
                              pd.DataFrame({"x": rng.normal(size=100)}))
    uri = profiles.merge_day(str(tmp_path), "m", H.date())
    from drift_checks.storage import Store

    daily = profiles.read_profile(Store(str(tmp_path)), "m/profiles/date=2024-05-01/daily.bin")
    assert uri.endswith("daily.bin")
    assert daily.get_column("x").get_metric("counts").n.value == 300


def test_profiles_on_s3(s3_root):
    root, endpoint = s3_root
    uri, created = profiles.profile_hour(root, "m", H, pd.DataFrame({"x": [1.0, 2.0]}), endpoint_url=endpoint)
    assert created and uri.startswith(root)
    view = profiles.load_hour_profile(root, "m", H, endpoint_url=endpoint)
    assert view.get_column("x").get_metric("counts").n.value == 2
