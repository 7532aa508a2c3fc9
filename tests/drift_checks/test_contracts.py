"""Great Expectations contract: derivation, an all-null column, datetime normalisation."""

import io
import json

import numpy as np
import pandas as pd
import pytest

from drift_checks.contract_types import Contract, ExpectationSpec
from drift_checks.contracts import derive_contract, run_contract, with_derived
from drift_checks.inference_log import LogSchema
from ground.exceptions import WindowError

SESSION_LOG_SCHEMA = LogSchema({"session_minutes": "float", "device": "category",
                        "promo_code": "category", "pages_viewed": "int"})
DATED_STORE_UNITS_CSV = """snapshot_date,store_id,units
2025-03-01,11,4
2025-03-01,17,9
2025-03-02,11,3
2025-03-02,23,7
2025-03-03,17,2
2025-03-03,23,5
"""
DAYS = ["2025-03-01", "2025-03-02", "2025-03-03"]


def test_datetime_column_and_iso_string_value_sets_agree_after_normalisation():
    df = pd.read_csv(io.StringIO(DATED_STORE_UNITS_CSV), parse_dates=["snapshot_date"])
    contract = Contract((
        ExpectationSpec("ExpectColumnDistinctValuesToEqualSet", {"column": "snapshot_date", "value_set": DAYS}),
        ExpectationSpec("ExpectColumnValuesToBeInSet", {"column": "snapshot_date", "value_set": DAYS}),
        ExpectationSpec("ExpectColumnMaxToBeBetween", {"column": "snapshot_date",
                                                       "min_value": "2025-03-03", "max_value": "2025-03-03"}),
    ))
    res = run_contract(contract, df)
    assert [(r.success, r.raised) for r in res.results] == [(True, False)] * 3
    assert res.status == "passed"
    assert str(df["snapshot_date"].dtype).startswith("datetime64")  # caller's frame untouched


def test_tz_aware_column_and_bounds_with_offsets_share_one_representation():
    df = pd.DataFrame({"t": pd.to_datetime(["2025-03-01T10:00:00+00:00"] * 3, utc=True)})
    res = run_contract(Contract((ExpectationSpec(
        "ExpectColumnMaxToBeBetween", {"column": "t", "min_value": "2025-03-01T11:00:00+01:00",
                                       "max_value": "2025-03-01T11:00:00+01:00"}),)), df)
    assert res.results[0].success and not res.results[0].raised


def test_an_expectation_that_raises_is_an_error_of_the_check_not_a_data_failure():
    df = pd.DataFrame({"units": [1, 2, 3]})
    res = run_contract(Contract((
        ExpectationSpec("ExpectColumnMaxToBeBetween", {"column": "units", "min_value": "a", "max_value": "b"}),
        ExpectationSpec("ExpectColumnMaxToBeBetween", {"column": "units", "max_value": 10}),
    )), df)
    assert res.status == "error"
    assert [r.raised for r in res.results] == [True, False]
    assert res.failures == [] and res.invalid_columns == []  # the data is not blamed
    assert res.check_errors[0].column == "units" and res.check_errors[0].message


def test_all_null_column_fails_its_null_expectation_and_only_that_column_is_invalid(null_and_empty_windows):
    ref, all_null, _ = null_and_empty_windows
    res = run_contract(derive_contract(ref, SESSION_LOG_SCHEMA), all_null)
    assert res.invalid_columns == ["promo_code"]
    nulls = [r for r in res.failures if r.expectation == "expect_column_values_to_not_be_null"]
    assert nulls[0].column == "promo_code" and nulls[0].observed["unexpected_percent"] == 100.0


def test_scale_error_on_a_learned_range_warns_and_a_missing_column_fails(null_and_empty_windows):
    ref, _, _ = null_and_empty_windows
    cur = ref.assign(session_minutes=ref.session_minutes * 1000).drop(columns=["device"])
    res = run_contract(derive_contract(ref, SESSION_LOG_SCHEMA), cur)
    assert res.invalid_columns == ["device"] and res.status == "failed"
    assert ("device", "expect_column_to_exist") in {(r.column, r.expectation) for r in res.failures}
    warned = {(r.column, r.expectation): r for r in res.warnings}
    mx = warned[("session_minutes", "expect_column_max_to_be_between")]
    assert mx.observed == 41700.0 and mx.severity == "warning" and mx.meta["learned_from"] == "reference"


