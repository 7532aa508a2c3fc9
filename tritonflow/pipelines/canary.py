"""Canary promotion and rollback, end to end, as plain functions.

The DAGs ``canary_promotion`` and ``canary_rollback`` call these functions; so can a test, a
benchmark or a shell. Nothing here imports Airflow. Every public function returns a small
JSON-serialisable dict (XCom-sized).

Sequence of a promotion (``canary_promotion``):

1. :func:`resolve` -- which versions: the challenger (a version number or an alias such as
   ``challenger``) and the champion (an explicit override, else the version the gateway serves
   now, else the ``champion`` alias). A run for a version that already holds ``champion`` and
   already takes 100 % of the traffic is a no-op: ``canary_promotion`` sets the alias itself and
   the registry watcher maps that alias move back to ``canary_promotion``.
2. :func:`preflight` -- enough memory to load the challenger beside the champion (GPU free memory
   through pynvml when the challenger's config asks for GPU instances and a GPU is present, host
   ``MemAvailable`` otherwise). Refuses before any traffic is touched.
3. :func:`ensure_loaded` -- both versions' signatures re-verified (OpenSSF model-signing, trusted
   keys), then both loaded side by side with a ``specific`` version policy that keeps them.
4. :func:`run_promotion` -- under the model's promotion lock for the whole canary: drive
   :func:`repository_sync.canary.run_canary` through the real NGINX router, Triton's metrics
   endpoint and the inference log; record every step's figures and verdict on the challenger's
   MLflow model version; at 100 %: move the ``champion`` alias (``previous_champion`` kept; with
   ``use_stages`` Production/Archived), set Triton's version policy to exactly {new champion,
   rollback target}, make the new champion's config the repository's serving config and
   garbage-collect old version folders of the repository (never the champion, the rollback target,
   a version holding an alias, one READY in Triton, nor one newer than the champion). On a failed
   step: automatic rollback, gateway to 100 % champion FIRST (and live), then the challenger is
   unloaded; the outcome is recorded on the MLflow version.

A manual rollback (``canary_rollback``, :func:`manual_rollback`) resolves the rollback target
from the ``previous_champion`` alias (refusing, with the alias and the version named, when it
dangles), re-verifies its signature, makes sure it is loaded, routes 100 % to it, then
moves the alias back and unloads the rolled-back version.

Where things are (:class:`CanaryEnvironment`): by default everything comes from
:class:`~tritonflow.settings.Settings` -- Triton's HTTP and metrics ports, the local NGINX gateway
(``settings.run_dir / "gateway"``, reloaded with ``NginxGateway.reload``), the repository, the
trusted keys, the MLflow tracking URI and the inference-log root. Tests and benchmarks pass their
own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from tritonflow.exceptions import (
    DataError,
    ModelLoadRefusedError,
    RegistryError,
    SettingsError,
)
from tritonflow.settings import Settings, get_settings

#: Registry aliases (same values as :mod:`model_registry.registry`).
CHAMPION_ALIAS = "champion"
PREVIOUS_CHAMPION_ALIAS = "previous_champion"
#: Model-version tag naming the Triton model a version was published as (written by publish).
TRITON_NAME_TAG = "tritonflow.triton_model_name"
#: Prefix of the canary tags on the challenger's model version.
CANARY_TAG_PREFIX = "tritonflow.canary."
#: Inference-log columns taken as predictions when none are named: names starting with these.
DEFAULT_PREDICTION_PREFIXES = ("prediction", "probabilit", "score")
#: Seconds to wait for a new gateway plan to be live (every probe sees its digest).
DEFAULT_LIVE_TIMEOUT_S = 15.0
#: Seconds a fixed overhead of one promotion may take on top of the bakes (loads, MLflow, GC);
#: used by :func:`canary_time_budget_s`.
PROMOTION_OVERHEAD_S = 600.0


# ----------------------------------------------------------------------------------- environment
@dataclasses.dataclass
class CanaryEnvironment:
    """Where the canary's systems are.

    Attributes:
        settings: The settings (thresholds, lock timeout, memory factor, home).
        triton_url: ``host:port`` of Triton's HTTP endpoint.
        metrics_url: Triton's Prometheus endpoint (``http://host:port/metrics``).
        gateway_url: Base URL of the NGINX gateway (``http://host:port``).
        gateway_conf_dir: The gateway's config folder (holds ``http.d/`` and ``locations.d/``).
        gateway_reload: Callable (or argv) that checks and gracefully reloads NGINX.
        gateway_test: Callable/argv running ``nginx -t`` before the reload (``None`` when the
            reload checks the config itself, as ``NginxGateway.reload`` does).
        repository_uri: Triton model repository (folder or ``s3://...``).
        trusted_keys: Folder of trusted public keys for signature verification.
        tracking_uri: MLflow tracking/registry URI.
        inference_log_root: Inference-log root (folder or ``s3://bucket/prefix``).
        endpoint_url: S3 endpoint for the repository and the log (``None``: from the URL).
        gpu_free_bytes: Callable giving free GPU memory in bytes (``None`` result: no GPU);
            default: pynvml through :mod:`model_registry.hardware`.
    """

    settings: Settings
    triton_url: str
    metrics_url: str
    gateway_url: str
    gateway_conf_dir: Path
    gateway_reload: Any
    gateway_test: Any
    repository_uri: str
    trusted_keys: Any
    tracking_uri: str
    inference_log_root: str
    endpoint_url: str | None = None
    gpu_free_bytes: Callable[[], int | None] | None = None

    @classmethod
    def from_settings(cls, settings: Settings | None = None, *, gateway: Any = None,
                      **overrides: Any) -> "CanaryEnvironment":
        """Environment of the local runtime described by ``settings`` (default: the environment).

        Args:
            settings: Settings; default :func:`~tritonflow.settings.get_settings`.
            gateway: An ``NginxGateway`` (``conf_dir``, ``reload()``, ``url``); default the
                runtime's gateway for ``settings`` (conf dir ``settings.run_dir / "gateway"``, URL
                ``settings.resolved_gateway_url``: ``TRITONFLOW_GATEWAY_URL`` or its connection).
            **overrides: Field values that win (e.g. ``metrics_url``).
        """
        from tritonflow.pipelines.shadow import trusted_keys_dir

        s = settings or get_settings()
        if gateway is None and s.gateway_reload == "watcher":
            # docker-compose: NGINX runs in its own container and reloads through its watcher.
            from repository_sync.router import WatcherReload

            gateway_url, conf_dir = s.resolved_gateway_url, s.resolved_gateway_conf_dir
            reload = WatcherReload(conf_dir)
        else:
            gateway_url = gateway.url if gateway is not None else s.resolved_gateway_url  # URL setting/connection
            if gateway is None:
                from tritonflow.runtime.services import NginxGateway

                gateway = NginxGateway(s)
            conf_dir, reload = Path(gateway.conf_dir), gateway.reload
        values: dict[str, Any] = dict(
            settings=s,
            triton_url=s.triton_http_url,
            metrics_url=s.resolved_triton_metrics_url,
            gateway_url=gateway_url,
            gateway_conf_dir=conf_dir,
            gateway_reload=reload,
            gateway_test=None,
            repository_uri=s.resolved_repository_uri,
            trusted_keys=trusted_keys_dir(s),  # the publish pipeline's rule (<home>/keys/trusted)
            tracking_uri=s.resolved_mlflow_tracking_uri,
            inference_log_root=s.inference_log_root or str(s.home / "inference_logs"),
            endpoint_url=s.s3_endpoint_url or None,
        )
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SettingsError(f"CanaryEnvironment: unknown field(s) {sorted(unknown)}")
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ clients
    def router(self):
        """The traffic router ``TRITONFLOW_TRAFFIC_ROUTER`` names (default: NGINX on the gateway's conf dir)."""
        from repository_sync.coordination import coordination_store
        from repository_sync.router import make_router

        return make_router(self.settings.traffic_router, conf_dir=self.gateway_conf_dir,
                           reload=self.gateway_reload, test=self.gateway_test,
                           response_header=self.settings.gateway_response_header,
                           fallback=self.settings.fallback_enabled, fallback_timeout_s=self.settings.fallback_timeout_s,
                           coordination=coordination_store(self.settings))

    def triton(self):
        """A :class:`repository_sync.triton_client.TritonModelControl` (verifies before loads)."""
        from repository_sync.coordination import coordination_store
        from repository_sync.triton_client import TritonModelControl

        return TritonModelControl(self.triton_url, repository=self.storage(),
                                  trusted_keys=self.trusted_keys,
                                  load_timeout_s=self.settings.load_timeout_s,
                                  coordination=coordination_store(self.settings))

    def storage(self):
        """The repository storage backend."""
        from repository_sync.storage import open_repository

        return open_repository(self.repository_uri, endpoint_url=self.endpoint_url)

    def registry(self):
        """A :class:`model_registry.registry.RegistryClient` on the tracking URI."""
        from model_registry.registry import RegistryClient

        return RegistryClient(self.tracking_uri, actor=f"canary@{socket.gethostname()}:{os.getpid()}")


def _env(env: CanaryEnvironment | None) -> CanaryEnvironment:
    return env if env is not None else CanaryEnvironment.from_settings()


def default_holder() -> str:
    """Holder text of a promotion lock when the caller names none (host and pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def canary_time_budget_s(steps: Sequence[int], bake_s: float, max_extensions: int) -> float:
    """Longest a canary may take: every step baked ``1 + max_extensions`` times plus overhead.

    Used by the DAG to refuse parameters its promotion task's ``execution_timeout`` cannot hold.
    """
    return len(steps) * float(bake_s) * (1 + int(max_extensions)) + PROMOTION_OVERHEAD_S


# ----------------------------------------------------------------------------------- resolution
def _as_int_version(value: Any, field: str) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise DataError(f"{field}={value!r} is not a model version (expected a positive integer)")
    text = str(value).strip()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    return None


def _triton_name(ref: Any) -> str:
    return str((ref.tags or {}).get(TRITON_NAME_TAG) or ref.name)


def _resolve_challenger(registry: Any, model: str, challenger: Any):
    if challenger is None or str(challenger).strip() == "":
        raise DataError(f"challenger={challenger!r} is empty: expected a version number or an alias "
                        f"(e.g. 'challenger') of model {model!r}")
    version = _as_int_version(challenger, "challenger")
    if version is not None:
        return registry.get_version(model, version)
    text = str(challenger).strip()
    if text.startswith("models:/") or "/" in text or "@" in text.lstrip("@")[1:]:
        ref = registry.resolve(text)
        if ref.name != model:
            raise DataError(f"challenger={challenger!r} names model {ref.name!r}, not {model!r}")
        return ref
    return registry.resolve_alias(model, text.lstrip("@"))


def _serving_version(plan: Any) -> int | None:
    """The champion of a live plan (its 100 % version, or the champion of a split)."""
    if plan is None:
        return None
    full = [v for v, w in plan.weights.items() if w == 100]
    return int(full[0]) if full else int(plan.champion)


def resolve(model: str, challenger: Any, champion: Any = None, *,
            env: CanaryEnvironment | None = None) -> dict[str, Any]:
    """Resolve the challenger and champion versions of ``model`` and say whether a run is a no-op.

    Args:
        model: Registered model name.
        challenger: Version number (int or digits) or alias (``"challenger"``, ``"@challenger"``)
            or model reference (``"models:/m@a"``).
        champion: Explicit champion version; default: the version the gateway serves now (the
            100 % route or the champion of a split left by an interrupted canary), else the
            ``champion`` alias.
        env: Where the systems are (default: from settings).

    Returns:
        ``{"model", "triton_model", "challenger", "champion", "registry_champion", "live_weights",
        "noop", "reason"}``; ``noop`` is True when the challenger already holds ``champion`` and
        takes 100 % of the gateway's traffic.

    Raises:
        DataError: Empty model, unknown version/alias (``RegistryError``), a challenger tagged
            ``rejected`` (stage and reason named), or no champion found.
    """
    if not model or not str(model).strip():
        raise DataError("model='' is empty: expected a registered model name")
    env = _env(env)
    registry = env.registry()
    ref = _resolve_challenger(registry, model, challenger)
    from tritonflow.pipelines.loop_context import rejection

    rejected = rejection(getattr(ref, "tags", None))
    if rejected:
        raise DataError(f"challenger={challenger!r} of model {model!r} is version {ref.version}, {rejected}; "
                        "a version rejected by one path is never promoted by another")
    triton_model = _triton_name(ref)
    live = env.router().current_plan(triton_model)
    aliases = registry.aliases(model)
    registry_champion = aliases.get(CHAMPION_ALIAS)
    explicit = _as_int_version(champion, "champion")
    if champion not in (None, "") and explicit is None:
        raise DataError(f"champion={champion!r} is not a model version (expected a positive integer)")
    if explicit is not None:
        registry.get_version(model, explicit)  # must exist
        champ = explicit
    else:
        champ = _serving_version(live) or registry_champion
    if champ is None:
        raise DataError(
            f"model {model!r}: no champion to compare version {ref.version} with: the gateway does "
            f"not route {triton_model!r} and alias {CHAMPION_ALIAS!r} is not set; pass champion="
        )
    live_weights = {str(k): v for k, v in live.weights.items()} if live else None
    serving_full = bool(live and live.weights.get(ref.version) == 100)
    noop = registry_champion == ref.version and serving_full
    if noop:
        reason = (f"version {ref.version} already holds {CHAMPION_ALIAS!r} and takes 100 % of "
                  f"{triton_model!r}'s traffic: nothing to do")
    elif champ == ref.version:
        reason = f"version {ref.version} is the serving champion: it will be routed 100 % without a canary"
    else:
        reason = f"canary of version {ref.version} against champion {champ}"
    return {
        "model": model, "triton_model": triton_model, "challenger": ref.version,
        "champion": int(champ), "registry_champion": registry_champion,
        "live_weights": live_weights, "noop": noop, "reason": reason,
    }


# ----------------------------------------------------------------------------------- pre-flight
def _config_message(config_bytes: bytes, name: str):
    from repository_sync.publish import parse_model_config

    return parse_model_config(config_bytes, name)


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
    (:func:`repository_sync.canary.preflight_memory`). The comparison is with the free memory of
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
    from repository_sync.canary import preflight_from_settings
    from repository_sync.layout import INTENDED_CONFIG_FILENAME, plan_version

    env = _env(env)
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
            from repository_sync.canary import model_files_bytes

            size = model_files_bytes(local)
            out.update(model_bytes=size, required_bytes=0, available_bytes=None, source="loaded")
            return out
        gpu = _gpu_free_for(msg, env) if msg is not None else env.gpu_free_bytes
        report = preflight_from_settings(env.settings, local, model=name, gpu_free_bytes=gpu)
    out.update(report.to_dict())
    return out


# ----------------------------------------------------------------------------------- loading
def _set_loaded(tc: Any, name: str, versions: Iterable[int], config_version: int) -> dict[str, Any]:
    """Make exactly ``versions`` of ``name`` loaded, with ``config_version``'s signed config.

    Every version's signature is verified first (nothing reaches Triton otherwise). An empty set
    unloads the model.
    """
    from google.protobuf import json_format
    from tritonclient.utils import InferenceServerException

    from repository_sync.model_control import reconcile

    wanted = sorted({int(v) for v in versions})
    if not wanted:
        tc.unload(name)
        return {"versions": [], "signatures": {}}
    if getattr(tc, "coordination", None) is not None:  # desired state, under the model-control lease
        done = reconcile(tc, name, exactly=wanted, config_version=int(config_version))
        return {"versions": done["versions"], "signatures": done["signatures"]}
    signatures: dict[str, str] = {}
    config_bytes = b""
    for v in wanted:
        info, intended = tc.verify(name, v)  # raises SignatureVerificationError: nothing loaded
        signatures[str(v)] = info.signature_digest
        if v == int(config_version):
            config_bytes = intended
    if not config_bytes:
        _, config_bytes = tc.verify(name, int(config_version))
    msg = _config_message(config_bytes, name)
    msg.version_policy.Clear()
    msg.version_policy.specific.versions.extend(wanted)
    previous = tc.ready_versions(name)
    previous_config = tc.model_config(name) if previous else None
    try:
        try:
            tc.client.load_model(name, config=json_format.MessageToJson(msg, preserving_proto_field_name=True,
                                                                        indent=None))
        except InferenceServerException as exc:
            raise ModelLoadRefusedError(
                f"Triton refused to load model {name!r} versions {wanted}: {exc.message()}"
            ) from None
        for v in wanted:
            tc.wait_ready(name, v)
    except BaseException:
        # a failed reload puts back what was loaded before (versions and their config)
        tc._restore(name, previous, previous_config)
        raise
    return {"versions": wanted, "signatures": signatures}


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
    env = _env(env)
    name = triton_model or model
    from repository_sync.model_control import reconcile

    with env.triton() as tc:  # desired state + these versions, one request, under the lease
        done = reconcile(tc, name, add=[int(v) for v in versions], config_version=int(versions[-1]),
                         purpose="canary")
        before = done["before"]
    return {"model": model, "versions": done["versions"], "ready_before": before,
            "loaded_now": sorted(set(done["versions"]) - set(before)), "signatures": done["signatures"]}


def _unload_version(env: CanaryEnvironment, name: str, version: int, keep_config_of: int) -> None:
    from repository_sync.model_control import reconcile

    with env.triton() as tc:  # the desired set minus this version, one request, under the lease
        reconcile(tc, name, remove=[int(version)], config_version=int(keep_config_of))


# ----------------------------------------------------------------------------------- recording
def _record(registry: Any, model: str, version: int, tags: Mapping[str, Any]) -> None:
    registry.set_version_tags(registry.get_version(model, version), dict(tags))


# ----------------------------------------------------------------------------------- repository GC
def _repository_versions(storage: Any, name: str) -> list[int]:
    out = set()
    for path in storage.list_paths():
        parts = path.split("/")
        if len(parts) >= 3 and parts[0] == name and parts[1].isdigit():
            out.add(int(parts[1]))
    return sorted(out)


def _delete_repository_version(storage: Any, name: str, version: int) -> None:
    """Remove one model version from the repository.

    Remove ``<name>/<version>/`` from the repository (filesystem: renamed to a dot-folder Triton
    ignores, then deleted, so a half-deleted version is never visible; S3: every object).
    """
    from repository_sync.storage import FileSystemStorage

    if isinstance(storage, FileSystemStorage):
        folder = storage.root / name / str(int(version))
        if not folder.is_dir():
            return
        trash = storage.root / name / f".deleting-{int(version)}-{uuid.uuid4().hex[:8]}"
        os.rename(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)
        return
    prefix = storage.location.key(name, str(int(version))) + "/"
    paginator = storage.client.get_paginator("list_objects_v2")
    keys = [o["Key"] for page in paginator.paginate(Bucket=storage.location.bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    for i in range(0, len(keys), 1000):
        storage.client.delete_objects(Bucket=storage.location.bucket,
                                      Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})


def garbage_collect_repository(model: str, *, champion: int, rollback_target: int | None,
                               triton_model: str | None = None, env: CanaryEnvironment | None = None,
                               registry: Any = None) -> dict[str, Any]:
    """Delete old version folders of ``model`` from the Triton repository.

    Kept: the champion, the rollback target, every version READY in Triton, every version holding
    an MLflow alias or a Production/Staging stage (``RegistryClient.plan_garbage_collection``), and
    every version newer than the champion (a challenger may be waiting). Deleted: the rest.

    Returns:
        ``{"deleted": [...], "kept": {version: reason}}``.
    """
    env = _env(env)
    name = triton_model or model
    registry = registry or env.registry()
    storage = env.storage()
    from repository_sync.model_control import desired_versions

    with env.triton() as tc:  # READY or meant to be loaded (e.g. by an evaluation starting now)
        ready = set(tc.ready_versions(name)) | set(desired_versions(tc.coordination, tc.coordination_key(name)))
    protected = {int(champion)} | ({int(rollback_target)} if rollback_target else set()) | ready
    plan = registry.plan_garbage_collection(model, deployed_versions=protected, keep_latest=0)
    registered = set(plan.delete) | set(plan.keep)
    kept: dict[str, str] = {}
    deleted: list[int] = []
    for v in _repository_versions(storage, name):
        if v == int(champion):
            kept[str(v)] = "champion"
        elif rollback_target and v == int(rollback_target):
            kept[str(v)] = "rollback target"
        elif v in ready:
            kept[str(v)] = "READY in Triton"
        elif v > int(champion):
            kept[str(v)] = "newer than the champion"
        elif v in plan.keep:
            kept[str(v)] = plan.keep[v]
        elif v in plan.delete or v not in registered:
            _delete_repository_version(storage, name, v)
            deleted.append(v)
    return {"deleted": deleted, "kept": kept}


# ----------------------------------------------------------------------------------- promotion
def _apply_live(router: Any, gateway_url: str, timeout_s: float):
    from repository_sync.router import wait_live

    def apply(plan):
        router.apply(plan)
        wait_live(gateway_url, plan, timeout_s=timeout_s)
        return plan

    return apply


def _now_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:4]


def run_promotion(
    model: str,
    champion: int | None,
    challenger: Any,
    *,
    steps: Sequence[int] | str | None = None,
    bake_s: float | None = None,
    min_requests: int | None = None,
    use_stages: bool = False,
    dry_run: bool = False,
    holder: str = "",
    prediction_columns: Sequence[str] | None = None,
    check_predictions: bool = True,
    expected_predictions: str | None = None,
    label_column: str | None = None,
    policy_overrides: Mapping[str, Any] | None = None,
    garbage_collect: bool = True,
    env: CanaryEnvironment | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Canary ``challenger`` against ``champion`` step by step; promote or roll back.

    Holds the model's promotion lease (``repository_sync.locks.promotion_lock`` in the shared
    coordination database, waiting ``settings.promotion_lock_timeout_s``) from the resolution to the
    end. See the module docstring for the sequence.

    Args:
        model: Registered model name.
        champion: Champion version (``None``: the version the gateway serves, else the alias).
        challenger: Version number or alias of the challenger.
        steps: Traffic percents (default ``settings.canary_steps``), increasing, ending at 100.
        bake_s: Seconds per step (default ``settings.canary_bake_s``).
        min_requests: Fewest challenger requests per step (default ``settings.canary_min_requests``);
            also the fewest challenger predictions the distribution check needs (when smaller than
            the policy's default).
        use_stages: Also move the legacy stages (Production/Archived).
        dry_run: Resolve, check pre-flight and validate the schedule; touch nothing.
        holder: Who promotes, written in the lock (e.g. ``dag_id/run_id/task_id``).
        prediction_columns: The challenger's output columns in the inference log (default:
            columns named ``prediction*``/``probabilit*``/``score*``).
        check_predictions: Read the inference log for the output checks (non-finite/constant
            outputs, expected behaviour, quality with labels, feature-space coverage).
        expected_predictions: URI of the challenger's expected predictions (the shadow
            evaluation's ``canary_conf``); default: the challenger version's
            ``tritonflow.shadow.expected_uri`` tag, else the prediction check is not evaluated.
        label_column: Label column of the inference-log labels (default: their only one).
        policy_overrides: Other :class:`~repository_sync.canary.CanaryPolicy` fields.
        garbage_collect: Delete old repository versions after a promotion.
        env: Where the systems are (default: from settings).
        sleep: Waits (``time.sleep``; injected by tests and benchmarks).
        clock: Unix time now (``time.time``; injected by tests and benchmarks).

    Returns:
        ``{"outcome": "promoted" | "rolled_back" | "rollback_failed" | "noop" | "routed" |
        "dry_run", "model", "champion", "challenger", "reason", "canary_id", "steps": [verdict
        summaries], "rollback": {...} | None, "promotion": {...} | None, "gc": {...} | None,
        "canary_run": {"run_id", "analyses", "analyses_uri", "plot"} | None}``; the MLflow run
        (experiment ``tritonflow-canary``) holds every analysis and the plot over time.

    Raises:
        ConcurrencyError: Another promotion of the model holds the lock (names the holder).
        DataError: Bad parameters (schedule, versions), pre-flight refused, signature invalid.
    """
    from repository_sync.canary import CanaryPolicy, metrics_scraper, run_canary
    from repository_sync.locks import promotion_lock
    from repository_sync.router import TrafficPlan

    env = _env(env)
    settings = env.settings
    overrides: dict[str, Any] = dict(policy_overrides or {})
    if steps is not None:
        overrides["steps"] = steps
    if bake_s is not None:
        overrides["bake_s"] = float(bake_s)
    if min_requests is not None:
        overrides["min_requests"] = int(min_requests)
        from repository_sync.canary import DEFAULT_MIN_PREDICTIONS

        overrides.setdefault("min_predictions", min(DEFAULT_MIN_PREDICTIONS, int(min_requests)))
    policy = CanaryPolicy.from_settings(settings, **overrides)  # SettingsError: nothing touched
    holder = holder or default_holder()

    with promotion_lock(model, settings=settings, holder=holder,
                        timeout_s=settings.promotion_lock_timeout_s):
        res = resolve(model, challenger, champion, env=env)
        name, champ, chal = res["triton_model"], res["champion"], res["challenger"]
        base = {"model": model, "triton_model": name, "champion": champ, "challenger": chal,
                "canary_id": None, "steps": [], "rollback": None, "promotion": None, "gc": None,
                "canary_run": None, "policy": policy.thresholds()}
        if res["noop"]:
            return {**base, "outcome": "noop", "reason": res["reason"]}
        router = env.router()
        apply_live = _apply_live(router, env.gateway_url, DEFAULT_LIVE_TIMEOUT_S)
        registry = env.registry()
        if champ == chal:
            if dry_run:
                return {**base, "outcome": "dry_run", "reason": res["reason"]}
            ensure_loaded(model, [chal], triton_model=name, env=env)
            apply_live(TrafficPlan.single(name, chal, name=f"{name}:route"))
            promo = registry.promote(model, chal, use_stages=use_stages, reason="routed without canary")
            return {**base, "outcome": "routed", "reason": res["reason"],
                    "promotion": dataclasses.asdict(promo)}

        pre = preflight(model, champ, chal, triton_model=name, env=env)
        if dry_run:
            plans = [TrafficPlan.canary(name, champ, chal, p).weights for p in policy.steps]
            return {**base, "outcome": "dry_run", "reason": res["reason"], "preflight": pre,
                    "plans": [{str(k): v for k, v in w.items()} for w in plans]}
        loaded = ensure_loaded(model, [champ, chal], triton_model=name, env=env)

        from tritonflow.pipelines.canary_observe import (
            CanaryRecord,
            coverage_reference_for,
            expected_for,
            observer,
        )

        expected, expected_note = expected_for(registry, model, chal, expected_predictions,
                                               tracking_uri=env.tracking_uri)
        coverage_ref, coverage_note = coverage_reference_for(
            env.inference_log_root, model, chal, policy.coverage_features, endpoint_url=env.endpoint_url)
        canary_id = _now_id()
        prefix = f"{CANARY_TAG_PREFIX}{canary_id}."
        record = CanaryRecord(env.tracking_uri, model=model, triton_model=name, champion=champ,
                              challenger=chal, canary_id=canary_id, thresholds=policy.thresholds(),
                              extra_tags={"tritonflow.holder": holder})
        _record(registry, model, chal, {
            f"{CANARY_TAG_PREFIX}latest": canary_id,
            prefix + "started": {"champion": champ, "challenger": chal, "holder": holder,
                                 "policy": policy.thresholds(), "preflight": pre,
                                 "signatures": loaded["signatures"], "run_id": record.run_id,
                                 "expected": expected_note, "coverage": coverage_note,
                                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        })

        def on_step(analysis) -> None:
            _record(registry, model, chal, {
                f"{prefix}step.{analysis.step:02d}.{analysis.attempt}": analysis.to_json(),
            })

        def unload_challenger() -> None:
            _unload_version(env, name, chal, keep_config_of=champ)

        observe = (observer(env.inference_log_root, name, prediction_columns=prediction_columns,
                            label_column=label_column, endpoint_url=env.endpoint_url)
                   if check_predictions else None)
        try:
            result = run_canary(
                model=name, champion=champ, challenger=chal, policy=policy, apply_plan=apply_live,
                scrape_metrics=metrics_scraper(env.metrics_url), unload_challenger=unload_challenger,
                observe=observe, expected=expected, coverage_reference=coverage_ref, sleep=sleep,
                clock=clock, on_step=on_step, on_analysis=record.add,
            )
        except BaseException as exc:
            # Anything unexpected (MLflow down while recording a step, interrupt): traffic back to
            # the champion first, then the challenger unloaded, then the error propagates.
            from repository_sync.canary import rollback

            rec = rollback(model=name, champion=champ, apply_plan=apply_live,
                           unload_challenger=unload_challenger, reason=f"canary aborted: {exc}")
            with contextlib.suppress(Exception):
                record.finish("aborted", str(exc))
            with contextlib.suppress(Exception):
                _record(registry, model, chal, {prefix + "outcome": "aborted",
                                                prefix + "rollback": dataclasses.asdict(rec)})
            raise

        canary_run = record.finish(result.outcome, result.reason)
        summary = [{"step": s.step, "percent": s.percent, "attempt": s.attempt, "verdict": s.verdict,
                    "reason": s.reasons[0] if s.reasons else "",
                    "canary_requests": s.canary_requests} for s in result.steps]
        out = {**base, "canary_id": canary_id, "outcome": result.outcome, "reason": result.reason,
               "steps": summary, "preflight": pre, "canary_run": canary_run,
               "rollback": dataclasses.asdict(result.rollback) if result.rollback else None}
        _record(registry, model, chal, {prefix + "run": canary_run})
        if not result.promoted:
            if res["registry_champion"] == chal:
                # The alias was moved to the challenger by hand (the event that started this run):
                # it goes back to the version that serves, so MLflow says what serves.
                registry.client.set_registered_model_alias(model, CHAMPION_ALIAS, str(champ))
                out["alias_restored_to"] = champ
            _record(registry, model, chal, {prefix + "outcome": result.outcome,
                                            prefix + "reason": result.reason,
                                            prefix + "rollback": out["rollback"]})
            return out

        # ---- promotion at 100 %
        if res["registry_champion"] == chal:
            # alias set by hand before the canary: keep the serving champion as rollback target
            from model_registry.registry import PREVIOUS_CHAMPION_TAG

            registry.client.set_registered_model_alias(model, PREVIOUS_CHAMPION_ALIAS, str(champ))
            registry.client.set_registered_model_tag(model, PREVIOUS_CHAMPION_TAG, str(champ))
        promo = registry.promote(model, chal, expected_champion=res["registry_champion"],
                                 use_stages=use_stages, reason=f"canary {canary_id} passed")
        target = promo.previous_champion or champ
        apply_live(TrafficPlan.single(name, chal, name=f"{name}:champion"))  # live plan names it
        with env.triton() as tc:
            from repository_sync.model_control import reconcile_model

            versions = reconcile_model(tc, registry, model, triton_model=name,
                                       keep=[chal, int(target)])["versions"]
            _, serving_config = tc.verify(name, chal)
        env.storage().write_serving_config(name, serving_config)
        gc = (garbage_collect_repository(model, champion=chal, rollback_target=int(target),
                                         triton_model=name, env=env, registry=registry)
              if garbage_collect else None)
        out.update(promotion=dataclasses.asdict(promo), loaded_versions=versions, gc=gc,
                   rollback_target=int(target))
        _record(registry, model, chal, {prefix + "outcome": "promoted",
                                        prefix + "reason": result.reason,
                                        prefix + "loaded_versions": versions,
                                        prefix + "gc": gc or {}})
        return out


# ----------------------------------------------------------------------------------- rollback
def manual_rollback(model: str, reason: str, *, use_stages: bool = False, holder: str = "",
                    unload_rolled_back: bool = True, expected_champion: int | None = None,
                    env: CanaryEnvironment | None = None) -> dict[str, Any]:
    """Roll ``model`` back to its ``previous_champion`` (the Airflow UI's manual rollback).

    Order: resolve the rollback target (never "latest"; a dangling or missing alias stops here
    with the alias and the version named) -> re-verify its signature and make sure it is
    loaded -> gateway 100 % to it (and live) -> alias ``champion`` moves back (``previous_champion``
    is cleared so a second rollback stops) -> the rolled-back version is unloaded.

    Args:
        model: Registered model name.
        reason: Why (recorded in the audit trail and on both versions); must not be empty.
        use_stages: Also move the legacy stages.
        holder: Who rolls back, written in the promotion lock.
        unload_rolled_back: Unload the version rolled back from once traffic left it.
        expected_champion: Roll back only while ``champion`` still names this version (the
            health sentinel passes the version it judged; read under the promotion lock, so a
            promotion that finished meanwhile is never undone). Otherwise nothing changes and the
            result holds ``skipped``.
        env: Where the systems are (default: from settings).

    Returns:
        ``{"model", "triton_model", "rolled_back_from", "rolled_back_to", "signature", "weights",
        "unloaded"}``.

    Raises:
        RegistryError: No resolvable rollback target (names alias and version).
        ConcurrencyError: A promotion of the model is in progress (names the holder).
        SignatureVerificationError: The target's files fail verification; nothing changed.
    """
    from repository_sync.locks import promotion_lock
    from repository_sync.router import TrafficPlan

    if not reason or not str(reason).strip():
        raise DataError("reason='' is empty: expected why the model is rolled back")
    env = _env(env)
    registry = env.registry()
    with promotion_lock(model, settings=env.settings, holder=holder or default_holder(),
                        timeout_s=env.settings.promotion_lock_timeout_s):
        current = registry.aliases(model).get(CHAMPION_ALIAS)
        if expected_champion is not None and current != int(expected_champion):
            return {"model": model, "skipped": f"champion is version {current}, not {int(expected_champion)}: "
                    "nothing rolled back", "rolled_back_from": None, "rolled_back_to": None}
        target = registry.rollback_target(model)  # refuses, naming alias and version
        name = _triton_name(target)
        with env.triton() as tc:
            info, _ = tc.verify(name, target.version)  # re-verified before any load
            from repository_sync.model_control import reconcile

            reconcile(tc, name, add=[target.version], config_version=target.version)
        plan = TrafficPlan.single(name, target.version, name=f"{name}:manual-rollback")
        _apply_live(env.router(), env.gateway_url, DEFAULT_LIVE_TIMEOUT_S)(plan)
        registry.rollback(model, use_stages=use_stages, reason=reason)
        unloaded = False
        if unload_rolled_back and current is not None and current != target.version:
            _unload_version(env, name, current, keep_config_of=target.version)
            unloaded = True
        record = {"tritonflow.rollback.at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "tritonflow.rollback.reason": reason,
                  "tritonflow.rollback.from": str(current), "tritonflow.rollback.to": str(target.version)}
        _record(registry, model, target.version, record)
        if current is not None and current != target.version:
            with contextlib.suppress(RegistryError):
                _record(registry, model, current, record)
    return {"model": model, "triton_model": name, "rolled_back_from": current,
            "rolled_back_to": target.version, "signature": info.signature_digest,
            "weights": {str(target.version): 100}, "unloaded": unloaded}


__all__ = [
    "CanaryEnvironment", "canary_time_budget_s", "default_holder", "ensure_loaded",
    "garbage_collect_repository", "manual_rollback", "preflight", "resolve", "run_promotion",
]
