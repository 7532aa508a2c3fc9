"""Traffic routing in front of Triton: split a model's requests between its versions, and watch it.

* :mod:`~repository_sync.routing.traffic_plan`: :class:`TrafficPlan` (which percentage each
  version gets, validated) and the :class:`TrafficRouter` interface a router implements;
* :mod:`~repository_sync.routing.router`: the routing contract, :data:`ROUTERS` and
  :func:`make_router` (``TRITONFLOW_TRAFFIC_ROUTER``); a new router is registered there;
* :mod:`~repository_sync.routing.nginx_router`: :class:`NginxRouter`, the NGINX gateway's router;
* :mod:`~repository_sync.routing.gateway_probe`: who answered a request (version, plan digest,
  fallback replica) and :func:`wait_live`;
* :mod:`~repository_sync.routing.gateway_status`: the gateway's per-version status log, read by
  the canary;
* :mod:`~repository_sync.routing.mirror`: the recorder of mirrored (shadow) requests.
"""
