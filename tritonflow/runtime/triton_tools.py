"""The Triton tools of the local runtime, as the value the measurement code takes.

:func:`triton_tools` builds a :class:`model_registry.profiling.triton_tools.TritonTools` from the settings:
the binaries and environment of the Triton tools environment (:mod:`tritonflow.runtime.services`)
and :func:`scratch_triton`, which starts a throwaway :class:`~tritonflow.runtime.services.TritonServer`.
The pipelines build it and pass it to Model Analyzer's and perf_analyzer's runners in
``model_registry``, which never import the runtime.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from pathlib import Path
from typing import Iterator, Sequence

from ground.exceptions import RuntimeStartError, TransientError
from ground.settings import Settings
from model_registry.profiling.analyzer import analyzer_binary
from model_registry.profiling.analyzer_config import SCRATCH_EXIT_TIMEOUT_S
from model_registry.profiling.perf import perf_analyzer_path
from model_registry.profiling.triton_tools import TritonTools
from tritonflow.runtime.services import (
    TritonServer,
    free_port,
    triton_backend_directory,
    triton_environment,
    triton_server_binary,
)

__all__ = ["scratch_triton", "triton_tools"]


def triton_tools(settings: Settings) -> TritonTools:
    """The Triton tools environment of ``settings`` (``settings.triton_venv``).

    Assembles the backend directory (``<run_dir>/triton-backends``) as a side effect.

    Args:
        settings: Where the Triton tools environment is, and what scratch servers copy.

    Returns:
        The tools, with :func:`scratch_triton` bound to ``settings`` as the server starter.
    """
    return TritonTools(
        environment=triton_environment(settings),
        own_environment=triton_environment(settings, {}),
        tritonserver=triton_server_binary(settings),
        perf_analyzer=perf_analyzer_path(settings),
        model_analyzer=analyzer_binary(settings),
        backend_directory=triton_backend_directory(settings),
        free_port=free_port,
        scratch_server=functools.partial(scratch_triton, settings),
    )


@contextlib.contextmanager
def scratch_triton(settings: Settings, repository: str | Path, models: Sequence[str], *, home: str | Path,
                   purpose: str) -> Iterator[str]:
    """A throwaway local Triton over ``repository`` with ``models`` loaded, stopped on exit.

    The server runs from a copy of ``settings`` with its own ``home`` and free HTTP, gRPC and
    metrics ports (explicit model control, the Triton tools environment), so it never collides
    with the serving Triton or another scratch one; it exits within
    :data:`~model_registry.profiling.analyzer_config.SCRATCH_EXIT_TIMEOUT_S` of being stopped (its
    Python-backend models take about a second each to unload otherwise). Used by the perf gate
    (:func:`model_registry.profiling.perf.perf_regression_gate`) and Model Analyzer's confirmation passes
    (:func:`model_registry.profiling.analyzer.measure_config_passes`).

    Args:
        settings: Settings the scratch server's are copied from.
        repository: Model repository folder; each of ``models`` is a folder in it.
        models: Model names to load before yielding.
        home: Folder for the server's state and logs.
        purpose: What the server is for, named in error messages (e.g. ``"the perf gate"``).

    Yields:
        The server's HTTP endpoint (``127.0.0.1:<port>``, tritonclient form).

    Raises:
        TransientError: Triton did not start or a model did not load: the tool failed, which is
            never a verdict on the model.
    """
    ts = dataclasses.replace(settings, home=Path(home), triton_http_port=free_port(),
                             triton_grpc_port=free_port(), triton_metrics_port=free_port())
    server = TritonServer(ts, repository=str(repository), exit_timeout_s=SCRATCH_EXIT_TIMEOUT_S)
    try:
        server.start()
    except RuntimeStartError as exc:
        raise TransientError(f"Triton for {purpose} did not start: {exc}") from exc
    try:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300.0)
        try:
            for model in models:
                client.load_model(model)
        except Exception as exc:  # noqa: BLE001 - a load failure here is the tool's, not a verdict
            raise TransientError(f"could not load {list(models)} for {purpose}: {exc}") from exc
        finally:
            client.close()
        yield server.http_url
    finally:
        server.stop()
