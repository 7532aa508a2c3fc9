"""Quantile sketches of a streamed window: the current side of KS and Wasserstein at scale.

A window too large for the exact path (:mod:`drift_checks.summaries`) keeps, per numeric
feature, a KLL sketch (Karnin, Lang, Liberty, "Optimal Quantile Approximation in Streams", FOCS
2016) from the Apache DataSketches library (``datasketches.kll_doubles_sketch``): a few thousand
weighted values whose cumulative weights approximate the window's empirical CDF, mergeable
across record batches, files, processes and Spark partitions. PSI, JS and chi-square never use
it: they are computed from exact bin and category counts.

**Error bounds** (``eps`` = the sketch's double-sided normalised rank error,
``kll_doubles_sketch.get_normalized_rank_error(k, True)``; k = 4096 (the default,
``TRITONFLOW_DRIFT_SKETCH_K``): eps = 9.6e-4; k = 200: 1.7e-2). DataSketches fits its bounds to
the 99th percentile of the largest rank error measured in thousands of trials: the single-sided
one (7.1e-4 at k = 4096) was exceeded once in 40 sketches of 10M values
(``benchmarks/drift_scale.py``: 8.0e-4), so the larger double-sided one is the stated bound. It
is a probabilistic bound, not a worst case:

* KS statistic: ``|D_sketch - D| <= eps`` (D is a supremum of CDF differences; the reference
  side is exact). The p-value is a decreasing function of D, so it lies between
  ``p(D_sketch + eps)`` and ``p(D_sketch - eps)``.
* Wasserstein-1: ``|W_sketch - W| <= eps * (max - min)`` of the window's finite values (both
  CDFs agree outside ``[min, max]``: the sketch keeps the exact extremes), divided by the
  reference standard deviation for the normalised value.
* A sketch that never compacted (a window of at most k rows) holds every value:
  :func:`sketch_sample` then returns the exact sample and the statistics are those of the exact
  path, bit for bit.

Both bounds are reported with each statistic (``extra["error_bound"]``) and tested against the
exact values (``tests/drift_checks/test_streaming.py``).

**Input order**: the summaries feed each record batch to the sketch in sorted runs of 256 values
(:func:`update_sketch`): the bound does not depend on the order of the stream, and DataSketches
compacts sorted runs about a quarter faster. Tested with random, ascending and descending streams.

**Reproducibility**: KLL compaction is randomised, so summarising the same window
twice can give slightly different sketches. The hourly check therefore summarises a window once,
stores the summary (:mod:`drift_checks.streaming`) and recomputes every later decision (rerun,
backfill) from the stored summary: the same window always gives the same statistics.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from drift_checks.numeric_statistics import NumericSample

#: Default KLL ``k``: stated rank error 9.6e-4, about 12,000 retained values and
#: 97 KB serialised per feature, whatever the window size.
DEFAULT_SKETCH_K = 4096


def new_sketch(k: int = DEFAULT_SKETCH_K):
    """An empty KLL sketch of doubles.

    Raises:
        ValueError: ``k`` outside DataSketches' range [8, 65535].
    """
    from datasketches import kll_doubles_sketch

    if not 8 <= int(k) <= 65535:
        raise ValueError(f"sketch k={k!r}; expected an integer in [8, 65535], e.g. {DEFAULT_SKETCH_K}")
    return kll_doubles_sketch(int(k))


#: Values reach a sketch in runs of this many, each sorted (:func:`update_sketch`).
SORTED_RUN = 256


def update_sketch(sketch, values: np.ndarray) -> None:
    """Add finite values to a KLL sketch, in runs of :data:`SORTED_RUN` values each sorted.

    The order in which values reach a KLL sketch leaves its error bound unchanged: the KLL
    bound holds for every order of the stream chosen without seeing the sketch's random bits,
    and sorting a batch in runs sees only the values. Sorted runs make DataSketches' compaction
    of its lowest level (a sort of a few dozen values at a time) cheaper: measured on the 2-core
    AMD EPYC VM of ``benchmarks/drift_scale.py`` at k = 4096, about 46 ns per value fed as they
    come, 34 ns in runs of 256 including numpy's sort of the runs (about 3 ns per value).
    Longer runs cost more to sort than they save.

    Args:
        sketch: A KLL sketch of doubles (:func:`new_sketch`), updated in place.
        values: 1-D finite values (any float dtype; NaN and infinities must already be removed).
    """
    x = np.asarray(values, dtype="float64").ravel()
    whole = x.size - x.size % SORTED_RUN
    if whole:  # np.sort returns a new writable, contiguous array, as the binding needs
        sketch.update(np.sort(x[:whole].reshape(-1, SORTED_RUN), axis=1).ravel())
    if whole < x.size:
        sketch.update(np.sort(x[whole:]))


def sketch_from_bytes(data: bytes):
    """A KLL sketch from :meth:`serialize` bytes."""
    from datasketches import kll_doubles_sketch

    return kll_doubles_sketch.deserialize(data)


def rank_error(k: int) -> float:
    """The stated error bound ``eps`` of a KLL sketch with this ``k``.

    The double-sided normalised rank error, see the module docstring.
    """
    from datasketches import kll_doubles_sketch

    return float(kll_doubles_sketch.get_normalized_rank_error(int(k), True))


@dataclasses.dataclass(frozen=True)
class SketchSample(NumericSample):
    """The current side of a numeric feature summarised by streaming.

    ``values`` are the sketch's retained values (ascending), ``weights`` how many window values
    each stands for (``weights.sum() == n_finite``).

    Attributes:
        weights: int64 weight of each retained value.
        n_finite: Finite values of the window.
        psi_edges / psi_counts: The reference's PSI bin edges the window was counted on, and the
            exact counts.
        rank_error: The sketch's normalised rank error (see the module docstring).
        v_min / v_max: Exact smallest and largest finite value.
    """

    weights: np.ndarray | None = None
    n_finite: int = 0
    psi_edges: np.ndarray | None = None
    psi_counts: np.ndarray | None = None
    rank_error: float = 0.0
    v_min: float = 0.0
    v_max: float = 0.0

    def d_and_w1(self, reference_sorted: np.ndarray) -> tuple[float, float]:
        """(KS statistic D, Wasserstein-1) between the exact reference ECDF and the sketch's ECDF.

        The sketch's ECDF is weighted (``F(x) = weight of retained values <= x / n_finite``); both are
        evaluated at every distinct value of both sides. The two sorted sides are merged by a stable
        argsort of their concatenation (two ascending runs: a linear merge); running counts of
        reference values and of sketch weight along the merge, read at the last copy of each value,
        are the two ECDFs there (``side="right"``): O(m + r) for a reference of m and r retained
        values, no binary search. Bit for bit what ``np.union1d`` and ``np.searchsorted`` give.
        """
        if self.weights is None:
            raise ValueError("d_and_w1 needs the sketch's weights")
        a = np.asarray(reference_sorted, dtype="float64")
        both = np.concatenate([a, np.asarray(self.values, dtype="float64")])
        order = np.argsort(both, kind="stable")
        allv = both[order]
        from_ref = order < a.size
        count_ref = np.cumsum(from_ref)
        weight = np.zeros(both.size, dtype="int64")
        weight[~from_ref] = np.asarray(self.weights, dtype="int64")[order[~from_ref] - a.size]
        count_cur = np.cumsum(weight)
        last = np.empty(both.size, dtype=bool)  # the last copy of each value
        np.not_equal(allv[1:], allv[:-1], out=last[:-1])
        last[-1] = True
        allv = allv[last]
        gap = count_ref[last] / a.size - count_cur[last] / float(count_cur[-1])
        return float(np.max(np.abs(gap))), float(np.sum(np.abs(gap[:-1]) * np.diff(allv)))

    def wasserstein_error_bound(self) -> float:
        """Bound of ``|W_sketch - W|`` (raw units): ``rank_error * (max - min)``."""
        return float(self.rank_error * (self.v_max - self.v_min))


def _parse_compacted(data: bytes, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(items, weights) from the bytes of a compacted KLL sketch of doubles (``None``: another layout).

    DataSketches' full layout (``kll_sketch::serialize``, preamble of 5 ints): 8 bytes of
    preamble (preamble ints, serial version, family 15, flags, k, m, unused), n (uint64), min k
    (uint16), number of levels L (uint8), 1 unused byte, the start of each level L x uint32 (the
    last level ends at the end), min and max (float64), then the retained items level by level;
    an item of level ``i`` stands for ``2**i`` values. Checked: the weights add up to ``n``.
    """
    if len(data) < 20 or data[0] != 5 or data[2] != 15:
        return None
    levels = data[18]
    start = 20 + 4 * levels + 16
    if levels == 0 or len(data) < start or (len(data) - start) % 8:
        return None
    bounds = np.frombuffer(data, dtype="<u4", count=levels, offset=20).astype("int64")
    items = np.frombuffer(data, dtype="<f8", offset=start).astype("float64")
    sizes = np.diff(np.append(bounds - bounds[0], items.size))
    if np.any(sizes < 0) or levels > 62:
        return None
    weights = np.repeat(np.left_shift(np.int64(1), np.arange(levels, dtype="int64")), sizes)
    if int(weights.sum()) != int(n):
        return None
    return items, weights


