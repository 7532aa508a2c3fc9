"""Summaries of a window in constant memory: what the hourly check needs, batch by batch.

A :class:`WindowSummary` holds, per feature of the reference's schema:

* the contract's :class:`~drift_checks.column_facts.ColumnFacts` (dtype, rows, nulls, min/max,
  value counts of categorical columns);
* numeric features: null and infinity counts, the EXACT counts in the reference's PSI bins
  (:func:`drift_checks.binning.bin_counts`) and a KLL sketch of the finite values
  (:mod:`drift_checks.sketches`, fed by :func:`~drift_checks.sketches.update_sketch`);
* categorical features: exact category counts (JS, chi-square, unseen share are exact);
* optionally a seeded sample (the rows with the smallest hash of ``request_id``: the same rows
  whatever the order or partitioning of the batches) for row-wise expectations written by hand.

Arrow record batches (the streamed log) are read column by column: a float column becomes a
numpy array (no copy when it has no nulls) and its facts come from
:meth:`~drift_checks.column_facts.ColumnFacts.of_float_array`, which gives what
:meth:`~drift_checks.column_facts.ColumnFacts.of_series` gives for the same pandas column; only the
other columns are converted to pandas.

Its size depends on the number of features and categories, never on the number of rows
(about 100 KB per numeric feature at the default sketch size). Summaries MERGE
(:meth:`WindowSummary.merge`): record batches of one process, files summarised by several
processes (:mod:`drift_checks.streaming`) and Spark partitions (:mod:`drift_checks.spark`) give
the same counts, and sketches within their error bound. :func:`drift_checks.verdict.check_window`
takes a summary wherever it takes a window's frame, and scores it with the same registry
functions.

Bytes (:meth:`WindowSummary.to_bytes`): zlib-compressed JSON, sketches in DataSketches' own
serialisation; stored once per window so that reruns decide from the same sketches.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import zlib
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from drift_checks import statistics as st
from drift_checks.binning import PsiBins, bin_counts
from drift_checks.column_facts import ColumnFacts
from drift_checks.declared_schema import apply_column
from drift_checks.inference_log import LogSchema, categorical_columns, numeric_columns
from drift_checks.numeric_statistics import as_float_array
from drift_checks.sketches import DEFAULT_SKETCH_K, new_sketch, sketch_from_bytes, sketch_sample, update_sketch

#: Format version of :meth:`WindowSummary.to_bytes`.
FORMAT = 2


def bins_of(reference) -> dict[str, PsiBins]:
    """The PSI bins of every scorable numeric feature of a prepared reference."""
    return {c: s.psi_bins for c, s in reference.numeric.items() if s.status == "ok"}


def bins_digest(bins: Mapping[str, PsiBins]) -> str:
    """Digest of a set of PSI bins (a stored summary is reused only with the same bins)."""
    h = hashlib.sha256()
    for c in sorted(bins):
        h.update(c.encode() + b"\0" + bytes([bins[c].discrete]) + np.asarray(bins[c].edges, "<f8").tobytes())
    return h.hexdigest()[:16]


@dataclasses.dataclass
class NumericState:
    """Streamed state of one numeric feature (see the module docstring)."""

    n_rows: int
    n_null: int
    n_pos_inf: int
    n_neg_inf: int
    counts: np.ndarray | None
    sketch: Any

    def merge(self, other: "NumericState") -> "NumericState":
        """Combine with the state of another batch of the same window (counts add, sketches merge).

        Note: ``self.sketch`` is merged in place; the PSI counts are ``None`` when either side lacks them.
        """
        self.sketch.merge(other.sketch)
        counts = None if self.counts is None or other.counts is None else self.counts + other.counts
        return NumericState(self.n_rows + other.n_rows, self.n_null + other.n_null,
                            self.n_pos_inf + other.n_pos_inf, self.n_neg_inf + other.n_neg_inf, counts, self.sketch)


@dataclasses.dataclass
class WindowSummary:
    """A window summarised for the hourly check (see the module docstring).

    Attributes:
        n_rows: Rows of the window.
        facts: ``{column: ColumnFacts}`` of the feature columns present in the window.
        numeric: ``{column: NumericState}`` of the numeric features.
        bins: The reference's PSI bins the numeric features were counted in.
        sketch_k: KLL ``k``.
        files: Files summarised (URIs, sorted).
        sample: Seeded sample rows (``_key`` column = the row's hash), or ``None``.
        sample_rows: Size of the sample kept (0: none).
    """

    n_rows: int
    facts: dict[str, ColumnFacts]
    numeric: dict[str, NumericState]
    bins: dict[str, PsiBins]
    sketch_k: int = DEFAULT_SKETCH_K
    files: list[str] = dataclasses.field(default_factory=list)
    sample: pd.DataFrame | None = None
    sample_rows: int = 0

    # ---------------------------------------------------------------- what the check reads
    @property
    def columns(self) -> list[str]:
        """Summarised feature columns."""
        return list(self.facts)

    def numeric_sample(self, col: str) -> st.NumericSample:
        """The current side of a numeric feature: exact when its sketch never compacted."""
        f, s = self.facts[col], self.numeric[col]
        b = self.bins[col]
        return sketch_sample(s.sketch, n_rows=f.n, n_null=s.n_null, n_pos_inf=s.n_pos_inf,
                             n_neg_inf=s.n_neg_inf, psi_edges=b.edges, psi_counts=s.counts)

    def category_counts(self, col: str) -> dict[str, int]:
        """Counts of a categorical feature, as :func:`drift_checks.statistics.category_counts`."""
        counts: dict[str, int] = {}
        for k, c in (self.facts[col].counts or {}).items():
            counts[str(k)] = counts.get(str(k), 0) + int(c)
        return {k: counts[k] for k in sorted(counts)}

    def missing_share(self, col: str) -> float | None:
        """Share of null values in ``col`` (6 decimals); ``None`` when unknown or the window is empty."""
        f = self.facts.get(col)
        return round(f.n_null / f.n, 6) if f is not None and f.n else None

    def sample_frame(self) -> pd.DataFrame | None:
        """The window's seeded row sample in a stable order (``None`` when no sample was kept)."""
        if self.sample is None:
            return None
        return self.sample.sort_values("_key", kind="stable").drop(columns="_key").reset_index(drop=True)

    # ---------------------------------------------------------------- merging
    def merge(self, other: "WindowSummary") -> "WindowSummary":
        """Both windows' rows together (this summary's sketches absorb the other's).

        Raises:
            ValueError: The two were counted in different PSI bins or with different sketch k.
        """
        if bins_digest(self.bins) != bins_digest(other.bins) or self.sketch_k != other.sketch_k:
            raise ValueError("summaries of different reference bins or sketch sizes cannot be merged")
        facts = dict(self.facts)
        for c, f in other.facts.items():
            facts[c] = facts[c].merge(f) if c in facts else f
        numeric = dict(self.numeric)
        for c, s in other.numeric.items():
            numeric[c] = numeric[c].merge(s) if c in numeric else s
        sample = self.sample
        if other.sample is not None:
            sample = other.sample if sample is None else _smallest(pd.concat([sample, other.sample]),
                                                                  max(self.sample_rows, other.sample_rows))
        return WindowSummary(self.n_rows + other.n_rows, facts, numeric, self.bins, self.sketch_k,
                             sorted(set(self.files) | set(other.files)), sample,
                             max(self.sample_rows, other.sample_rows))

    # ---------------------------------------------------------------- bytes
    def to_bytes(self, level: int = 6) -> bytes:
        """Serialise the summary (JSON, read back by :meth:`from_bytes`); it crosses process boundaries as XCom.

        Args:
            level: zlib compression level (0: stored, for bytes that only cross a pipe to another
                process; 1: the stored summary, about as small as 6 since the sketches are base64).
        """
        doc = {"format": FORMAT, "n_rows": self.n_rows, "sketch_k": self.sketch_k, "files": self.files,
               "facts": {c: f.to_json() for c, f in self.facts.items()},
               "bins": {c: {"edges": [float(e) for e in b.edges], "discrete": b.discrete}
                        for c, b in self.bins.items()},
               "numeric": {c: {"n_rows": s.n_rows, "n_null": s.n_null, "n_pos_inf": s.n_pos_inf,
                               "n_neg_inf": s.n_neg_inf,
                               "counts": None if s.counts is None else [int(x) for x in s.counts],
                               "sketch": base64.b64encode(s.sketch.serialize()).decode()}
                           for c, s in self.numeric.items()},
               "sample_rows": self.sample_rows, "sample": None}
        if self.sample is not None:
            buf = io.BytesIO()
            self.sample.to_parquet(buf, index=False)
            doc["sample"] = base64.b64encode(buf.getvalue()).decode()
        return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), int(level))

    @classmethod
    def from_bytes(cls, data: bytes) -> "WindowSummary":
        """Read a summary written by :meth:`to_bytes`.

        Raises:
            ValueError: Not a summary of this format.
        """
        try:
            doc = json.loads(zlib.decompress(data))
        except (zlib.error, ValueError) as exc:
            raise ValueError(f"not a window summary ({exc})") from None
        if doc.get("format") != FORMAT:
            raise ValueError(f"window summary format {doc.get('format')!r}; expected {FORMAT}")
        bins = {c: PsiBins(np.asarray(b["edges"], dtype="float64"), bool(b["discrete"]))
                for c, b in doc["bins"].items()}
        numeric = {c: NumericState(s["n_rows"], s["n_null"], s["n_pos_inf"], s["n_neg_inf"],
                                   None if s["counts"] is None else np.asarray(s["counts"], dtype="int64"),
                                   sketch_from_bytes(base64.b64decode(s["sketch"])))
                   for c, s in doc["numeric"].items()}
        sample = None
        if doc.get("sample"):
            sample = pd.read_parquet(io.BytesIO(base64.b64decode(doc["sample"])))
        return cls(doc["n_rows"], {c: ColumnFacts.from_json(f) for c, f in doc["facts"].items()}, numeric,
                   bins, doc["sketch_k"], list(doc["files"]), sample, doc.get("sample_rows", 0))


