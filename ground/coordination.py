"""Coordination across processes and hosts through the shared database.

Everything that changes what serves (Triton model control, the champion alias, the gateway, the
repository) and the long-running jobs that lead there (retraining) are serialised per model by
**leases** kept in one SQL table of the shared database: the drift history database
(``TRITONFLOW_COORDINATION_DB_URL``, default ``TRITONFLOW_DRIFT_HISTORY_DB_URL``, default SQLite at
``<home>/drift/history.db``). PostgreSQL in production, so that Airflow workers on several hosts
share it; SQLite serialises the processes of one host. Nothing lives in a host-local lock file.

Lease protocol (table ``tritonflow_leases``, one row per ``(purpose, name)``):

* **Acquire** is one conditional ``UPDATE ... WHERE holder_id IS NULL OR expires_at < now`` after an
  ``INSERT ... ON CONFLICT DO NOTHING`` of the free row: the database's row lock makes it atomic on
  PostgreSQL and SQLite alike (no read-then-write). Each acquisition increments the row's
  **fencing token**; a holder whose token is no longer the row's has lost the lease.
* A holder renews its lease every ``ttl_s / 3`` from a heartbeat thread; a holder that stops
  (crash, killed worker, partition) loses it ``ttl_s`` seconds after its last heartbeat. A holder
  on this host whose process is gone is taken over at once (its pid is checked, same host only).
* A refused acquire raises :class:`~ground.exceptions.LeaseBusyError` naming the holder
  (its text, host, pid), since when it holds it and when the lease expires.
* Release clears the holder only if the fencing token still matches (a taken-over lease is never
  released by its former holder).
* Every acquisition is also appended to ``tritonflow_lease_history`` (purpose, name, token, holder,
  host, pid, when acquired and released; :meth:`CoordinationStore.lease_history`), so which host
  held which lease can be read after the fact, e.g. per worker of a multi-host run. Rows older than
  :data:`LEASE_HISTORY_KEEP_S` are dropped as new ones are written.

Times are the workers' wall clocks (``time.time``); hosts must keep them NTP-synchronised within a
small part of ``ttl_s`` (default 60 s).

The same database keeps small coordination state (table ``tritonflow_state``: the registry
watcher's seen facts, the registry changes acted on and the webhook deliveries stored
(``tritonflow_plugin.change_ledger``), the retrain guard) and the **desired versions** of each
served model (table ``tritonflow_model_versions``, see :mod:`repository_sync.triton.model_control`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import sqlalchemy as sa

from ground.exceptions import DataError, LeaseBusyError, LeaseLostError, ServiceUnavailableError

#: Lease purposes (what a lease serialises).
PROMOTION = "promotion"
RETRAIN = "retrain"
MODEL_CONTROL = "model-control"
GATEWAY = "gateway"
#: Seconds a lease lives without a heartbeat (``TRITONFLOW_LEASE_TTL_S``).
DEFAULT_TTL_S = 60.0
#: Seconds between two acquisition attempts while waiting for a held lease.
POLL_INTERVAL_S = 0.1
#: Seconds a lease acquisition stays in ``tritonflow_lease_history`` (30 days).
LEASE_HISTORY_KEEP_S = 30 * 86400.0

metadata = sa.MetaData()
leases = sa.Table(
    "tritonflow_leases", metadata,
    sa.Column("purpose", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(512), primary_key=True),
    sa.Column("holder_id", sa.String(128), nullable=True),
    sa.Column("holder", sa.Text, nullable=True),
    sa.Column("host", sa.String(255), nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("acquired_at", sa.Float, nullable=True),
    sa.Column("expires_at", sa.Float, nullable=False, default=0.0),
    sa.Column("token", sa.BigInteger, nullable=False, default=0),
)
lease_history = sa.Table(
    "tritonflow_lease_history", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("purpose", sa.String(64), nullable=False),
    sa.Column("name", sa.String(512), nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.Text, nullable=True),
    sa.Column("host", sa.String(255), nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("acquired_at", sa.Float, nullable=False),
    sa.Column("released_at", sa.Float, nullable=True),
)
state = sa.Table(
    "tritonflow_state", metadata,
    sa.Column("scope", sa.String(128), primary_key=True),
    sa.Column("key", sa.String(512), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)
model_versions = sa.Table(
    "tritonflow_model_versions", metadata,
    sa.Column("model", sa.String(512), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("purpose", sa.String(64), nullable=False),
    sa.Column("holder", sa.Text, nullable=True),
    sa.Column("since", sa.Float, nullable=False),
)

_ENGINES: dict[str, sa.Engine] = {}
_ENGINES_LOCK = threading.Lock()


def database_url(settings: Any = None) -> str:
    """The coordination database URL of ``settings`` (default: :func:`get_settings`).

    ``coordination_db_url``, else ``drift_history_db_url``, else SQLite at ``<home>/drift/history.db``.
    """
    if settings is None:
        from ground.settings import get_settings

        settings = get_settings()
    url = getattr(settings, "coordination_db_url", "") or getattr(settings, "drift_history_db_url", "")
    return url or f"sqlite:///{Path(settings.home) / 'drift' / 'history.db'}"


def _iso(t: float | None) -> str:
    if not t:
        return "?"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_died(row: Mapping[str, Any]) -> bool:
    """Whether a lease row's holder was a process on this host that no longer exists.

    Such a lease is free at once (:meth:`CoordinationStore.try_acquire` takes it over); a holder
    on another host is only freed by its expiry.
    """
    return bool(row.get("pid")) and row.get("host") == socket.gethostname() and not _pid_alive(int(row["pid"]))


def engine_for(url: str) -> sa.Engine:
    """One cached engine per URL, tables created; ``postgresql://`` uses psycopg 3.

    Raises:
        DataError: ``url`` is empty or not a SQLAlchemy URL.
        ServiceUnavailableError: The database cannot be reached.
    """
    if not url:
        raise DataError("coordination database url='' is empty; expected a SQLAlchemy URL")
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    with _ENGINES_LOCK:
        engine = _ENGINES.get(url)
        if engine is not None:
            return engine
        try:
            parsed = sa.engine.make_url(url)
        except Exception as exc:
            raise DataError(f"coordination database url={url!r} is not a SQLAlchemy URL: {exc}") from None
        kwargs: dict[str, Any] = {}
        if parsed.get_backend_name() == "sqlite":
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            else:  # one in-memory database shared by the threads of this process
                kwargs["poolclass"] = sa.pool.StaticPool
            kwargs["connect_args"] = {"timeout": 30.0, "check_same_thread": False}
        engine = sa.create_engine(parsed, **kwargs)
        _create_tables(engine)
        _ENGINES[url] = engine
        return engine


def _create_tables(engine: sa.Engine) -> None:
    """Create the tables once, safe when several processes start at the same moment."""
    for attempt in range(5):
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":  # serialise concurrent creators
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(7263514)"))
                metadata.create_all(conn, checkfirst=True)
            return
        except sa.exc.OperationalError as exc:
            if "already exists" in str(exc) or "locked" in str(exc):
                time.sleep(0.1 * (attempt + 1))
                continue
            raise ServiceUnavailableError(f"coordination database {engine.url!r} unreachable: {exc}") from exc
    metadata.create_all(engine, checkfirst=True)


def _dialect_insert(engine: sa.Engine, table: sa.Table) -> Any:
    """``INSERT`` of the engine's dialect (PostgreSQL or SQLite: both have ``ON CONFLICT``)."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)


