"""The Triton tools a measurement needs, handed in by the layer that knows how to start them.

Model Analyzer (:mod:`model_registry.analyzer`) and perf_analyzer (:mod:`model_registry.perf`)
run the binaries of the Triton tools environment and measure on throwaway local Triton servers.
How that environment is assembled and how a server is started belongs to the local runtime
(``tritonflow.runtime``), which sits above this package: the runtime builds one
:class:`TritonTools` (``tritonflow.runtime.triton_tools.triton_tools(settings)``) and the
pipelines pass it down, so nothing here imports the runtime.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Protocol, Sequence

__all__ = ["ScratchServer", "TritonTools"]


class ScratchServer(Protocol):
    """Starts a throwaway local Triton with some models loaded; the context yields its HTTP URL."""

    def __call__(self, repository: str | Path, models: Sequence[str], *, home: str | Path,
                 purpose: str) -> ContextManager[str]:
        """A Triton over ``repository`` with ``models`` loaded, stopped when the context exits.

        Args:
            repository: Model repository folder; each of ``models`` is a folder in it.
            models: Model names loaded before the context is entered.
            home: Folder for the server's state and logs.
            purpose: What the server is for, named in error messages (e.g. ``"the perf gate"``).

        Returns:
            A context manager yielding the server's HTTP URL (``127.0.0.1:<port>``).

        Raises:
            TransientError: Triton did not start or a model did not load (the tool failed,
                never a verdict on the model).
        """
        ...  # pragma: no cover - a protocol


@dataclasses.dataclass(frozen=True)
class TritonTools:
    """The Triton tools environment: binaries, backends, environment and a server starter.

    Attributes:
        environment: Full environment for the tools' processes (``tritonserver``,
            ``perf_analyzer``, ``model-analyzer``): the caller's variables minus its Python ones,
            plus the tools' ``LD_LIBRARY_PATH``, ``PYTHONPATH``, ``PYTHONNOUSERSITE`` and ``PATH``.
        own_environment: The tools' own variables alone (built from an empty base): what Model
            Analyzer passes to the Triton it launches (``triton_server_environment``).
        tritonserver: Path of the ``tritonserver`` binary.
        perf_analyzer: Path of the ``perf_analyzer`` binary.
        model_analyzer: Path of the ``model-analyzer`` console script.
        backend_directory: Assembled ``--backend-directory`` (``python/``, ``onnxruntime/``).
        free_port: Returns a loopback TCP port free right now.
        scratch_server: Starts a throwaway local Triton (:class:`ScratchServer`).
    """

    environment: Mapping[str, str]
    own_environment: Mapping[str, str]
    tritonserver: Path
    perf_analyzer: Path
    model_analyzer: Path
    backend_directory: Path
    free_port: Callable[[], int]
    scratch_server: ScratchServer
