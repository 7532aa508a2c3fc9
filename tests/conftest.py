"""Shared fixtures: real local services on loopback (Triton, MLflow, S3 endpoint, NGINX).

Every service runs as a real process from :mod:`tritonflow.runtime.services` on free ports with
its state under pytest's temporary folder, and is stopped at teardown.

The ``integration`` marker is also set here, at collection (:func:`pytest_collection_modifyitems`),
on every test that needs a service, so that ``-m "not integration"`` is the service-free subset
whether or not a test's module remembered the marker; see :func:`service_reason`.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import re
import subprocess
import textwrap
import types
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import tritonflow.runtime.airflow  # noqa: F401  (its Service subclasses must be known below)
from ground.settings import Settings
from tritonflow.runtime.services import (
    MlflowServer,
    NginxGateway,
    S3Server,
    Service,
    TritonServer,
    free_port,
)

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


# ------------------------------------------------------------------ the integration marker
# "Service-free" (``-m "not integration"``) means: the test starts no service process and reaches
# none (MLflow, moto, Triton, NGINX, PostgreSQL, Redis, Celery, Airflow) and runs no DAG with
# ``dag.test`` (in process or in a subprocess). In-process helpers on loopback (an HTTP server in
# a thread, a Starlette TestClient) are service-free. It is checked by running the subset in a
# network namespace with only a loopback of its own (tests/README.md).

#: Fixtures that start (or reach) a service; a test using any of them, directly or through
#: another fixture, is an integration test.
SERVICE_FIXTURES = frozenset({
    "s3_server", "mlflow_server", "triton_factory", "gateway_factory",  # this file
    "mlflow_tracking_uri",  # tests/plugins/conftest.py: a real MLflow server
    "drift_s3", "s3_root",  # tests/drift_checks/conftest.py: a real moto server
    "registry_tracking_uri", "logged_sklearn_model", "register_versions",  # model_registry: MLflow
})

#: Test helper modules whose functions start services or run DAGs; calling anything from them
#: (or naming the script file of one) makes a test an integration test.
SERVICE_HELPER_MODULES = frozenset({
    "tests.demo_run",  # the quick demo: Airflow, MLflow, Triton, NGINX
    "tests.deployment.airflow_stack",  # the Celery deployment: PostgreSQL, Redis, Airflow
    "tests.ui.browser",  # Chromium against a running deployment
    "tests.dags.fire_and_forget_run",  # dag.test of a trigger DAG in a subprocess
    "tests.plugins.webhook_sink_run",  # dag.test of the webhook consumer in a subprocess
    "tests.repository_sync.celery_promotion_app",  # a Celery app on Redis
})

#: Parameter ids of a backend that is a service (``params=["sqlite", "postgresql"]``).
SERVICE_PARAM_IDS = frozenset({"postgresql", "postgres", "redis", "s3", "minio"})

def _subclasses(cls: type) -> set[type]:
    """``cls`` and all its subclasses, at any depth."""
    return {cls}.union(*(_subclasses(sub) for sub in cls.__subclasses__()))


#: Names of the classes that start a service process: every Service of tritonflow.runtime, the
#: Airflow deployment that runs five of them, and Spark's session (a JVM it starts and talks to).
SERVICE_CLASS_NAMES = frozenset({cls.__name__ for cls in _subclasses(Service)}
                                | {"AirflowDeployment", "SparkSession"})

#: Text of a Python script that may run a DAG (``dag.test()``); confirmed by parsing it.
DAG_RUN_TEXT = re.compile(r"\.test\(")

_TESTS_ROOT = Path(__file__).resolve().parent


def _code_reason(code: types.CodeType, namespace: dict[str, Any], home: Path, seen: set[int]) -> str | None:
    """Why a code object (and the test helpers it names, transitively) needs a service, or None."""
    if id(code) in seen:
        return None
    seen.add(id(code))
    names = set(code.co_names)
    if "test" in names:  # the attribute of ``dag.test()``
        return f"{code.co_name} runs a DAG with .test()"
    if {"__file__", "subprocess"} <= names and _script_runs_a_dag(Path(code.co_filename).read_text()):
        return f"{code.co_name} runs its own file, which runs a DAG, as a script"
    for name in sorted(names):
        if name in SERVICE_CLASS_NAMES:
            return f"{code.co_name} starts {name}"
        if name in SERVICE_HELPER_MODULES or any(name.startswith(m + ".") for m in SERVICE_HELPER_MODULES):
            return f"{code.co_name} imports {name}"
        reason = _object_reason(namespace.get(name), home, seen)
        if reason:
            return reason
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            reason = _code_reason(const, namespace, home, seen)
        else:
            reason = _text_reason(const, home, code.co_name)
        if reason:
            return reason
    return None


def _script_runs_a_dag(text: str) -> bool:
    """True when ``text`` parses as Python and calls ``<something>.test(...)`` (not prose)."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return False
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "test" for node in ast.walk(tree))


def _text_reason(const: Any, home: Path, where: str) -> str | None:
    """Why a constant (a script's text or a helper script's file name) runs a DAG, or None."""
    if not isinstance(const, str):
        return None
    if DAG_RUN_TEXT.search(const) and _script_runs_a_dag(const):
        return f"{where} runs a DAG script"
    if const.endswith(".py") and "/" not in const and (home / const).is_file():
        module = ".".join((home / const).relative_to(_TESTS_ROOT.parent).with_suffix("").parts)
        if module in SERVICE_HELPER_MODULES:
            return f"{where} runs {const}"
    return None


