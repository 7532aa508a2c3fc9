"""What a gateway answer says: who served a request, and when a traffic plan is live.

:func:`answered_by` names the Triton model that answered (the INT8 fallback replica
``<model>__fallback`` when the answer carries :data:`FALLBACK_HEADER`), :func:`served_by` asks the
gateway which version and plan routed one request, and :func:`wait_live` waits until a newly
applied plan's digest (:data:`PLAN_HEADER`) is on every new connection.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Mapping

from ground.exceptions import DataError, ServiceUnavailableError
from ground.settings import DEFAULTS
from repository_sync.routing.traffic_plan import MODEL_NAME_RE, TrafficPlan

#: Response header carrying the digest of the plan that routed a request.
PLAN_HEADER = "X-Tritonflow-Plan"
#: Suffix of the Triton model name of a model's INT8 fallback replica (``<model>__fallback``).
FALLBACK_SUFFIX = "__fallback"
#: Response header marking an answer of the fallback replica (value: its Triton model name).
FALLBACK_HEADER = "X-Tritonflow-Fallback"


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
              response_header: str = DEFAULTS.gateway_response_header) -> tuple[str | None, str | None, int]:
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
