"""Which version a publish takes when the run names none (the trigger form's empty field).

A fixed default of alias ``champion`` failed for a freshly registered model (no alias yet). Real
MLflow server; guards: the wrong version published, and a silent choice (the log must say it).
"""

from __future__ import annotations

import logging

import pytest

from tests.conftest import make_settings

pytestmark = pytest.mark.integration


def test_an_empty_version_takes_the_champion_else_the_latest_version_and_says_so(
        mlflow_server, tmp_path, caplog):
    from mlflow import MlflowClient
    from sklearn.linear_model import LogisticRegression

    from ground.exceptions import RegistryError
    from tests.pipelines.test_publish_pipeline import churn_data, register
    from tritonflow.pipelines.publish import default_selector

    settings = make_settings(tmp_path, mlflow_tracking_uri=mlflow_server.tracking_uri)
    X, y = churn_data(n=80, seed=5)
    name = "fresh_model_default_version"
    for _ in range(2):  # a freshly registered model: two versions, no alias
        register(mlflow_server.tracking_uri, name, LogisticRegression().fit(X, y), X, alias=None)

    with caplog.at_level(logging.INFO, logger="tritonflow.pipelines.publish"):
        assert default_selector(name, settings=settings) == "2"
    assert "has no alias 'champion'" in caplog.text and "latest version 2" in caplog.text

    MlflowClient(mlflow_server.tracking_uri).set_registered_model_alias(name, "champion", "1")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tritonflow.pipelines.publish"):
        assert default_selector(name, settings=settings) == "champion"
    assert "has alias 'champion' (version 1)" in caplog.text

    with pytest.raises(RegistryError, match="'no_such_model_default_version'"):
        default_selector("no_such_model_default_version", settings=settings)
