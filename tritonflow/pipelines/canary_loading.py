"""Canary pre-flight and loading: memory for the challenger, both versions loaded side by side.

Steps 2 and 3 of a promotion (:mod:`tritonflow.pipelines.canary` describes the sequence):
:func:`preflight` checks there is memory to load the challenger beside the champion before any
traffic is touched; :func:`ensure_loaded` re-verifies both versions' signatures and loads them
side by side. The promotion and the rollbacks unload a version through the same desired-state
reconciliation (:func:`repository_sync.triton.model_control.reconcile`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from ground.exceptions import DataError
from tritonflow.pipelines.canary import CanaryEnvironment, environment_or_default


# ----------------------------------------------------------------------------------- pre-flight
def _config_message(config_bytes: bytes, name: str):
    from repository_sync.model_config import parse_config

    return parse_config(config_bytes, model_name=name)


def _gpu_free_for(config_msg: Any, env: CanaryEnvironment) -> Callable[[], int | None]:
    """Free GPU memory callable: ``None`` (host check) unless the config can use a GPU."""
    from tritonclient.grpc import model_config_pb2 as pb

    kinds = {ig.kind for ig in config_msg.instance_group}
    cpu_only = bool(kinds) and kinds <= {pb.ModelInstanceGroup.KIND_CPU}
    if env.gpu_free_bytes is not None:
        return (lambda: None) if cpu_only else env.gpu_free_bytes

    def free() -> int | None:
        if cpu_only:
            return None
        from model_registry.hardware import inventory

        inv = inventory()
        if not inv.gpus:
            return None
        return min(int(g.memory_free_bytes) for g in inv.gpus)

    return free


def preflight(model: str, champion: int, challenger: int, *, triton_model: str | None = None,
              env: CanaryEnvironment | None = None) -> dict[str, Any]:
    """Check there is memory to load ``challenger`` beside the loaded ``champion``.

    The challenger's files in the repository are measured; it needs about
    ``settings.preflight_memory_factor`` times that plus ``settings.preflight_memory_margin_mib``
    (:func:`repository_sync.canary.preflight.preflight_memory`). The comparison is with the free memory of
    the GPU (pynvml, via :mod:`model_registry.hardware`) when the challenger's config may run on a
    GPU and one is present, else with the host's ``MemAvailable``. A challenger that is already
    READY needs nothing more.

    Returns:
        ``{"model", "champion", "challenger", "already_loaded", "model_bytes", "required_bytes",
        "available_bytes", "source"}`` (bytes; ``source`` is ``"gpu"`` or ``"host"``).

    Raises:
        PreflightError: Not enough memory; raised before any traffic is touched.
        DataError: The challenger is not in the repository.
    """
    from repository_sync.canary.preflight import preflight_from_settings
    from repository_sync.layout import INTENDED_CONFIG_FILENAME, plan_version

    env = environment_or_default(env)
    name = triton_model or model
    out: dict[str, Any] = {"model": model, "champion": int(champion), "challenger": int(challenger)}
    with env.triton() as tc:
        ready = tc.ready_versions(name)
    out["already_loaded"] = int(challenger) in ready
    storage = env.storage()
    with storage.local_version(plan_version(name, int(challenger))) as local:
        intended = Path(local) / INTENDED_CONFIG_FILENAME
        msg = _config_message(intended.read_bytes(), name) if intended.is_file() else None
        if out["already_loaded"]:
            from repository_sync.canary.preflight import model_files_bytes

            size = model_files_bytes(local)
            out.update(model_bytes=size, required_bytes=0, available_bytes=None, source="loaded")
            return out
        gpu = _gpu_free_for(msg, env) if msg is not None else env.gpu_free_bytes
        report = preflight_from_settings(env.settings, local, model=name, gpu_free_bytes=gpu)
    out.update(report.to_dict())
    return out


# ----------------------------------------------------------------------------------- loading
def ensure_loaded(model: str, versions: Sequence[int], *, triton_model: str | None = None,
                  env: CanaryEnvironment | None = None) -> dict[str, Any]:
    """Load ``versions`` side by side (keeping what is already READY), signatures re-verified.

    The version policy becomes ``specific`` = the versions already READY plus ``versions``; the
    config is the signed ``config.pbtxt.intended`` of the last of ``versions`` (the challenger),
    since Triton serves one config per model.

    Returns:
        ``{"model", "versions", "ready_before", "loaded_now", "signatures": {version: digest}}``.

    Raises:
        SignatureVerificationError: A version fails verification; nothing is loaded.
        ModelLoadRefusedError, ModelLoadError: Triton refused or did not reach READY.
    """
    if not versions:
        raise DataError("versions=[] is empty: expected the champion and challenger versions")
    env = environment_or_default(env)
    name = triton_model or model
    from repository_sync.triton.model_control import reconcile, when_triton_answers

    with env.triton() as tc:  # desired state + these versions, one request, under the lease
        done = when_triton_answers(lambda: reconcile(tc, name, add=[int(v) for v in versions],
                                                     config_version=int(versions[-1]), purpose="canary"),
                                   timeout_s=env.settings.start_timeout_s)
        before = done["before"]
    return {"model": model, "versions": done["versions"], "ready_before": before,
            "loaded_now": sorted(set(done["versions"]) - set(before)), "signatures": done["signatures"]}


def unload_version(env: CanaryEnvironment, name: str, version: int, keep_config_of: int) -> None:
    """Unload ``version`` of Triton model ``name``, keeping the other loaded versions.

    One repository-API request for the desired set minus this version, under the model-control
    lease; the serving config stays ``keep_config_of``'s. While Triton does not answer (restarting)
    the request is retried for up to ``settings.start_timeout_s``, and the desired set it sends
    loads back what the restart unloaded.

    Args:
        env: Where the systems are (Triton, its repository, the coordination store).
        name: Triton model name.
        version: The version to unload (a rolled-back challenger or champion).
        keep_config_of: The version whose ``config.pbtxt`` stays the serving config.
    """
    from repository_sync.triton.model_control import reconcile, when_triton_answers

    with env.triton() as tc:  # the desired set minus this version, one request, under the lease
        # Retried while Triton restarts: it then forgets every loaded version, and this reconcile
        # (a rollback's or a promotion's last step) is what loads the one that serves back.
        when_triton_answers(lambda: reconcile(tc, name, remove=[int(version)], config_version=int(keep_config_of)),
                            timeout_s=env.settings.start_timeout_s)


__all__ = ["ensure_loaded", "preflight", "unload_version"]
