"""Health sentinel of a serving champion: golden samples, probes, verdicts (no Airflow here).

The ``champion_sentinel`` DAG defers to ``ChampionSentinelTrigger`` (plugin), which runs
:func:`watch` in Airflow's triggerer: every ``interval_s`` seconds (``TRITONFLOW_SENTINEL_INTERVAL_S``)
one request carrying every golden sample goes through the gateway to the champion version
(``POST <gateway>/v2/models/<triton model>/versions/<champion>/infer``; the gateway passes version
routes straight to Triton), and :func:`judge` checks the answer:

* **finite** -- no NaN or infinity in any numeric output;
* **not constant** -- with two or more samples, an output whose every sample got the same answer
  is refused (a model stuck on one value, e.g. after a weights or preprocessing failure), except
  an integer or boolean output (Triton ``INT*``/``UINT*``/``BOOL``, such as a class label): a
  handful of golden samples may all belong to one class, and a stuck classifier is still seen in
  its probabilities;
* **in range** -- every value lies within the range seen at validation for that output (the
  validation outputs' min and max, widened by ``range_margin`` times their span on each side);
* **fast enough** -- answered within ``latency_limit_s`` (``TRITONFLOW_SENTINEL_LATENCY_S``).

An answer of Triton refusing the request (HTTP 4xx/5xx from Triton for that version) is a failed
probe too. A gateway that does not answer, or NGINX's own 502/504 (Triton unreachable), is an
infrastructure problem, never a verdict on the model: such a probe is counted apart and neither
fails nor clears the streak (rolling back would not help: the rollback needs both). So is a
refusal after which Triton's ready endpoint says the version is not loaded (``unloaded``: a
Triton restarted in ``explicit`` model-control mode comes back empty); after ``failures``
consecutive such probes :func:`watch` returns ``unloaded`` and the DAG loads back the model's
desired versions instead of rolling back.

After ``failures`` consecutive failed probes (``TRITONFLOW_SENTINEL_FAILURES``) :func:`watch`
returns ``unhealthy`` with each probe's reasons; the DAG then rolls back through the same path as
``canary_rollback``. Worst case from the first bad answer to the decision: ``failures`` probes,
i.e. ``failures x interval_s`` (the first bad answer may come just after a probe).

Golden samples come from the champion's drift reference (rows of the data it was validated on,
:func:`tritonflow.pipelines.sentinel.golden_set`); the ranges from the validation outputs recorded
at publish (tag ``tritonflow.output_range``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ground.exceptions import DataError

#: Default share of the validation span added on each side of an output's range.
DEFAULT_RANGE_MARGIN = 0.1
#: NGINX statuses meaning "Triton did not answer" (infrastructure, not the model).
GATEWAY_UPSTREAM_STATUSES = (502, 504)
#: Seconds between two checks that the sentinel's version is still the champion.
DEFAULT_CHAMPION_CHECK_S = 30.0

_NUMPY_TO_KSERVE = {
    "float32": "FP32", "float64": "FP64", "float16": "FP16", "int64": "INT64", "int32": "INT32",
    "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
    "uint64": "UINT64", "bool": "BOOL",
}


@dataclasses.dataclass(frozen=True)
class SentinelPolicy:
    """How a champion is probed and judged.

    Attributes:
        interval_s: Seconds between the starts of two probes (> 0).
        failures: Consecutive failed probes that make the champion unhealthy (>= 1).
        latency_limit_s: Longest a probe may take, seconds (> 0); also the request's timeout.
        range_margin: Share of the validation span allowed outside it on each side (>= 0).
    """

    interval_s: float = 10.0
    failures: int = 3
    latency_limit_s: float = 2.0
    range_margin: float = DEFAULT_RANGE_MARGIN

    def __post_init__(self) -> None:
        checks = {
            "interval_s": (self.interval_s, "> 0", _finite(self.interval_s) and self.interval_s > 0),
            "failures": (self.failures, "an integer >= 1",
                         isinstance(self.failures, int) and not isinstance(self.failures, bool)
                         and self.failures >= 1),
            "latency_limit_s": (self.latency_limit_s, "> 0",
                                _finite(self.latency_limit_s) and self.latency_limit_s > 0),
            "range_margin": (self.range_margin, ">= 0", _finite(self.range_margin) and self.range_margin >= 0),
        }
        for field, (value, expected, ok) in checks.items():
            if not ok:
                raise DataError(f"sentinel {field}={value!r}: expected {expected}")

    @classmethod
    def from_settings(cls, settings: Any) -> SentinelPolicy:
        """Policy from ``TRITONFLOW_SENTINEL_*`` settings."""
        return cls(interval_s=float(settings.sentinel_interval_s), failures=int(settings.sentinel_failures),
                   latency_limit_s=float(settings.sentinel_latency_s))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (trigger kwargs)."""
        return dataclasses.asdict(self)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@dataclasses.dataclass(frozen=True)
