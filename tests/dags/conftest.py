"""Fixtures of the DAG integrity tests: the Airflow environment (set before Airflow imports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugins import airflow_env


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """AIRFLOW_HOME with a migrated SQLite metadata DB."""
    return airflow_env.migrated_home()