def test_a_learned_range_only_warns_while_a_declared_range_fails_the_contract(null_and_empty_windows):
    ref, _, _ = null_and_empty_windows
    cur = ref.assign(session_minutes=ref.session_minutes + 500)
    learned = run_contract(derive_contract(ref, SESSION_LOG_SCHEMA), cur)
    assert learned.status == "passed" and learned.invalid_columns == []
    assert [(r.column, r.expectation) for r in learned.warnings] == [
        ("session_minutes", "expect_column_max_to_be_between")]
    declared = Contract((ExpectationSpec("ExpectColumnMaxToBeBetween",
                                         {"column": "session_minutes", "max_value": 100.0}),))
    res = run_contract(declared, cur)
    assert res.status == "failed" and res.invalid_columns == ["session_minutes"]


def test_a_set_expectation_sees_every_row_of_a_large_window_so_a_rare_value_is_never_missed():
    rng = np.random.default_rng(1)
    n = 80_000
    df = pd.DataFrame({"plan": rng.choice(["basic", "pro"], n)})
    df.loc[4242, "plan"] = "enterprise"  # one rare row a 5,000-row sample would miss
    contract = Contract((
        ExpectationSpec("ExpectColumnDistinctValuesToEqualSet",
                        {"column": "plan", "value_set": ["basic", "enterprise", "pro"]}),
        ExpectationSpec("ExpectColumnDistinctValuesToContainSet",
                        {"column": "plan", "value_set": ["enterprise"]}),
        ExpectationSpec("ExpectColumnUniqueValueCountToBeBetween",
                        {"column": "plan", "min_value": 3, "max_value": 3}),
    ))
    res = run_contract(contract, df, gx_sample_rows=5_000)
    assert [r.success for r in res.results] == [True, True, True], res.results
    assert all(r.sample_rows is None for r in res.results)
    assert res.results[0].observed == ["basic", "enterprise", "pro"]


def test_a_dtype_failure_names_the_column_and_its_first_offending_values(null_and_empty_windows):
    ref, _, _ = null_and_empty_windows
    cur = ref.assign(pages_viewed=ref.pages_viewed.astype(object))
    cur.loc[[2, 5], "pages_viewed"] = ["n/a", "twelve"]
    res = run_contract(derive_contract(ref, SESSION_LOG_SCHEMA), cur)
    (bad,) = [r for r in res.failures if r.expectation == "expect_column_values_to_be_in_type_list"]
    assert bad.column == "pages_viewed" and bad.observed["first_offending_values"] == ["n/a", "twelve"]
    assert "pages_viewed" in bad.message and "n/a" in bad.message


def test_an_infinite_maximum_is_reported_as_infinite_not_as_null(null_and_empty_windows):
    ref, _, _ = null_and_empty_windows
    cur = ref.assign(session_minutes=ref.session_minutes.where(ref.index != 3, np.inf))
    res = run_contract(derive_contract(ref, SESSION_LOG_SCHEMA), cur)
    (mx,) = [r for r in res.warnings if r.expectation == "expect_column_max_to_be_between"]
    assert mx.observed == "inf"


def test_the_null_expectation_carries_the_reference_missing_share(null_and_empty_windows):
    ref, all_null, _ = null_and_empty_windows
    res = run_contract(derive_contract(ref, SESSION_LOG_SCHEMA), all_null)
    (nulls,) = [r for r in res.failures if r.expectation == "expect_column_values_to_not_be_null"]
    assert nulls.meta["reference_null_fraction"] == pytest.approx(0.45)


def test_vectorised_checks_agree_with_great_expectations_on_the_same_window(null_and_empty_windows):
    """The exact fast path and GX give the same verdicts and observed values (small window)."""
    from drift_checks.contract_exact import exact_result
    from drift_checks.contract_gx import run_gx

    ref, all_null, _ = null_and_empty_windows
    cur = all_null.assign(session_minutes=all_null.session_minutes * 3,
                          device=all_null.device.where(all_null.index % 3 > 0, "tv"))
    # (an all-null column passes the dtype check here, GX fails it: the null check reports it)
    specs = [(i, s) for i, s in enumerate(derive_contract(ref, SESSION_LOG_SCHEMA).expectations)
             if s.type != "ExpectColumnToExist"
             and not (s.type == "ExpectColumnValuesToBeInTypeList" and cur[s.column].isna().all())]
    from drift_checks.column_facts import ColumnFacts

    fast = {i: exact_result(s, ColumnFacts.of_series(cur[s.column]), False) for i, s in specs}
    assert all(r is not None for r in fast.values())
    gx = dict(run_gx(specs, cur, set(), 10_000, 0))
    assert {i: r.success for i, r in fast.items()} == {i: r.success for i, r in gx.items()}
    assert any(not r.success for r in fast.values()) and any(r.success for r in fast.values())
    for i, r in fast.items():
        if r.expectation.startswith("expect_column_m"):
            assert r.observed == gx[i].observed
        if r.expectation in ("expect_column_values_to_not_be_null", "expect_column_values_to_be_in_set"):
            assert r.observed["unexpected_percent"] == pytest.approx(gx[i].observed["unexpected_percent"])


