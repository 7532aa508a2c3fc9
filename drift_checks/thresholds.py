"""Drift thresholds: one per (model, reference, feature, statistic), with a floor and a ceiling.

Where a threshold comes from, in order (:func:`resolve_thresholds`):

1. ``dynamic``: the ``quantile`` (default 0.95, "P95") of the statistic's past hourly values
   over the previous ``window_days`` (default 30 days; the current hour excluded), once at least
   ``min_history`` (default 48) values TAUGHT it. For p-values (drift when LOW) the ``1 - quantile``
   quantile (P5). Only values computed against the SAME reference count: after a promotion the new
   champion's statistics are never judged by thresholds learned against the old champion's
   reference (the history store keys every value by ``reference_id``).
2. ``reference``: until then, the same quantile of the statistic over time-ordered CHUNKS of the
   reference itself, each chunk the size of the current window (:func:`calibrate_from_reference`):
   how much windows of this size vary while nothing has drifted, seasons and sampling noise
   included. It needs at least :data:`MIN_REFERENCE_CHUNKS` chunks (at most
   :data:`MAX_REFERENCE_CHUNKS` are scored, spread evenly over the reference). This is the
   calibration judged against the reference: it exists from the first hour, so early windows that
   have already drifted cannot teach the threshold their drift. (NannyML calibrates its univariate
   drift thresholds on reference chunks the same way.) Guard statistics (unseen-category share) are
   always 0 on chunks of the reference and skip this step.
3. ``static``: the registry's static threshold (:mod:`drift_checks.statistics`).

Bounds, applied to every source:

* **floor** (no degenerate threshold): a distance threshold is never below the statistic's
  minimum meaningful effect (PSI 0.1, normalised Wasserstein 0.1, JS 0.05, unseen share 0.01),
  and a p-value threshold never above its static value (0.05). With the strict comparison of
  :meth:`~drift_checks.statistics.Statistic.is_drift`, a statistic that repeats the same value
  hour after hour can never alarm by equality.
* **reference bound**: a dynamic threshold is never tighter than the reference one (served
  windows calmer than the reference do not make every return to the reference's own variation an
  alarm); it can only rise, up to the ceiling;
* **ceiling** (strong effect): ``max(strong_effect, ceiling_factor * reference threshold)`` for
  distances (``ceiling_factor`` default 2; without a reference calibration, the registry's
  ``strong_effect``: PSI 0.25, Wasserstein 0.5, JS 0.2, unseen share 0.2). A dynamic threshold
  never exceeds it, and a value above it is a *strong* effect (:mod:`drift_checks.policy`).

Which values teach (``taught`` in the history store; decided by :mod:`drift_checks.verdict`): a
value of a valid feature whose effect was not strong, in a window whose contract passed and
whose dataset verdict was not drift. A drifted history can therefore raise a threshold at most to
the ceiling, never past a real shift.

Per-feature weights give the weighted dataset score :func:`weighted_score`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Mapping

import numpy as np

from drift_checks import statistics as st
from drift_checks.history import HistoryStore
from drift_checks.statistics import REGISTRY
from ground.exceptions import SettingsError

if TYPE_CHECKING:
    from ground.settings import Settings

#: Default look-back of the dynamic threshold (days).
DEFAULT_WINDOW_DAYS = 30
#: Default quantile of distance statistics (P95); p-values use 1 - quantile (P5).
DEFAULT_QUANTILE = 0.95
#: Taught hourly values needed before the dynamic threshold replaces the reference one (windows).
DEFAULT_MIN_HISTORY = 48
#: Default ceiling factor: a learned threshold never exceeds this multiple of the reference's own
#: threshold (nor the statistic's strong effect, whichever is larger).
DEFAULT_CEILING_FACTOR = 2.0
#: Fewest reference chunks for a ``reference`` threshold (fewer: the static one applies).
MIN_REFERENCE_CHUNKS = 10
#: Most reference chunks scored per calibration (spread evenly over the reference).
MAX_REFERENCE_CHUNKS = 200
#: Smallest chunk (rows) worth calibrating on.
MIN_CHUNK_ROWS = 5


def settings_fields(settings: Any, overrides: dict[str, Any], **fields: tuple) -> dict[str, Any]:
    """Keyword arguments of a drift policy object, from the settings in effect.

    Args:
        settings: The :class:`ground.settings.Settings` in effect (the caller reads them); an
            object without one of the attributes gives that field its default.
        overrides: Field values that replace the settings' ones (taken as given).
        **fields: ``field=(settings attribute, default)`` or ``(attribute, default, convert)``,
            where ``convert`` maps the setting's value to the field's (e.g. hours to a timedelta).

    Returns:
        ``{field: value}``.
    """
    kw: dict[str, Any] = {}
    for field, (attr, default, *convert) in fields.items():
        value = getattr(settings, attr, default)
        kw[field] = convert[0](value) if convert else value
    kw.update(overrides)
    return kw


class SettingsPolicy:
    """A frozen policy dataclass read from the settings and checked field by field.

    Subclasses declare two tables: ``SETTINGS`` (``field -> (settings attribute, default[,
    convert])``, see :func:`settings_fields`) and ``CHECKS`` (``field -> (predicate, what is
    expected)``); a value failing its predicate raises ``SettingsError`` naming the field, the
    value and what was expected.
    """

    SETTINGS: ClassVar[dict[str, tuple]] = {}
    CHECKS: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {}

    def __post_init__(self) -> None:
        """Check every field against ``CHECKS``.

        Raises:
            SettingsError: A field's value fails its check.
        """
        for field, (ok, expected) in self.CHECKS.items():
            value = getattr(self, field)
            if not ok(value):
                raise SettingsError(f"{field}={value!r}; expected {expected}")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> Any:
        """The policy from the settings in effect (``SETTINGS``), then ``overrides``.

        Args:
            settings: The settings in effect, read by the caller (a pipeline, the CLI).
            **overrides: Field values that replace the settings' ones.

        Returns:
            The policy (an instance of the subclass).

        Raises:
            SettingsError: A value fails its check.
        """
        return cls(**settings_fields(settings, overrides, **cls.SETTINGS))

@dataclasses.dataclass(frozen=True)
class ThresholdPolicy(SettingsPolicy):
    """How thresholds are chosen.

    Attributes:
        window_days: Look-back in days.
        quantile: Quantile for distance statistics, in (0.5, 1); p-values use ``1 - quantile``.
        min_history: Taught hourly values required before the dynamic threshold applies.
        static: Overrides of the registry's static thresholds ``{statistic: value}``.
        ceiling_factor: Multiple of the reference threshold a learned threshold may reach (>= 1).
    """

    window_days: float = DEFAULT_WINDOW_DAYS
    quantile: float = DEFAULT_QUANTILE
    min_history: int = DEFAULT_MIN_HISTORY
    static: Mapping[str, float] = dataclasses.field(default_factory=dict)
    ceiling_factor: float = DEFAULT_CEILING_FACTOR

    SETTINGS: ClassVar[dict[str, tuple]] = {
        "window_days": ("drift_history_window_days", DEFAULT_WINDOW_DAYS),
        "quantile": ("drift_quantile", DEFAULT_QUANTILE),
        "min_history": ("drift_min_history_windows", DEFAULT_MIN_HISTORY),
        "ceiling_factor": ("drift_ceiling_factor", DEFAULT_CEILING_FACTOR),
    }
    CHECKS: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {
        "quantile": (lambda q: 0.5 < q < 1, "a number in (0.5, 1), e.g. 0.95"),
        "window_days": (lambda d: d > 0, "> 0 days, e.g. 30"),
        "min_history": (lambda n: n >= 1, ">= 1 windows, e.g. 48"),
        "ceiling_factor": (lambda f: f >= 1 and math.isfinite(f), "a number >= 1, e.g. 2"),
    }

    def tail_quantile(self, statistic: str) -> float:
        """The quantile used for ``statistic``: ``quantile`` or ``1 - quantile`` for p-values."""
        return 1 - self.quantile if REGISTRY[statistic].direction == "p_value" else self.quantile

    def static_threshold(self, statistic: str) -> float:
        """The fixed threshold of ``statistic``: the configured override, else the registry default."""
        return float(self.static.get(statistic, REGISTRY[statistic].default_threshold))


@dataclasses.dataclass(frozen=True)
class Threshold:
    """The threshold applied to one (feature, statistic) in one hour.

    Attributes:
        value: Threshold value (inside the floor/ceiling bounds).
        source: ``"dynamic"`` (taught history), ``"reference"`` (reference chunks) or ``"static"``.
        n_history: Taught hourly values in the look-back window (same reference).
        quantile: Quantile used when dynamic or reference, else ``None``.
        floor: Minimum effect (distances) / highest allowed p-value threshold.
        ceiling: Strong-effect level (distances); ``None`` for p-values.
        reference_chunks: Reference chunks behind a ``reference`` value (0: none).
    """

    value: float
    source: str
    n_history: int
    quantile: float | None = None
    floor: float | None = None
    ceiling: float | None = None
    reference_chunks: int = 0

    def to_dict(self) -> dict:
        """JSON-able form of the threshold (every field)."""
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------- reference calibration
@dataclasses.dataclass(frozen=True)
class Calibration:
    """Quantiles of each statistic over chunks of the reference.

    Attributes:
        chunk_rows: Rows per chunk.
        n_chunks: Chunks scored.
        values: ``{(feature, statistic): tail quantile over the chunks}``.
        quantile: The quantile of ``values`` (distances; p-values use ``1 - quantile``).
        chunks: Each chunk's results in time order, ``{feature: {statistic: StatisticResult}}``
            (guards included): the reference's own windows, judged again by
            :mod:`drift_checks.budget` to calibrate the false-alarm budget.
    """

    chunk_rows: int
    n_chunks: int
    values: Mapping[tuple[str, str], float]
    quantile: float = DEFAULT_QUANTILE
    chunks: tuple[Mapping[str, Mapping[str, Any]], ...] = ()

    def at_quantile(self, quantile: float) -> "Calibration":
        """The same chunks with ``values`` at another quantile (p-values: ``1 - quantile``)."""
        if quantile == self.quantile:
            return self
        return dataclasses.replace(self, values=chunk_quantiles(self.chunks, quantile), quantile=quantile)


def chunk_quantiles(chunks: Iterable[Mapping[str, Mapping[str, Any]]], quantile: float
                     ) -> dict[tuple[str, str], float]:
    """``{(feature, statistic): tail quantile}`` of the chunks' defined values (guards skipped)."""
    collected: dict[tuple[str, str], list[float]] = {}
    for chunk in chunks:
        for col, res in chunk.items():
            for name, r in res.items():
                if r.value is not None and REGISTRY[name].role != "guard":
                    collected.setdefault((col, name), []).append(r.value)
    values = {}
    for (col, name), vals in collected.items():
        q = 1 - quantile if REGISTRY[name].direction == "p_value" else quantile
        values[(col, name)] = float(np.quantile(np.asarray(vals), q, method="linear"))
    return values


