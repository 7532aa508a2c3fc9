"""Shared fixtures: real local services on loopback (Triton, MLflow, S3 endpoint, NGINX).

Every service runs as a real process from :mod:`tritonflow.runtime.services` on free ports with
its state under pytest's temporary folder, and is stopped at teardown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tritonflow.runtime.services import (
    MlflowServer,
    NginxGateway,
    S3Server,
    TritonServer,
    free_port,
)
from tritonflow.settings import Settings

#: Fake credentials for the moto S3 endpoint (moto accepts any).
TEST_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "tritonflow-test",
    "AWS_SECRET_ACCESS_KEY": "tritonflow-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def make_settings(home: Path, **overrides) -> Settings:
    """Settings rooted at ``home`` with every port freshly chosen by the kernel."""
    ports = dict(
        triton_http_port=free_port(),
        triton_grpc_port=free_port(),
        triton_metrics_port=free_port(),
        mlflow_port=free_port(),
        s3_port=free_port(),
        gateway_port=free_port(),
    )
    ports.update(overrides)
    return Settings.from_env({}, home=home, **ports)


@pytest.fixture
def settings_factory(tmp_path) -> Callable[..., Settings]:
    """``settings_factory(**overrides)`` -> Settings under a fresh tmp folder with free ports."""
    counter = iter(range(10_000))

    def factory(**overrides) -> Settings:
        return make_settings(tmp_path / f"home{next(counter)}", **overrides)

    return factory


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """A real moto S3 server on loopback; sets fake AWS credentials in the environment."""
    saved = {k: os.environ.get(k) for k in TEST_AWS_ENV}
    os.environ.update(TEST_AWS_ENV)
    server = S3Server(make_settings(tmp_path_factory.mktemp("s3"))).start()
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> Iterator[MlflowServer]:
    """A real MLflow tracking server (SQLite backend, served artifacts) on loopback."""
    server = MlflowServer(make_settings(tmp_path_factory.mktemp("mlflow"))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def triton_factory(tmp_path) -> Iterator[Callable[[str], TritonServer]]:
    """``triton_factory(repository)`` starts a real Triton (explicit mode) over that repository."""
    started: list[TritonServer] = []

    def factory(repository: str) -> TritonServer:
        settings = make_settings(tmp_path / f"triton{len(started)}")
        server = TritonServer(settings, repository=str(repository))
        started.append(server)
        return server.start()

    yield factory
    for server in started:
        server.stop()


@pytest.fixture
def gateway_factory(tmp_path) -> Iterator[Callable[[TritonServer], NginxGateway]]:
    """``gateway_factory(triton)`` starts NGINX in front of that Triton's HTTP endpoint."""
    started: list[NginxGateway] = []

    def factory(triton: TritonServer) -> NginxGateway:
        settings = make_settings(tmp_path / f"gateway{len(started)}")
        gateway = NginxGateway(settings, triton_http=triton.http_url)
        started.append(gateway)
        return gateway.start()

    yield factory
    for gateway in started:
        gateway.stop()
