"""Traffic routers: split a model's requests between its champion and challenger versions.

Triton serves several versions of a model side by side but does not split traffic between them.
A :class:`TrafficRouter` does, in front of Triton. :class:`NginxRouter` is the implementation for
the NGINX gateway of the local runtime (and of any NGINX that includes our snippet folders); Kong,
Envoy or Istio adapters can be added behind the same interface.

A :class:`TrafficPlan` says, for one model, which percentage of requests each version gets. Plans
are validated before anything is written: every weight is an integer percent 0-100 and
the weights sum to exactly 100; anything else raises
:class:`~tritonflow.exceptions.TrafficPlanError` naming the plan, the model and each problem.
Nothing is ever normalised.

How the NGINX router routes (files under the gateway's ``conf_dir``, see the runtime contract):

* ``conf_dir/http.d/tritonflow-route-<model>.conf`` (inside ``http {}``): a ``split_clients``
  block that maps a hash of ``$request_id`` (or of a request header, for sticky routing; requests
  without that header fall back to ``$request_id``) to a version number, by percentage.
* ``conf_dir/locations.d/tritonflow-route-<model>.conf`` (inside ``server {}``): a regex
  ``location`` for ``/v2/models/<model>``, ``/v2/models/<model>/ready`` and
  ``/v2/models/<model>/infer`` that rewrites them to Triton's
  ``/v2/models/<model>/versions/<v>/...`` and proxies to the ``triton`` upstream, adding a
  response header (``settings.gateway_response_header``, default ``X-Tritonflow-Version``) naming
  the version and ``X-Tritonflow-Plan`` carrying the plan digest. Requests that name a version
  explicitly, and every other Triton route, keep going to the gateway's default ``location /``.

Fallback replica (``fallback=True``): the ``/infer`` and ``/ready`` routes also intercept the
serving version's 5xx answers and its timeouts (``proxy_read_timeout`` = ``fallback_timeout_s``;
NGINX answers 504) and retry the same request, body included (NGINX buffered it), once on the
INT8 replica ``<model>__fallback`` (:data:`FALLBACK_SUFFIX`), same version number, through a named
location (``error_page 500 502 503 504 = @...``). Those answers carry :data:`FALLBACK_HEADER`
(value: the fallback model's name) and no version header; :func:`answered_by` reads it. A 4xx
(bad request) is never retried. When the fallback cannot answer either, the client gets its error.

Applying a plan: both files are written atomically (temporary file + ``os.replace``), the whole
config is checked (``nginx -t``), then NGINX reloads gracefully (``nginx -s reload``: old workers
finish their requests). If the check or the reload fails, both files are restored byte for byte
and the error is raised, so live routing never changes to a config NGINX refused. The files that
were live before the last successful apply are kept under ``conf_dir/tritonflow-router/`` (not
included by NGINX) and :meth:`NginxRouter.restore_previous` brings them back.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import numbers
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

from repository_sync.coordination import GATEWAY, CoordinationStore
from tritonflow.exceptions import (
    DataError,
    GatewayConfigError,
    GatewayReloadError,
    ServiceUnavailableError,
    TrafficPlanError,
)
from tritonflow.settings import DEFAULT_GATEWAY_RESPONSE_HEADER

#: Response header carrying the digest of the plan that routed a request.
PLAN_HEADER = "X-Tritonflow-Plan"
#: First-line marker of a generated file; the rest of the line is the plan as JSON.
PLAN_MARKER = "# tritonflow-plan: "
#: Prefix of the generated snippet file names.
FILE_PREFIX = "tritonflow-route-"
#: Seconds an ``nginx -t`` / ``nginx -s reload`` command may take.
COMMAND_TIMEOUT_S = 30.0

#: Model names the router accepts (they end up in NGINX regexes and file names).
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: Request header names accepted for sticky routing.
HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
#: Mirror recorder addresses accepted (``host:port``; they end up in an NGINX upstream).
MIRROR_TARGET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}:[0-9]{1,5}$")
#: Internal location prefix of the mirror subrequests.
MIRROR_LOCATION = "/_tritonflow_mirror/"
#: Suffix of the Triton model name of a model's INT8 fallback replica (``<model>__fallback``).
FALLBACK_SUFFIX = "__fallback"
#: Response header marking an answer of the fallback replica (value: its Triton model name).
FALLBACK_HEADER = "X-Tritonflow-Fallback"
#: Serving-version answers the gateway retries on the fallback (504 also covers its timeout).
FALLBACK_STATUSES = (500, 502, 503, 504)

Command = Union[Sequence[str], Callable[[], Any], None]


# ----------------------------------------------------------------------------------------- plans
@dataclasses.dataclass(frozen=True)
class Route:
    """One version's share of a model's requests.

    Attributes:
        version: Triton model version (positive integer).
        weight: Percent of requests, an integer 0-100 (``None`` when a raw plan omitted it; such a
            route never passes :class:`TrafficPlan` validation).
    """

    version: Any
    weight: Any


@dataclasses.dataclass(frozen=True)
class Mirror:
    """Live shadow: a share of the champion's requests copied to another version.

    The gateway sends a copy of ``percent`` % of the inference requests it routes to the plan's
    champion (drawn independently of the routing) to the mirror recorder at ``target``, which
    forwards them to ``version`` (:mod:`repository_sync.mirror`). NGINX discards the mirror's
    answer: clients never see it.

    Attributes:
        version: The version that answers the mirrored requests (the challenger).
        percent: Integer percent 1-100 of the champion's requests mirrored.
        target: ``host:port`` of the mirror recorder.
    """

    version: Any
    percent: Any
    target: str

    def problems(self, champion: Any) -> list[str]:
        """What is wrong with this mirror (empty: valid)."""
        out = []
        if not _is_int(self.version) or int(self.version) < 1:
            out.append(f"mirror version={self.version!r} is not a positive integer")
        elif _is_int(champion) and int(self.version) == int(champion):
            out.append(f"mirror version {self.version} is the champion itself")
        if not _is_int(self.percent) or not 1 <= int(self.percent) <= 100:
            out.append(f"mirror percent={self.percent!r} is not an integer percent 1-100")
        if not isinstance(self.target, str) or not MIRROR_TARGET_RE.match(self.target):
            out.append(f"mirror target={self.target!r} is not host:port")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"version": int(self.version), "percent": int(self.percent), "target": self.target}


@dataclasses.dataclass(frozen=True)
class TrafficPlan:
    """How one model's requests are split between its versions. Validated on construction.

    Attributes:
        model: Triton model name (``[A-Za-z0-9_.-]``, at most 128 characters).
        routes: One :class:`Route` per version; weights are integer percents summing to 100.
        champion: The version that takes 100 % on rollback; defaults to the first route's.
        sticky_header: Request header whose value picks the version (same value, same version);
            requests without it are split by ``$request_id``. ``None``: every request is drawn anew.
        name: Plan name used in messages (defaults to the model name).
        mirror: Live shadow (:class:`Mirror`): a share of the champion's requests also sent to
            another version, whose answers never reach clients. ``None``: no mirror.

    Raises:
        TrafficPlanError: Any problem with the plan; the message names the plan, the model and
            every problem found (sum not 100, missing weight, negative or above-100 weight,
            non-integer percent, bad or duplicate version, unknown champion, bad names).
    """

    model: str
    routes: tuple[Route, ...]
    champion: Any = None
    sticky_header: str | None = None
    name: str = ""
    mirror: Mirror | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "routes", tuple(self.routes))
        if self.champion is None and self.routes:
            object.__setattr__(self, "champion", self.routes[0].version)
        if not self.name:
            object.__setattr__(self, "name", str(self.model))
        problems = _plan_problems(self)
        if problems:
            raise TrafficPlanError(
                f"traffic plan {self.name!r} for model {self.model!r} refused: "
                + "; ".join(problems)
                + ". Expected one weight per version, integer percents 0-100 summing to 100; "
                "nothing was applied"
            )

    # -------------------------------------------------------------- constructors
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "TrafficPlan":
        """Build and validate a plan from a mapping (YAML/JSON/DAG params).

        Args:
            data: ``{"model": str, "routes": [{"version": int, "weight": int}, ...],
                "champion": int (optional), "sticky_header": str (optional),
                "id" or "name": str (optional)}``.

        Raises:
            TrafficPlanError: The mapping or the plan is invalid (see :class:`TrafficPlan`).
        """
        if not isinstance(data, Mapping):
            raise TrafficPlanError(f"traffic plan {data!r}: expected a mapping with 'model' and 'routes'")
        name = str(data.get("id") or data.get("name") or data.get("model") or "")
        model: Any = data.get("model")  # raw input: TrafficPlan validates it
        raw_routes = data.get("routes")
        if not isinstance(raw_routes, (list, tuple)) or not raw_routes:
            raise TrafficPlanError(
                f"traffic plan {name!r} for model {model!r} refused: routes={raw_routes!r}; "
                "expected a non-empty list of {version, weight}"
            )
        mirror = data.get("mirror")
        if isinstance(mirror, Mapping):
            target: Any = mirror.get("target")  # raw input: Mirror validates it
            mirror = Mirror(version=mirror.get("version"), percent=mirror.get("percent"), target=target)
        routes = []
        for i, r in enumerate(raw_routes):
            if not isinstance(r, Mapping):
                raise TrafficPlanError(
                    f"traffic plan {name!r} for model {model!r} refused: routes[{i}]={r!r}; "
                    "expected a mapping {version, weight}"
                )
            routes.append(Route(version=r.get("version"), weight=r.get("weight")))
        return cls(
            model=model,
            routes=tuple(routes),
            champion=data.get("champion"),
            sticky_header=data.get("sticky_header"),
            name=name,
            mirror=mirror,
        )

    @classmethod
    def from_weights(
        cls,
        model: str,
        weights: Mapping[int, int],
        *,
        champion: int | None = None,
        sticky_header: str | None = None,
        name: str = "",
    ) -> "TrafficPlan":
        """Build a plan from ``{version: percent}``.

        Insertion order is kept; the first version is the champion unless ``champion`` says
        otherwise.
        """
        return cls(
            model=model,
            routes=tuple(Route(v, w) for v, w in weights.items()),
            champion=champion,
            sticky_header=sticky_header,
            name=name,
        )

    @classmethod
    def canary(
        cls,
        model: str,
        champion: int,
        challenger: int,
        percent: int,
        *,
        sticky_header: str | None = None,
    ) -> "TrafficPlan":
        """The plan of a canary step: ``percent`` % to ``challenger``, the rest to ``champion``."""
        if isinstance(percent, numbers.Integral) and not isinstance(percent, bool):
            champion_weight: Any = 100 - int(percent)
        else:
            champion_weight = percent  # refused below with the challenger's problem named
        return cls(
            model=model,
            routes=(Route(champion, champion_weight), Route(challenger, percent)),
            champion=champion,
            sticky_header=sticky_header,
            name=f"{model}@{percent}%",
        )

    @classmethod
    def single(cls, model: str, version: int, *, name: str = "", mirror: Mirror | None = None) -> "TrafficPlan":
        """Build a plan that sends all requests of ``model`` to one version.

        All requests of ``model`` to ``version`` (the rollback plan; with ``mirror``, the live
        shadow plan).
        """
        return cls(model=model, routes=(Route(version, 100),), champion=version, name=name, mirror=mirror)

    # -------------------------------------------------------------- views
    @property
    def weights(self) -> dict[int, int]:
        """``{version: percent}``."""
        return {int(r.version): int(r.weight) for r in self.routes}

    def weight_of(self, version: int) -> int:
        """Percent of requests ``version`` gets (0 when not in the plan)."""
        return self.weights.get(int(version), 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, readable by :meth:`from_mapping` (``mirror`` only when set)."""
        out = {
            "id": self.name,
            "model": self.model,
            "routes": [{"version": int(r.version), "weight": int(r.weight)} for r in self.routes],
            "champion": int(self.champion),
            "sticky_header": self.sticky_header,
        }
        if self.mirror is not None:
            out["mirror"] = self.mirror.to_dict()
        return out

    @property
    def digest(self) -> str:
        """Short digest of the routing (model, weights, sticky header); sent as ``X-Tritonflow-Plan``."""
        key: dict[str, Any] = {
            "model": self.model,
            "routes": sorted((int(r.version), int(r.weight)) for r in self.routes),
            "sticky_header": (self.sticky_header or "").lower(),
        }
        if self.mirror is not None:
            key["mirror"] = self.mirror.to_dict()
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _plan_problems(plan: TrafficPlan) -> list[str]:
    problems: list[str] = []
    if not isinstance(plan.model, str) or not MODEL_NAME_RE.match(plan.model):
        problems.append(
            f"model={plan.model!r} is not a valid model name (expected [A-Za-z0-9_.-], 1-128 chars)"
        )
    if not plan.routes:
        problems.append("no routes; expected at least one {version, weight}")
        return problems
    seen: set[int] = set()
    weights_ok = True
    for i, r in enumerate(plan.routes):
        label = f"routes[{i}] (version {r.version!r})"
        if not isinstance(r, Route):
            problems.append(f"routes[{i}]={r!r} is not a Route")
            weights_ok = False
            continue
        if not _is_int(r.version) or int(r.version) < 1:
            problems.append(f"{label}: version={r.version!r} is not a positive integer")
        elif int(r.version) in seen:
            problems.append(f"{label}: version {r.version} appears twice")
        else:
            seen.add(int(r.version))
        w = r.weight
        if w is None:
            problems.append(f"{label}: weight is missing")
            weights_ok = False
        elif not _is_int(w):
            problems.append(
                f"{label}: weight={w!r} is not an integer percent "
                f"({type(w).__name__}; fractions and strings are refused, never rounded)"
            )
            weights_ok = False
        elif w < 0:
            problems.append(f"{label}: weight={w} is negative")
            weights_ok = False
        elif w > 100:
            problems.append(f"{label}: weight={w} is above 100")
            weights_ok = False
    if weights_ok:
        total = sum(int(r.weight) for r in plan.routes)
        if total != 100:
            shares = ", ".join(f"v{r.version}={r.weight}" for r in plan.routes)
            problems.append(f"weights sum to {total} ({shares}), not 100")
    if plan.champion is not None and _is_int(plan.champion):
        if int(plan.champion) not in seen:
            problems.append(f"champion={plan.champion!r} is not one of the plan's versions {sorted(seen)}")
    else:
        problems.append(f"champion={plan.champion!r} is not a positive integer version")
    if plan.sticky_header is not None and (
        not isinstance(plan.sticky_header, str) or not HEADER_NAME_RE.match(plan.sticky_header)
    ):
        problems.append(
            f"sticky_header={plan.sticky_header!r} is not a header name (expected [A-Za-z0-9-])"
        )
    if not isinstance(plan.name, str):
        problems.append(f"name={plan.name!r} is not a string")
    if plan.mirror is not None:
        if not isinstance(plan.mirror, Mirror):
            problems.append(f"mirror={plan.mirror!r} is not a Mirror")
        else:
            problems.extend(plan.mirror.problems(plan.champion))
    return problems