def chunk_rows_for(window_rows: int, reference_rows: int) -> int:
    """Chunk size for a window of ``window_rows`` rows (0: no calibration).

    The window size rounded to a grid of about 19 % steps (so nearby window sizes share one
    calibration). 0 when the reference holds fewer than :data:`MIN_REFERENCE_CHUNKS` such chunks:
    smaller chunks would calibrate the noise of smaller samples, not of the window (then the static
    thresholds apply).
    """
    if window_rows < 1 or reference_rows < 1:
        return 0
    grid = int(round(2 ** (round(math.log2(window_rows) * 4) / 4)))
    if grid < MIN_CHUNK_ROWS or reference_rows < MIN_REFERENCE_CHUNKS * grid:
        return 0
    return grid


def calibrate_from_reference(
    frame: Any,
    numeric: Mapping[str, st.NumericSample],
    categorical: Mapping[str, Mapping[str, int]],
    chunk_rows: int,
    *,
    quantile: float = DEFAULT_QUANTILE,
    names: Iterable[str] | None = None,
    max_chunks: int = MAX_REFERENCE_CHUNKS,
) -> Calibration:
    """Score time-ordered chunks of the reference against the whole reference.

    Args:
        frame: The reference sample in row (time) order (pandas DataFrame).
        numeric: ``{column: prepared reference}`` (:func:`~drift_checks.statistics.prepare_numeric`).
        categorical: ``{column: reference counts}``.
        chunk_rows: Rows per chunk (:func:`chunk_rows_for`); chunk ``i`` = rows
            ``[i * chunk_rows, (i + 1) * chunk_rows)``.
        quantile: Quantile of distances (p-values: ``1 - quantile``).
        names: Statistics to compute (default: every registered one; guards are skipped).
        max_chunks: Chunks scored at most, spread evenly over the reference.

    Returns:
        A :class:`Calibration` (empty ``values`` when fewer than 1 chunk fits).
    """
    n_total = len(frame) // chunk_rows if chunk_rows > 0 else 0
    if n_total < 1:
        return Calibration(chunk_rows, 0, {}, quantile)
    picks = np.unique(np.linspace(0, n_total - 1, min(n_total, max_chunks)).round().astype(int))
    wanted = list(names) if names is not None else None
    chunks = []
    for i in picks:
        chunk = frame.iloc[i * chunk_rows:(i + 1) * chunk_rows]
        results: dict[str, Mapping[str, Any]] = {}
        for col, ref in numeric.items():
            results[col] = st.score_numeric(ref, st.prepare_numeric(chunk[col]), wanted)
        for col, counts in categorical.items():
            results[col] = st.score_categorical(counts, st.category_counts(chunk[col]), reference_rows=len(frame),
                                                current_rows=len(chunk), names=wanted)
        chunks.append(results)
    return Calibration(chunk_rows, int(picks.size), chunk_quantiles(chunks, quantile), quantile, tuple(chunks))


