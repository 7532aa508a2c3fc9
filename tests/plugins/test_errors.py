"""DataError fails a task at once; TransientError is left for Airflow's retries."""

from __future__ import annotations

import asyncio

import pytest
from airflow.sdk.exceptions import AirflowFailException

from ground.exceptions import ModelConfigError, ServiceUnavailableError
from tritonflow_plugin.errors import fail_fast_on_bad_data


def test_bad_data_becomes_airflow_fail_exception_without_retry():
    @fail_fast_on_bad_data
    def validate(name):
        raise ModelConfigError(f"model {name!r}: dims [1, 12] expected [12]")

    with pytest.raises(AirflowFailException) as err:
        validate("churn_head")
    assert "ModelConfigError" in str(err.value) and "churn_head" in str(err.value)
    assert isinstance(err.value.__cause__, ModelConfigError)


def test_transient_error_propagates_for_retry():
    @fail_fast_on_bad_data
    def load():
        raise ServiceUnavailableError("triton at 127.0.0.1:8000 did not answer")

    with pytest.raises(ServiceUnavailableError):
        load()


def test_async_task_and_return_value_are_kept():
    @fail_fast_on_bad_data
    async def bad():
        raise ModelConfigError("x")

    @fail_fast_on_bad_data
    def good(a, b=2):
        return a + b

    with pytest.raises(AirflowFailException):
        asyncio.run(bad())
    assert good(1, b=3) == 4 and good.__name__ == "good"
