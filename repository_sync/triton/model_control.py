"""Desired-state Triton model control, serialised per model through the shared database.

In explicit mode every load of a model replaces its set of loaded versions with the request's
version policy. Building that set from "what is READY now" is a read-modify-write: two tasks
loading versions of one model at once (a publish and a shadow evaluation, say) each send the
stale set, and the later request unloads the version the earlier task just reported loaded.

Here the set of versions a model keeps loaded is **desired state** in the coordination database
(table ``tritonflow_model_versions``: model, version, purpose, holder, since) and every change:

1. holds the model's ``model-control`` lease (:mod:`ground.coordination`) -- across
   processes and hosts when the database is shared;
2. computes the new set from the desired state (``add`` / ``remove`` / ``exactly``) plus, when the
   control has a registry source, the versions the registry needs (:func:`registry_versions`:
   ``champion``, ``challenger``, ``previous_champion``);
3. verifies every version's signature, checks the lease's fencing token, sends **one** load
   request with ``version_policy: specific`` = that set, waits until each is READY;
4. records the new set (and the config used) only after success. On failure the desired set is
   unchanged and Triton is brought back to it (never to a snapshot of what was READY).

A model tritonflow has never controlled (no record) starts from what Triton has READY, read once
under the lease. The desired set is per model name: every Triton serving the repository (replicas
behind the gateway) is meant to serve the same set. With a
:class:`repository_sync.triton.replicas.TritonReplicaSet` one lease covers every replica: the load
request goes to the replicas in order, each READY before the next; when one fails, the replicas
already changed and the failing one are brought back to the desired set, which is unchanged, and
the error names the replica.

Triton in explicit mode forgets every loaded model when it restarts; the desired set does not.
:func:`when_triton_answers` retries a change while Triton is unreachable, so the reconcile sent
once it answers again loads the desired set back (a canary's rollback or promotion after a Triton
restart leaves the version that should serve READY).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import sqlalchemy as sa

from ground.coordination import MODEL_CONTROL, CoordinationStore, model_versions
from ground.exceptions import DataError, ModelLoadRefusedError, ServiceUnavailableError, VersionNotInRepositoryError
from repository_sync.model_config import parse_config, to_json

#: State scope of the config each model was last loaded with (JSON dict, per model key).
CONFIG_SCOPE = "model-control.config"
#: Aliases whose versions a served model keeps loaded (rollback needs ``previous_champion``).
SERVING_ALIASES = ("champion", "challenger", "previous_champion")


def registry_versions(registry: Any, model: str) -> set[int]:
    """Versions of ``model`` the registry needs loaded: those named by :data:`SERVING_ALIASES`.

    Args:
        registry: A :class:`model_registry.registry.RegistryClient` (``aliases(name) -> {alias: version}``).
        model: Registered model name.
    """
    aliases = registry.aliases(model)
    return {int(v) for a, v in aliases.items() if a in SERVING_ALIASES}


def desired_versions(store: CoordinationStore, key: str) -> dict[int, str]:
    """Version -> purpose recorded as desired for the model key (``{}`` when none)."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(model_versions.c.version, model_versions.c.purpose)
                            .where(model_versions.c.model == key)).all()
    return {int(v): p for v, p in rows}


def _write_desired(store: CoordinationStore, key: str, versions: Mapping[int, str], holder: str,
                   config: Mapping[str, Any] | None) -> None:
    now = time.time()
    with store.engine.begin() as conn:
        conn.execute(model_versions.delete().where(model_versions.c.model == key))
        if versions:
            conn.execute(model_versions.insert(), [
                {"model": key, "version": int(v), "purpose": p, "holder": holder, "since": now}
                for v, p in sorted(versions.items())])
        store.set_state(CONFIG_SCOPE, key, dict(config) if config is not None else {}, conn=conn)