class GoldenSet:
    """Golden samples of one champion version and the output ranges seen at validation.

    Attributes:
        model: Registered model name.
        triton_model: Triton model name.
        version: The champion version probed.
        inputs: ``{input name: {"datatype", "shape", "data"}}`` (KServe v2 JSON tensors, the batch
            of samples included in ``shape``).
        output_ranges: ``{output name: [low, high]}`` seen at validation (may be empty).
        samples: Number of samples (rows) in the request.
        source: Where samples and ranges came from (for the record).
    """

    model: str
    triton_model: str
    version: int
    inputs: Mapping[str, Mapping[str, Any]]
    output_ranges: Mapping[str, Sequence[float]]
    samples: int
    source: str = ""

    @classmethod
    def from_arrays(cls, model: str, triton_model: str, version: int, inputs: Mapping[str, np.ndarray],
                    output_ranges: Mapping[str, Sequence[float]] | None = None, *, source: str = "") -> GoldenSet:
        """Build from numpy arrays whose first axis is the sample axis.

        Raises:
            DataError: No input, no sample, an unsupported dtype, a non-finite or inverted range.
        """
        if not inputs:
            raise DataError(f"golden set of {model!r} v{version} has no input: expected at least one tensor")
        tensors: dict[str, dict[str, Any]] = {}
        samples = None
        for name, array in inputs.items():
            arr = np.asarray(array)
            if arr.ndim == 0 or arr.shape[0] == 0:
                raise DataError(f"golden input {name!r} of {model!r} has shape {list(arr.shape)}: "
                                "expected at least one sample on axis 0")
            samples = arr.shape[0] if samples is None else min(samples, arr.shape[0])
            if arr.dtype == object or arr.dtype.kind in "SU":
                datatype = "BYTES"
                data = [v.decode() if isinstance(v, bytes) else str(v) for v in arr.reshape(-1)]
            else:
                kserve_type = _NUMPY_TO_KSERVE.get(arr.dtype.name)
                if kserve_type is None:
                    raise DataError(f"golden input {name!r} has dtype {arr.dtype}: expected one of "
                                    f"{sorted(_NUMPY_TO_KSERVE)} or strings")
                datatype = kserve_type
                data = arr.reshape(-1).tolist()
            tensors[name] = {"datatype": datatype, "shape": list(arr.shape), "data": data}
        ranges: dict[str, list[float]] = {}
        for name, bounds in (output_ranges or {}).items():
            lo, hi = (float(b) for b in bounds)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise DataError(f"output range of {name!r} is {[lo, hi]}: expected finite low <= high")
            ranges[name] = [lo, hi]
        return cls(model, triton_model, int(version), tensors, ranges, int(samples or 0), source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GoldenSet:
        """Inverse of :meth:`to_dict`."""
        return cls(str(data["model"]), str(data["triton_model"]), int(data["version"]),
                   dict(data["inputs"]), {k: list(v) for k, v in dict(data["output_ranges"]).items()},
                   int(data["samples"]), str(data.get("source", "")))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (trigger kwargs, XCom)."""
        return {"model": self.model, "triton_model": self.triton_model, "version": self.version,
                "inputs": {k: dict(v) for k, v in self.inputs.items()},
                "output_ranges": {k: list(v) for k, v in self.output_ranges.items()},
                "samples": self.samples, "source": self.source}

    def request_body(self) -> bytes:
        """KServe v2 JSON inference request with every golden sample."""
        return json.dumps({"inputs": [{"name": k, **v} for k, v in self.inputs.items()]}).encode()

    def path(self) -> str:
        """Gateway path of the champion version's infer route."""
        return f"/v2/models/{self.triton_model}/versions/{self.version}/infer"


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """One probe.

    Attributes:
        status: ``ok``, ``failed`` (a verdict on the model), ``unreachable`` (the gateway or
            Triton did not answer) or ``unloaded`` (Triton answers but does not hold the version
            READY, e.g. after a restart); the last two are infrastructure, never a verdict.
        reasons: Why it failed / was unreachable (empty when ok).
        latency_s: Seconds from sending to the full answer (or to the error).
        http_status: HTTP status (0 when none came back).
        at: Wall-clock time the probe started (``time.time()``).
    """

    status: str
    reasons: tuple[str, ...]
    latency_s: float
    http_status: int
    at: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"status": self.status, "reasons": list(self.reasons), "latency_s": round(self.latency_s, 4),
                "http_status": self.http_status, "at": self.at}


