"""Stream a window of the inference log in record batches: constant memory in the window size.

:func:`open_window` lists the window's Parquet files (``<root>/<model>/date=/hour=``, a folder or
S3 through pyarrow's own filesystems), checks every file's columns against the schema (the
messages of :func:`drift_checks.inference_log.read_window`) and counts the rows from the
Parquet footers without reading any data. :func:`summarize_window` then scans the files with
``pyarrow.dataset`` in record batches of ``batch_rows`` rows, keeps the rows with
``start <= timestamp < end`` and folds them into a :class:`~drift_checks.summaries.WindowSummary`:
exact PSI bin counts and category counts, KLL sketches, contract facts. Memory holds one batch
per worker plus the summary (about 100 KB per numeric feature), whatever the window's size.
Files (row groups) are summarised by ``workers`` processes, each claiming the next file from a
shared counter when done with one (a worker slowed by other work on the host does less), and the
partial summaries merged: the counts are the same in any order, the sketches within their bound.
Float columns go from the Arrow batch to numpy without pandas (:class:`WindowSummarizer`).

:func:`stored_summary` makes decisions reproducible: a window's summary is computed
once and stored under ``<root>/<model>/drift_summaries/<bins digest>-k<k>/``; a rerun or backfill
of the same window over the same files (inference-log files are immutable, uuid-named) reads it
back instead of sketching again, so it decides from the same sketches.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Sequence
from urllib.parse import urlparse

import pandas as pd

from drift_checks.binning import PsiBins
from drift_checks.column_facts import ColumnFacts
from drift_checks.inference_log import (
    BASE_COLUMNS,
    EXPECTED_TYPES,
    LogSchema,
    check_model_name,
    hour_floor,
    hours_between,
    partition_prefix,
    read_type_ok,
    type_error,
)
from drift_checks.sketches import DEFAULT_SKETCH_K
from drift_checks.storage import S3Store, Store
from drift_checks.summaries import WindowSummarizer, WindowSummary, bins_digest
from ground.exceptions import WindowError

#: Default rows per record batch.
DEFAULT_BATCH_ROWS = 131_072


def arrow_filesystem(store: Store):
    """(pyarrow filesystem, key -> path) for a :class:`~drift_checks.storage.Store` root.

    S3: ``pyarrow.fs.S3FileSystem`` on the store's endpoint (credentials and region from the
    usual ``AWS_*`` environment variables).
    """
    import pyarrow.fs as pafs

    if not isinstance(store, S3Store):
        return pafs.LocalFileSystem(), store.uri
    kw: dict[str, Any] = {}
    if store.endpoint_url:
        u = urlparse(store.endpoint_url)
        kw = {"endpoint_override": u.netloc or u.path, "scheme": u.scheme or "https"}
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
    return pafs.S3FileSystem(region=region, **kw), lambda key: f"{store.bucket}/{store._key(key)}"


@dataclasses.dataclass
class WindowScan:
    """The files of one window, checked and counted (nothing read yet).

    Attributes:
        model / start / end: The window ``[start, end)`` (UTC).
        files: URIs of the files (for reports and the stored summary's fingerprint).
        paths: The same files as paths of ``filesystem``.
        row_groups: Row groups per file.
        n_rows: Rows in the files (footers; rows outside ``[start, end)`` included).
        filesystem: pyarrow filesystem of ``paths``.
        store: The log root.
    """

    model: str
    start: pd.Timestamp
    end: pd.Timestamp
    files: list[str]
    paths: list[str]
    row_groups: list[int]
    n_rows: int
    filesystem: Any
    store: Store


def open_window(root: str, model: str, start, end, schema: LogSchema | None = None,
                endpoint_url: str | None = None) -> WindowScan:
    """List, check and count the files of a window.

    Raises:
        WindowError: Naive or inverted bounds, an unreadable file, a missing column or a column of
            the wrong type (names the file, the column and the expected type).
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    check_model_name(model)
    s = hour_floor(start)
    e = pd.Timestamp(end)
    if e.tzinfo is None:
        raise WindowError(f"window end {end!r} is naive; expected a timezone-aware (UTC) datetime")
    e, s_exact = e.tz_convert("UTC"), pd.Timestamp(start).tz_convert("UTC")
    if e <= s_exact:
        raise WindowError(f"window end {e} is not after start {s_exact}")
    store = Store(root, endpoint_url)
    fs, path_of = arrow_filesystem(store)
    keys = [k for h in hours_between(s, e) for k in store.list(partition_prefix(model, h)) if k.endswith(".parquet")]
    required = schema.columns if schema is not None else dict(BASE_COLUMNS)
    features = schema.features if schema is not None else {}
    files, paths, groups, n_rows = [], [], [], 0
    for key in keys:
        uri, path = store.uri(key), path_of(key)
        try:
            frag = next(iter(ds.dataset(path, filesystem=fs, format="parquet").get_fragments()))
            meta = frag.metadata
        except (pa.ArrowInvalid, OSError, StopIteration) as exc:
            raise WindowError(f"{uri}: not a readable Parquet file ({exc})") from None
        phys = frag.physical_schema
        for col, kind in required.items():
            if col not in phys.names:
                raise WindowError(f"{uri}: column {col!r} is missing; expected {EXPECTED_TYPES[kind]}")
            if not read_type_ok(kind, phys.field(col).type, feature=col in features):
                column = frag.to_table(columns=[col]).column(col)
                raise type_error(uri, col, phys.field(col).type, kind, column)
        files.append(uri)
        paths.append(path)
        groups.append(int(meta.num_row_groups))
        n_rows += int(meta.num_rows)
    return WindowScan(model, s_exact, e, files, paths, groups, n_rows, fs, store)


def _units(scan: WindowScan, workers: int) -> list[tuple[str, list[int] | None]]:
    """Work units: whole files, or row groups when there are fewer files than workers."""
    if len(scan.paths) >= workers:
        return [(p, None) for p in scan.paths]
    return [(p, [g]) for p, n in zip(scan.paths, scan.row_groups, strict=True) for g in range(n)]


def _bins_doc(bins: dict[str, PsiBins]) -> dict[str, tuple[list[float], bool]]:
    return {c: ([float(x) for x in b.edges], bool(b.discrete)) for c, b in bins.items()}


def _batches(units, filesystem, columns: Sequence[str], start, end, batch_rows: int):
    """Record batches of the units' rows with ``start <= timestamp < end``.

    Each holds the ``columns`` present in its file, plus ``timestamp``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    lo = pa.scalar(pd.Timestamp(start).value, type=pa.int64())
    hi = pa.scalar(pd.Timestamp(end).value, type=pa.int64())
    for path, groups in units:
        frag = next(iter(ds.dataset(path, filesystem=filesystem, format="parquet").get_fragments()))
        if groups is not None:
            frag = frag.subset(row_group_ids=groups)
        names = frag.physical_schema.names
        cols = ["timestamp"] + [c for c in columns if c in names and c != "timestamp"]
        for batch in frag.to_batches(columns=cols, batch_size=batch_rows, use_threads=True):
            ts = pc.cast(pc.cast(batch.column("timestamp"), pa.timestamp("ns", "UTC")), pa.int64())
            keep = pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi))
            if not pc.all(keep).as_py():
                batch = batch.filter(keep)
            if batch.num_rows:
                yield batch


def iter_window_frames(scan: WindowScan, columns: Sequence[str], batch_rows: int = DEFAULT_BATCH_ROWS):
    """The window as pandas frames of at most ``batch_rows`` rows (one at a time in memory)."""
    from drift_checks.inference_log import arrow_to_pandas

    for batch in _batches([(p, None) for p in scan.paths], scan.filesystem, columns, scan.start, scan.end,
                          batch_rows):
        yield arrow_to_pandas(batch)


def summarize_units(units: Iterable[tuple[str, list[int] | None]], filesystem, schema: dict, bins: dict,
                    start: pd.Timestamp, end: pd.Timestamp, *, sketch_k: int = DEFAULT_SKETCH_K,
                    batch_rows: int = DEFAULT_BATCH_ROWS, sample_rows: int = 0, level: int = 6) -> bytes:
    """Summary (bytes) of some files / row groups of a window.

    The work of one process, one Spark partition, or the whole window.

    Args:
        units: ``(path, row groups or None for the whole file)``, read in this order (any iterable).
        filesystem: pyarrow filesystem of the paths.
        schema: :meth:`LogSchema.to_dict` of the reference.
        bins: ``{column: (edges, discrete)}`` of the reference's PSI bins.
        start: Start of the window, inclusive (rows outside are skipped).
        end: End of the window, exclusive.
        sketch_k: KLL ``k`` of the numeric sketches.
        batch_rows: Rows per Arrow record batch read.
        sample_rows: Rows of the seeded window sample kept for row-wise contract checks (0: none).
        level: zlib level of the bytes (:meth:`WindowSummary.to_bytes`).
    """
    return _summarize(units, filesystem, schema, bins, start, end, sketch_k=sketch_k, batch_rows=batch_rows,
                      sample_rows=sample_rows).to_bytes(level)


def _summarize(units: Iterable[tuple[str, list[int] | None]], filesystem, schema: dict, bins: dict,
               start: pd.Timestamp, end: pd.Timestamp, *, sketch_k: int = DEFAULT_SKETCH_K,
               batch_rows: int = DEFAULT_BATCH_ROWS, sample_rows: int = 0) -> WindowSummary:
    """:func:`summarize_units` as an object (no serialisation, for work done in this process)."""
    import numpy as np

    log_schema = LogSchema.from_dict(schema)
    psi = {c: PsiBins(np.asarray(e, dtype="float64"), bool(d)) for c, (e, d) in bins.items()}
    acc = WindowSummarizer(log_schema, psi, sketch_k=sketch_k, sample_rows=sample_rows)
    columns = list(log_schema.features) + (["request_id"] if sample_rows else [])
    for batch in _batches(units, filesystem, columns, start, end, batch_rows):
        acc.add(batch)
    return acc.result(files=[])


def _as_read_back(summary: WindowSummary) -> WindowSummary:
    """The summary as :meth:`WindowSummary.from_bytes` would give it back, sketches not serialised.

    Plain Python min/max and examples in the facts; a kept sample goes through Parquet.
    """
    if summary.sample is not None:
        return WindowSummary.from_bytes(summary.to_bytes(1))
    summary.facts = {c: ColumnFacts.from_json(f.to_json()) for c, f in summary.facts.items()}
    return summary


def sample_window(scan: WindowScan, schema: LogSchema, rows: int,
                  batch_rows: int = DEFAULT_BATCH_ROWS) -> pd.DataFrame:
    """A seeded sample of ``rows`` rows of a streamed window, for the Evidently report.

    The rows with the smallest hash of ``request_id``: the same rows on every run.
    """
    data = summarize_units([(p, None) for p in scan.paths], scan.filesystem, schema.to_dict(), {},
                           scan.start, scan.end, batch_rows=batch_rows, sample_rows=rows)
    sample = WindowSummary.from_bytes(data).sample_frame()
    return sample if sample is not None else pd.DataFrame(columns=list(schema.features))


#: In a worker process: the shared index of the next work unit (:func:`_init_worker`).
_NEXT_UNIT: Any = None

#: Values (rows x features) a worker process must have to summarise before one more is started: a
#: worker costs about 0.1 s (fork, the bytes of its summary, the merge), about the time to sketch
#: 2 M values (about 50 ns per value, ``benchmarks/drift_scale.py``), so each needs twice that.
MIN_VALUES_PER_WORKER = 4_000_000


def _init_worker(counter) -> None:
    global _NEXT_UNIT
    _NEXT_UNIT = counter


def _claimed(units: Sequence, counter: Any = None) -> Iterator:
    """The units claimed from the shared counter (default: this worker's), one at a time, until none is left."""
    counter = _NEXT_UNIT if counter is None else counter
    while True:
        with counter.get_lock():
            i = counter.value
            counter.value = i + 1
        if i >= len(units):
            return
        yield units[i]


def _summarize_shared(args: tuple) -> bytes:
    units, fs, schema, bins, start, end, kw = args  # zlib level 0: the bytes only cross a pipe
    return summarize_units(_claimed(units), fs, schema, bins, start, end, level=0, **kw)


def stream_workers(scan: WindowScan, n_features: int, workers: int,
                   min_values_per_worker: int = MIN_VALUES_PER_WORKER) -> int:
    """Processes worth using for a window, this one included.

    At most ``workers`` (0: one per CPU core), one per work unit (file or row group), and one per
    ``min_values_per_worker`` values (rows x features, :data:`MIN_VALUES_PER_WORKER`).
    """
    workers = workers or os.cpu_count() or 1
    by_size = max(1, (scan.n_rows * max(1, n_features)) // max(1, int(min_values_per_worker)))
    return max(1, min(workers, by_size, len(_units(scan, workers)) or 1))


def summarize_window(scan: WindowScan, reference, *, sketch_k: int = DEFAULT_SKETCH_K,
                     batch_rows: int = DEFAULT_BATCH_ROWS, workers: int = 1,
                     sample_rows: int = 0, min_values_per_worker: int = MIN_VALUES_PER_WORKER) -> WindowSummary:
    """Stream the window's files into one summary.

    This process summarises files too: with ``n`` processes, ``n - 1`` are forked, and each of
    the ``n`` claims the next file (or row group) from a shared counter when done with one. Only
    the forked workers' summaries cross a process boundary (as bytes).

    Args:
        scan: From :func:`open_window`.
        reference: The prepared reference (its schema and PSI bins).
        sketch_k: KLL ``k`` of the numeric sketches (:class:`~drift_checks.summaries.WindowSummarizer`).
        batch_rows: Rows per Arrow record batch read.
        sample_rows: Rows of the seeded window sample kept for row-wise contract checks (0: none).
        workers: Most processes summarising files (or row groups) in parallel, this one included;
            0: one per CPU core. Fewer are used for a small window (:func:`stream_workers`).
        min_values_per_worker: Values (rows x features) per process at least (:data:`MIN_VALUES_PER_WORKER`).

    Returns:
        The :class:`WindowSummary` (its ``files`` are the scan's files).
    """
    from drift_checks.summaries import bins_of

    ref_bins = bins_of(reference)
    bins = _bins_doc(ref_bins)
    kw = dict(sketch_k=sketch_k, batch_rows=batch_rows, sample_rows=sample_rows)
    schema = reference.schema.to_dict()
    n = stream_workers(scan, len(reference.schema.features), workers, min_values_per_worker)
    units = _units(scan, n)
    if not units:
        return WindowSummarizer(reference.schema, ref_bins, sketch_k=sketch_k).result()
    if n <= 1:
        summary = _as_read_back(_summarize(units, scan.filesystem, schema, bins, scan.start, scan.end, **kw))
    else:
        import multiprocessing

        # fork: no re-import of the caller's main module (Airflow's task runner); pyarrow
        # re-creates its thread pools after a fork. Each process claims the next unit from a shared
        # counter when it is done with one, so a worker slowed by other work on the host does less.
        ctx = multiprocessing.get_context("fork")
        counter = ctx.Value("i", 0)
        with ProcessPoolExecutor(n - 1, mp_context=ctx, initializer=_init_worker, initargs=(counter,)) as pool:
            futures = [pool.submit(_summarize_shared, (units, scan.filesystem, schema, bins, scan.start, scan.end,
                                                       kw)) for _ in range(n - 1)]
            try:
                summary = _as_read_back(_summarize(_claimed(units, counter), scan.filesystem, schema, bins,
                                                   scan.start, scan.end, **kw))
            except BaseException:
                with counter.get_lock():  # the workers stop after their current unit
                    counter.value = len(units)
                raise
            parts = [f.result() for f in futures]
        for p in parts:
            summary = summary.merge(WindowSummary.from_bytes(p))
    summary.files = list(scan.files)
    return summary


def summary_key(scan: WindowScan, reference, sketch_k: int) -> str:
    """Where the window's summary is stored (relative to the log root)."""
    from drift_checks.summaries import bins_of

    stamp = f"{scan.start:%Y%m%dT%H%M%S}_{scan.end:%Y%m%dT%H%M%S}"
    return f"{scan.model}/drift_summaries/{bins_digest(bins_of(reference))}-k{int(sketch_k)}/{stamp}.summary"


def stored_summary(scan: WindowScan, reference, compute: Callable[[], WindowSummary], *,
                   sketch_k: int = DEFAULT_SKETCH_K, writes: list | None = None) -> tuple[WindowSummary, bool]:
    """The window's stored summary when it covers the same files, else ``compute()`` stored.

    Args:
        scan: From :func:`open_window`.
        reference: The prepared reference (its PSI bins name the stored summary).
        compute: Computes the summary when none is stored for these files.
        sketch_k: KLL ``k`` (part of the stored summary's key).
        writes: When a list, a computed summary is written on a thread, its
            :class:`~concurrent.futures.Future` appended: the caller scores the summary meanwhile
            (only reading it) and waits for every future (``result()`` re-raises a failed write).
            ``None``: written before returning.

    Returns:
        ``(summary, computed)``: ``computed`` is ``False`` when the stored one was reused.
    """
    key = summary_key(scan, reference, sketch_k)
    try:
        old = WindowSummary.from_bytes(scan.store.get_bytes(key))
        if old.files == sorted(scan.files):
            return old, False
    except (FileNotFoundError, ValueError):
        pass
    summary = compute()
    summary.files = sorted(scan.files)

    def write() -> None:  # zlib level 1: about as small as 6 (the sketches are base64), faster
        scan.store.put_bytes(key, summary.to_bytes(1))

    if writes is None:
        write()
    else:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(1, thread_name_prefix="drift-summary-write")
        writes.append(pool.submit(write))
        pool.shutdown(wait=False)  # the thread ends after the write
    return summary, True
