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
from urllib.parse import quote

#: Seconds between two polls of the REST API while waiting for a state.
POLL_S = 1.0
#: Attempts of a REST call that the API server answers with HTTP 5xx, and the first delay (s).
API_RETRIES = 4
API_RETRY_DELAY_S = 2.0
#: States in which a DAG run has ended.
FINISHED_RUN_STATES = ("success", "failed")


def xcom_value(raw: Any) -> Any:
    """An XCom value as the REST API returns it: JSON, or JSON in a string (decoded), or a plain string."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


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

    def delete(self, path: str) -> Any:
        """``DELETE /api/v2<path>``."""
        return self._request("DELETE", f"/api/v2{path}")

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

    def reparse(self, dag_id: str) -> None:
        """Have the dag-processor parse ``dag_id``'s file again at its next scan.

        Airflow registers a DAG's asset watchers (its triggers) only when it parses the file of an
        unpaused DAG; without this, an unpaused DAG's watcher waits for the file's next regular parse
        (``min_file_process_interval``).
        """
        token = self.get(f"/dags/{dag_id}")["file_token"]
        self._request("PUT", f"/api/v2/parseDagFile/{quote(token, safe='')}")

    def trigger(self, dag_id: str, conf: dict[str, Any], run_id: str) -> dict[str, Any]:
        """Create run ``run_id`` of ``dag_id`` with ``conf`` (its form's fields); return the run."""
        return self.post(f"/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": None, "conf": conf})

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """Run ``run_id`` of ``dag_id`` (``state``, ``note``, dates)."""
        return self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float, interval_s: float = 2.0) -> dict[str, Any]:
        """Wait until run ``run_id`` has ended (``success`` or ``failed``); return its last state.

        Uses Airflow's run-wait endpoint (``GET .../dagRuns/{run_id}/wait``, newline-delimited JSON
        of the run's state every ``interval_s``) and polls ``GET .../dagRuns/{run_id}`` where the
        server has no such route.

        Raises:
            TimeoutError: The run had not ended after ``timeout_s`` (names the run and its state).
        """
        deadline = time.monotonic() + timeout_s
        try:
            state = self._stream_wait(dag_id, run_id, deadline, interval_s)
        except AirflowApiError as exc:
            if exc.status not in (404, 405):
                raise
            state = None
        if state is None or state not in FINISHED_RUN_STATES:
            while time.monotonic() < deadline:
                state = self.dag_run(dag_id, run_id).get("state")
                if state in FINISHED_RUN_STATES:
                    break
                time.sleep(interval_s)
        run = self.dag_run(dag_id, run_id)
        if run.get("state") not in FINISHED_RUN_STATES:
            raise TimeoutError(f"run {run_id} of DAG {dag_id} is still {run.get('state')} after {timeout_s:.0f} s")
        return run

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """XCom ``key`` of task ``task_id`` in a run (decoded when it is JSON text); ``None`` if absent."""
        path = (f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"
                f"/xcomEntries/{quote(key, safe='')}")
        try:
            raw = self.get(path).get("value")
        except AirflowApiError as exc:
            if exc.status == 404:
                return None
            raise
        return xcom_value(raw)

    def hitl_details(self, dag_id: str, run_id: str = "~", *, pending: bool | None = None) -> list[dict[str, Any]]:
        """Required actions (human-in-the-loop requests) of a DAG's runs (``~``: all); ``pending``: unanswered."""
        query = "" if pending is None else f"&response_received={str(not pending).lower()}"
        doc = self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='~')}/hitlDetails?limit=100{query}")
        rows = list(doc.get("hitl_details") or [])
        if pending is not None:
            rows = [r for r in rows if bool(r.get("response_received")) != pending]
        return rows

    def answer_hitl(self, dag_id: str, run_id: str, task_id: str, chosen_options: list[str], *,
                    map_index: int = -1, params_input: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer the required action of task ``task_id`` in a run, as the signed-in user."""
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/{map_index}/hitlDetails"
        return self.patch(path, {"chosen_options": chosen_options, "params_input": params_input or {}})

    def _stream_wait(self, dag_id: str, run_id: str, deadline: float, interval_s: float) -> str | None:
        """Read the run-wait endpoint's lines until the run ends or ``deadline``; the last state seen."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/wait?interval={interval_s:g}"
        req = urllib.request.Request(f"{self.base_url}{path}", method="GET")
        req.add_header("Accept", "application/x-ndjson")
        req.add_header("Authorization", f"Bearer {self.token()}")
        state = None
        try:
            with urllib.request.urlopen(req, timeout=max(self.timeout, 4 * interval_s)) as resp:  # noqa: S310
                for line in resp:
                    if line.strip():
                        state = json.loads(line).get("state")
                    if state in FINISHED_RUN_STATES or time.monotonic() >= deadline:
                        break
        except urllib.error.HTTPError as exc:
            raise AirflowApiError(exc.code, f"GET {path}: HTTP {exc.code}: "
                                  f"{exc.read().decode(errors='replace')[:2000]}") from None
        except (TimeoutError, urllib.error.URLError):
            return state  # the stream stalled: the caller polls
        return state


class AirflowApiError(RuntimeError):
    """The Airflow REST API answered with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