def coerce_plan(plan: TrafficPlan | Mapping[str, Any]) -> TrafficPlan:
    """Return ``plan`` as a validated :class:`TrafficPlan` (mappings go through ``from_mapping``)."""
    if isinstance(plan, TrafficPlan):
        return plan
    return TrafficPlan.from_mapping(plan)


# ----------------------------------------------------------------------------------- interface
class TrafficRouter(abc.ABC):
    """Splits each model's requests between its versions.

    Implementations must validate a plan completely before changing anything and must leave the
    live routing unchanged when applying fails.
    """

    @abc.abstractmethod
    def apply(self, plan: TrafficPlan | Mapping[str, Any]) -> TrafficPlan:
        """Validate ``plan`` and make it the live routing of its model; return the applied plan.

        Raises:
            TrafficPlanError: The plan is invalid; nothing changed.
            GatewayConfigError: The gateway refused the generated config; the previous is live.
            GatewayReloadError: The gateway could not be reloaded; the previous config is restored.
        """

    @abc.abstractmethod
    def current_plan(self, model: str) -> TrafficPlan | None:
        """The plan live for ``model`` (``None``: the router does not route it)."""

    @abc.abstractmethod
    def previous_plan(self, model: str) -> TrafficPlan | None:
        """The plan that was live before the last successful :meth:`apply` (``None`` if none)."""

    def rollback(self, model: str, champion: int | None = None) -> TrafficPlan:
        """Send 100 % of ``model``'s requests to ``champion`` (default: the live plan's champion).

        Raises:
            DataError: No champion is given and the router has no live plan for ``model``.
            GatewayConfigError, GatewayReloadError: As :meth:`apply`.
        """
        if champion is None:
            live = self.current_plan(model)
            if live is None:
                raise DataError(
                    f"rollback of model {model!r}: champion=None and no live plan names one; "
                    "pass the champion version"
                )
            champion = int(live.champion)
        return self.apply(TrafficPlan.single(model, champion, name=f"{model}:rollback"))


