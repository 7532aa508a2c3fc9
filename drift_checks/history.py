"""History of hourly drift statistics (SQLAlchemy: SQLite embedded, PostgreSQL in deployment).

Three tables (names take an optional prefix, e.g. for tests or several deployments in one
schema). Statistics and verdicts are keyed by the REFERENCE they were computed against
(``reference_id``, e.g. ``v3:training:1f2e...``): a threshold learned against one model
version's reference never judges statistics computed against another one.

* ``drift_statistics``: one row per (model, reference, feature, statistic, hour) with the finite
  value, the threshold it was judged by (value and source) and whether it may teach the dynamic
  threshold (``taught``, see :mod:`drift_checks.thresholds`); the primary key
  ``(model, reference_id, feature, statistic, hour)`` is also the index the P95 lookup scans
  (a range scan per model and reference over the last N days).
* ``drift_feature_verdicts``: one row per (model, reference, feature, hour): severity, whether
  the feature was flagged and whether its effect was strong.
* ``drift_windows``: one row per (model, hour): status (``ok``, ``no_data``,
  ``contract_failed``...), row count, model version, reference, the dataset verdict, whether a
  drift alert fired (the alert policy's consecutive-window rule and cooldown read these) and the
  JSON summary.
* ``drift_series_cache``: one row per (model, reference, feature, statistic) with the TAUGHT
  values of the last ``cache_days`` (default 35) days packed as two arrays (hours, values),
  maintained by :meth:`HistoryStore.record_hour` and :meth:`HistoryStore.bulk_load` in the same
  transaction as the rows they write. The P95 lookup of a model reads these rows (one query, a
  few KB per series) instead of scanning every hourly row: 50 features x 3 statistics x 720 hours
  took 107-160 ms on SQLite as a range scan and takes a few ms from the cache
  (``benchmarks/drift_scale.py``). A row is complete for the hours from its ``since`` on; a
  lookup reaching further back (a backfill of an old hour, a look-back longer than the cache)
  reads the statistics table as before, so results never depend on the cache.

A database created by an older tritonflow (tables without ``reference_id``) is refused with a
message naming the URL; nothing is dropped.

Writes are idempotent per hour: :meth:`HistoryStore.record_hour` replaces everything stored for
that (model, hour) in one transaction (delete, then upsert), so a rerun or backfill never
duplicates rows. NaN and infinite values are refused before they reach the table.

Hours are stored as naive UTC ``DateTime`` values (same representation on both back ends).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import math
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from ground.exceptions import DataError

if TYPE_CHECKING:
    from ground.settings import Settings

#: Days of taught values kept per series in the lookup cache (``drift_series_cache``).
DEFAULT_CACHE_DAYS = 35.0
_EPOCH = dt.datetime(1970, 1, 1)


def _hour_index(naive_utc_hour: dt.datetime) -> int:
    return int((naive_utc_hour - _EPOCH).total_seconds() // 3600)


def _utc_hour(hour: dt.datetime) -> dt.datetime:
    import pandas as pd

    t = pd.Timestamp(hour)
    if t.tzinfo is None:
        raise DataError(f"hour {hour!r} is naive; expected a timezone-aware (UTC) datetime")
    return t.tz_convert("UTC").floor("h").tz_localize(None).to_pydatetime()


def _series_key() -> list[Any]:
    """The primary-key columns naming one statistic series: model, reference, feature, statistic."""
    import sqlalchemy as sa

    return [
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("reference_id", sa.String(200), primary_key=True),
        sa.Column("feature", sa.String(200), primary_key=True),
        sa.Column("statistic", sa.String(64), primary_key=True),
    ]


@dataclasses.dataclass(frozen=True)
class StatisticRow:
    """One hourly value.

    Attributes:
        feature / statistic: Names.
        value: Finite value (NaN/inf rows are never stored).
        taught: Whether the value may teach the dynamic threshold.
        threshold / source: The threshold it was judged by and its source.
        reference_id: The reference it was computed against when not the hour's own (the
            season-matched reference of the season run rule: :mod:`drift_checks.policy`).
    """

    feature: str
    statistic: str
    value: float
    taught: bool = True
    threshold: float | None = None
    source: str | None = None
    reference_id: str | None = None


class HistoryStore:
    """Hourly statistics store.

    Args:
        url: SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://user@host/db``; a plain
            ``postgresql://`` URL uses psycopg 3).
        table_prefix: Prefix of the three table names.
        schema: Database schema (PostgreSQL) holding the tables.
        create: Create missing tables and indexes.
        cache_days: Span of taught values kept per series in ``drift_series_cache`` (days; at
            least the threshold look-back, ``TRITONFLOW_DRIFT_HISTORY_WINDOW_DAYS``, for the
            lookup to be served from it).
    """

    def __init__(self, url: str, table_prefix: str = "", schema: str | None = None,
                 create: bool = True, cache_days: float = DEFAULT_CACHE_DAYS):
        import sqlalchemy as sa

        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://"):]
        if url.startswith("sqlite:///"):
            from pathlib import Path

            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.url = url
        self.cache_hours = int(math.ceil(float(cache_days) * 24))
        self.engine = sa.create_engine(url, future=True)
        self.dialect = self.engine.dialect.name
        md = sa.MetaData(schema=schema)
        p = table_prefix
        self.stats = sa.Table(
            f"{p}drift_statistics", md,
            *_series_key(),
            sa.Column("hour", sa.DateTime(), primary_key=True),
            sa.Column("value", sa.Float(), nullable=False),
            sa.Column("model_version", sa.Integer(), nullable=True),
            sa.Column("taught", sa.Boolean(), nullable=False, server_default=sa.true()),
            sa.Column("threshold", sa.Float(), nullable=True),
            sa.Column("source", sa.String(32), nullable=True),
            # SQLite: the primary key IS the table (clustered), so the P95 range scan reads the
            # values from the key's B-tree without a second lookup per row.
            sqlite_with_rowid=False,
        )
        self.verdicts = sa.Table(
            f"{p}drift_feature_verdicts", md,
            sa.Column("model", sa.String(200), primary_key=True),
            sa.Column("reference_id", sa.String(200), primary_key=True),
            sa.Column("feature", sa.String(200), primary_key=True),
            sa.Column("hour", sa.DateTime(), primary_key=True),
            sa.Column("severity", sa.String(32), nullable=False),
            sa.Column("flagged", sa.Boolean(), nullable=False),
            sa.Column("strong", sa.Boolean(), nullable=False, server_default=sa.false()),
        )
        self.windows = sa.Table(
            f"{p}drift_windows", md,
            sa.Column("model", sa.String(200), primary_key=True),
            sa.Column("hour", sa.DateTime(), primary_key=True),
            sa.Column("status", sa.String(32), nullable=False),
            sa.Column("n_rows", sa.Integer(), nullable=False),
            sa.Column("model_version", sa.Integer(), nullable=True),
            sa.Column("reference_id", sa.String(200), nullable=False, server_default=""),
            sa.Column("dataset_drift", sa.Boolean(), nullable=False, server_default=sa.false()),
            sa.Column("alert", sa.Boolean(), nullable=False, server_default=sa.false()),
            sa.Column("summary", sa.Text(), nullable=True),
        )
        self.series = sa.Table(
            f"{p}drift_series_cache", md,
            *_series_key(),
            sa.Column("since", sa.Integer(), nullable=False),  # hours since the epoch (UTC)
            sa.Column("hours", sa.LargeBinary(), nullable=False),  # int64 hours, ascending
            sa.Column("vals", sa.LargeBinary(), nullable=False),  # float64 values, same order
        )
        # Hour-first index for pruning / "what ran in this hour" queries.
        sa.Index(f"ix_{p}drift_statistics_model_hour", self.stats.c.model, self.stats.c.hour)
        self.metadata = md
        if create:
            md.create_all(self.engine)
            self._check_schema()

    def _check_schema(self) -> None:
        """Refuse tables written by an older tritonflow (no ``reference_id``).

        The message says what to do; no data is touched.
        """
        import sqlalchemy as sa

        insp = sa.inspect(self.engine)
        for table in (self.stats, self.verdicts, self.windows):
            have = {c["name"] for c in insp.get_columns(table.name, schema=table.schema)}
            missing = sorted(c.name for c in table.c if c.name not in have)
            if missing:
                from ground.exceptions import SettingsError

                raise SettingsError(
                    f"drift history table {table.name!r} at {self.engine.url.render_as_string()} lacks "
                    f"columns {missing} (written by an older tritonflow, before thresholds were keyed "
                    "by reference); expected a new database: set TRITONFLOW_DRIFT_HISTORY_DB_URL to "
                    "an empty one, or drop the three drift_* tables")

    # ------------------------------------------------------------------ writes
    def _upsert(self, conn, table, rows: list[dict], keys: Sequence[str]) -> None:
        if not rows:
            return
        insert: Any  # either dialect's insert(): both build an INSERT ... ON CONFLICT DO UPDATE
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            insert = pg_insert
        elif self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            insert = sqlite_insert
        else:  # portable fallback: delete then insert
            import sqlalchemy as sa

            for r in rows:
                conn.execute(sa.delete(table).where(*[table.c[k] == r[k] for k in keys]))
            conn.execute(table.insert(), rows)
            return
        stmt = insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[table.c[k] for k in keys],
            set_={c.name: stmt.excluded[c.name] for c in table.c if c.name not in keys},
        )
        conn.execute(stmt, rows)

    def record_hour(
        self,
        model: str,
        hour: dt.datetime,
        *,
        status: str,
        n_rows: int,
        statistics: Iterable[StatisticRow] = (),
        verdicts: Mapping[str, tuple] | None = None,
        model_version: int | None = None,
        reference_id: str = "",
        dataset_drift: bool = False,
        alert: bool = False,
        summary: Mapping[str, Any] | None = None,
    ) -> int:
        """Replace everything stored for (model, hour) in one transaction.

        Args:
            model: Model name.
            hour: Any time inside the hour (timezone-aware); floored to the UTC hour.
            status: Window status (``ok``, ``no_data``, ``contract_failed``, ...).
            n_rows: Rows in the window.
            statistics: Hourly values; NaN/inf are skipped (never stored).
            verdicts: ``{feature: (severity, flagged)}`` or ``(severity, flagged, strong)``.
            model_version: Model version that served the window.
            reference_id: The reference the statistics were computed against.
            dataset_drift: The window's dataset verdict.
            alert: Whether a drift alert fired for the window.
            summary: JSON-serialisable summary kept with the window row.

        Returns:
            Number of statistic rows stored.
        """
        import sqlalchemy as sa

        h = _utc_hour(hour)
        ref = str(reference_id or "")
        stat_rows: list[dict[str, Any]] = [
            {"model": model, "reference_id": s.reference_id or ref, "feature": s.feature, "statistic": s.statistic,
             "hour": h, "value": float(s.value), "model_version": model_version,
             "taught": bool(s.taught),
             "threshold": None if s.threshold is None or not math.isfinite(float(s.threshold))
             else float(s.threshold), "source": s.source}
            for s in statistics
            if s.value is not None and math.isfinite(float(s.value))
        ]
        verdict_rows = [
            {"model": model, "reference_id": ref, "feature": f, "hour": h, "severity": v[0],
             "flagged": bool(v[1]), "strong": bool(v[2]) if len(v) > 2 else False}
            for f, v in (verdicts or {}).items()
        ]
        window_row = {"model": model, "hour": h, "status": status, "n_rows": int(n_rows),
                      "model_version": model_version, "reference_id": ref,
                      "dataset_drift": bool(dataset_drift), "alert": bool(alert),
                      "summary": json.dumps(summary, sort_keys=True) if summary is not None else None}
        with self.engine.begin() as conn:
            self._lock_model(conn, model)
            for t in (self.stats, self.verdicts):
                conn.execute(sa.delete(t).where(t.c.model == model, t.c.hour == h))
            self._upsert(conn, self.stats, stat_rows, ("model", "reference_id", "feature", "statistic", "hour"))
            self._upsert(conn, self.verdicts, verdict_rows, ("model", "reference_id", "feature", "hour"))
            self._upsert(conn, self.windows, [window_row], ("model", "hour"))
            self._update_cache(conn, model, h, {(r["reference_id"], r["feature"], r["statistic"]): r["value"]
                                                for r in stat_rows if r["taught"]})
        return len(stat_rows)

    # ------------------------------------------------------------------ lookup cache
    def _lock_model(self, conn, model: str) -> None:
        """Serialise writers of one model's history (the cache rows are read, then rewritten).

        PostgreSQL: a transaction-scoped advisory lock on the model. SQLite: the transaction's
        first statement is a write (it takes the database's write lock before anything is read).
        """
        if self.dialect == "postgresql":
            import sqlalchemy as sa

            conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
                         {"k": f"tritonflow.drift_history:{model}"})

    def _update_cache(self, conn, model: str, hour: dt.datetime,
                      values: Mapping[tuple[str, str, str], float]) -> None:
        """Replace ``hour`` in every cached series of ``model`` and add this hour's taught values.

        ``values``: ``{(reference_id, feature, statistic): value}``; series without a cache row are
        built from the table.
        """
        import sqlalchemy as sa

        c, hi = self.series, _hour_index(hour)
        rows = conn.execute(sa.select(c.c.reference_id, c.c.feature, c.c.statistic, c.c.since, c.c.hours,
                                      c.c.vals).where(c.c.model == model)).all()
        seen, updates = set(), []
        for ref, feature, statistic, since, hb, vb in rows:
            hrs, vals = np.frombuffer(hb, dtype="<i8"), np.frombuffer(vb, dtype="<f8")
            key = (ref, feature, statistic)
            add = values.get(key)
            if key in values:
                seen.add(key)
            keep = hrs != hi
            if add is None and keep.all():
                continue
            hrs, vals = hrs[keep], vals[keep]
            if add is not None and hi >= since:
                at = int(np.searchsorted(hrs, hi))
                hrs, vals = np.insert(hrs, at, hi), np.insert(vals, at, float(add))
            since = max(int(since), int(hrs[-1]) - self.cache_hours) if hrs.size else int(since)
            first = int(np.searchsorted(hrs, since))
            updates.append({"k_ref": ref, "k_feature": feature, "k_statistic": statistic, "k_since": since,
                            "k_hours": hrs[first:].astype("<i8").tobytes(),
                            "k_vals": vals[first:].astype("<f8").tobytes()})
        if updates:  # one executemany, not a statement per series
            b = sa.bindparam
            conn.execute(sa.update(c).where(c.c.model == model, c.c.reference_id == b("k_ref"),
                                            c.c.feature == b("k_feature"), c.c.statistic == b("k_statistic"))
                         .values(since=b("k_since"), hours=b("k_hours"), vals=b("k_vals")), updates)
        missing: dict[str, list[tuple[str, str]]] = {}
        for ref, feature, statistic in values:
            if (ref, feature, statistic) not in seen:
                missing.setdefault(ref, []).append((feature, statistic))
        for ref, keys in missing.items():
            self._build_cache(conn, model, ref, keys)

    def _build_cache(self, conn, model: str, reference_id: str, keys: Sequence[tuple[str, str]]) -> None:
        """(Re)build the cache rows of ``keys`` from the statistics table.

        Each row holds the taught values of the last ``cache_hours`` before the series' newest hour.
        """
        import sqlalchemy as sa

        t, c = self.stats, self.series
        wanted = set(keys)
        got: dict[tuple[str, str], list] = {}
        stmt = sa.select(t.c.feature, t.c.statistic, t.c.hour, t.c.value).where(
            t.c.model == model, t.c.reference_id == reference_id, t.c.taught == sa.true(),
            t.c.feature.in_(sorted({f for f, _ in wanted})), t.c.statistic.in_(sorted({s for _, s in wanted})))
        for f, s_, hr, v in conn.execute(stmt):
            if (f, s_) in wanted:
                got.setdefault((f, s_), []).append((_hour_index(hr), float(v)))
        conn.execute(sa.delete(c).where(c.c.model == model, c.c.reference_id == reference_id,
                                        sa.tuple_(c.c.feature, c.c.statistic).in_(sorted(wanted))))
        out = []
        for (f, s_), pts in got.items():
            pts.sort()
            hrs = np.fromiter((p_[0] for p_ in pts), dtype="<i8", count=len(pts))
            vals = np.fromiter((p_[1] for p_ in pts), dtype="<f8", count=len(pts))
            since = int(hrs[-1]) - self.cache_hours
            first = int(np.searchsorted(hrs, since))
            out.append({"model": model, "reference_id": reference_id, "feature": f, "statistic": s_,
                        "since": since, "hours": hrs[first:].tobytes(), "vals": vals[first:].tobytes()})
        if out:
            conn.execute(c.insert(), out)

    def _cached_quantiles(self, model: str, reference_id: str, start: dt.datetime, end: dt.datetime,
                          wanted: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], tuple[float, int]]:
        """Quantiles of the series whose cache covers ``[start, end)`` (one query per model)."""
        import sqlalchemy as sa

        c = self.series
        lo, hi = _hour_index(start), _hour_index(end)
        out: dict[tuple[str, str], tuple[float, int]] = {}
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(c.c.feature, c.c.statistic, c.c.since, c.c.hours, c.c.vals).where(
                c.c.model == model, c.c.reference_id == reference_id)).all()
        for feature, statistic, since, hb, vb in rows:
            key = (feature, statistic)
            if key not in wanted or since > lo:
                continue
            hrs = np.frombuffer(hb, dtype="<i8")
            a, b = np.searchsorted(hrs, lo), np.searchsorted(hrs, hi)
            if b > a:
                vals = np.frombuffer(vb, dtype="<f8")[a:b]
                out[key] = (float(np.quantile(vals, wanted[key], method="linear")), int(b - a))
            else:
                out[key] = (math.nan, 0)
        return out

    def bulk_load(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Upsert raw statistic rows (backfills, benchmarks).

        Rows hold ``model, feature, statistic, hour, value`` and optionally ``reference_id``, ``taught``.
        NaN/inf rows are skipped.
        """
        clean = [
            {**r, "hour": _utc_hour(r["hour"]), "model_version": r.get("model_version"),
             "reference_id": str(r.get("reference_id") or ""), "taught": bool(r.get("taught", True)),
             "threshold": r.get("threshold"), "source": r.get("source")}
            for r in rows
            if math.isfinite(float(r["value"]))
        ]
        series: dict[tuple[str, str], set] = {}
        for r in clean:
            series.setdefault((r["model"], r["reference_id"]), set()).add((r["feature"], r["statistic"]))
        with self.engine.begin() as conn:
            for model in sorted({m for m, _ in series}):
                self._lock_model(conn, model)
            for i in range(0, len(clean), 5000):
                self._upsert(conn, self.stats, clean[i:i + 5000],
                             ("model", "reference_id", "feature", "statistic", "hour"))
            for (model, ref), keys in series.items():
                self._build_cache(conn, model, ref, sorted(keys))

    # ------------------------------------------------------------------ reads
    def window(self, model: str, hour: dt.datetime) -> dict[str, Any] | None:
        """Stored window row (summary decoded), or ``None``."""
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.windows).where(
                self.windows.c.model == model, self.windows.c.hour == _utc_hour(hour))).mappings().first()
        if row is None:
            return None
        out = dict(row)
        out["summary"] = json.loads(out["summary"]) if out["summary"] else None
        return out

    def values(self, model: str, feature: str, statistic: str,
               reference_id: str | None = None) -> list[tuple[dt.datetime, float]]:
        """All stored (hour, value) of one series, by hour (every reference unless one is named)."""
        import sqlalchemy as sa

        t = self.stats
        where = [t.c.model == model, t.c.feature == feature, t.c.statistic == statistic]
        if reference_id is not None:
            where.append(t.c.reference_id == reference_id)
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.hour, t.c.value).where(*where).order_by(t.c.hour)).all()
        return [(r[0], r[1]) for r in rows]

    def quantiles(
        self,
        model: str,
        before: dt.datetime,
        days: float,
        wanted: Mapping[tuple[str, str], float],
        *,
        reference_id: str | None = None,
        taught_only: bool = False,
    ) -> dict[tuple[str, str], tuple[float, int]]:
        """Quantile of each (feature, statistic) series over ``[before - days, before)``.

        Args:
            model: Model name.
            before: The current hour (excluded: the baseline never contains the hour it judges).
            days: Length of the look-back window in days.
            wanted: ``{(feature, statistic): q}`` with q in [0, 1] (0.95 for distances, 0.05 for
                p-values).
            reference_id: Only values computed against this reference (``None``: every one).
            taught_only: Only values allowed to teach a threshold.

        Returns:
            ``{(feature, statistic): (quantile value, number of hourly values)}``; series without
            values are absent. Linear interpolation (PostgreSQL ``percentile_cont``, computed in
            SQL there; ``numpy.quantile(method="linear")`` on SQLite, same definition).
        """
        if not wanted:
            return {}
        end = _utc_hour(before)
        start = end - dt.timedelta(days=days)
        out: dict[tuple[str, str], tuple[float, int]] = {}
        if reference_id is not None and taught_only:  # the lookup the hourly check makes
            cached = self._cached_quantiles(model, reference_id, start, end, wanted)
            out.update({k: v for k, v in cached.items() if v[1] > 0})
            wanted = {k: wanted[k] for k in wanted if k not in cached}
            if not wanted:
                return out
        span = _SeriesSpan(model, start, end, sorted({f for f, _ in wanted}), sorted({s for _, s in wanted}),
                           reference_id, taught_only)
        if self.dialect == "postgresql":
            out.update(self._postgres_quantiles(span, wanted))
            return out
        rows = self._sqlite_values(span) if self.dialect == "sqlite" else self._values_in(span)
        out.update(_grouped_quantiles(rows, wanted))
        return out

    def _where(self, span: _SeriesSpan) -> list[Any]:
        """WHERE clauses selecting the statistics table's rows of ``span``."""
        import sqlalchemy as sa

        t = self.stats
        where = [t.c.model == span.model, t.c.hour >= span.start, t.c.hour < span.end,
                 t.c.feature.in_(span.features), t.c.statistic.in_(span.statistics)]
        if span.reference_id is not None:
            where.append(t.c.reference_id == span.reference_id)
        if span.taught_only:
            where.append(t.c.taught == sa.true())
        return where

    def _postgres_quantiles(self, span: _SeriesSpan, wanted: Mapping[tuple[str, str], float]
                            ) -> dict[tuple[str, str], tuple[float, int]]:
        """The quantiles computed in PostgreSQL (``percentile_cont``), one grouped query."""
        import sqlalchemy as sa

        t = self.stats
        qs = sorted(set(wanted.values()))
        cols = [sa.func.percentile_cont(q).within_group(t.c.value).label(f"q{i}") for i, q in enumerate(qs)]
        stmt = sa.select(t.c.feature, t.c.statistic, sa.func.count().label("n"), *cols).where(
            *self._where(span)).group_by(t.c.feature, t.c.statistic)
        out: dict[tuple[str, str], tuple[float, int]] = {}
        with self.engine.connect() as conn:
            for row in conn.execute(stmt).all():
                key = (row[0], row[1])
                if key in wanted:
                    out[key] = (float(row[3 + qs.index(wanted[key])]), int(row[2]))
        return out

    def _sqlite_values(self, span: _SeriesSpan) -> Sequence[Any]:
        """``(feature, statistic, value)`` rows of ``span`` on SQLite, ordered by (feature, statistic).

        ONE query through the primary-key B-tree (model, reference, feature IN, statistic IN, hour
        range; the table is clustered on that key, so values are read from the index itself),
        fetched as raw DB-API tuples. 50 features x 3 statistics x 720 hours: ~0.15 s (was 1.8 s
        with a rowid table, ORM rows and per-row Python grouping).
        """
        t = self.stats
        to_db = t.c.hour.type.bind_processor(self.engine.dialect) or (lambda v: v)
        marks = lambda n: ", ".join("?" * n)  # noqa: E731
        extra, params = "", []
        if span.reference_id is not None:
            extra += " AND reference_id = ?"
            params.append(span.reference_id)
        if span.taught_only:
            extra += " AND taught = 1"
        sql = (f"SELECT feature, statistic, value FROM "
               f"{self.engine.dialect.identifier_preparer.format_table(t)} "
               f"WHERE model = ?{extra} AND feature IN ({marks(len(span.features))}) "
               f"AND statistic IN ({marks(len(span.statistics))}) AND hour >= ? AND hour < ? "
               f"ORDER BY feature, statistic")
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute(sql, [span.model, *params, *span.features, *span.statistics, to_db(span.start),
                              to_db(span.end)])
            rows = cur.fetchall()
            cur.close()
        finally:
            raw.close()
        return rows

    def _values_in(self, span: _SeriesSpan) -> Sequence[Any]:
        """``(feature, statistic, value)`` rows of ``span`` (other dialects), ordered by (feature, statistic)."""
        import sqlalchemy as sa

        t = self.stats
        stmt = sa.select(t.c.feature, t.c.statistic, t.c.value).where(*self._where(span)).order_by(
            t.c.feature, t.c.statistic)
        with self.engine.connect() as conn:
            return list(conn.execute(stmt).all())

    def previous_flags(self, model: str, features: Iterable[str], hour: dt.datetime,
                       n: int, *, reference_id: str | None = None) -> dict[str, list[bool]]:
        """Flags of the ``n`` hours before ``hour`` per feature, oldest first.

        A missing hour (or one judged against another reference) counts as not flagged.
        """
        import sqlalchemy as sa

        feats = list(features)
        out = {f: [False] * n for f in feats}
        if n <= 0 or not feats:
            return out
        t = self.verdicts
        hours, where = _feature_lookback(t, model, feats, hour, n, reference_id)
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.feature, t.c.hour, t.c.flagged).where(*where)).all()
        for f, hr, flag in rows:
            if hr in hours:
                out[f][hours.index(hr)] = bool(flag)
        return out

    def previous_evidence(self, model: str, features: Iterable[str], hour: dt.datetime,
                          n: int, *, reference_id: str | None = None) -> dict[str, list[bool]]:
        """Evidence of drift in the ``n`` hours before ``hour`` per feature, oldest first.

        Evidence: at least one statistic of the feature was STRICTLY beyond the threshold it was
        judged by (the stored value and threshold, compared as
        :meth:`~drift_checks.statistic_types.Statistic.is_drift` does), whether or not the vote
        flagged the feature, where that threshold tells a shift from sampling noise: a p-value
        (significance) or a guard statistic beyond any threshold, an effect statistic (PSI,
        Wasserstein, JS) only beyond a ``reference`` or ``dynamic`` threshold (calibrated on windows
        of this size). An effect beyond a ``static`` threshold is no evidence: on small windows
        sampling noise alone exceeds the static 0.1. A missing hour, a statistic stored without a
        threshold, or one judged against another reference counts as no evidence.
        """
        import sqlalchemy as sa

        from drift_checks.statistics import REGISTRY

        feats = list(features)
        out = {f: [False] * n for f in feats}
        if n <= 0 or not feats:
            return out
        t = self.stats
        hours, where = _feature_lookback(t, model, feats, hour, n, reference_id)
        where.append(t.c.threshold.is_not(None))
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.feature, t.c.statistic, t.c.hour, t.c.value, t.c.threshold,
                                          t.c.source).where(*where)).all()
        for f, name, hr, value, threshold, source in rows:
            stat = REGISTRY.get(name)
            if hr not in hours or stat is None or not stat.is_drift(value, threshold):
                continue
            if stat.role == "effect" and source not in ("reference", "dynamic"):
                continue
            out[f][hours.index(hr)] = True
        return out

    def previous_windows(self, model: str, hour: dt.datetime, n: int, *,
                         reference_id: str | None = None) -> list[bool]:
        """Dataset verdicts (``dataset_drift``) of the ``n`` hours before ``hour``, oldest first.

        A missing hour, an empty one or one judged against another reference counts as no drift (the run
        of consecutive drifted windows is broken).
        """
        import sqlalchemy as sa

        h = _utc_hour(hour)
        hours = [h - dt.timedelta(hours=k) for k in range(n, 0, -1)]
        out = [False] * max(n, 0)
        if n <= 0:
            return out
        t = self.windows
        where = [t.c.model == model, t.c.hour >= hours[0], t.c.hour < h]
        if reference_id is not None:
            where.append(t.c.reference_id == reference_id)
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.hour, t.c.dataset_drift).where(*where)).all()
        for hr, drift in rows:
            if hr in hours:
                out[hours.index(hr)] = bool(drift)
        return out

    def last_alert(self, model: str, before: dt.datetime, *,
                   reference_id: str | None = None) -> tuple[dt.datetime, list[str]] | None:
        """The latest hour before ``before`` whose window raised a drift alert, or ``None``.

        It comes with the features the alert named (from its summary).
        """
        import sqlalchemy as sa

        t = self.windows
        where = [t.c.model == model, t.c.alert == sa.true(), t.c.hour < _utc_hour(before)]
        if reference_id is not None:
            where.append(t.c.reference_id == reference_id)
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.c.hour, t.c.summary).where(*where)
                               .order_by(t.c.hour.desc()).limit(1)).first()
        if row is None:
            return None
        summary = json.loads(row[1]) if row[1] else {}
        return row[0].replace(tzinfo=dt.timezone.utc), list(summary.get("alert_features") or [])

    def drop(self) -> None:
        """Drop the three tables (tests, teardown)."""
        self.metadata.drop_all(self.engine)
        self.engine.dispose()



