"""Live shadow: the recorder behind the gateway's NGINX ``mirror``.

The gateway mirrors a share of the champion's inference requests (``TrafficPlan.mirror``, see
:mod:`repository_sync.routing.router`) to this recorder. NGINX discards a mirror subrequest's response,
so nothing the recorder or the challenger answers ever reaches a client. The recorder answers
``204`` at once (so the mirror costs the client next to nothing: NGINX finishes a request only
when its mirror subrequest is done), queues the request, and forwards it to the challenger's
version on Triton (``/v2/models/<model>/versions/<challenger>/infer``, same body and headers, so
JSON and binary-tensor requests alike). Each answer is decoded with tritonclient
(``InferResult.from_response_body``) and kept with the request id the gateway passed
(``X-Request-Id``: the client's own, else NGINX's ``$request_id``, the one the gateway also returns
to the client), the version that served the client (``X-Tritonflow-Served-Version``), the status
and the latency. Champion and challenger outputs are then paired by request id on the same live
inputs (:func:`tritonflow.pipelines.shadow_live.live`).

The recorder is an aiohttp server on its own event loop in a background thread, started and
stopped by the live shadow evaluation around its window. A full queue drops the mirrored request
(counted in :attr:`MirrorRecorder.dropped`), never slows the gateway.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np

#: Path prefix the gateway's mirror location posts to: ``/mirror/<model>/<version>``.
MIRROR_PATH = "/mirror"
#: Header carrying the version that served the client (set by the gateway's mirror location).
SERVED_HEADER = "X-Tritonflow-Served-Version"
#: Requests waiting to be forwarded before new ones are dropped.
DEFAULT_QUEUE_SIZE = 10_000
#: Concurrent forwards to Triton.
DEFAULT_WORKERS = 4
#: Seconds a forwarded request may take.
DEFAULT_TIMEOUT_S = 30.0


def decode_outputs(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """Triton's inference response (JSON or binary tensors) as ``{output name: array}``.

    Raises:
        ValueError: The body is not an inference response.
    """
    from tritonclient.http import InferResult

    result = InferResult.from_response_body(body, header_length=header_length)
    out = {}
    for item in result.get_response().get("outputs", []):
        arr = result.as_numpy(item["name"])
        if arr is not None:
            out[item["name"]] = np.asarray(arr)
    return out


def output_columns(outputs: dict[str, np.ndarray]) -> list[dict[str, float]]:
    """One dict per row: ``name`` for a single value per row, ``name_j`` for column ``j``."""
    rows: list[dict[str, float]] = []
    for name, arr in outputs.items():
        if arr.dtype.kind not in "fiub":
            continue
        a = arr.reshape(arr.shape[0], -1) if arr.ndim >= 1 and arr.size else arr.reshape(1, -1)
        for i in range(a.shape[0]):
            while len(rows) <= i:
                rows.append({})
            if a.shape[1] == 1:
                rows[i][name] = float(a[i, 0])
            else:
                for j in range(a.shape[1]):
                    rows[i][f"{name}_{j}"] = float(a[i, j])
    return rows


class MirrorRecorder:
    """Receives mirrored requests, forwards them to the challenger, keeps its answers.

    Args:
        triton_url: ``host:port`` of Triton's HTTP endpoint.
        model: Triton model name; version: the challenger's Triton version.
        host: Address to listen on (``0.0.0.0`` when the gateway runs on another host).
        port: Port (0: the kernel picks one; see :attr:`port`).
        workers, queue_size, timeout_s: Forwarding concurrency, queue bound and timeout.

    Example::

        with MirrorRecorder("127.0.0.1:8000", "rain", 7) as rec:
            router.apply(TrafficPlan.single("rain", 6, mirror=Mirror(7, 10, rec.address)))
            ...
        frame = rec.records()
    """

    def __init__(self, triton_url: str, model: str, version: int, *, host: str = "127.0.0.1",
                 port: int = 0, workers: int = DEFAULT_WORKERS, queue_size: int = DEFAULT_QUEUE_SIZE,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.triton_url = triton_url if "://" in triton_url else f"http://{triton_url}"
        self.model, self.version = model, int(version)
        self.host, self.port = host, int(port)
        self.workers, self.queue_size, self.timeout_s = workers, queue_size, timeout_s
        self.received = self.forwarded = self.failed = self.dropped = 0
        self._rows: list[dict[str, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def address(self) -> str:
        """``host:port`` the gateway's mirror upstream points at."""
        return f"{self.host}:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 30.0) -> "MirrorRecorder":
        """Start listening (returns once the port is bound).

        Raises:
            RuntimeError: The server did not start (port taken, ...).
        """
        self._thread = threading.Thread(target=self._run, name="mirror-recorder", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"mirror recorder on {self.host}:{self.port} did not start: {self._error}")
        return self

    def stop(self, drain_s: float = 10.0) -> None:
        """Stop accepting, forward what is queued (at most ``drain_s`` seconds), stop."""
        stopped = self._stopped
        if self._loop is None or self._thread is None or stopped is None:
            return  # never served (start() returns only once the event exists)
        self._drain_s = drain_s
        self._loop.call_soon_threadsafe(stopped.set)
        self._thread.join(timeout=drain_s + 30)

    def __enter__(self) -> "MirrorRecorder":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def records(self):
        """Every mirrored answer so far as a DataFrame.

        Columns: ``request_id``, ``timestamp`` (UTC, when the mirror arrived), ``served_version``,
        ``status``, ``latency_ms``, ``error``, ``row`` and the output columns (``name`` or ``name_j``).
        """
        import pandas as pd

        rows = list(self._rows)
        frame = pd.DataFrame(rows)
        if frame.empty:
            return pd.DataFrame({"request_id": pd.Series([], dtype=object),
                                 "timestamp": pd.Series([], dtype="datetime64[ns, UTC]")})
        frame["timestamp"] = pd.to_datetime(frame["timestamp"], unit="s", utc=True)
        return frame

    def counters(self) -> dict[str, int]:
        """Mirrored requests received, forwarded, failed (Triton error or no answer), dropped."""
        return {"received": self.received, "forwarded": self.forwarded, "failed": self.failed,
                "dropped": self.dropped}

    # ------------------------------------------------------------------ server
    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 -- reported by start()
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        import aiohttp
        from aiohttp import web

        self._stopped = asyncio.Event()
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.queue_size)

        async def receive(request: web.Request) -> web.Response:
            body = await request.read()
            self.received += 1
            item = (time.time(), request.headers.get("X-Request-Id", ""),
                    request.headers.get(SERVED_HEADER, ""), body,
                    {k: v for k, v in request.headers.items()
                     if k.lower() in ("content-type", "inference-header-content-length")})
            try:
                queue.put_nowait(item)
            except asyncio.QueueFull:
                self.dropped += 1
            return web.Response(status=204)

        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post(MIRROR_PATH + "/{model}/{version}", receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)  # started above: a TCP site's listening server
        self.port = server.sockets[0].getsockname()[1]  # the bound port when 0 was asked
        url = f"{self.triton_url}/v2/models/{self.model}/versions/{self.version}/infer"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            workers = [asyncio.create_task(self._forward(session, url, queue)) for _ in range(self.workers)]
            self._ready.set()
            await self._stopped.wait()
            await runner.cleanup()  # stop accepting
            try:
                await asyncio.wait_for(queue.join(), timeout=getattr(self, "_drain_s", 10.0))
            except asyncio.TimeoutError:
                pass
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _forward(self, session, url: str, queue: asyncio.Queue) -> None:
        while True:
            received_at, rid, served, body, headers = await queue.get()
            t0 = time.perf_counter()
            base = {"request_id": rid, "timestamp": received_at, "served_version": served}
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    data = await resp.read()
                    latency = (time.perf_counter() - t0) * 1000.0
                    if resp.status != 200:
                        self.failed += 1
                        self._rows.append({**base, "status": resp.status, "latency_ms": latency,
                                           "error": data[:200].decode("utf-8", "replace"), "row": 0})
                        continue
                    hlen = resp.headers.get("Inference-Header-Content-Length")
                    rows = output_columns(decode_outputs(data, int(hlen) if hlen else None)) or [{}]
                self.forwarded += 1
                for i, outputs in enumerate(rows):
                    self._rows.append({**base, "status": 200, "latency_ms": latency, "error": "",
                                       "row": i, **outputs})
            except Exception as exc:  # noqa: BLE001 -- recorded; the shadow never affects clients
                self.failed += 1
                self._rows.append({**base, "status": 0, "latency_ms": (time.perf_counter() - t0) * 1000.0,
                                   "error": f"{type(exc).__name__}: {exc}"[:200], "row": 0})
            finally:
                queue.task_done()


__all__ = ["MIRROR_PATH", "MirrorRecorder", "SERVED_HEADER", "decode_outputs", "output_columns"]
