"""PSI binning as pure functions over values and bin counts (the drift registry's PSI).

Three steps, so counts accumulated anywhere (a streamed window, stored hourly histograms, Spark
partitions) give exactly the PSI of the raw values: :func:`psi_edges` (the reference's bins),
:func:`bin_counts` (values -> counts), :func:`psi_from_counts` (two count vectors -> PSI).

Bins: the reference's deciles (:data:`PSI_BINS`; bin ``i`` holds ``(edge[i-1], edge[i]]``, outer
bins open, duplicate edges merged); a reference with at most :data:`PSI_BINS` distinct values
(labels, rounded scores, small integer codes) gets one bin per distinct value plus one bin for
every other value, so values the reference never had do not hide in a neighbouring bin.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

#: Number of reference-quantile bins used by PSI (deciles, as in common PSI practice).
PSI_BINS = 10
#: Floor applied to bin proportions in PSI and to proportions in Jensen-Shannon, so the
#: logarithm stays finite. Evidently uses the same value (``np.where(p == 0, 0.0001, p)``).
PSI_EPSILON = 1e-4
#: Up to this many edges, unsorted values are counted with one comparison pass per edge (a
#: streamed record batch: about 1 ns per value and edge instead of a binary search per value).
_FEW_EDGES = 16


@dataclasses.dataclass(frozen=True)
class PsiBins:
    """PSI bins of one reference.

    Attributes:
        edges: Quantile bins: inner edges ascending (bin ``i`` holds ``(edges[i-1], edges[i]]``,
            outer bins open). Discrete bins: the reference's distinct values (one bin each, plus
            a last bin for every other value).
        discrete: Which of the two layouts.
    """

    edges: np.ndarray
    discrete: bool

    @property
    def n_bins(self) -> int:
        """Number of bins: one more than the inner edges (the outer bins are open-ended)."""
        return int(self.edges.size + 1)


def psi_edges(reference_sorted: np.ndarray, bins: int = PSI_BINS) -> PsiBins:
    """PSI bins of a reference (finite values, sorted ascending).

    Args:
        reference_sorted: From :func:`prepare_numeric` (``.values``).
        bins: Quantile bins (>= 2).

    Returns:
        :class:`PsiBins`: one bin per distinct value when the reference has at most ``bins``
        distinct values, else the reference's ``bins``-quantiles (duplicate edges merged).

    Raises:
        ValueError: ``bins < 2`` or an empty reference.
    """
    if bins < 2:
        raise ValueError(f"bins={bins!r}; expected >= 2")
    a = np.asarray(reference_sorted, dtype="float64")
    if a.size == 0:
        raise ValueError("psi_edges needs a non-empty reference")
    distinct = a[np.concatenate([[True], a[1:] != a[:-1]])]
    if distinct.size <= bins:
        return PsiBins(distinct, True)
    return PsiBins(np.unique(np.quantile(a, np.linspace(0, 1, bins + 1)[1:-1])), False)


def bin_counts(values: np.ndarray, bins: PsiBins, *, is_sorted: bool = False) -> np.ndarray:
    """Counts of ``values`` (finite) in the PSI bins of :func:`psi_edges`.

    Args:
        values: 1-D finite values.
        bins: The reference's bins.
        is_sorted: ``values`` are sorted ascending (two binary searches per edge instead of one
            per value).

    Returns:
        int64 array of ``bins.n_bins`` counts.
    """
    x = np.asarray(values, dtype="float64")
    e = bins.edges
    if bins.discrete:
        if not is_sorted:
            hits = np.fromiter((np.count_nonzero(x == v) for v in e), dtype="int64", count=e.size)
            return np.append(hits, x.size - int(hits.sum())).astype("int64")
        hits = np.searchsorted(x, e, side="right") - np.searchsorted(x, e, side="left")
        return np.append(hits, x.size - int(hits.sum())).astype("int64")
    if is_sorted:
        cum = np.searchsorted(x, e, side="right")
        return np.diff(np.concatenate([[0], cum, [x.size]])).astype("int64")
    if e.size <= _FEW_EDGES:  # one vectorised comparison per edge beats a binary search per value
        cum = np.fromiter((np.count_nonzero(x <= edge) for edge in e), dtype="int64", count=e.size)
        return np.diff(np.concatenate([[0], cum, [x.size]])).astype("int64")
    return np.bincount(np.searchsorted(e, x, side="left"), minlength=e.size + 1).astype("int64")


def psi_from_counts(reference_counts: Any, current_counts: Any, eps: float = PSI_EPSILON) -> float:
    """Population Stability Index from two count vectors over the same bins.

    ``PSI = sum((c_i - r_i) * ln(c_i / r_i))`` with ``r_i``, ``c_i`` the bin shares floored at
    ``eps`` (Siddiqi 2006; Evidently floors at the same 1e-4).

    Args:
        reference_counts: Non-negative counts of the reference per bin, positive total.
        current_counts: Non-negative counts of the current window in the same bins, positive total.
        eps: Floor of each bin share (default :data:`PSI_EPSILON`, 1e-4).

    Returns:
        PSI >= 0.

    Raises:
        ValueError: Lengths differ or a side has no count.
    """
    r = np.asarray(reference_counts, dtype="float64")
    c = np.asarray(current_counts, dtype="float64")
    if r.shape != c.shape or r.ndim != 1:
        raise ValueError(f"bin counts have shapes {r.shape} and {c.shape}; expected equal 1-D")
    if r.sum() <= 0 or c.sum() <= 0:
        raise ValueError("psi_from_counts needs a positive total on both sides")
    r = np.maximum(r / r.sum(), eps)
    c = np.maximum(c / c.sum(), eps)
    return float(np.sum((c - r) * np.log(c / r)))


def psi_cap(reference_counts: np.ndarray, eps: float = PSI_EPSILON) -> float:
    """Largest PSI these bins can give: the whole window in the reference's rarest bin."""
    cur = np.zeros_like(reference_counts)
    cur[int(np.argmin(reference_counts))] = 1
    return psi_from_counts(reference_counts, cur, eps)
