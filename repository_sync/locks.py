"""Per-model promotion locks (issue 6 part 5: one promotion per model at a time).

A lock is an advisory ``fcntl.flock`` on ``<settings.home>/locks/promotion-<model>.lock``. The
holder writes who it is (free text such as an Airflow ``dag_id/run_id/task_id``, plus pid, host and
start time) into the file after it has the lock, so a refused second promotion can say who holds
it. The kernel releases a ``flock`` when its holder's file descriptor closes, including when the
process dies, so a crashed promotion never leaves a stale lock behind.

Scope: ``flock`` serialises promotions on one host, or across hosts only on a shared filesystem
that implements ``flock`` across clients (local disks do; NFSv4 does; many FUSE/SMB mounts do not).
A deployment whose Airflow workers run on several hosts without such a filesystem must use a SQL
row lock on the metadata database instead (``SELECT ... FOR UPDATE`` on a per-model row); the
interface here (:func:`promotion_lock` as a context manager raising
:class:`~tritonflow.exceptions.ConcurrencyError`) is what such an implementation must keep.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Iterator

from tritonflow.exceptions import ConcurrencyError, DataError

#: Seconds between two attempts while waiting for a held lock.
LOCK_POLL_INTERVAL_S = 0.05

_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def lock_path(home: Path | str, model: str) -> Path:
    """Path of the promotion lock file of ``model`` under ``home``.

    Args:
        home: The tritonflow state folder (``settings.home``).
        model: Model name; characters outside ``[A-Za-z0-9_.-]`` are replaced by ``_``.

    Raises:
        DataError: ``model`` is empty.
    """
    if not model:
        raise DataError("promotion lock: model='' is empty; expected a model name")
    return Path(home) / "locks" / f"promotion-{_SAFE_NAME.sub('_', model)}.lock"


def read_holder(path: Path | str) -> dict:
    """Return the holder record written in a lock file (``{}`` when none is readable)."""
    try:
        text = Path(path).read_text()
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def file_lock(path: Path | str, *, what: str, holder: str = "", timeout_s: float = 0.0) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``path`` for the ``with`` block.

    Args:
        path: Lock file; created (with its folder) when missing.
        what: What the lock protects, for messages (e.g. ``"promotion of model 'churn'"``).
        holder: Free text naming the holder, stored in the file while the lock is held.
        timeout_s: Seconds to wait for a held lock; ``0`` fails at once.

    Yields:
        The lock file path.

    Raises:
        ConcurrencyError: Another holder kept the lock for ``timeout_s`` seconds; the message names
            ``what`` and that holder (its text, pid, host and since when).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    info = read_holder(path)
                    who = info.get("holder") or "an unnamed holder"
                    raise ConcurrencyError(
                        f"{what} is already in progress, held by {who!r} "
                        f"(pid {info.get('pid', '?')} on host {info.get('host', '?')} since "
                        f"{info.get('since', '?')}); waited {timeout_s:g} s. Wait for it to finish "
                        f"or stop it; lock file {path}"
                    ) from None
                time.sleep(LOCK_POLL_INTERVAL_S)
        record = {
            "holder": holder,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def promotion_lock(
    model: str, *, home: Path | str, holder: str = "", timeout_s: float = 0.0
) -> Iterator[Path]:
    """Hold the promotion lock of ``model``: one canary/promotion/rollback per model at a time.

    Args:
        model: Registered model name.
        home: The tritonflow state folder (``settings.home``).
        holder: Who is promoting, e.g. ``"canary_promotion/manual__2024-01-01/analyse"``.
        timeout_s: Seconds to wait for another promotion to finish (``settings.promotion_lock_timeout_s``);
            ``0`` fails at once.

    Example::

        with promotion_lock("churn_model", home=settings.home, holder=run_id):
            run_canary(...)

    Raises:
        ConcurrencyError: Another promotion of ``model`` holds the lock; the message names the model
            and the holder.
    """
    with file_lock(
        lock_path(home, model),
        what=f"promotion of model {model!r}",
        holder=holder,
        timeout_s=timeout_s,
    ) as path:
        yield path