def _smallest(frame: pd.DataFrame, n: int) -> pd.DataFrame:
    return frame.nsmallest(n, "_key", keep="first") if len(frame) > n else frame


class WindowSummarizer:
    """Accumulates record batches of one window into a :class:`WindowSummary`.

    Args:
        schema: Feature kinds (the reference's).
        bins: The reference's PSI bins (:func:`bins_of`).
        sketch_k: KLL ``k``.
        sample_rows: Rows of the seeded sample to keep (0: none).

    Example::

        s = WindowSummarizer(reference.schema, bins_of(reference))
        for batch in batches:           # pyarrow RecordBatch or pandas DataFrame
            s.add(batch)
        summary = s.result()
    """

    def __init__(self, schema: LogSchema, bins: Mapping[str, PsiBins], *, sketch_k: int = DEFAULT_SKETCH_K,
                 sample_rows: int = 0):
        self.schema = schema
        self.bins = dict(bins)
        self.sketch_k = int(sketch_k)
        self.sample_rows = int(sample_rows)
        self.numeric_cols = [c for c in numeric_columns(schema) if c in self.bins]
        self.counted = set(categorical_columns(schema))
        self.summary = WindowSummary(0, {}, {}, self.bins, self.sketch_k, [], None, self.sample_rows)
        self.summary.numeric = {c: NumericState(0, 0, 0, 0, np.zeros(self.bins[c].n_bins, dtype="int64"),
                                                new_sketch(self.sketch_k)) for c in self.numeric_cols}

    def add(self, batch: Any) -> None:
        """Add a record batch (pyarrow ``RecordBatch``/``Table`` or pandas ``DataFrame``).

        The rows must already be inside the window. Arrow float columns are read as numpy arrays
        (no copy without nulls) and never go through pandas; the other columns (and every column
        when a sample is kept) are converted with :func:`~drift_checks.inference_log.arrow_to_pandas`.
        """
        if isinstance(batch, pd.DataFrame):
            return self._add_frame(batch, batch, len(batch))
        if batch.num_rows == 0:
            return None
        if self.sample_rows > 0:
            from drift_checks.inference_log import arrow_to_pandas

            frame = arrow_to_pandas(batch)
            return self._add_frame(frame, frame, len(frame))
        import pyarrow as pa

        names = set(batch.schema.names)
        floats = {c for c, kind in self.schema.features.items()  # declared float: no cast needed
                  if kind == "float" and c in names and pa.types.is_floating(batch.schema.field(c).type)}
        others = [c for c in self.schema.features if c in names and c not in floats]
        frame = None
        if others:
            from drift_checks.inference_log import arrow_to_pandas

            frame = arrow_to_pandas(batch.select(others))
        columns = {c: batch.column(c).to_numpy(zero_copy_only=False) for c in floats}
        return self._add_frame(columns if frame is None else {**columns, **{c: frame[c] for c in others}},
                               frame, batch.num_rows)

    def _add_frame(self, columns: Mapping[str, Any], frame: pd.DataFrame | None, n_rows: int) -> None:
        """Add one batch of ``n_rows`` rows.

        ``columns`` maps a feature to a pandas Series or a numpy float array (NaN: null) of a
        column declared ``float``; ``frame`` (pandas, or ``None``) also holds ``request_id`` for
        the sample. Each Series is first read as its declared kind
        (:func:`~drift_checks.declared_schema.apply_column`), as the exact path reads a window.
        """
        if n_rows == 0:
            return
        sm = self.summary
        sm.n_rows += n_rows
        typed: dict[str, Any] = {}
        for col, kind in self.schema.features.items():
            if col not in columns:
                continue
            values = columns[col]
            if isinstance(values, np.ndarray):
                f = ColumnFacts.of_float_array(values)
            else:
                values, bad = apply_column(col, kind, values)
                f = ColumnFacts.of_series(values, counts=col in self.counted, keep=False)
                f.unreadable = bad
            typed[col] = values
            sm.facts[col] = sm.facts[col].merge(f) if col in sm.facts else f
            if col in sm.numeric:
                self._add_numeric(sm.numeric[col], values, col)
        if self.sample_rows > 0 and frame is not None and "request_id" in frame.columns:
            keys = pd.util.hash_pandas_object(frame["request_id"].astype(str), index=False).to_numpy()
            part = pd.DataFrame({c: typed[c] for c in self.schema.features if c in frame.columns and c in typed},
                                index=frame.index).assign(_key=keys)
            both = part if sm.sample is None else pd.concat([sm.sample, part], ignore_index=True)
            sm.sample = _smallest(both, self.sample_rows).reset_index(drop=True)

    def _add_numeric(self, state: NumericState, values: Any, col: str) -> None:
        arr = as_float_array(values)
        finite = np.isfinite(arr)
        n_fin = int(np.count_nonzero(finite))
        if n_fin < arr.size:
            pos, neg = int(np.count_nonzero(arr == np.inf)), int(np.count_nonzero(arr == -np.inf))
            state.n_pos_inf += pos
            state.n_neg_inf += neg
            state.n_null += arr.size - n_fin - pos - neg
            arr = arr[finite]
        state.n_rows += int(finite.size)
        if arr.size:
            update_sketch(state.sketch, arr)
            state.counts += bin_counts(arr, self.bins[col])

    def result(self, files: Iterable[str] = ()) -> WindowSummary:
        """The summary (``files``: the files it covers, recorded with it)."""
        self.summary.files = sorted(set(self.summary.files) | set(files))
        return self.summary


def summarize_frame(frame: pd.DataFrame, reference, *, sketch_k: int = DEFAULT_SKETCH_K,
                    batch_rows: int = 131_072, sample_rows: int = 0) -> WindowSummary:
    """Summary of an in-memory window, batch by batch (the backtest's streaming engine; tests)."""
    s = WindowSummarizer(reference.schema, bins_of(reference), sketch_k=sketch_k, sample_rows=sample_rows)
    for i in range(0, len(frame), batch_rows):
        s.add(frame.iloc[i:i + batch_rows])
    return s.result()