def _outputs_of(answer: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for item in answer.get("outputs") or []:
        data = item.get("data")
        if item.get("datatype") == "BYTES":
            continue
        discrete = str(item.get("datatype", "")).startswith(("INT", "UINT", "BOOL"))
        if data and discrete and all(v is not None for v in data):
            values = np.asarray(data, dtype=np.int64)  # judged as a discrete output (no constancy check)
        else:
            values = np.asarray([np.nan if v is None else v for v in data], dtype=np.float64) if data else np.array([])
        shape = [int(s) for s in item.get("shape") or [len(values)]]
        out[str(item["name"])] = values.reshape(shape) if values.size == int(np.prod(shape)) else values
    return out


def judge(outputs: Mapping[str, np.ndarray], latency_s: float, golden: GoldenSet,
          policy: SentinelPolicy) -> tuple[str, ...]:
    """Reasons a probe's answer is unhealthy (empty tuple: healthy).

    Args:
        outputs: ``{output name: array}``, first axis the samples.
        latency_s: Seconds the probe took.
        golden: What was sent (sample count, validation ranges).
        policy: Latency limit and range margin.

    Returns:
        One sentence per problem, naming the output, what was seen and what was expected.
    """
    reasons: list[str] = []
    if latency_s > policy.latency_limit_s:
        reasons.append(f"answered in {latency_s:.3f} s, over the {policy.latency_limit_s:g} s limit")
    if not outputs:
        reasons.append("the answer holds no numeric output")
    for name in golden.output_ranges:
        if name not in outputs:
            reasons.append(f"output {name!r} is missing from the answer (outputs: {sorted(outputs)})")
    for name, values in outputs.items():
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:
            reasons.append(f"output {name!r} is empty")
            continue
        bad = int((~np.isfinite(arr)).sum())
        if bad:
            reasons.append(f"output {name!r}: {bad} of {arr.size} values are not finite (NaN or infinite)")
            continue
        rows = arr.reshape(arr.shape[0], -1) if arr.ndim >= 1 and golden.samples >= 2 \
            and arr.shape[0] == golden.samples else None
        discrete = np.asarray(values).dtype.kind in "iub"  # Triton INT*/UINT*/BOOL: a class label
        if rows is not None and not discrete and np.all(rows == rows[0]):
            reasons.append(f"output {name!r} is constant across the {golden.samples} golden samples "
                           f"(every sample got {rows[0][:4].tolist()})")
        if name in golden.output_ranges:
            lo, hi = golden.output_ranges[name]
            pad = policy.range_margin * (hi - lo)
            low, high = lo - pad, hi + pad
            seen_lo, seen_hi = float(arr.min()), float(arr.max())
            if seen_lo < low or seen_hi > high:
                reasons.append(f"output {name!r} spans [{seen_lo:.6g}, {seen_hi:.6g}], outside the "
                               f"validation range [{lo:.6g}, {hi:.6g}] (+/- {policy.range_margin:g} x span)")
    return tuple(reasons)


def _not_ready(gateway_url: str, golden: GoldenSet, policy: SentinelPolicy) -> str:
    """Why Triton does not hold ``golden``'s version READY (empty: it does, or no answer came).

    Asked after Triton refused a probe: a version Triton does not hold (a restarted Triton in
    ``explicit`` model-control mode starts empty) is an infrastructure state, not a verdict.
    """
    url = gateway_url.rstrip("/") + f"/v2/models/{golden.triton_model}/versions/{golden.version}/ready"
    try:
        with urllib.request.urlopen(url, timeout=policy.latency_limit_s):
            return ""
    except urllib.error.HTTPError as exc:
        if exc.code in GATEWAY_UPSTREAM_STATUSES:
            return ""
        return f"Triton's ready endpoint answers HTTP {exc.code}: the version is not loaded"
    except (TimeoutError, urllib.error.URLError, OSError):
        return ""


def probe(gateway_url: str, golden: GoldenSet, policy: SentinelPolicy) -> ProbeResult:
    """Send the golden samples to the champion version through the gateway and judge the answer.

    Never raises for a network or HTTP problem: it is the result's ``status``. A refusal from
    Triton is ``failed``, unless Triton's ready endpoint then says the version is not loaded:
    that is ``unloaded`` (infrastructure, like ``unreachable``).
    """
    url = gateway_url.rstrip("/") + golden.path()
    request = urllib.request.Request(url, data=golden.request_body(), method="POST",
                                     headers={"Content-Type": "application/json"})
    at, t0 = time.time(), time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=policy.latency_limit_s) as resp:
            body, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        latency = time.perf_counter() - t0
        detail = exc.read()[:300].decode(errors="replace").strip()
        if exc.code in GATEWAY_UPSTREAM_STATUSES:
            return ProbeResult("unreachable", (f"gateway answered {exc.code}: Triton did not answer",),
                               latency, exc.code, at)
        unloaded = _not_ready(gateway_url, golden, policy)
        if unloaded:
            return ProbeResult("unloaded", (f"HTTP {exc.code} from {golden.triton_model} v{golden.version}: "
                                            f"{detail}; {unloaded}",), latency, exc.code, at)
        return ProbeResult("failed", (f"HTTP {exc.code} from {golden.triton_model} v{golden.version}: "
                                      f"{detail}",), latency, exc.code, at)
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        latency = time.perf_counter() - t0
        reason = getattr(exc, "reason", exc)
        if isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return ProbeResult("failed", (f"no answer within the {policy.latency_limit_s:g} s latency limit",),
                               latency, 0, at)
        return ProbeResult("unreachable", (f"gateway {gateway_url} did not answer: {reason}",), latency, 0, at)
    latency = time.perf_counter() - t0
    try:
        outputs = _outputs_of(json.loads(body))
    except (ValueError, TypeError, KeyError) as exc:
        return ProbeResult("failed", (f"answer is not a KServe v2 JSON response: {exc}",), latency, status, at)
    reasons = judge(outputs, latency, golden, policy)
    return ProbeResult("failed" if reasons else "ok", reasons, latency, status, at)


