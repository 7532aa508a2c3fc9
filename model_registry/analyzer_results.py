"""Model Analyzer outputs: the results CSV, per-pass stability and the choice of the best config.

:func:`read_results_csv` reads ``metrics-model-inference.csv`` into :class:`ProfileRow` items,
:func:`stability` drops a configuration whose throughput coefficient of variation across passes
exceeds ``analyzer_stability_cv`` (or that perf_analyzer reported unstable,
:func:`unstable_configs_from_log`), and :func:`choose_best` picks the highest throughput among the
stable configurations within the p99 latency limit; :func:`chosen_config` reads its
``config.pbtxt``. Used by :mod:`model_registry.analyzer`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ground.exceptions import MeasurementUnstableError, ProfilingError
from ground.settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from tritonclient.grpc import model_config_pb2

#: Model Analyzer's inference results file (``<export_path>/results/``).
RESULTS_CSV = "metrics-model-inference.csv"
#: perf_analyzer's message when its stability criterion is not met (perf_analyzer source).
PA_UNSTABLE_MESSAGE = "Failed to obtain stable measurement"


@dataclasses.dataclass(frozen=True)
class ProfileRow:
    """One measured (config, concurrency) from Model Analyzer's results CSV.

    Attributes:
        config: Tried config folder name (``<model>_config_N`` or ``..._config_default``).
        model: Model name.
        batch: Client batch size.
        concurrency: Client concurrency.
        throughput: Inferences per second.
        p99_latency_ms: p99 latency, milliseconds.
        instance_group: Model Analyzer's instance group text (e.g. ``1:CPU``).
        max_batch_size: The config's ``max_batch_size``.
        satisfies_constraints: Model Analyzer's own verdict.
    """

    config: str
    model: str
    batch: int
    concurrency: int
    throughput: float
    p99_latency_ms: float
    instance_group: str
    max_batch_size: int
    satisfies_constraints: bool


def _num(row: Mapping[str, str], *keys: str, default: float = math.nan) -> float:
    for k in keys:
        if k in row and str(row[k]).strip() not in {"", "None"}:
            try:
                return float(row[k])
            except ValueError:
                return default
    return default


def read_results_csv(path_or_text: str | os.PathLike) -> list[ProfileRow]:
    """Parse Model Analyzer's ``metrics-model-inference.csv`` (path or CSV text).

    Columns used: Model, Batch, Concurrency, Model Config Path, Instance Group, Max Batch Size,
    Satisfies Constraints, Throughput (infer/sec), p99 Latency (ms).

    Raises:
        ProfilingError: The file is missing or lacks the throughput/latency columns.
    """
    text = str(path_or_text)
    if "\n" not in text:
        p = Path(text)
        if not p.is_file():
            raise ProfilingError(f"Model Analyzer results {text!r} do not exist (no config was measured)")
        text = p.read_text()
    reader = csv.DictReader(io.StringIO(text))
    fields = reader.fieldnames or []
    need = ["Model Config Path", "Throughput (infer/sec)", "p99 Latency (ms)"]
    missing = [f for f in need if f not in fields]
    if missing:
        raise ProfilingError(f"Model Analyzer results lack columns {missing} (have {fields})")
    rows = []
    for r in reader:
        rows.append(ProfileRow(
            config=r["Model Config Path"].strip(),
            model=r.get("Model", "").strip(),
            batch=int(_num(r, "Batch", default=1)),
            concurrency=int(_num(r, "Concurrency", default=0)),
            throughput=_num(r, "Throughput (infer/sec)"),
            p99_latency_ms=_num(r, "p99 Latency (ms)"),
            instance_group=r.get("Instance Group", "").strip(),
            max_batch_size=int(_num(r, "Max Batch Size", default=0)),
            satisfies_constraints=str(r.get("Satisfies Constraints", "")).strip().lower() in {"yes", "true"},
        ))
    return rows


def read_perf_passes(path_or_text: str | os.PathLike) -> dict[str, list[float]]:
    """Throughput per pass per config from repeated perf_analyzer passes.

    Reads a ``config,concurrency,pass,throughput_infer_per_s,...`` CSV; passes are ordered by ``pass``.
    """
    text = str(path_or_text)
    if "\n" not in text:
        text = Path(text).read_text()
    rows = sorted(csv.DictReader(io.StringIO(text)), key=lambda r: (r["config"], int(r.get("pass", 0) or 0)))
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["config"].strip(), []).append(float(r["throughput_infer_per_s"]))
    return out


@dataclasses.dataclass(frozen=True)
class Stability:
    """Stability of one config's throughput across passes.

    Attributes:
        config: Config name.
        passes: Number of passes.
        mean: Mean throughput, infer/s.
        cv: Coefficient of variation (population std / mean).
        stable: ``cv <= threshold`` and perf_analyzer did not report instability.
        reason: Why it is unstable ("" when stable).
    """

    config: str
    passes: int
    mean: float
    cv: float
    stable: bool
    reason: str


def stability(
    passes: Mapping[str, Sequence[float]],
    *,
    threshold: float | None = None,
    unstable_flags: Iterable[str] = (),
    settings: Settings,
) -> dict[str, Stability]:
    """Coefficient of variation of each config's throughput passes.

    Args:
        passes: ``{config: [throughput per pass]}``.
        threshold: Largest stable CV (default ``settings.analyzer_stability_cv``, 0.1).
        unstable_flags: Configs for which perf_analyzer reported "Failed to obtain stable
            measurement".
        settings: Settings the defaults come from.
    """
    import numpy as np

    limit = settings.analyzer_stability_cv if threshold is None else threshold
    flagged = set(unstable_flags)
    out = {}
    for config, values in passes.items():
        v = np.asarray(list(values), dtype=float)
        mean = float(v.mean()) if v.size else math.nan
        cv = float(v.std() / mean) if v.size and mean > 0 else math.inf
        reason = ""
        if config in flagged:
            reason = "perf_analyzer could not obtain a stable measurement"
        elif not v.size:
            reason = "no measurement"
        elif not cv <= limit:
            reason = (
                f"unstable: throughput coefficient of variation {cv:.2f} > {limit:g} across "
                f"{v.size} passes (min {v.min():.1f}, max {v.max():.1f} infer/s)"
            )
        out[config] = Stability(config, int(v.size), mean, cv, reason == "", reason)
    return out


def unstable_configs_from_log(text: str, config_names: Iterable[str]) -> set[str]:
    """Configs whose perf_analyzer run reported instability in a Model Analyzer log.

    A config is flagged when the stability failure message appears after the line that names it
    and before the next config's line.
    """
    names = sorted(set(config_names), key=len, reverse=True)
    flagged: set[str] = set()
    current = None
    for line in text.splitlines():
        for n in names:
            if n in line:
                current = n
                break
        if PA_UNSTABLE_MESSAGE in line and current:
            flagged.add(current)
    return flagged


@dataclasses.dataclass
class Selection:
    """The chosen config and why the others were not chosen.

    Attributes:
        model: Model name.
        best: Winning config name.
        best_row: Its measurement (best concurrency within the constraint).
        ranking: ``[(config, throughput)]`` of eligible configs, best first (ranked by the mean
            of its passes when passes were given, else by the measured throughput).
        dropped: ``{config: reason}`` for every config left out.
        p99_latency_ms: The constraint used.
    """

    model: str
    best: str
    best_row: ProfileRow
    ranking: list[tuple[str, float]]
    dropped: dict[str, str]
    p99_latency_ms: float

    def report(self) -> str:
        """Human-readable summary: the choice, the ranking and each dropped config's reason."""
        lines = [
            f"model {self.model!r}: chose {self.best} ({self.best_row.throughput:.1f} infer/s, "
            f"p99 {self.best_row.p99_latency_ms:.2f} ms <= {self.p99_latency_ms:g} ms, "
            f"concurrency {self.best_row.concurrency})"
        ]
        lines += [f"  rank {i + 1}: {c} {t:.1f} infer/s" for i, (c, t) in enumerate(self.ranking)]
        lines += [f"  dropped {c}: {r}" for c, r in sorted(self.dropped.items())]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for MLflow)."""
        return {"model": self.model, "best": self.best, "best_row": dataclasses.asdict(self.best_row),
                "ranking": self.ranking, "dropped": self.dropped, "p99_latency_ms": self.p99_latency_ms}


def choose_best(
    rows: Sequence[ProfileRow],
    *,
    model_name: str,
    passes: Mapping[str, Sequence[float]] | None = None,
    unstable: Iterable[str] = (),
    p99_latency_ms: float | None = None,
    stability_cv: float | None = None,
    settings: Settings,
) -> Selection:
    """Pick the highest-throughput config whose p99 latency meets the constraint, among stable ones.

    A config is dropped (with the reason recorded) when perf_analyzer flagged it unstable, its
    passes' CV exceeds ``stability_cv``, none of its measurements is finite, or every
    measurement violates ``p99 <= p99_latency_ms``.

    Args:
        rows: Measurements (:func:`read_results_csv`).
        model_name: Used in messages.
        passes: Optional ``{config: [throughput per pass]}`` from repeated measurements.
        unstable: Configs perf_analyzer reported unstable.
        p99_latency_ms: Constraint (default ``settings.analyzer_p99_latency_ms``).
        stability_cv: CV threshold (default ``settings.analyzer_stability_cv``).
        settings: Settings the defaults come from.

    Raises:
        ProfilingError: No candidate survived; the message names the model and each reason. An
            empty or all-dropped table never yields a "best config".
        MeasurementUnstableError: Every candidate was dropped for instability alone (none for its
            latency): the measurements say nothing about the model (a busy host), so this is an
            infrastructure error, not a :class:`ProfilingError`.
    """
    s = settings
    limit = s.analyzer_p99_latency_ms if p99_latency_ms is None else p99_latency_ms
    stab = stability(passes or {}, threshold=stability_cv, unstable_flags=unstable, settings=s)
    flagged = set(unstable)
    by_config: dict[str, list[ProfileRow]] = {}
    for r in rows:
        by_config.setdefault(r.config, []).append(r)
    for c in list(passes or {}) + list(flagged):
        by_config.setdefault(c, [])
    dropped: dict[str, str] = {}
    unstable_only: set[str] = set()  # dropped for how they were measured, not for what was measured
    eligible: list[tuple[str, float, ProfileRow]] = []
    for config, measured in by_config.items():
        st = stab.get(config)
        if config in flagged:
            dropped[config] = "perf_analyzer could not obtain a stable measurement"
            unstable_only.add(config)
            continue
        if st is not None and not st.stable:
            dropped[config] = st.reason
            unstable_only.add(config)
            continue
        finite = [r for r in measured if math.isfinite(r.throughput) and math.isfinite(r.p99_latency_ms)]
        if not finite:
            if st is not None and measured == []:
                # Passes only (no Model Analyzer row): rank by the pass mean.
                row = ProfileRow(config, model_name, 1, 0, st.mean, math.nan, "", 0, True)
                eligible.append((config, st.mean, row))
            else:
                dropped[config] = "no finite measurement"
                unstable_only.add(config)
            continue
        ok = [r for r in finite if r.p99_latency_ms <= limit]
        if not ok:
            worst = min(r.p99_latency_ms for r in finite)
            dropped[config] = f"p99 latency {worst:.2f} ms > constraint {limit:g} ms at every concurrency"
            continue
        best_row = max(ok, key=lambda r: r.throughput)
        score = st.mean if st is not None else best_row.throughput
        eligible.append((config, score, best_row))
    if not eligible:
        reasons = "; ".join(f"{c}: {r}" for c, r in sorted(dropped.items())) or "no configuration was measured"
        if dropped and set(dropped) == unstable_only:
            raise MeasurementUnstableError(
                f"profiling model {model_name!r}: no configuration could be measured stably ({reasons}); "
                "the host is too busy for a stable measurement, which says nothing about the model"
            )
        raise ProfilingError(
            f"profiling model {model_name!r} produced no usable configuration ({reasons}); "
            "nothing is published as best config"
        )
    eligible.sort(key=lambda e: e[1], reverse=True)
    best, _, row = eligible[0]
    return Selection(model_name, best, row, [(c, sc) for c, sc, _ in eligible], dropped, float(limit))


def chosen_config(
    output_model_repository: str | os.PathLike, selection: Selection, *, model_name: str | None = None
) -> "model_config_pb2.ModelConfig":
    """Read the winning config from Model Analyzer's output repository, renamed to the model.

    Raises:
        ProfilingError: The config file is missing.
    """
    from model_registry.triton_config import read_config

    path = Path(output_model_repository) / selection.best / "config.pbtxt"
    if not path.is_file():
        raise ProfilingError(f"chosen config {str(path)!r} does not exist (Model Analyzer output missing)")
    cfg = read_config(path)
    cfg.name = model_name or selection.model
    return cfg