def test_large_window_runs_other_expectations_on_a_seeded_sample_and_derived_ones_exactly():
    rng = np.random.default_rng(0)
    n = 60_000
    df = pd.DataFrame({"x": rng.normal(size=n), "flag": rng.random(n) < 0.5})
    df.loc[123, "x"] = 40.0  # one extreme row: the exact max must see it
    contract = Contract((
        ExpectationSpec("ExpectColumnMaxToBeBetween", {"column": "x", "max_value": 10.0}),
        ExpectationSpec("ExpectColumnValuesToBeBetween", {"column": "x", "min_value": -8, "max_value": 8,
                                                          "mostly": 0.99}),
        ExpectationSpec("ExpectColumnValuesToBeInSet", {"column": "flag", "value_set": ["False", "True"]}),
    ))
    a, b = run_contract(contract, df, gx_sample_rows=5_000), run_contract(contract, df, gx_sample_rows=5_000)
    assert a == b  # same seeded sample on a rerun
    mx, between, flag = a.results
    assert mx.observed == 40.0 and not mx.success and mx.sample_rows is None
    assert between.success and between.sample_rows == 5_000 and "sample" in between.message
    assert flag.success and flag.observed["unexpected_percent"] == 0.0


# ------------------------------------------------------------------ the declared schema comes first
STORE_UNITS_SCHEMA = LogSchema({"store_id": "category", "units": "int"})


def _store_units():
    return pd.read_csv(io.StringIO(DATED_STORE_UNITS_CSV))[["store_id", "units"]]


def test_an_integer_column_declared_categorical_passes_with_the_reference_s_values():
    ref = _store_units()
    assert ref["store_id"].dtype.kind == "i"
    cur = ref.iloc[::-1].reset_index(drop=True)
    res = run_contract(derive_contract(ref, STORE_UNITS_SCHEMA), cur)
    assert res.status == "passed" and res.failures == [] and res.warnings == [], res.to_dict()
    # the same categories whatever the dtype: a float column (an integer column with a null) or text
    for other in (cur.astype({"store_id": "float64"}), cur.astype({"store_id": str})):
        again = run_contract(derive_contract(ref, STORE_UNITS_SCHEMA), other)
        assert again.status == "passed" and again.warnings == [], again.to_dict()
    # a hand-written set of integers names the same categories
    user = Contract((ExpectationSpec("ExpectColumnValuesToBeInSet", {"column": "store_id", "value_set": [11, 17, 23]}),
                     ExpectationSpec("ExpectColumnDistinctValuesToEqualSet",
                                     {"column": "store_id", "value_set": [11, 17, 23]})))
    res = run_contract(user, cur, schema=STORE_UNITS_SCHEMA.features)
    assert [r.success for r in res.results] == [True, True], res.results
    unseen = run_contract(derive_contract(ref, STORE_UNITS_SCHEMA), cur.assign(store_id=[11, 17, 99, 99, 99, 99]))
    assert unseen.status == "passed"
    (w,) = unseen.warnings
    assert w.column == "store_id" and w.observed["partial_unexpected_list"] == ["99"]