@dataclasses.dataclass(frozen=True)
class SentinelOutcome:
    """Why :func:`watch` returned.

    Attributes:
        status: ``unhealthy`` (roll back), ``unloaded`` (Triton does not hold the version: load
            it back), ``superseded`` (the version is no longer the champion),
            ``renew`` (``until`` passed with no failing streak open) or ``stopped`` (``max_probes``
            reached; tests and benchmarks).
        model / triton_model / version: What was watched.
        probes: Probes sent; ``unreachable``: of which the gateway or Triton did not answer.
        failed: The consecutive failed (or, for ``unloaded``, unloaded) probes that decided
            (``ProbeResult.to_dict``), last first.
        first_failure_at: Wall-clock time of the first probe of the failing streak.
    """

    status: str
    model: str
    triton_model: str
    version: int
    probes: int
    unreachable: int
    failed: tuple[dict, ...] = ()
    first_failure_at: float | None = None

    def reason(self) -> str:
        """One line for the rollback record."""
        if self.status == "unloaded":
            seen = self.failed[0]["reasons"] if self.failed else []
            return (f"health sentinel: {len(self.failed)} consecutive probes found {self.triton_model} "
                    f"v{self.version} not loaded in Triton: " + "; ".join(seen))[:900]
        if self.status != "unhealthy":
            return f"sentinel {self.status} after {self.probes} probe(s)"
        seen = self.failed[0]["reasons"] if self.failed else []
        return (f"health sentinel: {len(self.failed)} consecutive failed probes of {self.triton_model} "
                f"v{self.version}: " + "; ".join(seen))[:900]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (TriggerEvent payload)."""
        return dataclasses.asdict(self) | {"failed": list(self.failed), "reason": self.reason()}


async def watch(gateway_url: str, golden: GoldenSet, policy: SentinelPolicy, *,
                still_champion: Callable[[], Awaitable[bool]] | None = None,
                champion_check_s: float = DEFAULT_CHAMPION_CHECK_S,
                max_probes: int | None = None, until: float | None = None,
                on_probe: Callable[[ProbeResult], None] | None = None) -> SentinelOutcome:
    """Probe ``golden`` every ``policy.interval_s`` until a decision or a stop.

    The decisions: ``policy.failures`` failed probes in a row (``unhealthy``), or as many in a row
    finding the version not loaded (``unloaded``). Before either is returned, ``still_champion``
    is asked once more whatever ``champion_check_s`` says: a rollback or promotion unloads the
    version it replaces, and a sentinel that saw that must end ``superseded``, never load the
    old version's model back or judge it.

    Each probe runs in a worker thread (``asyncio.to_thread``), so the triggerer's event loop is
    never blocked.

    Args:
        gateway_url: Base URL of the gateway (``http://host:port``).
        golden: The champion version and its golden samples.
        policy: Interval, failures, latency limit, range margin.
        still_champion: Coroutine function answering whether ``golden.version`` is still the
            champion; called at most every ``champion_check_s`` seconds (after a promotion or a
            manual rollback the sentinel ends ``superseded`` so the DAG can start the new one).
        champion_check_s: Seconds between two ``still_champion`` checks.
        max_probes: Stop after this many probes (``stopped``); ``None`` runs until a decision.
        until: Wall-clock time (``time.time()``) after which it returns ``renew`` (the DAG's
            scheduled run starts a fresh sentinel with a fresh golden set); ``None``: never.
        on_probe: Called with every probe's result (logging).

    Returns:
        :class:`SentinelOutcome`.
    """
    probes = unreachable = 0
    streak: list[ProbeResult] = []
    absent: list[ProbeResult] = []  # consecutive "unloaded" probes
    last_check = time.monotonic()
    while True:
        started = time.monotonic()
        result = await asyncio.to_thread(probe, gateway_url, golden, policy)
        probes += 1
        if on_probe is not None:
            on_probe(result)
        absent = absent + [result] if result.status == "unloaded" else []
        if len(absent) >= policy.failures:
            if still_champion is not None and not await still_champion():
                return SentinelOutcome("superseded", golden.model, golden.triton_model, golden.version,
                                       probes, unreachable)
            return SentinelOutcome("unloaded", golden.model, golden.triton_model, golden.version, probes,
                                   unreachable, tuple(r.to_dict() for r in reversed(absent)), absent[0].at)
        if result.status in ("unreachable", "unloaded"):
            unreachable += result.status == "unreachable"
        elif result.status == "failed":
            streak.append(result)
            if len(streak) >= policy.failures:
                if still_champion is not None and not await still_champion():
                    return SentinelOutcome("superseded", golden.model, golden.triton_model, golden.version,
                                           probes, unreachable)
                return SentinelOutcome("unhealthy", golden.model, golden.triton_model, golden.version, probes,
                                       unreachable, tuple(r.to_dict() for r in reversed(streak)), streak[0].at)
        else:
            streak.clear()
        if max_probes is not None and probes >= max_probes:
            return SentinelOutcome("stopped", golden.model, golden.triton_model, golden.version, probes,
                                   unreachable, tuple(r.to_dict() for r in reversed(streak)))
        if until is not None and time.time() >= until and not streak:
            return SentinelOutcome("renew", golden.model, golden.triton_model, golden.version, probes,
                                   unreachable)
        if still_champion is not None and time.monotonic() - last_check >= champion_check_s:
            last_check = time.monotonic()
            if not await still_champion():
                return SentinelOutcome("superseded", golden.model, golden.triton_model, golden.version,
                                       probes, unreachable)
        await asyncio.sleep(max(0.0, policy.interval_s - (time.monotonic() - started)))


__all__ = ["GoldenSet", "ProbeResult", "SentinelOutcome", "SentinelPolicy", "judge", "probe", "watch"]
