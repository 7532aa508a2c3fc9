"""Traffic routers: split a model's requests between its champion and challenger versions.

Triton serves several versions of a model side by side but does not split traffic between them.
A :class:`TrafficRouter` does, in front of Triton. :class:`NginxRouter` is the implementation for
the NGINX gateway of the local runtime (and of any NGINX that includes our snippet folders); Kong,
Envoy or Istio adapters can be added behind the same interface. Which router a deployment uses
is the setting ``TRITONFLOW_TRAFFIC_ROUTER``; :func:`make_router` builds it.

A :class:`TrafficPlan` says, for one model, which percentage of requests each version gets. Plans
are validated before anything is written: every weight is an integer percent 0-100 and
the weights sum to exactly 100; anything else raises
:class:`~ground.exceptions.TrafficPlanError` naming the plan, the model and each problem.
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

Layout: plans and the :class:`TrafficRouter` interface are in
:mod:`repository_sync.routing.traffic_plan`, the NGINX implementation in
:mod:`repository_sync.routing.nginx_router`, and reading who answered a request (fallback header,
plan digest, :func:`wait_live`) in :mod:`repository_sync.routing.gateway_probe`; import each name
from the module that defines it. This module holds the routers by name (:data:`ROUTERS`).
"""

from __future__ import annotations

from typing import Any

from ground.exceptions import SettingsError
from repository_sync.routing.nginx_router import NginxRouter
from repository_sync.routing.traffic_plan import TrafficRouter

#: Traffic routers by the name ``TRITONFLOW_TRAFFIC_ROUTER`` (``settings.traffic_router``) gives.
ROUTERS: dict[str, type[TrafficRouter]] = {"nginx": NginxRouter}


def make_router(kind: str, **options: Any) -> TrafficRouter:
    """The traffic router ``kind`` names, built with ``options``.

    Args:
        kind: A key of :data:`ROUTERS`, normally ``settings.traffic_router``.
        **options: The router's own arguments (for ``nginx``: those of :class:`NginxRouter`).

    Returns:
        The router.

    Raises:
        SettingsError: ``kind`` names no router; the message names the setting, the value and the
            routers there are.
    """
    router = ROUTERS.get(str(kind).strip().lower())
    if router is None:
        raise SettingsError(
            f"TRITONFLOW_TRAFFIC_ROUTER={kind!r} names no traffic router; expected one of {sorted(ROUTERS)}"
        )
    return router(**options)
