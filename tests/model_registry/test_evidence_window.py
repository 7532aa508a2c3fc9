"""The retraining window after a confirmed shift, on the real NOAA series and the real champion's scores.

The champion is the demo's (trained on days 0-7,999); its scores on the days around the day-12,000
concept shift are the "served" scores of a log mapped 48 days per logical hour, as in the demo.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import DataError
from model_registry import datasets as ds
from model_registry.evidence_window import EvidenceWindowPolicy, change_point, choose_window
from model_registry.noaa_model import train_noaa

START = pd.Timestamp("2025-01-01", tz="UTC")
SCORE = "probability_rain"


def stamp(day):
    """Logical time of a day (or days): 48 days per hour (75 s apart) from day 8,000."""
    return START + pd.to_timedelta((np.asarray(day) - 8_000) * 75, unit="s")


@pytest.fixture(scope="module")
def served() -> pd.DataFrame:
    """Days 10,560-12,176 (the lookback of a retraining decided 176 days after the shift), champion-scored."""
    data = ds.load_noaa()
    champion = train_noaa(data[data[ds.DAY_COLUMN] < 8_000])
    rows = data[(data[ds.DAY_COLUMN] >= 10_560) & (data[ds.DAY_COLUMN] < 12_176)].copy()
    rows["timestamp"] = stamp(rows[ds.DAY_COLUMN].to_numpy())
    rows[SCORE] = champion.predict_scores(rows)
    return rows.reset_index(drop=True)


def test_the_champions_loss_locates_the_concept_shift_within_an_hour(served):
    loss = (served[ds.LABEL_COLUMN] - served[SCORE]) ** 2
    cp = change_point(loss.to_numpy())
    assert cp is not None and cp.p_value < 1e-6 and cp.mean_after > cp.mean_before
    assert abs(int(served[ds.DAY_COLUMN].iloc[cp.index]) - ds.CONCEPT_DRIFT_DAY) <= 48


def test_no_change_point_in_a_quiet_stretch(served):
    quiet = served[served[ds.DAY_COLUMN] < 11_900]
    assert change_point(((quiet[ds.LABEL_COLUMN] - quiet[SCORE]) ** 2).to_numpy()) is None


def test_few_post_shift_rows_take_the_floor_and_ask_for_a_follow_up(served):
    end = stamp(12_176)
    choice = choose_window(served, label_column=ds.LABEL_COLUMN, policy=EvidenceWindowPolicy(score_column=SCORE),
                           span_start=end - pd.Timedelta(hours=10), end=end)
    assert choice.rule == "floor" and choice.window_rows == 200
    assert 150 <= choice.post_shift_rows <= 200
    assert choice.followup_at == end + pd.Timedelta(hours=4)
    assert "below the floor of 200" in choice.reason and "follow-up" in choice.reason
    tags = choice.tags()
    assert tags["window_rule"] == "floor" and tags["change_point"] == choice.change_point.isoformat()


def test_enough_post_shift_rows_train_on_the_rows_since_the_shift_only(served):
    end = stamp(12_176)
    policy = EvidenceWindowPolicy(min_post_shift_rows=100, followup_factor=1.0, score_column=SCORE)
    choice = choose_window(served, label_column=ds.LABEL_COLUMN, policy=policy,
                           span_start=end - pd.Timedelta(hours=10), end=end)
    assert choice.rule == "since_change_point" and choice.followup_at is None
    assert choice.window_rows == choice.post_shift_rows < 480 - 300  # the span would hold 480 rows


def test_a_recorded_change_point_is_reused_by_the_follow_up(served):
    end = stamp(12_176)
    policy = EvidenceWindowPolicy(min_post_shift_rows=50, score_column=SCORE)
    choice = choose_window(served, label_column=ds.LABEL_COLUMN, policy=policy,
                           span_start=end - pd.Timedelta(hours=10), end=end,
                           recorded_change_point=stamp(12_000).isoformat())
    assert choice.rule == "recorded_change_point" and choice.post_shift_rows == 176
    assert choice.start == stamp(12_000)


def test_without_a_score_column_or_with_rule_span_the_policys_span_is_kept(served):
    end = stamp(12_176)
    span_start = end - pd.Timedelta(hours=10)
    for policy, frame in [(EvidenceWindowPolicy(rule="span", score_column=SCORE), served),
                          (EvidenceWindowPolicy(score_column=SCORE), served.drop(columns=[SCORE])),
                          (EvidenceWindowPolicy(), served)]:  # no score column set (the default)
        choice = choose_window(frame, label_column=ds.LABEL_COLUMN, policy=policy, span_start=span_start, end=end)
        assert choice.rule == "span" and choice.start == span_start and choice.window_rows == 480


def test_bad_input_is_refused_by_name():
    with pytest.raises(DataError, match=r"loss\[1\]=inf"):
        change_point([0.1, np.inf, 0.2])
    with pytest.raises(DataError, match="min_post_shift_rows=0; expected >= 1"):
        EvidenceWindowPolicy(min_post_shift_rows=0)
    with pytest.raises(DataError, match="rule='recent'"):
        EvidenceWindowPolicy(rule="recent")
    with pytest.raises(DataError, match="lack column 'timestamp'"):
        choose_window(pd.DataFrame({"rain": [1]}), label_column="rain", policy=EvidenceWindowPolicy(score_column=SCORE),
                      span_start=START, end=START)