def reconcile(control: Any, name: str, *, add: Iterable[int] = (), remove: Iterable[int] = (),
              exactly: Iterable[int] | None = None, config: Any = None, config_version: int | None = None,
              purpose: str = "serving", timeout_s: float | None = None,
              optional: Iterable[int] = ()) -> dict[str, Any]:
    """Change the versions ``name`` keeps loaded in one Triton request, under its model-control lease.

    Args:
        control: A :class:`repository_sync.triton.client.TritonModelControl` or a
            :class:`repository_sync.triton.replicas.TritonReplicaSet` (every replica, one lease).
        name: Triton model name.
        add: Versions to load beside the desired ones.
        remove: Versions to unload (a version the registry still needs stays).
        exactly: The whole new set (replaces the desired one; ``add``/``remove`` then ignored).
        config: Config to load with (pbtxt, JSON, dict, ModelConfig); default: ``config_version``'s
            signed ``config.pbtxt.intended``, else the config recorded at the last change, else the
            newest version's. Its version policy is replaced.
        config_version: Version whose signed config is used.
        purpose: Why the added versions are loaded (``serving``, ``evaluation``, ``canary``...).
        timeout_s: Seconds to wait for READY per version (default ``control.load_timeout_s``).
        optional: Versions of the new set that only the registry wants (its aliases): one not in
            the repository is left out and named in ``skipped``, not an error.

    Returns:
        ``{"model_name", "versions", "before", "signatures": {version: digest}, "key_ids",
        "skipped": {version: why}}`` (``skipped``: versions only the registry named that are not in
        the repository, e.g. alias ``challenger`` on a version whose publish failed); for a replica
        set also ``replicas: {url: {"versions", "load_s", "signatures"}}``.

    Raises:
        LeaseBusyError: Another model-control change of ``name`` held the lease too long.
        LeaseLostError: The lease was lost before the load was sent; nothing was sent.
        SignatureVerificationError: A version fails verification; nothing is sent to Triton.
        ModelLoadRefusedError, ModelLoadError: Triton refused or a version is not READY in time;
            Triton is brought back to the desired set, which is unchanged.
    """
    store: CoordinationStore = control.coordination
    key = control.coordination_key(name)
    holder = control.holder or f"{socket.gethostname()}:{os.getpid()}"
    with store.hold(MODEL_CONTROL, key, holder=holder, timeout_s=control.lock_timeout_s,
                    what=f"model control of Triton model {name!r}") as lease:
        recorded_config = store.get_state(CONFIG_SCOPE, key)
        before = _starting_versions(control, store, key, name, recorded_config)
        added = {int(v) for v in add}
        target, registry_only = _target_versions(control, name, before, added, remove, exactly,
                                                 optional, purpose)
        result: dict[str, Any] = {"model_name": name, "versions": [], "before": sorted(before),
                                  "signatures": {}, "key_ids": {}, "skipped": {}}
        intended = _verify_versions(control, name, target, registry_only, result)
        result["versions"] = sorted(target)
        if result["skipped"] and not target:
            raise VersionNotInRepositoryError(
                f"model {name!r}: none of the versions the registry names is in the repository "
                f"({result['skipped']}); refusing to unload what serves")
        servers = replicas_of(control)
        if not target:
            _unload_everywhere(servers, name, lease)
            _write_desired(store, key, {}, holder, recorded_config or {})
            if len(servers) > 1:
                result["replicas"] = {s.url: {"versions": []} for s in servers}
            return result
        chosen = _config_to_load(config, config_version, intended, recorded_config, added, target)
        body = _load_body(chosen, name, target)
        per_replica = _load_on_replicas(servers, name, body, sorted(target), sorted(before),
                                        recorded_config, lease, timeout_s, result["signatures"])
        _write_desired(store, key, target, holder, json.loads(body))
        if len(servers) > 1:
            result["replicas"] = per_replica
        return result


def _starting_versions(control: Any, store: CoordinationStore, key: str, name: str,
                       recorded_config: Any) -> dict[int, str]:
    """The desired set before this change; for a model never controlled, what Triton has READY."""
    before = desired_versions(store, key)
    if not before and recorded_config is None:  # never controlled: adopt what Triton serves
        ready = getattr(control, "ready_versions_any", control.ready_versions)  # any replica
        before = {v: "adopted" for v in ready(name)}
    return before


def _verify_versions(control: Any, name: str, target: dict[int, str], registry_only: set[int],
                     result: dict[str, Any]) -> dict[int, bytes]:
    """Verify each target version's signature; return their signed intended configs.

    Fills ``result``'s ``signatures``, ``key_ids`` and ``skipped``; a registry-only version absent
    from the repository is dropped from ``target`` and named in ``skipped``.

    Raises:
        VersionNotInRepositoryError: A version asked for explicitly is not in the repository.
        SignatureVerificationError: A version fails verification.
    """
    intended: dict[int, bytes] = {}
    for v in sorted(target):
        try:
            info, intended[v] = control.verify(name, v)
        except VersionNotInRepositoryError as exc:
            # An alias may name a version whose publish failed or is still running: the registry
            # wants it, but there is nothing to load yet. A version asked for explicitly still fails.
            if v not in registry_only:
                raise
            del target[v]
            result["skipped"][str(v)] = str(exc)
            continue
        result["signatures"][str(v)] = info.signature_digest
        result["key_ids"][str(v)] = info.key_id
    return intended


