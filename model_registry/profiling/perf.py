"""perf_analyzer measurements: repeated passes, stability, and the p99 latency regression gate.

* :func:`run_pass` runs ``perf_analyzer`` once against a running Triton (one concurrency, CSV
  report) and returns throughput, p99 latency and perf_analyzer's own stability verdict (its
  "Failed to obtain stable measurement" message).
* :func:`measure_interleaved` measures several models on the SAME Triton in interleaved rounds
  (A B, B A, A B, ...), so slow drifts of a shared machine hit every model alike.
* :func:`p99_regression` is the gate's decision (pure): the challenger is rejected when its median
  p99 is worse than the champion's by more than ``max_regression`` (default 10 %) beyond the
  noise band, and by more than ``min_regression_ms`` (default 1 ms) in absolute terms. The noise
  band is the larger relative spread of either model's p99 passes (what repeating the same
  measurement moves; :func:`noise_spread`: the range, or from 5 passes on the spread without each
  end's extreme pass). The practitioners' pipeline this comes
  from blocks a release whose p99 latency regresses (``shared/references``).
* :func:`perf_regression_gate` starts a throwaway local Triton (``tools.scratch_server``: the
  Triton tools environment, explicit model control, free ports) over a temporary repository
  holding the champion and the challenger side by side, measures both at the champion's
  concurrency, and returns :class:`PerfGateResult`.

The binaries, their environment and the server starter come in a
:class:`~model_registry.profiling.triton_tools.TritonTools` that the caller builds
(``tritonflow.runtime.triton_tools.triton_tools``); this module never imports the runtime.

A failure of the tools (perf_analyzer missing, Triton not starting, a pass that errors) raises
:class:`~ground.exceptions.TransientError`: it is never a verdict on the model.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ground.exceptions import TransientError
from ground.settings import Settings
from model_registry.profiling.triton_tools import TritonTools

#: perf_analyzer's message when its stability criterion is not met.
PA_UNSTABLE_MESSAGE = "Failed to obtain stable measurement"
#: Fewest passes per model the gate accepts.
MIN_PASSES = 3
#: The gate's longest adaptive window as a multiple of its first (:func:`next_window_ms`; 250 ms -> 4 s).
MAX_WINDOW_FACTOR = 16


@dataclasses.dataclass(frozen=True)
class PerfPass:
    """One perf_analyzer pass.

    Attributes:
        model: Model measured.
        concurrency: Client concurrency.
        throughput: Inferences per second.
        p99_ms: p99 latency, milliseconds.
        stable: perf_analyzer reached its stability criterion.
        window_ms: perf_analyzer's measurement window of the pass, milliseconds (0: not recorded).
    """

    model: str
    concurrency: int
    throughput: float
    p99_ms: float
    stable: bool
    window_ms: int = 0


def perf_analyzer_path(settings: Settings) -> Path:
    """``perf_analyzer`` of the Triton tools environment."""
    return settings.triton_venv / "bin" / "perf_analyzer"


def input_data_json(config: Any, sample: Mapping[str, np.ndarray], path: str | Path, rows: int = 16) -> Path | None:
    """Write a perf_analyzer ``--input-data`` JSON from validation rows (one entry per row).

    Returns None when the sample lacks one of the config's inputs (perf_analyzer then uses random
    data).
    """
    names = [i.name for i in config.input]
    if any(n not in sample for n in names):
        return None
    batched = int(config.max_batch_size) > 0
    n = min(rows, min(len(sample[k]) for k in names))
    entries = []
    for r in range(n):
        entry = {}
        for name in names:
            value = np.asarray(sample[name][r] if batched else sample[name])
            content = [v.decode() if isinstance(v, bytes) else (str(v) if value.dtype.kind in "OUS" else v.item())
                       for v in value.reshape(-1)]
            entry[name] = {"content": content, "shape": list(value.shape) or [1]}
        entries.append(entry)
    p = Path(path)
    p.write_text(json.dumps({"data": entries}))
    return p


def run_pass(model: str, url: str, concurrency: int, *, tools: TritonTools, settings: Settings,
             measurement_ms: int = 1000, input_data: str | Path | None = None, max_trials: int = 5,
             stability_percentage: int | None = None, timeout_s: float = 120.0) -> PerfPass:
    """One perf_analyzer pass over HTTP at one concurrency (batch 1).

    perf_analyzer stabilises on throughput and average latency (``stability_percentage``, default
    ``analyzer_stability_cv * 100``); p99 comes from its CSV report. A pass it could not stabilise
    is returned with ``stable=False`` and NaN figures.

    Args:
        model: Model loaded on the Triton at ``url``.
        url: Triton's HTTP endpoint (``host:port``).
        concurrency: Client concurrency.
        tools: The Triton tools (``perf_analyzer`` and its environment).
        settings: Source of the default stability criterion (``analyzer_stability_cv``).
        measurement_ms: perf_analyzer's measurement window, milliseconds.
        input_data: perf_analyzer ``--input-data`` JSON (None: random data).
        max_trials: perf_analyzer's trials before it gives up stabilising.
        stability_percentage: perf_analyzer's stability criterion, percent.
        timeout_s: Limit for the pass, seconds.

    Returns:
        The pass: throughput (inferences/s), p99 latency (ms) and perf_analyzer's stability verdict.

    Raises:
        TransientError: perf_analyzer is missing, timed out or failed (the output tail included).
    """
    binary = tools.perf_analyzer
    if not binary.is_file():
        raise TransientError(f"perf_analyzer not found at {binary}; run scripts/setup.sh")
    stab = int(round(settings.analyzer_stability_cv * 100)) if stability_percentage is None else stability_percentage
    with tempfile.TemporaryDirectory(prefix="tritonflow-pa-") as tmp:
        report = Path(tmp) / "report.csv"
        argv = [str(binary), "-m", model, "-u", url, "-i", "http", f"--concurrency-range={concurrency}",
                f"--measurement-interval={measurement_ms}", f"--stability-percentage={stab}",
                f"--max-trials={max_trials}", "-f", str(report)]
        if input_data:
            argv.append(f"--input-data={input_data}")
        try:
            proc = subprocess.run(argv, env=dict(tools.environment), capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise TransientError(f"perf_analyzer on {model!r} ran past {timeout_s:g} s") from exc
        out = proc.stdout + proc.stderr
        unstable = PA_UNSTABLE_MESSAGE in out
        if unstable and not report.is_file():  # perf_analyzer's own verdict: no figure to trust
            return PerfPass(model, int(concurrency), math.nan, math.nan, False, int(measurement_ms))
        if not report.is_file():
            raise TransientError(f"perf_analyzer on {model!r} failed (exit {proc.returncode}): {out[-800:]}")
        rows = list(csv.DictReader(io.StringIO(report.read_text())))
    if not rows:
        raise TransientError(f"perf_analyzer on {model!r} wrote an empty report: {out[-800:]}")
    row = rows[-1]
    return PerfPass(model, int(concurrency), float(row["Inferences/Second"]), float(row["p99 latency"]) / 1000.0,
                    not unstable and proc.returncode == 0, int(measurement_ms))


def next_window_ms(last: PerfPass, *, min_requests: int, max_window_ms: int) -> int:
    """The measurement window of a model's next pass, grown to what its last pass showed it needs.

    A p99 from a window of few requests is the window's slowest request or close to it, and
    perf_analyzer cannot stabilise throughput and mean latency over windows of a dozen requests: a
    challenger 10-30x slower than its champion on a loaded 2-core host got 2 stable passes in 10 at
    the champion's 250 ms (a CI failure). So after an unstable pass the window doubles, and after a
    stable one it grows to hold ``min_requests`` requests at the pass's throughput; it never shrinks
    and never exceeds ``max_window_ms``.

    Args:
        last: The model's last pass (its ``window_ms`` >= 1).
        min_requests: Fewest requests a window should hold (0: only instability grows it).
        max_window_ms: Largest window, milliseconds.

    Returns:
        The next window, milliseconds, in ``[last.window_ms, max(last.window_ms, max_window_ms)]``.
    """
    window_ms = int(last.window_ms)
    if not last.stable or not math.isfinite(last.throughput) or last.throughput <= 0:
        wanted = 2 * window_ms
    else:
        wanted = math.ceil(min_requests * 1000.0 / last.throughput)
    return max(window_ms, min(int(max_window_ms), int(wanted)))


def measure_interleaved(models: Sequence[str], url: str, concurrency: int, *, tools: TritonTools,
                        settings: Settings, passes: int = MIN_PASSES, measurement_ms: int = 1000,
                        input_data: Mapping[str, str | Path | None] | None = None,
                        stability_percentage: int | None = None, max_trials: int = 5, min_requests: int = 0,
                        max_measurement_ms: int | None = None) -> dict[str, list[PerfPass]]:
    """At least ``passes`` stable perf_analyzer passes per model on one Triton, interleaved.

    The order is reversed every other round (A B, B A, ...). Rounds go on while a model has fewer than
    ``passes`` stable passes, at most ``2 * passes`` rounds. With ``max_measurement_ms`` each model's
    window adapts to it (:func:`next_window_ms`): a slow model gets longer windows than a fast one.

    Args:
        models: Models loaded on the Triton at ``url``.
        url: Triton's HTTP endpoint (``host:port``).
        concurrency: Client concurrency.
        tools: The Triton tools (``perf_analyzer`` and its environment).
        settings: Source of the default stability criterion (:func:`run_pass`).
        passes: Stable passes wanted per model.
        measurement_ms: perf_analyzer's measurement window, milliseconds.
        input_data: ``{model: --input-data JSON}`` (missing: random data).
        stability_percentage: perf_analyzer's stability criterion, percent.
        max_trials: perf_analyzer's trials per pass.
        min_requests: Fewest requests per window the adaptive windows aim at.
        max_measurement_ms: Largest adaptive window, milliseconds (None: every window is
            ``measurement_ms``).

    Returns:
        ``{model: [PerfPass, ...]}`` in measurement order (unstable passes included, flagged).

    Raises:
        TransientError: A pass failed (:func:`run_pass`).
    """
    out: dict[str, list[PerfPass]] = {m: [] for m in models}
    window = dict.fromkeys(models, int(measurement_ms))
    for rnd in range(2 * passes):
        if rnd >= passes and all(sum(p.stable for p in out[m]) >= passes for m in models):
            break
        order = list(models) if rnd % 2 == 0 else list(reversed(models))
        for m in order:
            out[m].append(run_pass(m, url, concurrency, tools=tools, settings=settings, measurement_ms=window[m],
                                   input_data=(input_data or {}).get(m), max_trials=max_trials,
                                   stability_percentage=stability_percentage))
            if max_measurement_ms is not None:
                window[m] = next_window_ms(out[m][-1], min_requests=min_requests, max_window_ms=max_measurement_ms)
    return out


@dataclasses.dataclass(frozen=True)
class P99Verdict:
    """The p99 regression decision (:func:`p99_regression`).

    Attributes:
        champion_p99_ms: Median of the champion's p99 passes.
        challenger_p99_ms: Median of the challenger's p99 passes.
        regression: ``challenger / champion - 1`` (0.25 = 25 % slower).
        noise_band: Larger relative spread of either model's passes (:func:`noise_spread`).
        max_regression: Allowed regression (``TRITONFLOW_MAX_P99_REGRESSION``).
        limit: ``max_regression + noise_band``: the regression that rejects.
        rejected: ``regression > limit`` and ``regression_ms > min_regression_ms``.
        reason: One sentence with the figures.
        regression_ms: ``challenger_p99_ms - champion_p99_ms`` (milliseconds).
        min_regression_ms: Smallest regression in milliseconds that may reject
            (``TRITONFLOW_MIN_P99_REGRESSION_MS``).
    """

    champion_p99_ms: float
    challenger_p99_ms: float
    regression: float
    noise_band: float
    max_regression: float
    limit: float
    rejected: bool
    reason: str
    regression_ms: float = 0.0
    min_regression_ms: float = 0.0


#: Passes per model from which the noise band drops each end's extreme pass.
TRIM_FROM_PASSES = 5


def noise_spread(values: Sequence[float]) -> float:
    """Relative spread of one model's p99 passes: ``(high - low) / median``.

    With fewer than :data:`TRIM_FROM_PASSES` passes, ``high`` and ``low`` are the largest and smallest
    pass (the range). From 5 passes on they are the second largest and second smallest: one pass
    that a scheduling hiccup made slow (or fast) then widens neither end, as the median it is
    compared against already ignores it. For normally distributed passes of standard deviation
    ``sigma`` the expected range of 3 is 1.69 sigma and the expected 2nd-to-4th spread of 5 is
    0.99 sigma (normal order statistics, e.g. Harter, *Expected values of normal order statistics*,
    Biometrika 48, 1961); the median of 5 is also steadier than that of 3 (standard error about
    0.54 sigma against 0.67 sigma).

    Args:
        values: p99 per pass (milliseconds), at least 2.

    Returns:
        The spread as a fraction of the median (0.25 = 25 %); infinity when the median is not positive.
    """
    ordered = sorted(values)
    if len(ordered) >= TRIM_FROM_PASSES:
        ordered = ordered[1:-1]
    med = statistics.median(values)
    return (ordered[-1] - ordered[0]) / med if med > 0 else math.inf


def p99_regression(champion_p99_ms: Sequence[float], challenger_p99_ms: Sequence[float], *,
                   max_regression: float, min_passes: int = MIN_PASSES,
                   min_regression_ms: float = 0.0) -> P99Verdict:
    """Decide whether the challenger's p99 latency regresses beyond the allowance and the noise.

    The challenger is rejected when its median p99 is worse than the champion's by more than
    ``max_regression`` (relative) plus the noise band AND by more than ``min_regression_ms``
    (absolute): a ratio alone rejects sub-millisecond models on scheduling noise (two same-size
    models measured 1.5 ms vs 2.1 ms on a busy 2-core host).

    Args:
        champion_p99_ms: The champion's p99 per pass (milliseconds; non-finite passes dropped).
        challenger_p99_ms: The challenger's p99 per pass (milliseconds).
        max_regression: Allowed relative regression on top of the noise band (0.1 = 10 %).
        min_passes: Fewest finite passes per model.
        min_regression_ms: Smallest absolute regression (milliseconds) that may reject.

    Raises:
        ValueError: Fewer than ``min_passes`` finite passes for either model, or a negative
            ``max_regression`` or ``min_regression_ms``.
    """
    a = [float(v) for v in champion_p99_ms if math.isfinite(v)]
    b = [float(v) for v in challenger_p99_ms if math.isfinite(v)]
    if len(a) < min_passes or len(b) < min_passes:
        raise ValueError(f"the p99 gate needs >= {min_passes} passes per model "
                         f"(champion {len(a)}, challenger {len(b)})")
    for name, value in (("max_regression", max_regression), ("min_regression_ms", min_regression_ms)):
        if not value >= 0:
            raise ValueError(f"{name}={value!r} is invalid (expected >= 0)")
    ma, mb = statistics.median(a), statistics.median(b)
    regression = mb / ma - 1.0 if ma > 0 else math.inf
    regression_ms = mb - ma
    noise = max(noise_spread(a), noise_spread(b))
    limit = max_regression + noise
    beyond_ratio = regression > limit
    rejected = beyond_ratio and regression_ms > min_regression_ms
    reason = (f"challenger median p99 {mb:.3f} ms vs champion {ma:.3f} ms: {regression:+.1%} "
              f"({'>' if beyond_ratio else '<='} allowed {max_regression:.0%} + noise band {noise:.1%} = {limit:.1%})")
    if beyond_ratio and not rejected:
        reason += f", but only {regression_ms:+.3f} ms (<= the {min_regression_ms:g} ms floor): passed"
    return P99Verdict(ma, mb, regression, noise, max_regression, limit, rejected, reason,
                      regression_ms, min_regression_ms)


@dataclasses.dataclass
class PerfGateResult:
    """Figures and verdict of :func:`perf_regression_gate` (all JSON-able through :meth:`to_dict`)."""

    verdict: P99Verdict
    concurrency: int
    passes: dict[str, list[PerfPass]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: verdict, p99 figures, concurrency and every measured pass per model."""
        return {"verdict": "rejected" if self.verdict.rejected else "passed",
                **dataclasses.asdict(self.verdict), "concurrency": self.concurrency,
                "passes": {k: [dataclasses.asdict(p) for p in v] for k, v in self.passes.items()}}