# ----------------------------------------------------------------------------------- NGINX
@dataclasses.dataclass(frozen=True)
class ApplyRecord:
    """What one apply did, for the MLflow record and the rollback benchmark.

    Attributes:
        plan: The plan applied.
        changed: False when the files already held this plan (nothing reloaded).
        test_s: Seconds ``nginx -t`` took; ``reload_s``: seconds the reload command took.
    """

    plan: TrafficPlan
    changed: bool
    test_s: float
    reload_s: float


class WatcherReload:
    """Reload an NGINX that runs in another container, through its reload watcher.

    A worker cannot signal NGINX in another container. The gateway container of the
    docker-compose stack runs ``deploy/nginx/reload-watcher.sh`` beside NGINX; it watches
    ``<conf_dir>/reload.request``, runs ``nginx -t`` and ``nginx -s reload``, waits until the new
    config is live and answers ``<token> ok`` or ``<token> failed`` (plus NGINX's output) in
    ``<conf_dir>/reload.result``. Use an instance as :class:`NginxRouter`'s ``reload`` with
    ``test=None`` (the watcher tests the config itself).

    Args:
        conf_dir: The gateway config folder shared with the NGINX container.
        timeout_s: Seconds to wait for the watcher's answer.
    """

    def __init__(self, conf_dir: str | os.PathLike[str], timeout_s: float = 30.0):
        self.conf_dir = Path(conf_dir)
        self.timeout_s = timeout_s

    def __call__(self) -> str:
        """Post a fresh token and wait for the watcher's answer to it.

        Returns:
            NGINX's output on success.

        Raises:
            GatewayConfigError: The watcher refused the config (``nginx -t`` or reload failed).
            GatewayReloadError: No answer within ``timeout_s``.
        """
        token = uuid.uuid4().hex
        tmp = self.conf_dir / f".reload.request.{token}"
        tmp.write_text(token + "\n")
        os.replace(tmp, self.conf_dir / "reload.request")
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                first, _, rest = (self.conf_dir / "reload.result").read_text().partition("\n")
            except FileNotFoundError:
                first, rest = "", ""
            parts = first.split()
            if parts and parts[0] == token:
                if parts[1:] == ["ok"]:
                    return rest
                raise GatewayConfigError(f"gateway refused the reload: {rest.strip()}")
            time.sleep(0.05)
        raise GatewayReloadError(
            f"gateway reload watcher gave no answer to token {token} within {self.timeout_s} s "
            f"(is the gateway container running its reload watcher on {self.conf_dir}?)"
        )