@dataclasses.dataclass(frozen=True)
class _SeriesSpan:
    """The statistics-history rows a quantile lookup reads: which series, over which hours."""

    model: str
    start: dt.datetime
    end: dt.datetime
    features: list[str]
    statistics: list[str]
    reference_id: str | None
    taught_only: bool


def _grouped_quantiles(rows: Sequence[Any], wanted: Mapping[tuple[str, str], float]
                       ) -> dict[tuple[str, str], tuple[float, int]]:
    """Quantile and count of each contiguous (feature, statistic) group of ``rows`` (numpy, linear)."""
    out: dict[tuple[str, str], tuple[float, int]] = {}
    if not rows:
        return out
    keys = [(f, st) for f, st, _ in rows]
    values = np.fromiter((r[2] for r in rows), dtype="float64", count=len(rows))
    bounds = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    for lo, hi in itertools.pairwise(bounds):
        key = keys[lo]
        if key in wanted:
            out[key] = (float(np.quantile(values[lo:hi], wanted[key], method="linear")), hi - lo)
    return out


def default_history_url(settings: Settings) -> str:
    """The drift history's SQLAlchemy URL.

    Args:
        settings: The settings in effect, read by the caller.

    Returns:
        ``settings.drift_history_db_url``, or SQLite at ``<home>/drift/history.db`` when it is empty.
    """
    url = getattr(settings, "drift_history_db_url", "")
    return url or f"sqlite:///{settings.home / 'drift' / 'history.db'}"


def _feature_lookback(t: Any, model: str, feats: list[str], hour: dt.datetime, n: int,
                      reference_id: str | None) -> tuple[list[dt.datetime], list[Any]]:
    """The ``n`` hours before ``hour`` (oldest first) and the WHERE clauses selecting them in ``t``."""
    h = _utc_hour(hour)
    hours = [h - dt.timedelta(hours=k) for k in range(n, 0, -1)]
    where = [t.c.model == model, t.c.feature.in_(feats), t.c.hour >= hours[0], t.c.hour < h]
    if reference_id is not None:
        where.append(t.c.reference_id == reference_id)
    return hours, where
