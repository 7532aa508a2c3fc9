"""Traffic of the demo: real inference requests through the NGINX gateway.

:class:`GatewayClient` sends one request per NOAA day (built with tritonclient) and reads the
serving version from the gateway's response header; :class:`BackgroundTraffic` keeps a steady
stream going while a canary bakes (wall-clock timestamps, labels written at once: NOAA's labels
are known the next day, the canary compares the versions' quality on them).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from ground.exceptions import DataError

#: HTTP connections the traffic replay keeps open to the gateway.
REPLAY_CONCURRENCY = 4


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """The served model's interface as the gateway reports it (inputs and outputs)."""

    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    batched: bool


class GatewayClient:
    """Real inference requests through the NGINX gateway, one row per request.

    Requests are built and parsed with tritonclient (``InferenceServerClient.generate_request_body``
    and ``InferResult.from_response_body``) and sent over keep-alive HTTP connections, so the
    gateway's response header (``X-Tritonflow-Version``, written by the canary router) is read;
    without it the version comes from Triton's response (``model_version``).

    Args:
        gateway_url: ``http://host:port`` of the gateway.
        model: Model name.
        features: Feature columns, in the model's input order.
        response_header: Header naming the serving version.
        concurrency: Parallel connections.
    """

    def __init__(self, gateway_url: str, model: str, features: Iterable[str], *,
                 response_header: str = "X-Tritonflow-Version", concurrency: int = REPLAY_CONCURRENCY):
        host_port = gateway_url.split("://", 1)[-1].rstrip("/")
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.model = model
        self.features = list(features)
        self.header = response_header
        self.concurrency = concurrency
        self._local = threading.local()
        self._served: ServedModel | None = None
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="replay")

    def close(self) -> None:
        """Shut the request pool down, waiting for requests in flight."""
        self.pool.shutdown(wait=True)

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self._local.conn = conn
        return conn

    def _get_json(self, path: str) -> dict:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise DataError(f"GET {path} through the gateway answered {resp.status}: {body[:300]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def served_model(self, refresh: bool = False) -> ServedModel:
        """Inputs/outputs of the model behind the gateway (cached)."""
        if self._served is None or refresh:
            meta = self._get_json(f"/v2/models/{self.model}")
            config = self._get_json(f"/v2/models/{self.model}/config")
            batched = int(config.get("max_batch_size", 0)) > 0

            def spec(items):
                return tuple((i["name"], i["datatype"], tuple(int(d) for d in i["shape"])) for i in items)

            self._served = ServedModel(spec(meta["inputs"]), spec(meta["outputs"]), batched)
        return self._served

    def _inputs(self, rows: pd.DataFrame):
        import tritonclient.http as httpclient
        from tritonclient.utils import triton_to_np_dtype

        served = self.served_model()
        out = []
        for name, datatype, _shape in served.inputs:
            cols = [name] if name in rows.columns else self.features
            arr = rows[cols].to_numpy(dtype=triton_to_np_dtype(datatype))
            item = httpclient.InferInput(name, list(arr.shape), datatype)
            item.set_data_from_numpy(arr, binary_data=True)
            out.append(item)
        return out

    def infer_rows(self, rows: pd.DataFrame, request_id: str) -> dict[str, Any]:
        """One request for ``rows`` (usually one row); returns score, prediction, version, status."""
        import tritonclient.http as httpclient

        served = self.served_model()
        outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name, _, _ in served.outputs]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            self._inputs(rows), outputs=outputs, request_id=request_id)
        headers = {"Content-Type": "application/octet-stream", "X-Request-Id": request_id}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        t = time.perf_counter()
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request("POST", f"/v2/models/{self.model}/infer", body, headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    return {"status": 0, "version": None, "score": np.nan, "prediction": -1,
                            "latency_ms": (time.perf_counter() - t) * 1000}
        latency = (time.perf_counter() - t) * 1000
        version = resp.getheader(self.header)
        if resp.status != 200:
            return {"status": resp.status, "version": int(version) if version else None,
                    "score": np.nan, "prediction": -1, "latency_ms": latency}
        hlen = resp.getheader("Inference-Header-Content-Length")
        result = httpclient.InferResult.from_response_body(
            data, header_length=int(hlen) if hlen else None)
        if not version:
            version = result.get_response().get("model_version")
        score, pred = self._decode(result, served)
        return {"status": 200, "version": int(version) if version else None, "score": score,
                "prediction": pred, "latency_ms": latency}

    @staticmethod
    def _decode(result: Any, served: ServedModel) -> tuple[float, int]:
        score = pred = None
        for name, datatype, _ in served.outputs:
            arr = result.as_numpy(name)
            if arr is None:
                continue
            arr = np.asarray(arr)
            if datatype.startswith("FP"):
                flat = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(-1, 1)
                score = float(flat[0, -1])  # P(rain) is the last (positive-class) column
            else:
                pred = int(np.asarray(arr).reshape(-1)[0])
        if score is None:
            score = float(pred) if pred is not None else np.nan
        if pred is None:
            pred = int(score >= 0.5)
        return score, pred

    def replay(self, frame: pd.DataFrame, request_ids: list[str]) -> pd.DataFrame:
        """Send each row of ``frame`` as its own request (``concurrency`` in flight).

        Returns:
            One row per request, in order: ``request_id``, ``status``, ``version``, ``score``,
            ``prediction``, ``latency_ms``.
        """
        futures = [self.pool.submit(self.infer_rows, frame.iloc[[i]], rid)
                   for i, rid in enumerate(request_ids)]
        rows = [{"request_id": rid, **f.result()} for rid, f in zip(request_ids, futures, strict=True)]
        return pd.DataFrame(rows)


class BackgroundTraffic:
    """Steady traffic through the gateway while a canary bakes (a daemon thread).

    The thread sends only while :attr:`active` is set (the driver sets it while a
    ``canary_promotion`` run is queued or running). Each request is one NOAA day from the current
    frame (cycled; :meth:`set_frame` swaps it); request ids are logged by the client and sent as
    ``X-Request-Id``. ``on_batch`` receives each finished batch (to write the inference log and
    the labels).
    """

    def __init__(self, client: GatewayClient, frame: pd.DataFrame, rps: float,
                 on_batch: Callable[[pd.DataFrame, pd.DataFrame], Any] | None = None,
                 batch: int = 8):
        self.client, self.rps = client, rps
        self.frame = frame.reset_index(drop=True)
        self.on_batch, self.batch = on_batch, batch
        self.results: list[pd.DataFrame] = []
        self.active = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="canary-traffic", daemon=True)
        self.error: BaseException | None = None

    def set_frame(self, frame: pd.DataFrame) -> None:
        """Rows the following batches cycle through."""
        self.frame = frame.reset_index(drop=True)

    def __enter__(self) -> "BackgroundTraffic":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.active.set()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                if not self.active.wait(timeout=1.0):
                    continue
                t = time.monotonic()
                frame = self.frame
                n = len(frame)
                idx = [(i + k) % n for k in range(self.batch)]
                i += self.batch
                rows = frame.iloc[idx].reset_index(drop=True)
                rids = [f"canary-{uuid.uuid4().hex}" for _ in idx]
                res = self.client.replay(rows, rids)
                res["wall_time"] = pd.Timestamp.now(tz="UTC")
                self.results.append(res)
                if self.on_batch is not None:
                    self.on_batch(rows, res)
                self._stop.wait(max(0.0, self.batch / self.rps - (time.monotonic() - t)))
        except BaseException as exc:  # noqa: BLE001 - reported by the driver
            self.error = exc