class NginxRouter(TrafficRouter):
    """:class:`TrafficRouter` writing NGINX snippets into the gateway's ``http.d``/``locations.d``.

    Args:
        conf_dir: The gateway's config folder (holds ``http.d/`` and ``locations.d/``, created when
            missing).
        reload: argv (e.g. ``["nginx", "-p", P, "-c", C, "-s", "reload"]``) or callable that reloads
            NGINX gracefully. A failing reload (non-zero exit or exception) restores the files.
        test: argv (``[..., "-t"]``) or callable that checks the whole config, or ``None`` when
            ``reload`` checks it itself (as the runtime gateway's ``handle.reload()`` does).
        upstream: Name of the NGINX upstream that reaches Triton (``triton`` in the runtime).
        response_header: Header naming the version that served (``settings.gateway_response_header``).
        state_dir: Where the previous config and the lock live (default ``conf_dir/tritonflow-router``).
        fallback: Retry 5xx answers and timeouts of the serving version on ``<model>__fallback``
            (``settings.fallback_enabled``; see the module doc).
        fallback_timeout_s: Seconds to wait for the serving version's answer before that retry
            (``settings.fallback_timeout_s``).
        state_dir: Where the previous config lives (default ``conf_dir/tritonflow-router``).
        coordination: Shared coordination store or its URL; every update of this gateway holds its
            ``gateway`` lease there (named by the conf dir: ``nginx -t`` checks the whole config).
            Default: SQLite in ``state_dir`` (only for a gateway whose writers share one host).
        lock_timeout_s: Seconds an update waits for another update of this gateway.

    Example::

        router = NginxRouter.from_nginx_cmd(handle.conf_dir, handle.nginx_cmd())
        router.apply(TrafficPlan.canary("churn_model", champion=6, challenger=7, percent=5))
        router.rollback("churn_model")
    """

    def __init__(
        self,
        conf_dir: Path | str,
        *,
        reload: Command,
        test: Command = None,
        upstream: str = "triton",
        response_header: str = DEFAULT_GATEWAY_RESPONSE_HEADER,
        state_dir: Path | str | None = None,
        fallback: bool = False,
        fallback_timeout_s: float = 10.0,
        coordination: CoordinationStore | str | None = None,
        lock_timeout_s: float = 60.0,
    ) -> None:
        if not re.match(r"^[A-Za-z0-9_.-]+$", upstream):
            raise DataError(f"NginxRouter: upstream={upstream!r} is not an NGINX upstream name")
        if not HEADER_NAME_RE.match(response_header):
            raise DataError(f"NginxRouter: response_header={response_header!r} is not a header name")
        if reload is None:
            raise DataError("NginxRouter: reload=None; expected an argv or a callable that reloads NGINX")
        self.conf_dir = Path(conf_dir)
        self.http_dir = self.conf_dir / "http.d"
        self.locations_dir = self.conf_dir / "locations.d"
        self.state_dir = Path(state_dir) if state_dir else self.conf_dir / "tritonflow-router"
        self.upstream = upstream
        self.response_header = response_header
        if coordination is None:
            coordination = f"sqlite:///{self.state_dir / 'coordination.db'}"
        self._coordination = coordination
        self.lock_timeout_s = float(lock_timeout_s)
        self._reload = reload
        self._test = test
        self.last_apply: ApplyRecord | None = None
        if not (isinstance(fallback_timeout_s, (int, float)) and 0 < float(fallback_timeout_s) <= 3600):
            raise DataError(f"NginxRouter: fallback_timeout_s={fallback_timeout_s!r}; expected seconds in (0, 3600]")
        self.fallback = bool(fallback)
        self.fallback_timeout_s = float(fallback_timeout_s)

    @classmethod
    def from_nginx_cmd(cls, conf_dir: Path | str, nginx_cmd: Sequence[str], **kwargs: Any) -> "NginxRouter":
        """Build a router for an NGINX run as ``nginx_cmd``.

        Router for an NGINX run as ``nginx_cmd`` (argv prefix such as ``nginx -p P -c C``):
        tests with ``nginx_cmd + ["-t"]``, reloads with ``nginx_cmd + ["-s", "reload"]``.
        """
        argv = list(nginx_cmd)
        return cls(conf_dir, reload=argv + ["-s", "reload"], test=argv + ["-t", "-q"], **kwargs)

    # -------------------------------------------------------------- file names
    def _paths(self, model: str) -> tuple[Path, Path]:
        name = f"{FILE_PREFIX}{model}.conf"
        return self.http_dir / name, self.locations_dir / name

    def config_files(self, model: str) -> tuple[Path, Path]:
        """The (``http.d``, ``locations.d``) snippet files of ``model``."""
        return self._paths(model)

    # -------------------------------------------------------------- rendering
    @staticmethod
    def _ident(model: str) -> str:
        safe = re.sub(r"[^A-Za-z0-9_]", "_", model)
        return f"{safe}_{hashlib.sha1(model.encode()).hexdigest()[:8]}"

    def render(self, plan: TrafficPlan) -> tuple[bytes, bytes]:
        """Return the (``http.d``, ``locations.d``) snippets routing ``plan``."""
        ident = self._ident(plan.model)
        version_var = f"$tritonflow_v_{ident}"
        header = PLAN_MARKER + json.dumps(plan.to_dict(), sort_keys=True) + "\n"
        header += "# Generated by repository_sync.router.NginxRouter; edits are overwritten.\n"

        http = [header]
        if plan.sticky_header:
            key_var = f"$tritonflow_k_{ident}"
            header_var = "$http_" + plan.sticky_header.lower().replace("-", "_")
            http.append(
                f"map {header_var} {key_var} {{\n"
                f'    ""      $request_id;\n'
                f"    default {header_var};\n"
                f"}}\n"
            )
        else:
            key_var = "$request_id"
        nonzero = [r for r in plan.routes if int(r.weight) > 0]
        lines = [f"split_clients \"{key_var}\" {version_var} {{\n"]
        for r in nonzero[:-1]:
            lines.append(f"    {int(r.weight)}% {int(r.version)};\n")
        lines.append(f"    * {int(nonzero[-1].version)};\n")
        lines.append("}\n")
        http.append("".join(lines))

        escaped = re.escape(plan.model)
        retry, fallback = self._render_fallback(plan, ident, escaped)
        if plan.mirror is None:
            locations = header + (
                f"location ~ ^/v2/models/{escaped}(/ready|/infer)?$ {{\n"
                f"    rewrite ^/v2/models/{escaped}(.*)$ /v2/models/{plan.model}/versions/{version_var}$1 break;\n"
                f"    proxy_pass http://{self.upstream};\n"
                f"    add_header {self.response_header} {version_var} always;\n"
                f"    add_header {PLAN_HEADER} {plan.digest} always;\n"
                + retry
                + "}\n"
            )
        else:
            mirror_http, locations = self._render_mirror(plan, ident, version_var, escaped, retry)
            http.append(mirror_http)
            locations = header + locations
        return "".join(http).encode(), (locations + fallback).encode()

    def _render_fallback(self, plan: TrafficPlan, ident: str, escaped: str) -> tuple[str, str]:
        """(directives added to a routed location, the named fallback location); empty when off.

        The named location is reached by ``error_page`` after the routed location's rewrite, so
        the URI is ``/v2/models/<model>/versions/<v>/<route>``: it is rewritten to the same
        version of ``<model>__fallback``.
        """
        if not self.fallback:
            return "", ""
        target = fallback_model_name(plan.model)
        named = f"@tritonflow_fallback_{ident}"
        timeout = f"{self.fallback_timeout_s:g}s"
        retry = (
            f"    proxy_read_timeout {timeout};\n"
            f"    proxy_intercept_errors on;\n"
            f"    error_page {' '.join(str(c) for c in FALLBACK_STATUSES)} = {named};\n"
        )
        location = (
            f"location {named} {{\n"
            f"    rewrite ^/v2/models/{escaped}/versions/([0-9]+)(.*)$ /v2/models/{target}/versions/$1$2 break;\n"
            f"    proxy_pass http://{self.upstream};\n"
            f"    proxy_read_timeout {timeout};\n"
            f"    add_header {FALLBACK_HEADER} {target} always;\n"
            f"    add_header {PLAN_HEADER} {plan.digest} always;\n"
            f"}}\n"
        )
        return retry, location

    def _render_mirror(self, plan: TrafficPlan, ident: str, version_var: str, escaped: str,
                       retry: str = "") -> tuple[str, str]:
        """``http.d`` and ``locations.d`` parts of a plan with a :class:`Mirror`.

        The infer route gets ``mirror``; the mirror subrequest (which shares the main request's
        variables, so it sees the version the main request was routed to and the same request id)
        goes to the recorder only when the request went to the champion and falls in the mirrored
        share, else it ends at once with 204. The gateway returns the request id it passes to the
        recorder (the client's ``X-Request-Id``, else ``$request_id``) as ``X-Request-Id``.
        """
        from repository_sync.mirror import MIRROR_PATH, SERVED_HEADER

        m = plan.mirror
        if m is None:  # only plans with a mirror are rendered here
            raise TrafficPlanError(f"traffic plan for model {plan.model!r} has no mirror to render")
        rid, share, hit = (f"$tritonflow_rid_{ident}", f"$tritonflow_ms_{ident}",
                           f"$tritonflow_mirror_{ident}")
        upstream = f"tritonflow_mirror_{ident}"
        http = (
            f"map $http_x_request_id {rid} {{\n"
            f'    ""      $request_id;\n'
            f"    default $http_x_request_id;\n"
            f"}}\n"
            + (f'split_clients "${{request_id}}mirror" {share} {{\n    * 1;\n}}\n' if int(m.percent) == 100
               else f'split_clients "${{request_id}}mirror" {share} {{\n    {int(m.percent)}% 1;\n    * "";\n}}\n')
            + f'map "{version_var}:{share}" {hit} {{\n'
            f'    "{int(plan.champion)}:1" 1;\n'
            f'    default "";\n'
            f"}}\n"
            f"upstream {upstream} {{\n"
            f"    server {m.target};\n"
            f"    keepalive 8;\n"
            f"}}\n"
        )
        common = (
            f"    proxy_pass http://{self.upstream};\n"
            f"    add_header {self.response_header} {version_var} always;\n"
            f"    add_header {PLAN_HEADER} {plan.digest} always;\n"
            + retry
        )
        locations = (
            f"location ~ ^/v2/models/{escaped}/infer$ {{\n"
            f"    rewrite ^/v2/models/{escaped}(.*)$ /v2/models/{plan.model}/versions/{version_var}$1 break;\n"
            f"    mirror {MIRROR_LOCATION}{ident};\n"
            + common
            + f"    add_header X-Request-Id {rid} always;\n"
            f"}}\n"
            f"location ~ ^/v2/models/{escaped}(/ready)?$ {{\n"
            f"    rewrite ^/v2/models/{escaped}(.*)$ /v2/models/{plan.model}/versions/{version_var}$1 break;\n"
            + common
            + f"}}\n"
            f"location = {MIRROR_LOCATION}{ident} {{\n"
            f"    internal;\n"
            f'    if ({hit} = "") {{ return 204; }}\n'
            f"    proxy_pass http://{upstream}{MIRROR_PATH}/{plan.model}/{int(m.version)};\n"
            f"    proxy_http_version 1.1;\n"
            f'    proxy_set_header Connection "";\n'
            f"    proxy_set_header X-Request-Id {rid};\n"
            f"    proxy_set_header {SERVED_HEADER} {version_var};\n"
            f"    proxy_connect_timeout 1s;\n"
            f"    proxy_send_timeout 5s;\n"
            f"    proxy_read_timeout 5s;\n"
            f"}}\n"
        )
        return http, locations

    # -------------------------------------------------------------- reading
    @staticmethod
    def _plan_in(path: Path) -> TrafficPlan | None:
        try:
            with open(path, "rb") as fh:
                first = fh.readline().decode("utf-8", "replace")
        except FileNotFoundError:
            return None
        if not first.startswith(PLAN_MARKER):
            return None
        return TrafficPlan.from_mapping(json.loads(first[len(PLAN_MARKER):]))

    def current_plan(self, model: str) -> TrafficPlan | None:
        """The plan in ``model``'s live snippet (``None`` when the router does not route it)."""
        return self._plan_in(self._paths(model)[0])

    def previous_plan(self, model: str) -> TrafficPlan | None:
        """The plan that was live before the last successful apply of ``model`` (``None``: none)."""
        return self._plan_in(self._previous_dir(model) / "http.conf")

    def models(self) -> list[str]:
        """Models the router currently routes."""
        if not self.http_dir.is_dir():
            return []
        out = []
        for p in sorted(self.http_dir.glob(f"{FILE_PREFIX}*.conf")):
            plan = self._plan_in(p)
            if plan is not None:
                out.append(plan.model)
        return out

    def _previous_dir(self, model: str) -> Path:
        return self.state_dir / "previous" / model

    # -------------------------------------------------------------- writing
    def apply(self, plan: TrafficPlan | Mapping[str, Any]) -> TrafficPlan:
        """Validate ``plan``, write it atomically, ``nginx -t``, reload; restore on any failure.

        Raises:
            TrafficPlanError: The plan is invalid; no file was touched.
            GatewayConfigError: ``nginx -t`` refused the config; files restored byte for byte and
                NGINX not reloaded, so live routing is unchanged.
            GatewayReloadError: The reload failed; files restored byte for byte.
        """
        plan = coerce_plan(plan)  # validate before anything is touched
        http_bytes, loc_bytes = self.render(plan)
        self._write_and_reload(plan.model, {0: http_bytes, 1: loc_bytes}, plan)
        return plan

    def remove(self, model: str) -> None:
        """Stop routing ``model`` (its requests go to Triton's default version policy again)."""
        self._write_and_reload(model, {0: None, 1: None}, None)

    def restore_previous(self, model: str) -> TrafficPlan | None:
        """Bring back the config that was live before the last successful apply of ``model``.

        Returns:
            The restored plan (``None`` if the previous state was "not routed").

        Raises:
            DataError: No previous config is kept for ``model``.
        """
        prev = self._previous_dir(model)
        if not (prev / "present").exists():
            raise DataError(f"restore_previous: no previous gateway config kept for model {model!r}")
        if (prev / "present").read_text() == "0":
            self._write_and_reload(model, {0: None, 1: None}, None)
            return None
        contents: dict[int, bytes | None] = {0: (prev / "http.conf").read_bytes(),
                                             1: (prev / "locations.conf").read_bytes()}
        plan = self._plan_in(prev / "http.conf")
        self._write_and_reload(model, contents, plan)
        return plan

    def _write_and_reload(
        self, model: str, new: dict[int, bytes | None], plan: TrafficPlan | None
    ) -> None:
        if not MODEL_NAME_RE.match(model or ""):
            raise TrafficPlanError(f"model={model!r} is not a valid model name")
        paths = self._paths(model)
        self.http_dir.mkdir(parents=True, exist_ok=True)
        self.locations_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        store = (self._coordination if isinstance(self._coordination, CoordinationStore)
                 else CoordinationStore(self._coordination))
        with store.hold(GATEWAY, str(self.conf_dir.resolve()), holder=f"gateway update of model {model!r}",
                        timeout_s=self.lock_timeout_s, what=f"gateway update of model {model!r}"):
            old = {i: _read_or_none(p) for i, p in enumerate(paths)}
            if old == new:
                self.last_apply = ApplyRecord(plan, False, 0.0, 0.0) if plan else None
                return
            for i, p in enumerate(paths):
                _replace_atomically(p, new[i])
            t0 = time.monotonic()
            try:
                if self._test is not None:
                    _run(self._test, "nginx -t")
            except Exception as exc:
                self._restore(paths, old)
                raise GatewayConfigError(
                    f"gateway refused the config for model {model!r} "
                    f"(plan {plan.name if plan else 'remove'!r}): {exc}. The previous config was "
                    "restored byte for byte and NGINX was not reloaded; live routing is unchanged"
                ) from exc
            t1 = time.monotonic()
            try:
                _run(self._reload, "nginx reload")
            except Exception as exc:
                self._restore(paths, old)
                raise GatewayReloadError(
                    f"gateway reload failed for model {model!r} "
                    f"(plan {plan.name if plan else 'remove'!r}): {exc}. The previous config files "
                    "were restored byte for byte"
                ) from exc
            t2 = time.monotonic()
            self._keep_previous(model, old)
            self.last_apply = ApplyRecord(plan, True, t1 - t0, t2 - t1) if plan else None

    @staticmethod
    def _restore(paths: Iterable[Path], old: dict[int, bytes | None]) -> None:
        for i, p in enumerate(paths):
            _replace_atomically(p, old[i])

    def _keep_previous(self, model: str, old: dict[int, bytes | None]) -> None:
        prev = self._previous_dir(model)
        prev.mkdir(parents=True, exist_ok=True)
        if old[0] is None:
            _replace_atomically(prev / "present", b"0")
            return
        _replace_atomically(prev / "http.conf", old[0])
        _replace_atomically(prev / "locations.conf", old[1] or b"")
        _replace_atomically(prev / "present", b"1")


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _replace_atomically(path: Path, data: bytes | None) -> None:
    """Make ``path`` hold exactly ``data`` (``None``: absent) via a temp file and ``os.replace``."""
    if data is None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            shutil.copymode(path, tmp)
        except FileNotFoundError:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _run(command: Command, what: str) -> None:
    if command is None:
        return
    if callable(command):
        command()
        return
    try:
        proc = subprocess.run(
            list(command), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceUnavailableError(f"{what}: {' '.join(command)} could not run: {exc}") from exc
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip()
        raise ServiceUnavailableError(f"{what} exited {proc.returncode}: {msg}")


# ----------------------------------------------------------------------------------- probing
def fallback_model_name(model: str) -> str:
    """Triton model name of ``model``'s INT8 fallback replica (``<model>__fallback``).

    Raises:
        DataError: The result is not a valid model name (too long or bad characters).
    """
    name = f"{model}{FALLBACK_SUFFIX}"
    if not MODEL_NAME_RE.match(name or ""):
        raise DataError(f"model={model!r}: its fallback name {name!r} is not a valid Triton model name "
                        "(expected [A-Za-z0-9_.-], at most 128 characters)")
    return name


def answered_by(model: str, headers: Mapping[str, str]) -> str:
    """Name the Triton model that answered a gateway request.

    The Triton model that answered a gateway request: the fallback's name when the response
    carries :data:`FALLBACK_HEADER`, else ``model`` (what the inference log records).
    """
    lowered = {str(k).lower(): v for k, v in dict(headers).items()}
    return str(lowered.get(FALLBACK_HEADER.lower()) or model)


def served_by(gateway_url: str, model: str, *, path: str = "/ready", timeout_s: float = 5.0,
              response_header: str = DEFAULT_GATEWAY_RESPONSE_HEADER) -> tuple[str | None, str | None, int]:
    """Send one ``GET <gateway_url>/v2/models/<model><path>`` and report who routed it.

    Returns:
        ``(version header, plan digest header, HTTP status)``; headers are ``None`` when absent.

    Raises:
        ServiceUnavailableError: The gateway did not answer.
    """
    url = f"{gateway_url.rstrip('/')}/v2/models/{model}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.headers.get(response_header), resp.headers.get(PLAN_HEADER), resp.status
    except urllib.error.HTTPError as exc:
        return exc.headers.get(response_header), exc.headers.get(PLAN_HEADER), exc.code
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceUnavailableError(f"gateway {gateway_url} did not answer {url}: {exc}") from exc


def wait_live(
    gateway_url: str,
    plan: TrafficPlan,
    *,
    timeout_s: float = 10.0,
    poll_s: float = 0.01,
    consecutive: int = 5,
    settle_s: float = 0.3,
) -> float:
    """Wait until the gateway routes ``plan.model`` with ``plan`` (its ``X-Tritonflow-Plan``).

    NGINX's ``-s reload`` returns once the signal is sent. The master then starts new workers,
    sleeps 100 ms, and only then tells the old workers to stop accepting (``ngx_master_process_cycle``
    in NGINX's source), so for a little over 100 ms a new connection may still reach an old worker.
    The plan counts as live once every probe (each on a new connection) has seen its digest for
    ``settle_s`` seconds and at least ``consecutive`` probes in a row.

    Returns:
        Seconds waited.

    Raises:
        ServiceUnavailableError: The plan was not live within ``timeout_s`` seconds.
    """
    t0 = time.monotonic()
    seen = None
    streak = 0
    first_ok: float | None = None
    while True:
        try:
            _, seen, _ = served_by(gateway_url, plan.model, timeout_s=timeout_s)
        except ServiceUnavailableError:
            seen = None
        now = time.monotonic()
        if seen == plan.digest:
            streak += 1
            first_ok = now if first_ok is None else first_ok
            if streak >= consecutive and now - first_ok >= settle_s:
                return now - t0
        else:
            streak, first_ok = 0, None
        if time.monotonic() - t0 > timeout_s:
            raise ServiceUnavailableError(
                f"gateway {gateway_url}: plan {plan.name!r} (digest {plan.digest}) for model "
                f"{plan.model!r} not live after {timeout_s:g} s; last digest seen {seen!r}"
            )
        time.sleep(poll_s)
