"""Window summaries computed by Spark over the inference log's partitions, merged on the driver.

For logs too large for one machine. Spark reads the window's Parquet files (the inference-log
layout, folder or S3), keeps ``start <= timestamp < end`` and hands each of its partitions to
:func:`drift_checks.summaries.WindowSummarizer` as Arrow record batches (``mapInArrow``): every
partition yields the same per-partition summary the single-process path builds (exact PSI bin
and category counts, KLL sketches, contract facts). The driver collects those few hundred KB
per partition and merges them (:meth:`~drift_checks.summaries.WindowSummary.merge`); the DAG's
check task then only decides (:func:`drift_checks.verdict.check_window`). Counts equal the
single-process ones exactly; KS and Wasserstein differ by at most the sketch's stated error
bound (:mod:`drift_checks.sketches`).

Plain PySpark 4 (Java 17 runtime): :func:`get_spark` starts one in ``local[N]`` mode inside the
task, or connects to a cluster given its master URL (the executors need tritonflow and its
Python dependencies, and access to the log's storage).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from drift_checks.sketches import DEFAULT_SKETCH_K
from drift_checks.summaries import WindowSummarizer, WindowSummary, bins_of

#: The project root, put on the Python path of Spark's Python workers.
_ROOT = str(Path(__file__).resolve().parent.parent)


def get_spark(master: str = "local[2]", app_name: str = "tritonflow-drift"):
    """A SparkSession (created once per process; ``getOrCreate``).

    ``local[N]`` runs Spark inside this process's JVM with N cores; the Spark UI is off and the
    Python workers run this interpreter with the project on their path.

    Raises:
        RuntimeError: No Java runtime (``scripts/setup.sh`` installs ``openjdk-17-jre-headless``).
    """
    import shutil

    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise RuntimeError("Spark needs a Java runtime: no JAVA_HOME and no 'java' on PATH; expected "
                           "openjdk-17-jre-headless (scripts/setup.sh installs it)")
    path = os.pathsep.join(p for p in [_ROOT, os.environ.get("PYTHONPATH", "")] if p)
    os.environ["PYTHONPATH"] = path
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName(app_name)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.executorEnv.PYTHONPATH", path)
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", "131072")
            # pandas/pyarrow write nanosecond timestamps, which Spark reads only as longs
            .config("spark.sql.legacy.parquet.nanosAsLong", "true")
            .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def summarize_window_spark(spark, scan, reference, *, sketch_k: int = DEFAULT_SKETCH_K,
                           batch_rows: int = 131_072, sample_rows: int = 0,
                           partitions: int | None = None) -> WindowSummary:
    """Summary of a window computed by Spark, one per Spark partition, merged on the driver.

    Args:
        spark: A SparkSession (:func:`get_spark`).
        scan: :func:`drift_checks.streaming.open_window` of the window (its files, checked).
        reference: The prepared reference (schema and PSI bins, shipped to the executors).
        sketch_k: KLL ``k`` of the numeric sketches (:class:`~drift_checks.summaries.WindowSummarizer`).
        sample_rows: Rows of the seeded window sample kept for row-wise contract checks (0: none).
        batch_rows: Rows per Arrow batch handed to the summariser.
        partitions: Spark partitions to summarise (default: Spark's own split of the files).

    Returns:
        The merged :class:`WindowSummary` (``files`` = the scan's files).
    """
    import pyarrow as pa
    from pyspark.sql import functions as F

    bins = bins_of(reference)
    schema = reference.schema
    features = [c for c in schema.features]
    if not scan.files:
        return WindowSummarizer(schema, bins, sketch_k=sketch_k).result()
    paths = [p if not scan.store.is_s3 else "s3a://" + p for p in scan.paths]
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(int(batch_rows)))
    df = spark.read.parquet(*paths)
    present = set(df.columns)
    cols = [c for c in features if c in present] + (["request_id"] if sample_rows else [])
    if df.schema["timestamp"].dataType.typeName() == "long":  # nanoseconds since the epoch
        lo, hi = F.lit(int(scan.start.value)), F.lit(int(scan.end.value))
    else:
        lo, hi = F.lit(scan.start.to_pydatetime()), F.lit(scan.end.to_pydatetime())
    df = df.where((F.col("timestamp") >= lo) & (F.col("timestamp") < hi)).select(*cols)
    if partitions:
        df = df.repartition(int(partitions))
    k, n_sample = int(sketch_k), int(sample_rows)

    def per_partition(batches):
        acc = WindowSummarizer(schema, bins, sketch_k=k, sample_rows=n_sample)
        for batch in batches:
            acc.add(batch)
        yield pa.RecordBatch.from_pydict({"summary": [acc.result().to_bytes()]},
                                         schema=pa.schema([("summary", pa.binary())]))

    parts = [r["summary"] for r in df.mapInArrow(per_partition, "summary binary").collect()]
    summary = WindowSummarizer(schema, bins, sketch_k=k, sample_rows=n_sample).result()
    for data in parts:
        part = WindowSummary.from_bytes(bytes(data))
        if part.n_rows:
            summary = summary.merge(part) if summary.n_rows else part
    summary.files = sorted(scan.files)
    return summary