def _insert_ignore(engine: sa.Engine, table: sa.Table, **values: Any) -> Any:
    return _dialect_insert(engine, table).values(**values).on_conflict_do_nothing()


def _upsert(engine: sa.Engine, table: sa.Table, keys: tuple[str, ...], **values: Any) -> Any:
    stmt = _dialect_insert(engine, table).values(**values)
    return stmt.on_conflict_do_update(index_elements=list(keys),
                                      set_={k: stmt.excluded[k] for k in values if k not in keys})


@contextlib.contextmanager
def write_transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A transaction that holds the database's write lock from its start on SQLite.

    SQLite: ``BEGIN IMMEDIATE`` (no other writer until commit). PostgreSQL: an ordinary transaction;
    use ``SELECT ... FOR UPDATE`` on the rows it reads before writing them.
    """
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
    else:
        with engine.begin() as conn:
            yield conn


# ----------------------------------------------------------------------------- leases
@dataclasses.dataclass
class Lease:
    """A held lease. ``token`` is the fencing token: larger for every later holder of the row."""

    store: "CoordinationStore"
    purpose: str
    name: str
    holder_id: str
    holder: str
    token: int
    ttl_s: float
    acquired_at: float
    lost: threading.Event = dataclasses.field(default_factory=threading.Event)
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def renew(self) -> bool:
        """Push the expiry ``ttl_s`` ahead; False (and :attr:`lost` set) if the lease was lost."""
        with self.store.engine.begin() as conn:
            n = conn.execute(
                leases.update()
                .where(leases.c.purpose == self.purpose, leases.c.name == self.name,
                       leases.c.token == self.token, leases.c.holder_id == self.holder_id)
                .values(expires_at=time.time() + self.ttl_s)
            ).rowcount
        if n != 1:
            self.lost.set()
        return n == 1

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless this lease is still held (call before a write).

        Raises:
            LeaseLostError: The lease expired or another holder took it; stop the work.
        """
        if self.lost.is_set() or not self.renew():
            raise LeaseLostError(
                f"{self.purpose} lease of {self.name!r} (fencing token {self.token}) was lost: no "
                f"heartbeat within {self.ttl_s:g} s or taken over; stop and retry"
            )

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3.0):
            try:
                if not self.renew():
                    return
            except Exception:  # noqa: BLE001 - a database blip: try again next beat
                continue

    def start_heartbeat(self) -> None:
        """Renew in a daemon thread until :meth:`release`."""
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name=f"lease-{self.purpose}-{self.name}")
        self._thread.start()

    def stop_heartbeat(self) -> None:
        """Stop renewing (the lease then expires ``ttl_s`` after the last renewal)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def release(self) -> None:
        """Stop the heartbeat and free the row if this lease still holds it."""
        self.stop_heartbeat()
        with self.store.engine.begin() as conn:
            n = conn.execute(
                leases.update()
                .where(leases.c.purpose == self.purpose, leases.c.name == self.name,
                       leases.c.token == self.token, leases.c.holder_id == self.holder_id)
                .values(holder_id=None, holder=None, host=None, pid=None, expires_at=0.0)
            ).rowcount
            if n != 1:  # lost to another holder: the history keeps it unreleased
                return
            conn.execute(
                lease_history.update()
                .where(lease_history.c.purpose == self.purpose, lease_history.c.name == self.name,
                       lease_history.c.token == self.token, lease_history.c.released_at.is_(None))
                .values(released_at=time.time())
            )


class CoordinationStore:
    """Leases and coordination state in the shared database.

    Args:
        url: SQLAlchemy URL (``sqlite:///path.db``, ``postgresql://user@host/db``).
        ttl_s: Default lease time-to-live without heartbeat (seconds, > 0).
    """

    def __init__(self, url: str, *, ttl_s: float = DEFAULT_TTL_S,
                 model_control_timeout_s: float | None = None) -> None:
        if not ttl_s > 0:
            raise DataError(f"lease ttl_s={ttl_s!r} must be > 0 seconds")
        self.url = url
        self.ttl_s = float(ttl_s)
        #: Seconds a Triton load/unload waits for the model-control lease (None: the client's default).
        self.model_control_timeout_s = model_control_timeout_s
        self.engine = engine_for(url)

    @classmethod
    def from_settings(cls, settings: Any = None) -> "CoordinationStore":
        """Store at :func:`database_url` with ``settings.lease_ttl_s`` and ``model_control_lock_timeout_s``."""
        if settings is None:
            from ground.settings import get_settings

            settings = get_settings()
        return cls(database_url(settings), ttl_s=getattr(settings, "lease_ttl_s", DEFAULT_TTL_S),
                   model_control_timeout_s=getattr(settings, "model_control_lock_timeout_s", None))

    # ------------------------------------------------------------------ leases
    def holder_of(self, purpose: str, name: str) -> dict[str, Any] | None:
        """The current holder row of a lease (``None`` when free or expired)."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(leases).where(leases.c.purpose == purpose,
                                                       leases.c.name == name)).mappings().first()
        if row is None or row["holder_id"] is None or row["expires_at"] < time.time():
            return None
        return dict(row)

    def try_acquire(self, purpose: str, name: str, *, holder: str = "",
                    ttl_s: float | None = None) -> Lease | None:
        """One atomic attempt; the :class:`Lease` or ``None`` when someone else holds it."""
        if not name:
            raise DataError(f"{purpose} lease: name='' is empty; expected a model name")
        ttl = float(ttl_s or self.ttl_s)
        holder_id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(6).hex()}"
        now = time.time()
        mine = dict(holder_id=holder_id, holder=holder, host=socket.gethostname(), pid=os.getpid(),
                    acquired_at=now, expires_at=now + ttl, token=leases.c.token + 1)
        with self.engine.begin() as conn:
            conn.execute(_insert_ignore(self.engine, leases, purpose=purpose, name=name,
                                        expires_at=0.0, token=0))
            n = conn.execute(
                leases.update()
                .where(leases.c.purpose == purpose, leases.c.name == name,
                       sa.or_(leases.c.holder_id.is_(None), leases.c.expires_at < now))
                .values(**mine)
            ).rowcount
        if n != 1:
            other = self.holder_of(purpose, name)
            if not (other and other["pid"] != os.getpid() and holder_died(other)):
                return None
            with self.engine.begin() as conn:  # its process is gone: compare-and-set on the token
                n = conn.execute(
                    leases.update()
                    .where(leases.c.purpose == purpose, leases.c.name == name,
                           leases.c.token == other["token"])
                    .values(**mine)
                ).rowcount
            if n != 1:
                return None
        with self.engine.begin() as conn:
            token = conn.execute(sa.select(leases.c.token).where(
                leases.c.purpose == purpose, leases.c.name == name,
                leases.c.holder_id == holder_id)).scalar_one()
            conn.execute(lease_history.delete().where(lease_history.c.acquired_at < now - LEASE_HISTORY_KEEP_S))
            conn.execute(lease_history.insert().values(
                purpose=purpose, name=name, token=int(token), holder=holder, host=mine["host"],
                pid=mine["pid"], acquired_at=now, released_at=None))
        return Lease(self, purpose, name, holder_id, holder, int(token), ttl, now)

    def lease_history(self, purposes: tuple[str, ...] = (), since: float = 0.0) -> list[dict[str, Any]]:
        """Every recorded acquisition (oldest first), e.g. to tell which host held which lease.

        Args:
            purposes: Only these lease purposes (e.g. ``(MODEL_CONTROL, PROMOTION)``); all when empty.
            since: Only acquisitions at or after this time (seconds since the epoch).

        Returns:
            ``[{"purpose", "name", "token", "holder", "host", "pid", "acquired_at", "released_at"}]``;
            ``released_at`` is ``None`` for a lease still held or lost without release (expired).
        """
        q = sa.select(lease_history).where(lease_history.c.acquired_at >= since)
        if purposes:
            q = q.where(lease_history.c.purpose.in_(purposes))
        with self.engine.connect() as conn:
            rows = conn.execute(q.order_by(lease_history.c.acquired_at, lease_history.c.id)).mappings().all()
        return [{k: v for k, v in row.items() if k != "id"} for row in rows]

    def acquire(self, purpose: str, name: str, *, holder: str = "", timeout_s: float = 0.0,
                ttl_s: float | None = None, what: str | None = None) -> Lease:
        """Take the lease, waiting up to ``timeout_s``; the caller must :meth:`Lease.release` it.

        Raises:
            LeaseBusyError: Still held after ``timeout_s``; names the holder, since when and the expiry.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            lease = self.try_acquire(purpose, name, holder=holder, ttl_s=ttl_s)
            if lease is not None:
                lease.start_heartbeat()
                return lease
            if time.monotonic() >= deadline:
                other = self.holder_of(purpose, name) or {}
                if not other:  # released or expired since the attempt: one more try
                    lease = self.try_acquire(purpose, name, holder=holder, ttl_s=ttl_s)
                    if lease is not None:
                        lease.start_heartbeat()
                        return lease
                who = other.get("holder") or "an unnamed holder"
                since = _iso(other.get("acquired_at"))
                left = max(0.0, (other.get("expires_at") or 0.0) - time.time())
                raise LeaseBusyError(
                    f"{what or f'{purpose} of model {name!r}'} is already in progress, held by "
                    f"{who!r} (pid {other.get('pid', '?')} on host {other.get('host', '?')} since "
                    f"{since}, fencing token {other.get('token', '?')}; its lease expires in "
                    f"{left:.0f} s unless renewed); waited {timeout_s:g} s. Wait for it to finish "
                    f"or stop it (coordination database {self.engine.url!r})",
                    purpose=purpose, name=name, holder=str(who), since=since,
                )
            time.sleep(POLL_INTERVAL_S)

    @contextlib.contextmanager
    def hold(self, purpose: str, name: str, *, holder: str = "", timeout_s: float = 0.0,
             ttl_s: float | None = None, what: str | None = None) -> Iterator[Lease]:
        """Context manager: :meth:`acquire`, heartbeat during the block, release at exit."""
        lease = self.acquire(purpose, name, holder=holder, timeout_s=timeout_s, ttl_s=ttl_s, what=what)
        try:
            yield lease
        finally:
            lease.release()

    # ------------------------------------------------------------------ key/value state
    def get_state(self, scope: str, key: str, default: Any = None) -> Any:
        """The JSON value stored under ``(scope, key)``, or ``default``."""
        with self.engine.connect() as conn:
            raw = conn.execute(sa.select(state.c.value).where(state.c.scope == scope,
                                                              state.c.key == key)).scalar()
        return default if raw is None else json.loads(raw)

    def set_state(self, scope: str, key: str, value: Any, conn: sa.Connection | None = None) -> None:
        """Store ``value`` (JSON) under ``(scope, key)``, in ``conn``'s transaction when given."""
        stmt = _upsert(self.engine, state, ("scope", "key"), scope=scope, key=key,
                       value=json.dumps(value, sort_keys=True), updated_at=time.time())
        if conn is not None:
            conn.execute(stmt)
            return
        with self.engine.begin() as c:
            c.execute(stmt)

    @contextlib.contextmanager
    def locked_state(self, scope: str, key: str) -> Iterator[tuple[sa.Connection, Any]]:
        """A write transaction holding ``(scope, key)`` locked: yields ``(conn, value or None)``.

        Read-check-write of one state row is atomic: ``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR
        UPDATE`` (after creating the row) on PostgreSQL. Write back with :meth:`set_state` (``conn=``).
        """
        with write_transaction(self.engine) as conn:
            if self.engine.dialect.name == "postgresql":
                conn.execute(_insert_ignore(self.engine, state, scope=scope, key=key, value="null",
                                            updated_at=time.time()))
            q = sa.select(state.c.value).where(state.c.scope == scope, state.c.key == key)
            if self.engine.dialect.name == "postgresql":
                q = q.with_for_update()
            raw = conn.execute(q).scalar()
            yield conn, (None if raw is None else json.loads(raw))


_PRIVATE: list[str] = []


def private_store() -> CoordinationStore:
    """A store private to this process (SQLite in a temporary folder): serialises its threads only.

    For clients built without the shared store (tests, one-off scripts). Pipelines pass
    :func:`coordination_store` so that every process and host shares one.
    """
    with _ENGINES_LOCK:
        if not _PRIVATE:
            import tempfile

            folder = tempfile.mkdtemp(prefix=f"tritonflow-coordination-{os.getpid()}-")
            _PRIVATE.append(folder)
        folder = _PRIVATE[0]
    return CoordinationStore(f"sqlite:///{folder}/coordination.db")


def coordination_store(settings: Any = None) -> CoordinationStore:
    """The shared store of ``settings`` (default :func:`get_settings`); see :func:`database_url`."""
    return CoordinationStore.from_settings(settings)
