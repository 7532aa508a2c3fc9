"""The NGINX traffic router: plans written as NGINX snippets, checked, reloaded, restored on failure.

:class:`NginxRouter` writes ``http.d/tritonflow-route-<model>.conf`` (a ``split_clients`` block)
and ``locations.d/tritonflow-route-<model>.conf`` (the rewriting ``location``) atomically, runs
``nginx -t`` and ``nginx -s reload``, and restores both files byte for byte when either fails.
:class:`WatcherReload` reloads an NGINX in another container through its reload watcher. See
:mod:`repository_sync.routing.router` for the routing contract.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

from ground.coordination import GATEWAY, CoordinationStore
from ground.exceptions import (
    DataError,
    GatewayConfigError,
    GatewayReloadError,
    ServiceUnavailableError,
    TrafficPlanError,
)
from ground.settings import DEFAULTS
from repository_sync.routing.gateway_probe import FALLBACK_HEADER, PLAN_HEADER, fallback_model_name
from repository_sync.routing.traffic_plan import (
    HEADER_NAME_RE,
    MODEL_NAME_RE,
    TrafficPlan,
    TrafficRouter,
    coerce_plan,
)

#: First-line marker of a generated file; the rest of the line is the plan as JSON.
PLAN_MARKER = "# tritonflow-plan: "
#: Prefix of the generated snippet file names.
FILE_PREFIX = "tritonflow-route-"
#: Seconds an ``nginx -t`` / ``nginx -s reload`` command may take.
COMMAND_TIMEOUT_S = 30.0
#: Internal location prefix of the mirror subrequests.
MIRROR_LOCATION = "/_tritonflow_mirror/"
#: Serving-version answers the gateway retries on the fallback (504 also covers its timeout).
FALLBACK_STATUSES = (500, 502, 503, 504)

Command = Union[Sequence[str], Callable[[], Any], None]


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
    config is live and the workers of the old one have exited (at most 10 s by default), and
    answers ``<token> ok`` or ``<token> failed`` (plus NGINX's output) in
    ``<conf_dir>/reload.result``. Use an instance as :class:`NginxRouter`'s ``reload`` with
    ``test=None`` (the watcher tests the config itself).

    Args:
        conf_dir: The gateway config folder shared with the NGINX container.
        timeout_s: Seconds to wait for the watcher's answer: its poll (1 s), ``nginx -t``, the
            reload, up to 15 s for the new config to go live and up to 10 s for the old workers.
    """

    def __init__(self, conf_dir: str | os.PathLike[str], timeout_s: float = 60.0):
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
        status_log: File NGINX appends one JSON line per request of a routed model to (the path as
            NGINX sees it; :mod:`repository_sync.routing.gateway_status` reads it), so the canary counts
            the statuses clients got per version. ``None``: not written. Routed requests then go
            to this file instead of the regular access log (a ``location``'s ``access_log``
            replaces the inherited one).

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
        response_header: str = DEFAULTS.gateway_response_header,
        state_dir: Path | str | None = None,
        fallback: bool = False,
        fallback_timeout_s: float = 10.0,
        coordination: CoordinationStore | str | None = None,
        lock_timeout_s: float = 60.0,
        status_log: Path | str | None = None,
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
        if status_log is not None and not re.match(r"^[^\s;{}'\"$#]+$", str(status_log)):
            raise DataError(f"NginxRouter: status_log={str(status_log)!r} cannot be written into an NGINX "
                            "config (no spaces, quotes, ';', braces, '$' or '#')")
        self.status_log = str(status_log) if status_log is not None else None

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
        http.append(self._render_log_format(plan, ident, version_var))

        escaped = re.escape(plan.model)
        retry, fallback = self._render_fallback(plan, ident, escaped)
        if plan.mirror is None:
            locations = header + (
                f"location ~ ^/v2/models/{escaped}(/ready|/infer)?$ {{\n"
                f"    rewrite ^/v2/models/{escaped}(.*)$ /v2/models/{plan.model}/versions/{version_var}$1 break;\n"
                f"    proxy_pass http://{self.upstream};\n"
                f"    add_header {self.response_header} {version_var} always;\n"
                f"    add_header {PLAN_HEADER} {plan.digest} always;\n"
                + self._access_log(ident)
                + retry
                + "}\n"
            )
        else:
            mirror_http, locations = self._render_mirror(plan, ident, version_var, escaped, retry)
            http.append(mirror_http)
            locations = header + locations
        return "".join(http).encode(), (locations + fallback).encode()

    def _render_log_format(self, plan: TrafficPlan, ident: str, version_var: str) -> str:
        """The ``log_format`` of the status log (:data:`repository_sync.routing.gateway_status.LOG_FIELDS`).

        The model name is written literally (``MODEL_NAME_RE`` allows no quote nor backslash);
        ``escape=json`` escapes the variables.
        """
        if self.status_log is None:
            return ""
        return (
            f"log_format tritonflow_status_{ident} escape=json\n"
            f"    '{{\"t\":$msec,\"model\":\"{plan.model}\",\"version\":\"{version_var}\",'\n"
            f"    '\"status\":$status,\"upstream_status\":\"$upstream_status\",'\n"
            f"    '\"request_time\":$request_time,\"uri\":\"$uri\"}}';\n"
        )

    def _access_log(self, ident: str) -> str:
        """The ``access_log`` directive of a routed location (empty without a status log)."""
        if self.status_log is None:
            return ""
        return f"    access_log {self.status_log} tritonflow_status_{ident};\n"

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
            + self._access_log(ident)
            + "}\n"
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
        from repository_sync.routing.mirror import MIRROR_PATH, SERVED_HEADER

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
            + self._access_log(ident)
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
            which = f"model {model!r} (plan {plan.name if plan else 'remove'!r})"
            t0 = time.monotonic()
            self._run_or_restore(
                self._test, "nginx -t", paths, old, GatewayConfigError, f"gateway refused the config for {which}",
                "The previous config was restored byte for byte and NGINX was not reloaded; live routing is unchanged",
            )
            t1 = time.monotonic()
            self._run_or_restore(
                self._reload, "nginx reload", paths, old, GatewayReloadError, f"gateway reload failed for {which}",
                "The previous config files were restored byte for byte",
            )
            t2 = time.monotonic()
            self._keep_previous(model, old)
            self.last_apply = ApplyRecord(plan, True, t1 - t0, t2 - t1) if plan else None

    @staticmethod
    def _restore(paths: Iterable[Path], old: dict[int, bytes | None]) -> None:
        for i, p in enumerate(paths):
            _replace_atomically(p, old[i])

    def _run_or_restore(self, command: Command, what: str, paths: Iterable[Path], old: dict[int, bytes | None],
                        error: type[Exception], failed: str, restored: str) -> None:
        """Run one NGINX step (``nginx -t``, reload); if it fails, put ``old`` back and raise ``error``.

        The message is ``"<failed>: <the step's error>. <restored>"``; nothing is run for a ``None``
        command (see :func:`_run`).
        """
        try:
            _run(command, what)
        except Exception as exc:
            self._restore(paths, old)
            raise error(f"{failed}: {exc}. {restored}") from exc

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