def test_a_users_range_or_dtype_on_a_column_declared_categorical_is_an_error_of_the_check_never_bad_data():
    ref = _store_units()
    cur = ref.iloc[::-1].reset_index(drop=True)  # every value equals the reference's
    user = Contract((
        ExpectationSpec("ExpectColumnValuesToBeBetween", {"column": "store_id", "min_value": 0, "max_value": 100}),
        ExpectationSpec("ExpectColumnValuesToBeOfType", {"column": "store_id", "type_": "int64"}),
        ExpectationSpec("ExpectColumnValuesToBeInSet", {"column": "store_id", "value_set": [11, 17, 23]}),
        ExpectationSpec("ExpectColumnValuesToBeBetween", {"column": "units", "min_value": 0, "max_value": 100}),
    ))
    res = run_contract(with_derived(user, derive_contract(ref, STORE_UNITS_SCHEMA)), cur)
    assert res.failures == [] and res.invalid_columns == [] and res.status == "error"  # the data is not blamed
    assert [(r.column, r.expectation) for r in res.check_errors] == [
        ("store_id", "expect_column_values_to_be_between"), ("store_id", "expect_column_values_to_be_of_type")]
    between, dtype = res.check_errors
    assert "column 'store_id' is declared category" in between.message
    assert "numeric bounds {'min_value': 0, 'max_value': 100}" in between.message
    assert "dtype ['int64']" in dtype.message and "ExpectColumnValuesToBeInSet" in dtype.message
    assert {r.source for r in res.check_errors} == {"user"}
    user_ok = [r for r in res.results if r.source == "user" and not r.raised]
    assert [(r.column, r.success) for r in user_ok] == [("store_id", True), ("units", True)]


def test_a_value_that_cannot_be_read_as_its_declared_type_fails_the_contract_naming_column_value_and_type():
    from drift_checks.summaries import summarize_frame
    from drift_checks.verdict import prepare_reference

    ref = _store_units()
    cur = ref.astype({"units": object})
    cur.loc[[1, 4], "units"] = ["twelve", 2.5]  # a word, and a fraction in an integer column
    contract = derive_contract(ref, STORE_UNITS_SCHEMA)
    exact = run_contract(contract, cur)
    streamed = run_contract(contract, summarize_frame(cur, prepare_reference(ref, STORE_UNITS_SCHEMA), batch_rows=4))
    for res in (exact, streamed):
        assert res.status == "failed" and res.check_errors == [] and res.invalid_columns == ["units"]
        (bad,) = res.failures
        assert bad.expectation == "expect_column_values_to_be_in_type_list" and bad.column == "units"
        assert bad.observed["declared"] == "int" and bad.observed["unreadable_count"] == 2
        assert bad.observed["first_offending_values"] == ["twelve", 2.5]
        assert "'units'" in bad.message and "'twelve'" in bad.message and "as int" in bad.message
    # a reference value of the wrong kind is refused when the contract is derived, by name
    with pytest.raises(WindowError, match=r"column 'units' is declared int.*'twelve'"):
        derive_contract(cur, STORE_UNITS_SCHEMA)


# ------------------------------------------------------------------ non-finite values
def test_infinite_values_in_a_numeric_feature_fail_the_contract_by_name_count_and_share(null_and_empty_windows):
    from drift_checks.contract_gx import run_gx
    from drift_checks.summaries import summarize_frame
    from drift_checks.verdict import prepare_reference

    ref, _, _ = null_and_empty_windows
    cur = ref.assign(session_minutes=ref.session_minutes.where(~ref.index.isin([3, 7, 9]), np.inf))
    cur.loc[12, "session_minutes"] = -np.inf
    contract = derive_contract(ref, SESSION_LOG_SCHEMA)
    exact = run_contract(contract, cur)
    streamed = run_contract(contract, summarize_frame(cur, prepare_reference(ref, SESSION_LOG_SCHEMA), batch_rows=6))
    for res in (exact, streamed):
        assert res.status == "failed" and res.invalid_columns == ["session_minutes"]
        (bad,) = res.failures
        assert bad.column == "session_minutes" and bad.meta == {"check": "finite"}
        assert bad.observed["unexpected_count"] == 4 and bad.observed["share_of_rows"] == 0.2
        assert (bad.observed["n_pos_inf"], bad.observed["n_neg_inf"]) == (3, 1)
        assert "'session_minutes' holds 4 infinite values (+inf 3, -inf 1) in 20 rows (20.00 %)" in bad.message
    # the exact check is GX's own expectation: GX gives the same verdict on the same window
    spec = next(s for s in contract.expectations if s.type == "ExpectColumnValuesToNotBeInSet"
                and s.column == "session_minutes")
    ((_, gx),) = run_gx([(0, spec)], cur, set(), 10_000, 0)
    assert gx.success is False and not gx.raised and gx.observed["unexpected_percent"] == 20.0
    # a stored (JSON) contract writes the infinities as text: the same check
    again = run_contract(Contract.from_dict(json.loads(json.dumps(contract.to_dict()))), cur)
    assert again.invalid_columns == ["session_minutes"]
    assert run_contract(contract, ref).status == "passed"