# ------------------------------------------------------------------------------ resolution
def resolve_thresholds(
    history: HistoryStore,
    model: str,
    hour: dt.datetime,
    series: Iterable[tuple[str, str]],
    policy: ThresholdPolicy | None = None,
    *,
    reference_id: str | None = None,
    calibration: Calibration | None = None,
) -> dict[tuple[str, str], Threshold]:
    """Threshold of every (feature, statistic) for the window starting at ``hour``.

    Args:
        history: The statistics store.
        model: Model name.
        hour: Start of the current window (timezone-aware); its own values are excluded.
        series: (feature, statistic) pairs to resolve.
        policy: Threshold policy (default :class:`ThresholdPolicy`).
        reference_id: The reference the current statistics are computed against; only taught
            values of that reference count (``None``: every stored value, taught or not: the
            behaviour before thresholds were keyed by reference).
        calibration: From :func:`calibrate_from_reference` (``None``: no reference step).

    Returns:
        ``{(feature, statistic): Threshold}`` (see the module docstring for the order and bounds).
    """
    policy = policy or ThresholdPolicy()
    wanted = {(f, s): policy.tail_quantile(s) for f, s in series}
    found = history.quantiles(model, hour, policy.window_days, wanted, reference_id=reference_id,
                              taught_only=reference_id is not None)
    out = {}
    for key, fallback in reference_thresholds(wanted, policy, calibration).items():
        stat = REGISTRY[key[1]]
        value, n = found.get(key, (math.nan, 0))
        fallback = dataclasses.replace(fallback, n_history=n)
        if n >= policy.min_history and math.isfinite(value):
            v = stat.bounded(value)
            if fallback.source == "reference":  # never tighter than the reference's own variation
                v = max(v, fallback.value) if stat.direction == "distance" else min(v, fallback.value)
            if fallback.ceiling is not None:
                v = min(v, fallback.ceiling)
            out[key] = dataclasses.replace(fallback, value=v, source="dynamic", quantile=wanted[key])
        else:
            out[key] = fallback
    return out


