"""History of hourly drift statistics (SQLAlchemy: SQLite embedded, PostgreSQL in deployment).

Three tables (names take an optional prefix, e.g. for tests or several deployments in one
schema):

* ``drift_statistics``: one row per (model, feature, statistic, hour) with the finite value;
  primary key ``(model, feature, statistic, hour)`` is also the index the P95 lookup scans
  (a range scan per model over the last N days).
* ``drift_feature_verdicts``: one row per (model, feature, hour): severity and whether any
  statistic crossed its threshold (used for the consecutive-window rule).
* ``drift_windows``: one row per (model, hour): status (``ok``, ``no_data``, ``invalid``...),
  row count, model version and the JSON summary.

Writes are idempotent per hour: :meth:`HistoryStore.record_hour` replaces everything stored for
that (model, hour) in one transaction (delete, then upsert), so a rerun or backfill never
duplicates rows. NaN and infinite values are refused before they reach the table.

Hours are stored as naive UTC ``DateTime`` values (same representation on both back ends).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tritonflow.exceptions import DataError


def _utc_hour(hour: dt.datetime) -> dt.datetime:
    import pandas as pd

    t = pd.Timestamp(hour)
    if t.tzinfo is None:
        raise DataError(f"hour {hour!r} is naive; expected a timezone-aware (UTC) datetime")
    return t.tz_convert("UTC").floor("h").tz_localize(None).to_pydatetime()


@dataclasses.dataclass(frozen=True)
class StatisticRow:
    """One hourly value: feature, statistic name and finite value."""

    feature: str
    statistic: str
    value: float


class HistoryStore:
    """Hourly statistics store.

    Args:
        url: SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://user@host/db``; a plain
            ``postgresql://`` URL uses psycopg 3).
        table_prefix: Prefix of the three table names.
        schema: Database schema (PostgreSQL) holding the tables.
        create: Create missing tables and indexes.
    """

    def __init__(self, url: str, table_prefix: str = "", schema: str | None = None,
                 create: bool = True):
        import sqlalchemy as sa

        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://"):]
        if url.startswith("sqlite:///"):
            from pathlib import Path

            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.url = url
        self.engine = sa.create_engine(url, future=True)
        self.dialect = self.engine.dialect.name
        md = sa.MetaData(schema=schema)
        p = table_prefix
        self.stats = sa.Table(
            f"{p}drift_statistics", md,
            sa.Column("model", sa.String(200), primary_key=True),
            sa.Column("feature", sa.String(200), primary_key=True),
            sa.Column("statistic", sa.String(64), primary_key=True),
            sa.Column("hour", sa.DateTime(), primary_key=True),
            sa.Column("value", sa.Float(), nullable=False),
            sa.Column("model_version", sa.Integer(), nullable=True),
            # SQLite: the primary key IS the table (clustered), so the P95 range scan reads the
            # values from the key's B-tree without a second lookup per row.
            sqlite_with_rowid=False,
        )
        self.verdicts = sa.Table(
            f"{p}drift_feature_verdicts", md,
            sa.Column("model", sa.String(200), primary_key=True),
            sa.Column("feature", sa.String(200), primary_key=True),
            sa.Column("hour", sa.DateTime(), primary_key=True),
            sa.Column("severity", sa.String(32), nullable=False),
            sa.Column("flagged", sa.Boolean(), nullable=False),
        )
        self.windows = sa.Table(
            f"{p}drift_windows", md,
            sa.Column("model", sa.String(200), primary_key=True),
            sa.Column("hour", sa.DateTime(), primary_key=True),
            sa.Column("status", sa.String(32), nullable=False),
            sa.Column("n_rows", sa.Integer(), nullable=False),
            sa.Column("model_version", sa.Integer(), nullable=True),
            sa.Column("summary", sa.Text(), nullable=True),
        )
        # Hour-first index for pruning / "what ran in this hour" queries.
        sa.Index(f"ix_{p}drift_statistics_model_hour", self.stats.c.model, self.stats.c.hour)
        self.metadata = md
        if create:
            md.create_all(self.engine)

    # ------------------------------------------------------------------ writes
    def _upsert(self, conn, table, rows: list[dict], keys: Sequence[str]) -> None:
        if not rows:
            return
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
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
        verdicts: Mapping[str, tuple[str, bool]] | None = None,
        model_version: int | None = None,
        summary: Mapping[str, Any] | None = None,
    ) -> int:
        """Replace everything stored for (model, hour) in one transaction.

        Args:
            model: Model name.
            hour: Any time inside the hour (timezone-aware); floored to the UTC hour.
            status: Window status (``ok``, ``no_data``, ``invalid``, ...).
            n_rows: Rows in the window.
            statistics: Hourly values; NaN/inf are skipped (never stored).
            verdicts: ``{feature: (severity, flagged)}``.
            model_version: Model version that served the window.
            summary: JSON-serialisable summary kept with the window row.

        Returns:
            Number of statistic rows stored.
        """
        import sqlalchemy as sa

        h = _utc_hour(hour)
        stat_rows = [
            {"model": model, "feature": s.feature, "statistic": s.statistic, "hour": h,
             "value": float(s.value), "model_version": model_version}
            for s in statistics
            if s.value is not None and math.isfinite(float(s.value))
        ]
        verdict_rows = [
            {"model": model, "feature": f, "hour": h, "severity": sev, "flagged": bool(flag)}
            for f, (sev, flag) in (verdicts or {}).items()
        ]
        window_row = {"model": model, "hour": h, "status": status, "n_rows": int(n_rows),
                      "model_version": model_version,
                      "summary": json.dumps(summary, sort_keys=True) if summary is not None else None}
        with self.engine.begin() as conn:
            for t in (self.stats, self.verdicts):
                conn.execute(sa.delete(t).where(t.c.model == model, t.c.hour == h))
            self._upsert(conn, self.stats, stat_rows, ("model", "feature", "statistic", "hour"))
            self._upsert(conn, self.verdicts, verdict_rows, ("model", "feature", "hour"))
            self._upsert(conn, self.windows, [window_row], ("model", "hour"))
        return len(stat_rows)

    def bulk_load(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Upsert raw statistic rows (``model, feature, statistic, hour, value``): backfills,
        benchmarks. NaN/inf rows are skipped."""
        clean = [
            {**r, "hour": _utc_hour(r["hour"]), "model_version": r.get("model_version")}
            for r in rows
            if math.isfinite(float(r["value"]))
        ]
        with self.engine.begin() as conn:
            for i in range(0, len(clean), 5000):
                self._upsert(conn, self.stats, clean[i:i + 5000],
                             ("model", "feature", "statistic", "hour"))

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

    def values(self, model: str, feature: str, statistic: str) -> list[tuple[dt.datetime, float]]:
        """All stored (hour, value) of one series, by hour."""
        import sqlalchemy as sa

        t = self.stats
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.hour, t.c.value).where(
                t.c.model == model, t.c.feature == feature, t.c.statistic == statistic
            ).order_by(t.c.hour)).all()
        return [(r[0], r[1]) for r in rows]

    def quantiles(
        self,
        model: str,
        before: dt.datetime,
        days: float,
        wanted: Mapping[tuple[str, str], float],
    ) -> dict[tuple[str, str], tuple[float, int]]:
        """Quantile of each (feature, statistic) series over ``[before - days, before)``.

        Args:
            model: Model name.
            before: The current hour (excluded: the baseline never contains the hour it judges).
            days: Length of the look-back window in days.
            wanted: ``{(feature, statistic): q}`` with q in [0, 1] (0.95 for distances, 0.05 for
                p-values).

        Returns:
            ``{(feature, statistic): (quantile value, number of hourly values)}``; series without
            values are absent. Linear interpolation (PostgreSQL ``percentile_cont``, computed in
            SQL there; ``numpy.quantile(method="linear")`` on SQLite, same definition).
        """
        import sqlalchemy as sa

        if not wanted:
            return {}
        end = _utc_hour(before)
        start = end - dt.timedelta(days=days)
        t = self.stats
        features = sorted({f for f, _ in wanted})
        stats = sorted({s for _, s in wanted})
        where = [t.c.model == model, t.c.hour >= start, t.c.hour < end,
                 t.c.feature.in_(features), t.c.statistic.in_(stats)]
        out: dict[tuple[str, str], tuple[float, int]] = {}
        if self.dialect == "postgresql":
            qs = sorted(set(wanted.values()))
            cols = [sa.func.percentile_cont(q).within_group(t.c.value).label(f"q{i}")
                    for i, q in enumerate(qs)]
            stmt = sa.select(t.c.feature, t.c.statistic, sa.func.count().label("n"), *cols).where(
                *where).group_by(t.c.feature, t.c.statistic)
            with self.engine.connect() as conn:
                for row in conn.execute(stmt).all():
                    key = (row[0], row[1])
                    if key in wanted:
                        out[key] = (float(row[3 + qs.index(wanted[key])]), int(row[2]))
            return out
        # SQLite: ONE query through the primary-key B-tree (model, feature IN, statistic IN,
        # hour range; the table is clustered on that key, so values are read from the index
        # itself), rows ordered by (feature, statistic), fetched as raw DB-API tuples; quantiles
        # with numpy per contiguous group. 50 features x 3 statistics x 720 hours: ~0.15 s (was
        # 1.8 s with a rowid table, ORM rows and per-row Python grouping).
        if self.dialect == "sqlite":
            to_db = t.c.hour.type.bind_processor(self.engine.dialect) or (lambda v: v)
            marks = lambda n: ", ".join("?" * n)  # noqa: E731
            sql = (f"SELECT feature, statistic, value FROM "
                   f"{self.engine.dialect.identifier_preparer.format_table(t)} "
                   f"WHERE model = ? AND feature IN ({marks(len(features))}) "
                   f"AND statistic IN ({marks(len(stats))}) AND hour >= ? AND hour < ? "
                   f"ORDER BY feature, statistic")
            raw = self.engine.raw_connection()
            try:
                cur = raw.cursor()
                cur.execute(sql, [model, *features, *stats, to_db(start), to_db(end)])
                rows = cur.fetchall()
                cur.close()
            finally:
                raw.close()
        else:
            stmt = sa.select(t.c.feature, t.c.statistic, t.c.value).where(*where).order_by(
                t.c.feature, t.c.statistic)
            with self.engine.connect() as conn:
                rows = conn.execute(stmt).all()
        if not rows:
            return out
        keys = [(f, st) for f, st, _ in rows]
        values = np.fromiter((r[2] for r in rows), dtype="float64", count=len(rows))
        bounds = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            key = keys[lo]
            if key in wanted:
                out[key] = (float(np.quantile(values[lo:hi], wanted[key], method="linear")), hi - lo)
        return out

    def previous_flags(self, model: str, features: Iterable[str], hour: dt.datetime,
                       n: int) -> dict[str, list[bool]]:
        """Flags of the ``n`` hours before ``hour`` per feature, oldest first; a missing hour
        counts as not flagged (the run of consecutive windows is broken)."""
        import sqlalchemy as sa

        h = _utc_hour(hour)
        hours = [h - dt.timedelta(hours=k) for k in range(n, 0, -1)]
        feats = list(features)
        out = {f: [False] * n for f in feats}
        if n <= 0 or not feats:
            return out
        t = self.verdicts
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.feature, t.c.hour, t.c.flagged).where(
                t.c.model == model, t.c.feature.in_(feats), t.c.hour >= hours[0], t.c.hour < h)).all()
        for f, hr, flag in rows:
            if hr in hours:
                out[f][hours.index(hr)] = bool(flag)
        return out

    def drop(self) -> None:
        """Drop the three tables (tests, teardown)."""
        self.metadata.drop_all(self.engine)
        self.engine.dispose()


def default_history_url(settings=None) -> str:
    """``settings.drift_history_db_url`` or SQLite at ``<home>/drift/history.db``."""
    from tritonflow.settings import get_settings

    s = settings or get_settings()
    url = getattr(s, "drift_history_db_url", "")
    return url or f"sqlite:///{s.home / 'drift' / 'history.db'}"
