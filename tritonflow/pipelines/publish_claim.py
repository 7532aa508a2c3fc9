"""One publish per model version: the first publish claims the version, a later one joins it.

``model_publish`` and ``shadow_evaluation``'s own publish of a challenger often ask for the same
version at about the same time. Converting and profiling it twice costs minutes, and whichever
push lands first decides the served config (a pushed version is immutable). So the version is
**claimed** in the shared coordination database (:mod:`ground.coordination`, table
``tritonflow_state``, scope :data:`CLAIM_SCOPE`, key ``<model>/<version>``): the publish that asks
first does the work, and a publish that finds another attempt's claim alive waits for it and then
returns its record (it *joins*: no conversion, no profile, no push, no load of its own).

A claim is ``{"attempt", "holder", "host", "pid", "status", "beat_at", "started_at", ...}``:

* ``running``: renewed every ``ttl / 3`` seconds by the stage at work (:func:`claimed_stage`);
  alive while its last beat is younger than ``settings.publish_claim_ttl_s`` (long enough to span
  the queue gap between two tasks of a DAG run). An older one is stale: its run died, and the next
  publish takes the version over.
* ``published``: written by :func:`~tritonflow.pipelines.publish_record.record` with the record's
  summary. A publish that waited for this attempt joins it; a publish that starts after it ended
  (a deliberate re-run) claims the version anew.
* ``failed``: the holder's stage raised (a rejection, a service down). A waiting publish takes the
  version over and tries itself, as it would have without the claim.

A later stage of the same attempt (the DAG's next task, or a retry) finds its own claim and goes on;
when another attempt took the version over meanwhile (its claim had gone stale), it joins that one.

Plain Python (no Airflow import).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterator, Mapping

from ground.exceptions import TransientError
from ground.settings import Settings, get_settings

log = logging.getLogger(__name__)

__all__ = ["CLAIM_SCOPE", "JOINED_KEY", "MAX_WAIT_S", "claim_key", "claimed_stage", "finish_claim",
           "read_claim", "take_or_join"]

#: Scope of the claims in the coordination store's state table.
CLAIM_SCOPE = "publish_claim"
#: State key of a publish that joined another attempt's: that attempt's record summary.
JOINED_KEY = "joined_publish"
#: Longest wait for another attempt's publish of the same version (seconds), however alive it looks.
MAX_WAIT_S = 3600.0
#: Seconds between two looks at a claim held by another attempt.
POLL_S = 0.5


def claim_key(model: str, version: int | str) -> str:
    """The claim's key: ``<registered model>/<version>``."""
    return f"{model}/{int(version)}"


def _store(settings: Settings) -> Any:
    from ground.coordination import coordination_store

    return coordination_store(settings)


def read_claim(settings: Settings, model: str, version: int | str) -> dict[str, Any] | None:
    """The stored claim on a version (``None`` when none was ever taken)."""
    return _store(settings).get_state(CLAIM_SCOPE, claim_key(model, version))


def _alive(claim: Mapping[str, Any], ttl_s: float, now: float) -> bool:
    return claim.get("status") == "running" and now - float(claim.get("beat_at") or 0.0) <= ttl_s


def _mine(state: Mapping[str, Any], now: float) -> dict[str, Any]:
    return {"attempt": state["staging_attempt"], "status": "running", "beat_at": now, "started_at": now,
            "host": socket.gethostname(), "pid": os.getpid(), "holder": str(state.get("holder") or "")}