def _load_body(chosen: Any, name: str, target: Mapping[int, str]) -> str:
    """The load request's JSON config: ``chosen`` with its version policy set to exactly ``target``."""
    msg = parse_config(chosen, model_name=name, error=ModelLoadRefusedError)
    msg.version_policy.Clear()
    msg.version_policy.specific.versions.extend(sorted(target))
    return to_json(msg)


def _load_on_replicas(servers: list[Any], name: str, body: str, versions: list[int], before: list[int],
                      recorded_config: Any, lease: Any, timeout_s: float | None,
                      signatures: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Load ``versions`` on each server in order, each READY before the next is touched.

    Returns:
        ``{url: {"versions", "load_s", "signatures"}}`` per server.

    Raises:
        The load's error (named after the replica when there are several), after every server
        already changed and the failing one are brought back to ``before``.
    """
    per_replica: dict[str, dict[str, Any]] = {}
    for i, server in enumerate(servers):
        started = time.monotonic()
        try:
            lease.check()  # fencing: never send a load after losing the lease
            _send_load(server, name, body, versions)
            _check_listed(server, name, versions)
            for v in versions:
                server.wait_ready(name, v, timeout_s)
        except BaseException as exc:
            changed = servers[: i + 1]
            if set(before) != set(versions):
                for done in changed:
                    _bring_back(done, name, before, recorded_config, body)
            if len(servers) == 1:
                raise
            back = ", ".join(d.url for d in changed)
            named = name_replica(exc, server.url, i, len(servers),
                                 f"; replicas {back} brought back to versions {before}, "
                                 "the others untouched")
            if named is exc:
                raise
            raise named from exc
        per_replica[server.url] = {"versions": list(versions), "load_s": round(time.monotonic() - started, 3),
                                   "signatures": dict(signatures)}
    return per_replica


def _unload_everywhere(servers: list[Any], name: str, lease: Any) -> None:
    """Unload every version of ``name`` on each server, after checking the lease is still held."""
    lease.check()  # fencing: never send an unload after losing the lease
    for server in servers:
        server._call(f"unloading '{name}'", server.client.unload_model, name)


def _target_versions(control: Any, name: str, before: Mapping[int, str], added: set[int],
                     remove: Iterable[int], exactly: Iterable[int] | None, optional: Iterable[int],
                     purpose: str) -> tuple[dict[int, str], set[int]]:
    """The new desired set ``{version: purpose}`` of :func:`reconcile`, and the registry-only versions.

    ``exactly`` replaces the set (a version keeps the purpose it had); otherwise ``remove`` leaves
    it and ``added`` joins it with ``purpose``. Every version the registry needs
    (``control.needed_versions``) stays, with purpose ``registry``; those and ``optional`` ones
    that were not asked for explicitly are the registry-only versions, skipped when absent from
    the repository.
    """
    if exactly is not None:
        target = {int(v): before.get(int(v), purpose) for v in exactly}
    else:
        removed = {int(r) for r in remove}
        target = {v: p for v, p in before.items() if v not in removed}
        target.update({v: purpose for v in added})
    registry_only = {int(v) for v in optional} - added
    if control.needed_versions is not None:
        for v in control.needed_versions(name):
            if int(v) not in target:
                registry_only.add(int(v))
            target.setdefault(int(v), "registry")
    return target, registry_only


def _config_to_load(config: Any, config_version: int | None, intended: Mapping[int, bytes],
                    recorded_config: Any, added: set[int], target: Mapping[int, str]) -> Any:
    """Which config :func:`reconcile` loads with, in any encoding :func:`parse_config` reads.

    The caller's ``config``; else ``config_version``'s signed intended config; else, when nothing
    is added, the config recorded at the last change; else the intended config of the newest
    added (or, adding nothing, newest desired) version.
    """
    if config is not None:
        return config
    if config_version is not None and int(config_version) in intended:
        return intended[int(config_version)]
    if recorded_config and not added:
        return json.dumps(recorded_config)
    return intended[max(added or target)]


#: Seconds a version may stay absent from Triton's repository index after its load returned.
LISTED_GRACE_S = 5.0


def _check_listed(server: Any, name: str, versions: list[int]) -> None:
    """Fail fast when Triton does not list a version after the (synchronous) load returned.

    A server that cannot read a version folder (a replica on another or a stale copy of the
    repository) accepts the load and simply never lists it; waiting for READY would only time out.

    Raises:
        ModelLoadError: A version still absent from the index after :data:`LISTED_GRACE_S` seconds.
    """
    from ground.exceptions import ModelLoadError

    deadline = time.monotonic() + LISTED_GRACE_S
    while True:
        listed = {str(e.get("version", "")) for e in server.index() if e.get("name") == name}
        missing = [v for v in versions if str(v) not in listed]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise ModelLoadError(f"Triton at {server.url} does not list model '{name}' versions {missing} "
                                 f"after loading them (lists {sorted(listed - {''})}): it cannot read them "
                                 "from its repository")
        time.sleep(0.2)


def replicas_of(control: Any) -> list[Any]:
    """The single-server clients a control acts on: its ``replicas``, or itself."""
    return list(getattr(control, "replicas", None) or [control])


def name_replica(exc: BaseException, url: str, index: int, count: int, suffix: str) -> BaseException:
    """``exc`` with replica ``url`` (``index`` of ``count``) named; same class when it is a tritonflow error.

    Errors that are not tritonflow's (interrupts, client library errors) come back unchanged.
    """
    from ground.exceptions import LeaseBusyError, TritonflowError

    if not isinstance(exc, TritonflowError) or isinstance(exc, LeaseBusyError):
        return exc
    try:
        return type(exc)(f"Triton replica {url} ({index + 1} of {count}): {exc}{suffix}")
    except TypeError:
        return exc


def _send_load(control: Any, name: str, body: str, versions: list[int]) -> None:
    from tritonclient.utils import InferenceServerException

    try:
        control._call(f"loading '{name}'", control.client.load_model, name, config=body)
    except InferenceServerException as exc:
        raise ModelLoadRefusedError(
            f"Triton refused to load model '{name}' versions {versions}: {exc.message()}"
        ) from None


def _bring_back(control: Any, name: str, versions: list[int], recorded: Any, failed_body: str) -> None:
    """Best effort: Triton back to the (unchanged) desired ``versions``, still under the lease."""
    try:
        if not versions:
            control.client.unload_model(name)
            return
        if control.ready_versions(name) == versions:
            return  # Triton kept the old set after a refused load
        cfg = dict(recorded) if recorded else json.loads(failed_body)
        cfg["version_policy"] = {"specific": {"versions": versions}}
        control.client.load_model(name, config=json.dumps(cfg))
    except Exception:  # noqa: BLE001 - the original error is what matters
        pass


_T = TypeVar("_T")
_log = logging.getLogger(__name__)


def when_triton_answers(change: Callable[[], _T], *, timeout_s: float, poll_s: float = 2.0,
                        sleep: Callable[[float], Any] = time.sleep) -> _T:
    """Run ``change`` (a :func:`reconcile`), retried while Triton is unreachable, e.g. restarting.

    A reconcile is idempotent (it sends the desired set), so retrying one that failed because Triton
    did not answer is safe; after a restart it also loads back what Triton forgot.

    Args:
        change: The model-control change to make.
        timeout_s: Seconds to keep retrying (e.g. ``settings.start_timeout_s``), > 0.
        poll_s: Seconds between attempts.
        sleep: Waits (``time.sleep``; injected by tests).

    Returns:
        What ``change`` returned.

    Raises:
        ServiceUnavailableError: Triton still unreachable after ``timeout_s`` (the last error).
        Anything else ``change`` raises, at once.
    """
    if not timeout_s > 0:
        raise DataError(f"when_triton_answers: timeout_s={timeout_s!r} must be > 0 seconds")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return change()
        except ServiceUnavailableError as exc:
            if time.monotonic() + poll_s > deadline:
                raise
            _log.warning("Triton does not answer (restarting?); retrying the model-control change in %g s: %s",
                         poll_s, exc)
            sleep(poll_s)


def reconcile_model(control: Any, registry: Any, model: str, *, triton_model: str | None = None,
                    keep: Iterable[int] = (), timeout_s: float | None = None) -> dict[str, Any]:
    """Load exactly what the registry needs for ``model`` (plus versions pinned for evaluation/canary).

    The set is :func:`registry_versions` plus the desired versions recorded with purpose
    ``evaluation`` or ``canary`` plus ``keep``; one load request, under the model-control lease.

    Raises:
        DataError: The registry names no version to serve for ``model``.
        See :func:`reconcile` for the rest.
    """
    name = triton_model or model
    needed = registry_versions(registry, model) | {int(v) for v in keep}
    pinned = {v for v, p in desired_versions(control.coordination, control.coordination_key(name)).items()
              if p in ("evaluation", "canary")}
    if not needed | pinned:
        raise DataError(f"model {model!r}: no alias among {SERVING_ALIASES} and nothing pinned; "
                        "refusing to unload everything (use unload)")
    return reconcile(control, name, exactly=needed | pinned, timeout_s=timeout_s,
                     optional=registry_versions(registry, model) - pinned - {int(v) for v in keep})
