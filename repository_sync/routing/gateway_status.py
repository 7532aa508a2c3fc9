"""Per-version response statuses counted at the gateway, read from its JSON status log.

:class:`repository_sync.routing.nginx_router.NginxRouter` (given ``status_log``) makes NGINX write one JSON
line per request of a routed model (:data:`LOG_FIELDS`)::

    {"t": 1764558000.123, "model": "churn_model", "version": "7", "status": 500,
     "upstream_status": "500", "request_time": 0.004, "uri": "/v2/models/churn_model/versions/7/infer"}

``t`` is NGINX's ``$msec`` (unix seconds at ms resolution, from NGINX's cached clock: it can lag
the request's real end by a few ms, so a window's edges are that loose), ``version`` the
version the split routed the request to (empty when a request was not routed), ``status`` the
status the client got and ``upstream_status`` Triton's answer(s) (``"500, 200"`` when the fallback
answered after the routed version failed; ``"-"``/empty when Triton was not reached) and ``uri`` the
rewritten URI: only inference requests (``.../infer``) are counted, not readiness or metadata calls.
NGINX writes the line (unbuffered) in its log phase, just after the client got the answer, so a
request answered in the last milliseconds before a read may be counted only at the next read:
a window read again later (the canary's step window grows) counts it.

**Failure rule** (:func:`is_failure`): a request counts as failed for the version it was routed to
when the client got a status >= 500, or when Triton's answer of the routed version (the first entry
of ``upstream_status``) is >= 400. Triton 2.51's HTTP endpoint answers an error response a
Python-backend model *returned* with 500 and counts it as a success; it answers an inference for a
version it does not serve with 404 (a readiness call with 400) and counts it in no version's
counters (both checked on this server, ``tests/repository_sync/test_gateway_status.py``); those are
counted here. A malformed request (Triton: 400) counts too: at this level it cannot be told from a
model error, and the split sends the same share of such requests to every version. 499 (the client
closed the connection before the answer) is not a failure unless Triton had answered >= 400.

:class:`GatewayStatusLog` reads the file incrementally (it remembers its offset), keeps an
unfinished last line for the next read, and starts again from the beginning when the file was
rotated (another inode) or truncated (shorter than the offset, or its first bytes changed: a file
truncated and written again past the old offset between two reads).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ground.exceptions import MetricsUnavailableError

#: File name of the status log in the router's state folder.
STATUS_LOG_NAME = "gateway_access.jsonl"
#: Fields of one status-log line.
LOG_FIELDS = ("t", "model", "version", "status", "upstream_status", "request_time", "uri")
#: Seconds of records kept in memory before the newest one (older windows are not asked for).
DEFAULT_KEEP_S = 6 * 3600.0
#: Bytes at the start of the file compared at each read to notice a truncation.
HEAD_BYTES = 256
#: Bytes read per call at most (a huge backlog is read over several analyses, oldest first).
MAX_READ_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class StatusCounts:
    """Requests and failed requests of one version in a window, as the gateway answered them.

    Attributes:
        requests: Requests routed to the version that ended in the window.
        failures: Those that failed (:func:`is_failure`).
    """

    requests: int = 0
    failures: int = 0


def _first_status(upstream_status: Any) -> int | None:
    """The first status in NGINX's ``$upstream_status`` (``"500, 200"``, ``"502 : 200"``, ``"-"``)."""
    text = str(upstream_status or "").replace(":", ",").split(",")[0].strip()
    return int(text) if text.isdigit() else None


def is_failure(status: Any, upstream_status: Any = None) -> bool:
    """Whether a request failed for the version it was routed to (rule in the module doc).

    Args:
        status: The status the client got (``$status``).
        upstream_status: NGINX's ``$upstream_status`` (Triton's answers, first is the routed version).
    """
    try:
        code = int(status)
    except (TypeError, ValueError):
        return True  # a line NGINX wrote without a status: not a success
    first = _first_status(upstream_status)
    return code >= 500 or (first is not None and first >= 400)


class GatewayStatusLog:
    """Incremental reader of the gateway's status log.

    Args:
        path: The status log as this host sees it (``settings.gateway_access_log``).
        keep_s: Seconds of records kept before the newest record.

    Example::

        log = GatewayStatusLog("/srv/gateway/tritonflow-router/gateway_access.jsonl")
        counts = log.counts("churn_model", start, end)   # {7: StatusCounts(412, 3), 6: ...}
    """

    def __init__(self, path: str | os.PathLike[str], *, keep_s: float = DEFAULT_KEEP_S):
        self.path = Path(path)
        self.keep_s = float(keep_s)
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._head = b""  # the file's first bytes as read: a truncated-and-refilled file differs
        self._records: list[tuple[float, str, str, bool]] = []
        self.bad_lines = 0

    def readable(self) -> bool:
        """Whether the file exists and can be opened here (else the gateway runs elsewhere)."""
        return self.path.is_file() and os.access(self.path, os.R_OK)

    def _read_new(self) -> None:
        try:
            st = os.stat(self.path)
            fh = open(self.path, "rb")
        except OSError as exc:
            raise MetricsUnavailableError(
                f"gateway status log {self.path} is not readable here ({exc}); is the gateway on "
                "another host? (set TRITONFLOW_GATEWAY_ACCESS_LOG to where this host sees it)") from exc
        with fh:
            inode = (st.st_dev, st.st_ino)
            same = inode == self._inode and st.st_size >= self._offset
            if same and self._head:
                same = fh.read(len(self._head)) == self._head
            if not same:  # rotated (another inode) or truncated (shorter, or other first bytes)
                self._inode, self._offset, self._partial, self._head = inode, 0, b"", b""
            fh.seek(self._offset)
            data = fh.read(MAX_READ_BYTES)
        if len(self._head) < HEAD_BYTES and data:
            self._head = (self._head + data)[:HEAD_BYTES] if self._offset == len(self._head) else self._head
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" after a complete last line; else kept for the next read
        for raw in lines:
            self._add(raw)
        if self._records:
            horizon = self._records[-1][0] - self.keep_s
            if self._records[0][0] < horizon:
                self._records = [r for r in self._records if r[0] >= horizon]

    def _add(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            rec = json.loads(raw)
            t = float(rec["t"])
            model, version = str(rec["model"]), str(rec.get("version") or "")
            if not str(rec.get("uri") or "/infer").endswith("/infer"):
                return  # readiness / metadata call, not an inference
            failed = is_failure(rec.get("status"), rec.get("upstream_status"))
        except (ValueError, KeyError, TypeError):
            self.bad_lines += 1
            return
        self._records.append((t, model, version, failed))

    def counts(self, model: str, start: float, end: float) -> dict[int, StatusCounts]:
        """Per-version requests and failures of ``model`` that ended in ``[start, end)`` (unix s).

        Lines without a numeric routed version (a request NGINX answered before routing) are left
        out; a version Triton does not serve is counted like any other (its requests fail).

        Returns:
            ``{version: StatusCounts}``, only versions with requests in the window.

        Raises:
            MetricsUnavailableError: The file cannot be opened here (message names the path).
        """
        self._read_new()
        acc: dict[int, list[int]] = {}
        for t, m, v, failed in self._records:
            if m != model or not (start <= t < end) or not v.isdigit():
                continue
            slot = acc.setdefault(int(v), [0, 0])
            slot[0] += 1
            slot[1] += int(failed)
        return {v: StatusCounts(r, f) for v, (r, f) in sorted(acc.items())}


__all__ = ["LOG_FIELDS", "STATUS_LOG_NAME", "GatewayStatusLog", "StatusCounts", "is_failure"]