def take_or_join(state: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """Claim the version for this attempt, or wait for the attempt holding it and join its record.

    Args:
        state: Publish state with ``model``, ``version`` and ``staging_attempt`` (a state without
            an attempt, built by hand, is returned unchanged: nothing is claimed).
        settings: ``publish_claim_ttl_s`` and the coordination database.

    Returns:
        ``state`` itself when this attempt holds the claim; else ``state`` plus :data:`JOINED_KEY`:
        the record summary of the attempt it waited for.

    Raises:
        TransientError: Another attempt kept the version for more than :data:`MAX_WAIT_S` seconds.
    """
    if not state.get("staging_attempt"):
        return dict(state)
    store, key, attempt = _store(settings), claim_key(state["model"], state["version"]), state["staging_attempt"]
    ttl, deadline, waited_on = float(settings.publish_claim_ttl_s), time.monotonic() + MAX_WAIT_S, None
    while True:
        with store.locked_state(CLAIM_SCOPE, key) as (conn, claim):
            now = time.time()
            claim = claim or {}
            if claim.get("status") == "published" and claim.get("attempt") == waited_on:
                log.info("publish of %s: attempt %s joins attempt %s's publish (recorded)", key, attempt, waited_on)
                return {**state, JOINED_KEY: {**claim.get("summary", {}), "joined_attempt": waited_on}}
            if claim.get("attempt") == attempt or not _alive(claim, ttl, now):
                if claim and claim.get("attempt") != attempt and claim.get("status") == "running":
                    log.warning("publish of %s: attempt %s takes over from attempt %s (no heartbeat for %.0f s)",
                                key, attempt, claim.get("attempt"), now - float(claim.get("beat_at") or 0.0))
                started = claim.get("started_at") if claim.get("attempt") == attempt else None
                store.set_state(CLAIM_SCOPE, key, {**_mine(state, now), "started_at": started or now}, conn=conn)
                return dict(state)
            if waited_on != claim.get("attempt"):
                log.info("publish of %s: attempt %s waits for attempt %s (pid %s on %s), which is publishing it",
                         key, attempt, claim.get("attempt"), claim.get("pid"), claim.get("host"))
            waited_on = claim.get("attempt")
        if time.monotonic() > deadline:
            raise TransientError(f"publish of {key}: attempt {waited_on} has held the version for more than "
                                 f"{MAX_WAIT_S:.0f} s; retry once it has finished")
        time.sleep(POLL_S)


def _beat(settings: Settings, key: str, attempt: str, status: str = "running", **extra: Any) -> bool:
    """Renew (or end) this attempt's claim; False when another attempt holds it now."""
    store = _store(settings)
    with store.locked_state(CLAIM_SCOPE, key) as (conn, claim):
        if not claim or claim.get("attempt") != attempt:
            return False
        store.set_state(CLAIM_SCOPE, key, {**claim, "status": status, "beat_at": time.time(), **extra}, conn=conn)
        return True


def finish_claim(state: Mapping[str, Any], settings: Settings, summary: Mapping[str, Any]) -> None:
    """Mark this attempt's claim ``published`` with the record ``summary`` (waiting publishes join it)."""
    if state.get("staging_attempt"):
        _beat(settings, claim_key(state["model"], state["version"]), state["staging_attempt"], "published",
              summary=dict(summary), ended_at=time.time())


@contextlib.contextmanager
def _heartbeat(state: Mapping[str, Any], settings: Settings) -> Iterator[None]:
    """Renew the claim every ``ttl / 3`` while the block runs; mark it ``failed`` if the block raises."""
    key, attempt = claim_key(state["model"], state["version"]), state["staging_attempt"]
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(float(settings.publish_claim_ttl_s) / 3.0):
            try:
                if not _beat(settings, key, attempt):
                    return
            except Exception as exc:  # noqa: BLE001 - a database blip: the next beat tries again
                log.warning("publish claim %s: heartbeat failed: %s", key, exc)

    thread = threading.Thread(target=beat, daemon=True, name=f"publish-claim-{key}")
    thread.start()
    try:
        yield
    except BaseException as exc:
        stop.set()
        _beat(settings, key, attempt, "failed", reason=f"{type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        stop.set()
        thread.join(timeout=5)


def claimed_stage(*, last: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a publish stage ``f(state, *, settings=None, ...)`` with the version's claim.

    Before the stage, :func:`take_or_join`; a joined state passes through every later stage
    untouched (``last``: the record stage returns the joined record's summary). While the stage
    runs the claim is renewed; a raised error marks it ``failed``; the ``last`` stage's summary
    marks it ``published`` (:func:`finish_claim`).
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(state: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
            if state.get(JOINED_KEY):
                return dict(state[JOINED_KEY]) if last else dict(state)
            settings = kwargs.get("settings") or get_settings()
            state = take_or_join(state, settings)
            if state.get(JOINED_KEY):
                return dict(state[JOINED_KEY]) if last else state
            if not state.get("staging_attempt"):
                return func(state, *args, **kwargs)
            with _heartbeat(state, settings):
                out = func(state, *args, **kwargs)
                if last:
                    finish_claim(state, settings, out)
            return out

        return wrapper

    return decorate