def reference_thresholds(series: Iterable[tuple[str, str]], policy: ThresholdPolicy,
                         calibration: Calibration | None) -> dict[tuple[str, str], Threshold]:
    """The thresholds before any taught history: ``reference`` where calibrated, else ``static``.

    Args:
        series: (feature, statistic) pairs.
        policy: Threshold policy (static overrides, ceiling factor, quantile).
        calibration: From :func:`calibrate_from_reference`; used when it holds at least
            :data:`MIN_REFERENCE_CHUNKS` chunks.

    Returns:
        ``{(feature, statistic): Threshold}`` with floors and ceilings (module docstring),
        ``n_history`` 0.
    """
    usable = calibration if calibration is not None and calibration.n_chunks >= MIN_REFERENCE_CHUNKS else None
    out = {}
    for key in series:
        stat = REGISTRY[key[1]]
        cal = usable.values.get(key) if usable is not None else None
        ref_value = stat.bounded(cal) if cal is not None and math.isfinite(cal) else None
        ceiling = None
        if stat.direction == "distance":
            ceiling = float(stat.strong_effect if stat.strong_effect is not None else math.inf)
            if ref_value is not None:
                ceiling = max(ceiling, policy.ceiling_factor * ref_value)
        if ref_value is not None:
            assert usable is not None  # ref_value comes from it
            out[key] = Threshold(ref_value, "reference", 0, policy.tail_quantile(key[1]), stat.minimum_effect,
                                 ceiling, usable.n_chunks)
        else:
            out[key] = Threshold(stat.bounded(policy.static_threshold(key[1])), "static", 0, None,
                                 stat.minimum_effect, ceiling, 0)
    return out


def weighted_score(flags: Mapping[str, bool], weights: Mapping[str, float] | None = None) -> float:
    """Weighted share of flagged features: ``sum(w_i * flagged_i) / sum(w_i)``.

    Args:
        flags: ``{feature: flagged}`` of the features of the window (invalid ones count as
            flagged: they are never dropped from the denominator).
        weights: ``{feature: weight >= 0}``; missing features weigh 1.

    Returns:
        Score in [0, 1]; 0.0 when no feature (or only zero weights) was scored.

    Raises:
        SettingsError: A weight is negative or not finite.
    """
    weights = weights or {}
    total = hit = 0.0
    for f, flagged in flags.items():
        w = float(weights.get(f, 1.0))
        if not math.isfinite(w) or w < 0:
            raise SettingsError(f"weight of feature {f!r} is {w!r}; expected a finite number >= 0")
        total += w
        hit += w if flagged else 0.0
    return hit / total if total > 0 else 0.0
