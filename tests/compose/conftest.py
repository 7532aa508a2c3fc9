"""Fixtures of the compose tests: ``docker-compose.yaml`` as YAML, as interpolated, and its schema."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.compose.stack import COMPOSE_PATH, SCHEMA_PATH, env_of, interpolate


@pytest.fixture(scope="module")
def raw() -> dict:
    """docker-compose.yaml as YAML (anchors and merge keys resolved, variables not)."""
    return yaml.safe_load(COMPOSE_PATH.read_text())


@pytest.fixture(scope="module")
def compose(raw) -> dict:
    """docker-compose.yaml as ``docker compose`` sees it with no .env: every default applied."""
    return interpolate(raw, {})


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


@pytest.fixture(scope="module")
def worker_env(services) -> dict[str, str]:
    return env_of(services["airflow-worker"])


@pytest.fixture(scope="module")
def schema() -> dict:
    if not SCHEMA_PATH.is_file():
        pytest.skip(f"Compose Specification schema not found at {SCHEMA_PATH} (expected ../shared beside the checkout)")
    return json.loads(SCHEMA_PATH.read_text())
