"""Small client of a local Airflow deployment's REST API (``/api/v2``).

:class:`AirflowApi` takes a token from the simple auth manager (``GET /auth/token``; the local
deployments make every visitor an admin), retries a call the API server answers with HTTP 5xx
or not at all (a busy SQLite metadata DB), and raises :class:`AirflowApiError` with the status
for an error answer. Used by the demo, the benchmarks and the tests that drive a deployment from
:mod:`tritonflow.runtime.airflow`.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

#: Seconds between two polls of the REST API while waiting for a state.
POLL_S = 1.0
#: Attempts of a REST call that the API server answers with HTTP 5xx, and the first delay (s).
API_RETRIES = 4
API_RETRY_DELAY_S = 2.0


class AirflowApi:
    """Small client of the deployment's REST API (``/api/v2``) with a simple-auth-manager token.

    Args:
        base_url: API server base URL.
        timeout: Seconds per request.
        username: A simple-auth-manager user (the compose stack's admin); None: all-admins mode.
        password: That user's password.
    """

    def __init__(self, base_url: str, timeout: float = 60.0, *, username: str | None = None,
                 password: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.username = username
        self.password = password
        self._token: str | None = None

    def token(self) -> str:
        """JWT from ``/auth/token``.

        ``POST`` with the user's credentials when given, else ``GET`` (all-admins mode hands one out
        without credentials).
        """
        if self._token is None:
            if self.username is not None:
                doc = self._request("POST", "/auth/token",
                                    {"username": self.username, "password": self.password or ""}, auth=False)
            else:
                doc = self._request("GET", "/auth/token", auth=False)
            self._token = doc["access_token"]
        return self._token

    def _request(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        """One REST call, retried on a server error or on no answer in time.

        A server error is HTTP 5xx (e.g. SQLite's ``database is locked``). Requests that create
        something carry their own id, so a retry of one that did succeed answers 409.

        Raises:
            AirflowApiError: A client error, or a server error after :data:`API_RETRIES` attempts.
            TimeoutError / URLError: No answer after :data:`API_RETRIES` attempts.
        """
        for attempt in range(API_RETRIES):
            try:
                return self._request_once(method, path, body, auth=auth)
            except AirflowApiError as exc:
                if exc.status < 500 or attempt == API_RETRIES - 1:
                    raise
            except (TimeoutError, urllib.error.URLError):  # no answer in time (URLError: refused)
                if attempt == API_RETRIES - 1:
                    raise
            time.sleep(API_RETRY_DELAY_S * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _request_once(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (loopback)
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise AirflowApiError(exc.code, f"{method} {path}: HTTP {exc.code}: {detail}") from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        """``GET /api/v2<path>``."""
        return self._request("GET", f"/api/v2{path}")

    def post(self, path: str, body: Any) -> Any:
        """``POST /api/v2<path>`` with a JSON body."""
        return self._request("POST", f"/api/v2{path}", body)

    def patch(self, path: str, body: Any) -> Any:
        """``PATCH /api/v2<path>`` with a JSON body."""
        return self._request("PATCH", f"/api/v2{path}", body)

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """DAG runs of ``dag_id`` (up to 100, oldest logical date first)."""
        doc = self.get(f"/dags/{dag_id}/dagRuns?limit=100&order_by=id")
        return doc["dag_runs"]

    def wait_for_dag(self, dag_id: str, timeout_s: float) -> dict[str, Any]:
        """Wait until the dag-processor has parsed ``dag_id``; return the DAG.

        Raises:
            TimeoutError: naming the DAG and any import errors the API reports.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return self.get(f"/dags/{dag_id}")
            except AirflowApiError as exc:
                if exc.status != 404:
                    raise
            time.sleep(POLL_S)
        errors = self.get("/importErrors").get("import_errors", [])
        raise TimeoutError(f"DAG {dag_id!r} not parsed within {timeout_s:.0f} s; import errors: {errors}")

    def unpause(self, dag_id: str) -> None:
        """Unpause ``dag_id``."""
        self.patch(f"/dags/{dag_id}", {"is_paused": False})


class AirflowApiError(RuntimeError):
    """The Airflow REST API answered with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
