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
        stmt = sa.select(t.c.feature, t.c.statistic, t.c.value).where(*where).order_by(
            t.c.feature, t.c.statistic)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        groups: dict[tuple[str, str], list[float]] = {}
        for f, s, v in rows:
            groups.setdefault((f, s), []).append(v)
        for key, vals in groups.items():
            if key in wanted:
                out[key] = (float(np.quantile(np.asarray(vals), wanted[key], method="linear")), len(vals))
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
