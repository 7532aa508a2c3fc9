"""Triton's per-version Prometheus counters: scrape, parse, and the deltas of one window.

A canary step is judged on what Triton counted for each version between two scrapes of its
metrics endpoint (``nv_inference_request_success``, ``nv_inference_request_failure`` summed over
``reason``, ``nv_inference_request_duration_us``; see Triton's metrics documentation,
https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html):
:func:`parse_triton_metrics` reads one scrape, :func:`version_window` takes the deltas of one
version, :func:`metrics_scraper` makes the scrape callable the canary runner takes.
"""

from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request
from typing import Callable, Mapping

from ground.exceptions import MetricsUnavailableError

#: Seconds a metrics scrape may take.
DEFAULT_SCRAPE_TIMEOUT_S = 5.0

SUCCESS_METRIC = "nv_inference_request_success"
FAILURE_METRIC = "nv_inference_request_failure"
COUNT_METRIC = "nv_inference_count"
DURATION_METRIC = "nv_inference_request_duration_us"
QUEUE_METRIC = "nv_inference_queue_duration_us"


@dataclasses.dataclass(frozen=True)
class VersionCounters:
    """Triton's cumulative per-version counters at one scrape.

    Attributes:
        success, failure: Request counts (failure summed over every ``reason`` label).
        inference_count: Inferences performed (a batched request counts its batch size).
        request_duration_us, queue_duration_us: Cumulative microseconds.
    """

    success: float = 0.0
    failure: float = 0.0
    inference_count: float = 0.0
    request_duration_us: float = 0.0
    queue_duration_us: float = 0.0


_FIELD_OF = {
    SUCCESS_METRIC: "success",
    FAILURE_METRIC: "failure",
    COUNT_METRIC: "inference_count",
    DURATION_METRIC: "request_duration_us",
    QUEUE_METRIC: "queue_duration_us",
}


def parse_triton_metrics(text: str) -> dict[tuple[str, str], VersionCounters]:
    """Parse Triton's Prometheus exposition text into per-(model, version) counters.

    Args:
        text: Body of ``GET http://<triton>:8002/metrics``.

    Returns:
        ``{(model, version): VersionCounters}`` for every model version Triton reports.

    Raises:
        MetricsUnavailableError: The text is not valid Prometheus exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    acc: dict[tuple[str, str], dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            # prometheus_client names a counter family without "_total" and its samples with it
            field = _FIELD_OF.get(family.name) or _FIELD_OF.get(family.name.removesuffix("_total"))
            if field is None:
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = (sample.labels.get("model", ""), sample.labels.get("version", ""))
                slot = acc.setdefault(key, {})
                slot[field] = slot.get(field, 0.0) + float(sample.value)
    except (ValueError, TypeError) as exc:
        raise MetricsUnavailableError(f"Triton metrics text is not Prometheus exposition format: {exc}") from exc
    return {key: VersionCounters(**fields) for key, fields in acc.items()}


def fetch_metrics_text(url: str, timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S) -> str:
    """``GET`` Triton's metrics endpoint.

    Raises:
        MetricsUnavailableError: No answer, a non-200 status, or a timeout; the message names the URL.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            if resp.status != 200:
                raise MetricsUnavailableError(f"metrics endpoint {url} answered HTTP {resp.status}")
            return resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise MetricsUnavailableError(f"metrics endpoint {url} answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise MetricsUnavailableError(f"metrics endpoint {url} unreachable: {exc}") from exc


def metrics_scraper(url: str, timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S) -> Callable[[], str]:
    """A ``scrape_metrics`` callable for :func:`run_canary` reading ``url``."""
    return lambda: fetch_metrics_text(url, timeout_s)


@dataclasses.dataclass(frozen=True)
class VersionWindow:
    """One version's traffic between two scrapes (counter deltas).

    Attributes:
        requests: Successful plus failed requests in the window.
        failures: Failed requests.
        error_rate: ``failures / requests`` (``None`` without requests).
        mean_latency_ms: Mean request duration of successful requests, ms (``None`` without any);
            Triton accumulates ``nv_inference_request_duration_us`` for successful requests.
        present_before, present_after: Whether Triton reported the version in each scrape.
        reset: A counter went backwards (Triton restarted or the version was reloaded).
    """

    requests: float
    failures: float
    error_rate: float | None
    mean_latency_ms: float | None
    present_before: bool
    present_after: bool
    reset: bool


def version_window(
    before: Mapping[tuple[str, str], VersionCounters],
    after: Mapping[tuple[str, str], VersionCounters],
    model: str,
    version: int | str,
) -> VersionWindow:
    """Deltas of one version's counters between two parsed scrapes.

    A version absent from ``before`` counts from zero (it was just loaded). When a counter went
    backwards the window is taken from zero (Prometheus ``increase`` semantics) and ``reset`` is set.
    """
    key = (model, str(version))
    b = before.get(key)
    a = after.get(key)
    if a is None:
        return VersionWindow(0.0, 0.0, None, None, b is not None, False, False)
    b0 = b or VersionCounters()
    reset = any(getattr(a, f) < getattr(b0, f) for f in _FIELD_OF.values())
    if reset:
        b0 = VersionCounters()
    succ = a.success - b0.success
    fail = a.failure - b0.failure
    dur = a.request_duration_us - b0.request_duration_us
    reqs = succ + fail
    return VersionWindow(
        requests=reqs,
        failures=fail,
        error_rate=(fail / reqs) if reqs > 0 else None,
        mean_latency_ms=(dur / succ / 1000.0) if succ > 0 else None,
        present_before=b is not None,
        present_after=True,
        reset=reset,
    )