def perf_regression_gate(champion_dir: str | Path, challenger_dir: str | Path, *, concurrency: int,
                         passes: int = MIN_PASSES, max_regression: float | None = None,
                         min_regression_ms: float | None = None,
                         measurement_ms: int = 1000, samples: Mapping[str, Mapping[str, np.ndarray]] | None = None,
                         stability_percentage: int = 30, min_requests: int | None = None, tools: TritonTools,
                         settings: Settings) -> PerfGateResult:
    """Measure champion and challenger on one local Triton, interleaved, and decide on p99.

    Each model's window starts at ``measurement_ms`` and adapts to the model (:func:`next_window_ms`,
    up to ``MAX_WINDOW_FACTOR`` times longer), so a much slower challenger's p99 comes from as many
    requests as the champion's instead of a window's slowest few.

    Args:
        champion_dir: Folder with ``config.pbtxt`` and a version folder ``1/`` (the champion).
        challenger_dir: The same for the challenger.
        concurrency: Client concurrency (the champion's chosen one).
        passes: Passes per model (>= 3).
        max_regression: Allowed p99 regression (default ``settings.max_p99_regression``).
        min_regression_ms: Smallest absolute regression that rejects, milliseconds (default
            ``settings.min_p99_regression_ms``).
        measurement_ms: perf_analyzer's first window per model, milliseconds.
        samples: ``{"champion"|"challenger": validation feeds}`` used as ``--input-data``.
        stability_percentage: perf_analyzer's stability criterion per pass (the gate's own noise
            band handles pass-to-pass variation, so it is looser than profiling's).
        min_requests: Fewest requests per window the adaptive windows aim at (default
            ``settings.perf_gate_min_requests``).
        tools: The Triton tools (``perf_analyzer``, the scratch Triton starter).
        settings: Default ``max_regression``, ``min_regression_ms``, ``min_requests`` and stability
            criterion.

    Returns:
        The verdict, the concurrency and every measured pass per model (each with its window).

    Raises:
        ValueError: ``passes`` is below 3.
        TransientError: perf_analyzer or Triton failed, or fewer than 3 passes per model were
            stable (never a verdict on the model).
    """
    from model_registry.triton_config import read_config, to_pbtxt

    s = settings
    limit = s.max_p99_regression if max_regression is None else max_regression
    if passes < MIN_PASSES:
        raise ValueError(f"passes={passes} is invalid (expected >= {MIN_PASSES})")
    work = Path(tempfile.mkdtemp(prefix="tritonflow-perfgate-"))
    try:
        repo = work / "repository"
        data: dict[str, Path | None] = {}
        for role, src in (("champion", Path(champion_dir)), ("challenger", Path(challenger_dir))):
            dest = repo / role
            shutil.copytree(src, dest)
            cfg = read_config(dest / "config.pbtxt")
            cfg.name = role
            (dest / "config.pbtxt").write_text(to_pbtxt(cfg))
            sample = (samples or {}).get(role)
            data[role] = input_data_json(cfg, sample, work / f"{role}.json") if sample is not None else None
        with tools.scratch_server(repo, ["champion", "challenger"], home=work / "home",
                                  purpose="the perf gate") as url:
            measured = measure_interleaved(["champion", "challenger"], url, concurrency, tools=tools,
                                           passes=passes, settings=s, measurement_ms=measurement_ms,
                                           input_data=data, stability_percentage=stability_percentage,
                                           max_trials=10, max_measurement_ms=MAX_WINDOW_FACTOR * int(measurement_ms),
                                           min_requests=(s.perf_gate_min_requests if min_requests is None
                                                         else int(min_requests)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    try:
        verdict = p99_regression([p.p99_ms for p in measured["champion"]],
                                 [p.p99_ms for p in measured["challenger"]], max_regression=limit,
                                 min_regression_ms=(s.min_p99_regression_ms if min_regression_ms is None
                                                    else min_regression_ms))
    except ValueError as exc:  # unstable passes: the measurement failed, not the model
        raise TransientError(f"p99 regression gate: {exc}; perf_analyzer could not stabilise "
                             f"({ {k: [p.stable for p in v] for k, v in measured.items()} })") from exc
    return PerfGateResult(verdict, int(concurrency), measured)
