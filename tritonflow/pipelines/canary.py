"""Canary promotion and rollback, end to end, as plain functions: where things are, which versions.

The DAGs ``canary_promotion`` and ``canary_rollback`` call these functions; so can a test, a
benchmark or a shell. Nothing here imports Airflow. Every public function returns a small
JSON-serialisable dict (XCom-sized).

Sequence of a promotion (``canary_promotion``):

1. :func:`resolve` -- which versions: the challenger (a version number or an alias such as
   ``challenger``) and the champion (an explicit override, else the version the gateway serves
   now, else the ``champion`` alias). A run for a version that already holds ``champion`` and
   already takes 100 % of the traffic is a no-op: ``canary_promotion`` sets the alias itself and
   the registry watcher maps that alias move back to ``canary_promotion``.
2. :func:`tritonflow.pipelines.canary_loading.preflight` -- enough memory to load the challenger
   beside the champion (GPU free memory through pynvml when the challenger's config asks for GPU
   instances and a GPU is present, host ``MemAvailable`` otherwise). Refuses before any traffic is
   touched.
3. :func:`tritonflow.pipelines.canary_loading.ensure_loaded` -- both versions' signatures
   re-verified (OpenSSF model-signing, trusted keys), then both loaded side by side with a
   ``specific`` version policy that keeps them.
4. :func:`tritonflow.pipelines.canary_promotion.run_promotion` -- under the model's promotion lock
   for the whole canary: drive :func:`repository_sync.canary.runner.run_canary` through the real NGINX
   router, Triton's metrics endpoint and the inference log; record every step's figures and verdict
   on the challenger's MLflow model version; at 100 %: move the ``champion`` alias
   (``previous_champion`` kept; with ``use_stages`` Production/Archived), set Triton's version
   policy to exactly {new champion, rollback target}, make the new champion's config the
   repository's serving config and garbage-collect old version folders of the repository (never the
   champion, the rollback target, a version holding an alias, one READY in Triton, nor one newer
   than the champion). On a failed step: automatic rollback, gateway to 100 % champion FIRST (and
   live), then the challenger is unloaded; the outcome is recorded on the MLflow version.

A manual rollback (``canary_rollback``, :func:`tritonflow.pipelines.canary_rollback.manual_rollback`)
resolves the rollback target from the ``previous_champion`` alias (refusing, with the alias and the
version named, when it dangles), re-verifies its signature, makes sure it is loaded, routes 100 %
to it, then moves the alias back and unloads the rolled-back version.

This module holds step 1 and what every step shares. Where things are
(:class:`CanaryEnvironment`): by default everything comes from
:class:`~ground.settings.Settings` -- Triton's HTTP and metrics ports, the local NGINX gateway
(``settings.run_dir / "gateway"``, reloaded with ``NginxGateway.reload``), the repository, the
trusted keys, the MLflow tracking URI and the inference-log root. Tests and benchmarks pass their
own.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any, Callable, Mapping

from ground.exceptions import DataError, RejectedVersionError, SettingsError
from ground.settings import Settings, get_settings
from model_registry.registry.entities import CHAMPION_ALIAS

#: Model-version tag naming the Triton model a version was published as (written by publish).
TRITON_NAME_TAG = "tritonflow.triton_model_name"
#: Prefix of the canary tags on the challenger's model version.
CANARY_TAG_PREFIX = "tritonflow.canary."
#: Seconds to wait for a new gateway plan to be live (every probe sees its digest).
DEFAULT_LIVE_TIMEOUT_S = 15.0


# ----------------------------------------------------------------------------------- environment
def _status_log(s: Settings, conf_dir: Path) -> tuple[str | None, str]:
    """(the gateway status log path or ``None``, why ``None``) from ``TRITONFLOW_GATEWAY_ACCESS_LOG``.

    Empty: ``<conf_dir>/tritonflow-router/gateway_access.jsonl`` where NGINX runs on this host;
    with the reload watcher (NGINX in another container, which sees the conf dir at another path)
    none unless the setting names a path both see.
    """
    from repository_sync.routing.gateway_status import STATUS_LOG_NAME

    value = (s.gateway_access_log or "").strip()
    if value.lower() == "off":
        return None, "TRITONFLOW_GATEWAY_ACCESS_LOG=off"
    if value:
        return value, ""
    if s.gateway_reload == "watcher":
        return None, ("the gateway runs in another container (TRITONFLOW_GATEWAY_RELOAD=watcher) and "
                      "TRITONFLOW_GATEWAY_ACCESS_LOG names no status log both see")
    return str(Path(conf_dir) / "tritonflow-router" / STATUS_LOG_NAME), ""


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
        gateway_status_log: The gateway's status log (:mod:`repository_sync.routing.gateway_status`), the
            path as NGINX and this host both see it: the router makes NGINX write it and the canary
            counts per-version failures from it. ``None``: not used (``gateway_status_note`` says
            why), and the canary's error rate comes from Triton's metrics alone.
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
    gateway_status_log: str | None = None
    gateway_status_note: str = ""

    @classmethod
    def from_settings(cls, settings: Settings | None = None, *, gateway: Any = None,
                      **overrides: Any) -> "CanaryEnvironment":
        """Environment of the local runtime described by ``settings`` (default: the environment).

        Args:
            settings: Settings; default :func:`~ground.settings.get_settings`.
            gateway: An ``NginxGateway`` (``conf_dir``, ``reload()``, ``url``); default the
                runtime's gateway for ``settings`` (conf dir ``settings.run_dir / "gateway"``, URL
                ``settings.resolved_gateway_url``: ``TRITONFLOW_GATEWAY_URL`` or its connection).
            **overrides: Field values that win (e.g. ``metrics_url``).
        """
        from tritonflow.pipelines.shadow import trusted_keys_dir

        s = settings or get_settings()
        if gateway is None and s.gateway_reload == "watcher":
            # docker-compose: NGINX runs in its own container and reloads through its watcher.
            from repository_sync.routing.nginx_router import WatcherReload

            gateway_url, conf_dir = s.resolved_gateway_url, s.resolved_gateway_conf_dir
            reload = WatcherReload(conf_dir)
        else:
            gateway_url = gateway.url if gateway is not None else s.resolved_gateway_url  # URL setting/connection
            if gateway is None:
                from tritonflow.runtime.services import NginxGateway

                gateway = NginxGateway(s)
            conf_dir, reload = Path(gateway.conf_dir), gateway.reload
        status_log, status_note = _status_log(s, conf_dir)
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
            gateway_status_log=status_log,
            gateway_status_note=status_note,
        )
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SettingsError(f"CanaryEnvironment: unknown field(s) {sorted(unknown)}")
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ clients
    def router(self):
        """The traffic router ``TRITONFLOW_TRAFFIC_ROUTER`` names (default: NGINX on the gateway's conf dir)."""
        from ground.coordination import coordination_store
        from repository_sync.routing.router import make_router

        return make_router(self.settings.traffic_router, conf_dir=self.gateway_conf_dir,
                           reload=self.gateway_reload, test=self.gateway_test,
                           response_header=self.settings.gateway_response_header,
                           fallback=self.settings.fallback_enabled, fallback_timeout_s=self.settings.fallback_timeout_s,
                           coordination=coordination_store(self.settings),
                           status_log=self.gateway_status_log)

    def triton(self):
        """The model-control client (verifies before loads): every Triton replica, or ``triton_url`` alone.

        A :class:`repository_sync.triton.client.TritonModelControl`, or a
        :class:`repository_sync.triton.replicas.TritonReplicaSet` when ``TRITONFLOW_TRITON_REPLICA_URLS``
        names several and ``triton_url`` was not overridden.
        """
        from ground.coordination import coordination_store
        from repository_sync.triton.replicas import triton_control

        return triton_control(self.settings, self.triton_url, repository=self.storage(),
                              trusted_keys=self.trusted_keys,
                              load_timeout_s=self.settings.load_timeout_s,
                              coordination=coordination_store(self.settings))

    def storage(self):
        """The repository storage backend."""
        from repository_sync.storage.open import open_repository

        return open_repository(self.repository_uri, endpoint_url=self.endpoint_url)

    def registry(self):
        """A :class:`model_registry.registry.RegistryClient` on the tracking URI."""
        from model_registry.registry import RegistryClient

        return RegistryClient(self.tracking_uri, actor=f"canary@{socket.gethostname()}:{os.getpid()}")


def environment_or_default(env: CanaryEnvironment | None) -> CanaryEnvironment:
    """``env``, or the environment the settings describe when ``None`` (:meth:`CanaryEnvironment.from_settings`)."""
    return env if env is not None else CanaryEnvironment.from_settings()


def default_holder() -> str:
    """Holder text of a promotion lock when the caller names none (host and pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


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


def triton_name(ref: Any) -> str:
    """The Triton model a version was published as (tag :data:`TRITON_NAME_TAG`), else its registered name.

    Args:
        ref: A :class:`model_registry.registry.ModelVersionRef` (``tags``, ``name``).
    """
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
            ``rejected`` (``RejectedVersionError``, stage and reason named), or no champion found.
    """
    if not model or not str(model).strip():
        raise DataError("model='' is empty: expected a registered model name")
    env = environment_or_default(env)
    registry = env.registry()
    ref = _resolve_challenger(registry, model, challenger)
    from tritonflow.pipelines.loop_context import lift_hint, rejection

    rejected = rejection(getattr(ref, "tags", None))
    if rejected:
        raise RejectedVersionError(f"challenger={challenger!r} of model {model!r} is version {ref.version}, "
                                   f"{rejected}; a version rejected by one path is never promoted by another "
                                   f"({lift_hint(ref.tags)})")
    triton_model = triton_name(ref)
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


# ----------------------------------------------------------------------------------- recording
def record_tags(registry: Any, model: str, version: int, tags: Mapping[str, Any]) -> None:
    """Set ``tags`` on version ``version`` of ``model`` (a step's figures, an outcome).

    Args:
        registry: A :class:`model_registry.registry.RegistryClient`.
        model: Registered model name.
        version: Model version.
        tags: ``{tag: value}``; values are written as the client writes them (JSON for non-strings).

    Raises:
        RegistryError: The version does not exist. ServiceUnavailableError: MLflow did not answer.
    """
    registry.set_version_tags(registry.get_version(model, version), dict(tags))


# ----------------------------------------------------------------------------------- gateway
def live_applier(router: Any, gateway_url: str, timeout_s: float) -> Callable[[Any], Any]:
    """A function that applies a traffic plan and returns once the gateway serves it.

    Args:
        router: The traffic router (:meth:`CanaryEnvironment.router`).
        gateway_url: Base URL of the gateway the probes go to.
        timeout_s: Seconds to wait for every probe to see the plan's digest.

    Returns:
        ``apply(plan) -> plan``; it raises what :func:`repository_sync.routing.gateway_probe.wait_live` raises when
        the plan is not live in time.
    """
    from repository_sync.routing.gateway_probe import wait_live

    def apply(plan):
        router.apply(plan)
        wait_live(gateway_url, plan, timeout_s=timeout_s)
        return plan

    return apply


__all__ = ["CanaryEnvironment", "default_holder", "environment_or_default", "live_applier", "record_tags", "resolve",
           "triton_name"]
