"""whylogs profiles: each hour profiled once and stored, so its sketches never change on a rerun."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from drift_checks import profiles
from drift_checks.numeric_statistics import prepare_numeric
from drift_checks.statistics import score_numeric
from drift_checks.storage import Store

H = dt.datetime(2024, 5, 1, 13, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def same_lognormal_latency_frames():
    ref = pd.DataFrame({"latency_ms": np.random.default_rng(42).lognormal(3.0, 0.6, 60_000)})
    cur = pd.DataFrame({"latency_ms": np.random.default_rng(7).lognormal(3.0, 0.6, 600_000)})
    return ref, cur


def test_each_hour_is_profiled_once_and_its_stored_profile_reads_back_identically(tmp_path,
                                                                                  same_lognormal_latency_frames):
    _, cur = same_lognormal_latency_frames
    uri, created = profiles.profile_hour(str(tmp_path), "lat", H, cur)
    again_uri, again_created = profiles.profile_hour(str(tmp_path), "lat", H, cur)
    assert created and not again_created and uri == again_uri
    store = Store(str(tmp_path))
    reads = [profiles.read_profile(store, profiles.profile_key("lat", H)).serialize() for _ in range(2)]
    assert reads[0] == reads[1]
    view = profiles.read_profile(store, profiles.profile_key("lat", H))
    assert view.get_column("latency_ms").get_metric("counts").n.value == len(cur)


def test_exact_statistics_decide_no_drift_identically_on_every_rerun(same_lognormal_latency_frames):
    ref, cur = same_lognormal_latency_frames
    runs = [score_numeric(prepare_numeric(ref.latency_ms), prepare_numeric(cur.latency_ms)) for _ in range(3)]
    assert all({k: v.to_dict() for k, v in r.items()} == {k: v.to_dict() for k, v in runs[0].items()}
               for r in runs)
    assert runs[0]["ks_p_value"].value == pytest.approx(0.248, abs=0.01)
    assert runs[0]["ks_p_value"].value > 0.05 and runs[0]["psi"].value < 0.1


def test_the_views_of_a_streamed_window_s_batches_merge_into_the_hour_s_profile():
    rng = np.random.default_rng(0)
    views = [profiles.profile_frame(pd.DataFrame({"x": rng.normal(size=100)})) for _ in range(3)]
    merged = profiles.merge_profiles(views)
    assert merged.get_column("x").get_metric("counts").n.value == 300
    with pytest.raises(ValueError, match="at least one profile view"):
        profiles.merge_profiles([])


def test_profiles_on_s3(s3_root):
    root, endpoint = s3_root
    uri, created = profiles.profile_hour(root, "m", H, pd.DataFrame({"x": [1.0, 2.0]}), endpoint_url=endpoint)
    assert created and uri.startswith(root)
    view = profiles.read_profile(Store(root, endpoint), profiles.profile_key("m", H))
    assert view.get_column("x").get_metric("counts").n.value == 2