def _object_reason(obj: Any, home: Path, seen: set[int]) -> str | None:
    """Why an object a test names needs a service: a Service class, a helper module's object, a
    test helper function that does (followed transitively), or a constant that runs a DAG."""
    if obj is None or id(obj) in seen:
        return None
    if isinstance(obj, type) and issubclass(obj, Service):
        return f"uses {obj.__name__}"
    if isinstance(obj, types.ModuleType):
        seen.add(id(obj))
        return f"uses {obj.__name__}" if obj.__name__ in SERVICE_HELPER_MODULES else None
    if isinstance(obj, str):
        return _text_reason(obj, home, "a constant")
    module = getattr(obj, "__module__", None) or ""
    if module in SERVICE_HELPER_MODULES:
        return f"calls {module}.{getattr(obj, '__qualname__', obj)}"
    func = inspect.unwrap(obj) if callable(obj) else None
    if isinstance(func, types.FunctionType) and module.split(".")[0] == "tests":
        path = Path(func.__code__.co_filename).parent
        return _code_reason(func.__code__, func.__globals__, path, seen)
    return None


def service_reason(item: pytest.Item) -> str | None:
    """Why a collected test needs a service, or None when it is service-free.

    A test needs one when it (or a fixture it uses, at any depth) is in :data:`SERVICE_FIXTURES`,
    or when its function or one of its fixtures' functions starts a :class:`Service`, calls
    ``.test()`` on a DAG, runs a script that does, or calls into :data:`SERVICE_HELPER_MODULES`,
    directly or through the test helpers it calls; or when a parameter id names a service backend.
    """
    fixtures = set(getattr(item, "fixturenames", ()))
    hit = sorted(fixtures & SERVICE_FIXTURES)
    if hit:
        return f"uses fixture {hit[0]}"
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        ids = set(re.split(r"[-\[\]]", callspec.id)) | {str(v) for v in callspec.params.values()}
        if ids & SERVICE_PARAM_IDS:
            return f"parameter {sorted(ids & SERVICE_PARAM_IDS)[0]}"
    functions = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in sorted(fixtures):
        for fixturedef in (info.name2fixturedefs.get(name, ()) if info else ()):
            functions.append(fixturedef.func)
    for func in functions:
        if func not in _REASONS:
            _REASONS[func] = _object_reason(func, Path(str(item.path)).parent, set())
        if _REASONS[func]:
            return _REASONS[func]
    return None


_REASONS: dict[Any, str | None] = {}  # test or fixture function -> its reason (collection is slow enough)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs a service ``integration`` (see :func:`service_reason`); ``-vv``
    lists the tests marked here with the reason."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for item in items:
        if item.get_closest_marker("integration"):
            continue
        reason = service_reason(item)
        if reason:
            item.add_marker(pytest.mark.integration)
            item.user_properties.append(("integration_reason", reason))
            if reporter is not None and config.getoption("verbose") > 1:
                reporter.write_line(f"integration (conftest): {item.nodeid}: {reason}")


# A service-free test that starts a service process anyway fails at once, naming the process, so
# a marker the collection hook could not infer (a library call that starts one) cannot be missed.

#: Executables that are services when a test starts them, each with the subcommands that are
#: (None: every invocation); ``--help``, ``--version`` and ``-t`` (a configuration check) never are.
#: ``airflow db migrate`` on SQLite or ``mlflow gc`` are commands, not services.
SERVICE_EXECUTABLES: dict[str, frozenset[str] | None] = {
    "tritonserver": None, "moto_server": None, "nginx": None, "model-analyzer": None,
    "perf_analyzer": None, "redis-server": None, "postgres": None, "pg_ctl": None,
    "pg_ctlcluster": None, "gunicorn": None, "uvicorn": None, "chromium": None, "chromedriver": None,
    "mlflow": frozenset({"server", "ui", "serve"}),
    "celery": frozenset({"worker", "beat", "flower"}),
    "airflow": frozenset({"scheduler", "api-server", "webserver", "dag-processor", "triggerer", "celery",
                          "standalone", "test"}),  # ``dags test`` / ``tasks test`` run a DAG
}
_CHECK_ONLY_ARGS = frozenset({"--help", "--version", "-t"})
_SERVICE_FREE_TEST: list[str] = []  # node id of the running service-free test, if one runs
_popen_init = subprocess.Popen.__init__


def service_executable(args: Any) -> str | None:
    """The service an argv starts (``name`` or ``name subcommand``), or None."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    if not argv:
        return None
    words = [os.fsdecode(a) for a in argv]
    if len(words) == 1:
        words = words[0].split()
    name, rest = Path(words[0]).name, words[1:]
    if name not in SERVICE_EXECUTABLES or _CHECK_ONLY_ARGS & set(rest):
        return None
    subcommands = SERVICE_EXECUTABLES[name]
    if subcommands is None:
        return name
    used = [word for word in rest if word in subcommands]
    return f"{name} {used[0]}" if used else None


def _guarded_popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
    if _SERVICE_FREE_TEST:
        name = service_executable(args)
        if name:
            pytest.fail(f"{_SERVICE_FREE_TEST[-1]} starts {name} but is not marked integration: "
                        "add the marker, or name its fixture in SERVICE_FIXTURES (tests/conftest.py)",
                        pytrace=False)
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]


@contextlib.contextmanager
def _service_free(item: pytest.Item) -> Iterator[None]:
    service_free = item.get_closest_marker("integration") is None
    if service_free:
        _SERVICE_FREE_TEST.append(item.nodeid)
    try:
        yield
    finally:
        if service_free:
            _SERVICE_FREE_TEST.pop()


# Set-up and call only: a teardown may stop a wider-scoped service an integration test started.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """While a service-free test's fixtures are set up, starting a service fails it."""
    with _service_free(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """While a service-free test runs, starting a service fails it."""
    with _service_free(item):
        yield