def retained_items(sketch) -> tuple[np.ndarray, np.ndarray]:
    """(retained items, weight of each) of a KLL sketch of doubles, unsorted.

    The (item, weight) pairs of the sketch, read from its serialised bytes with numpy when it
    compacted (about 12,000 pairs at k = 4096: a Python loop over them costs a few ms per
    feature), else by iterating it. The weights add up to ``sketch.n`` and give the sketch's own
    ``get_rank``; DataSketches 5.2's Python iterator misweighs some merged sketches (a small
    sketch that absorbed a compacted one: weights adding up to less than ``n``), the bytes do not.
    """
    if sketch.is_empty():
        return np.empty(0, dtype="float64"), np.empty(0, dtype="int64")
    if sketch.is_estimation_mode():
        parsed = _parse_compacted(sketch.serialize(), sketch.n)
        if parsed is not None:
            return parsed
    pairs = list(sketch)
    items = np.fromiter((v for v, _ in pairs), dtype="float64", count=len(pairs))
    weights = np.fromiter((w for _, w in pairs), dtype="int64", count=len(pairs))
    return items, weights


def sketch_sample(sketch, *, n_rows: int, n_null: int, n_pos_inf: int, n_neg_inf: int,
                  psi_edges: np.ndarray, psi_counts: np.ndarray | None) -> NumericSample:
    """The current side for :func:`drift_checks.statistics.score_numeric`.

    Args:
        sketch: KLL sketch of the window's finite values.
        n_rows: Rows of the window, nulls and infinities included.
        n_null: Null / NaN values of the window.
        n_pos_inf: ``+inf`` values of the window.
        n_neg_inf: ``-inf`` values of the window.
        psi_edges: The reference's PSI bin edges the window was counted on.
        psi_counts: Exact counts of the window in those bins (needed only when the sketch
            compacted).

    Returns:
        A plain :class:`NumericSample` (every value, sorted) when the sketch never compacted, so
        small windows score exactly as on the exact path; else a :class:`SketchSample`.

    Raises:
        ValueError: The sketch compacted and ``psi_counts`` is ``None``.
    """
    items, weights = retained_items(sketch)
    order = np.argsort(items, kind="stable")
    items, weights = items[order], weights[order]
    if not sketch.is_estimation_mode():
        return NumericSample(values=np.repeat(items, weights), n_rows=int(n_rows), n_null=int(n_null),
                             n_pos_inf=int(n_pos_inf), n_neg_inf=int(n_neg_inf))
    if psi_counts is None:
        raise ValueError("a compacted sketch needs the window's exact counts in the reference's PSI bins")
    return SketchSample(values=items, n_rows=int(n_rows), n_null=int(n_null), n_pos_inf=int(n_pos_inf),
                        n_neg_inf=int(n_neg_inf), weights=weights, n_finite=int(sketch.n),
                        psi_edges=np.asarray(psi_edges, dtype="float64"),
                        psi_counts=np.asarray(psi_counts, dtype="int64"),
                        rank_error=float(sketch.normalized_rank_error(True)),
                        v_min=float(sketch.get_min_value()), v_max=float(sketch.get_max_value()))
