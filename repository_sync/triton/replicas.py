"""Several Triton replicas serving one repository, controlled as one.

The gateway balances over N Triton servers that share one model repository (S3 or NFS).
:class:`TritonReplicaSet` has the interface the pipelines use on a
:class:`~repository_sync.triton.client.TritonModelControl` (load, unload, unload_versions,
ready_versions, is_ready, wait_ready, verify, smoke_test, load_and_smoke_test, index,
coordination_key, close) and acts on every replica:

* **One lease per model, not per replica.** A change goes through
  :func:`repository_sync.triton.model_control.reconcile` under the model's ``model-control`` lease; the
  desired set of versions is recorded once (per model name) and every replica is brought to it.
* **Verification once.** The replicas read the same repository, so a version's signature is
  verified once, before anything is sent to any replica; the digest is reported per replica.
* **In order, all or nothing.** The load request goes to the replicas one after the other; each
  must reach READY before the next is touched. When a replica refuses, times out or is
  unreachable, the replicas already changed and the failing one are brought back to the
  (unchanged) desired set, the others were never touched, and the error names the replica.
  A replica that fails therefore blocks a promotion and leaves the others as they were.
* **Per-replica results.** ``load`` / ``reconcile`` results carry ``replicas: {url: {...}}``
  (versions, seconds to READY, smoke summary).

:func:`triton_control` is the one place the pipelines build their client: a plain
``TritonModelControl`` for one server, a ``TritonReplicaSet`` for several
(``TRITONFLOW_TRITON_REPLICA_URLS``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ground.exceptions import DataError
from ground.values import parse_replica_urls
from repository_sync.layout import plan_version
from repository_sync.signing import SignatureInfo
from repository_sync.storage.base import RepositoryStorage
from repository_sync.triton.client import (
    InputSpec,
    SmokeResult,
    TritonModelControl,
    coordination_store,
    load_then_smoke,
    repository_storage,
    trusted_key_map,
)

__all__ = ["TritonReplicaSet", "triton_control"]


class TritonReplicaSet:
    """Model control over several Triton servers sharing one repository.

    Args:
        urls: ``host:port`` of each replica's HTTP endpoint, in the order changes are applied.
        repository: The shared repository (folder, S3 URL or storage); verification reads it once.
        trusted_keys: Public key folder/files, or the mapping from ``load_public_keys``.
        endpoint_url: boto3 endpoint for an S3 repository.
        coordination: The shared coordination store (or its URL); default a store private to this
            process (then the key is prefixed with the replica list).
        **options: The other arguments of :class:`TritonModelControl`, the same for every replica
            (``load_timeout_s`` per replica, ``poll_interval_s``, ``needed_versions``, ``holder``,
            ``lock_timeout_s``).

    Raises:
        DataError: No replica given.
    """

    def __init__(self, urls: Sequence[str] | str, *, repository: str | RepositoryStorage | None = None,
                 trusted_keys: Any = None, endpoint_url: str | None = None, coordination: Any = None,
                 **options: Any):
        self.urls = parse_replica_urls(urls)
        if not self.urls:
            raise DataError("TritonReplicaSet: no replica URL given")
        storage = repository_storage(repository, endpoint_url)
        keys = trusted_key_map(trusted_keys)
        store, self._key_prefix = coordination_store(coordination, ",".join(self.urls) + "/")
        self.replicas = [TritonModelControl(u, repository=storage, trusted_keys=keys, coordination=store, **options)
                         for u in self.urls]
        first = self.replicas[0]
        self.url = ",".join(self.urls)
        self.coordination = store
        self.storage = storage
        self.needed_versions = first.needed_versions
        self.holder = first.holder
        self.lock_timeout_s = first.lock_timeout_s
        self.load_timeout_s = first.load_timeout_s
        self.poll_interval_s = first.poll_interval_s

    # ------------------------------------------------------------------ plumbing
    @property
    def client(self):
        """The first replica's ``tritonclient`` HTTP client (metadata reads, replay traffic)."""
        return self.replicas[0].client

    def coordination_key(self, name: str) -> str:
        """The lease/desired-state key of model ``name``: one per model, shared by every replica."""
        return self._key_prefix + name

    def close(self) -> None:
        """Close every replica's HTTP connections."""
        for r in self.replicas:
            r.close()

    def __enter__(self) -> "TritonReplicaSet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ state
    def index(self) -> list[dict]:
        """Every replica's repository index; each entry carries ``replica`` (its ``host:port``)."""
        return [dict(entry, replica=r.url) for r in self.replicas for entry in r.index()]

    def ready_by_replica(self, name: str) -> dict[str, list[int]]:
        """``{replica: READY versions of name}``."""
        return {r.url: r.ready_versions(name) for r in self.replicas}

    def ready_versions(self, name: str) -> list[int]:
        """Versions of ``name`` READY on **every** replica (what the gateway can serve from any)."""
        sets = [set(v) for v in self.ready_by_replica(name).values()]
        return sorted(set.intersection(*sets))

    def ready_versions_any(self, name: str) -> list[int]:
        """Versions of ``name`` READY on at least one replica (adopted when never controlled)."""
        return sorted(set().union(*self.ready_by_replica(name).values()))

    def is_ready(self, name: str, version: int) -> bool:
        """Whether the version is READY on every replica."""
        return all(r.is_ready(name, version) for r in self.replicas)

    def wait_ready(self, name: str, version: int, timeout_s: float | None = None) -> float:
        """Wait until the version is READY on every replica (each with ``timeout_s``).

        Returns:
            Seconds waited in all.

        Raises:
            ModelLoadError: A replica not READY in time (the message names it).
        """
        from repository_sync.triton.model_control import name_replica

        start = time.monotonic()
        for i, r in enumerate(self.replicas):
            try:
                r.wait_ready(name, version, timeout_s)
            except Exception as exc:
                named = name_replica(exc, r.url, i, len(self.replicas), "")
                if named is exc:
                    raise
                raise named from exc
        return time.monotonic() - start

    def model_config(self, name: str) -> dict:
        """The config the first replica serves ``name`` with (every replica gets the same)."""
        return self.replicas[0].model_config(name)

    def input_specs(self, name: str, version: int) -> list[InputSpec]:
        """Inputs of a loaded version (read from the first replica)."""
        return self.replicas[0].input_specs(name, version)

    # ------------------------------------------------------------------ changes
    def verify(self, name: str, version: int) -> tuple[SignatureInfo, bytes]:
        """Verify a version in the shared repository (once for every replica); see ``TritonModelControl.verify``."""
        return self.replicas[0].verify(name, version)

    def unload(self, name: str) -> None:
        """Unload every version of ``name`` on every replica (registry-needed versions stay)."""
        from repository_sync.triton.model_control import reconcile

        reconcile(self, name, exactly=())

    def unload_versions(self, name: str, versions: Sequence[int]) -> dict:
        """Unload ``versions`` of ``name`` on every replica, keeping the other desired ones."""
        from repository_sync.triton.model_control import reconcile

        return reconcile(self, name, remove=[int(v) for v in versions])

    def load(self, name: str, version: int, config: Any = None, *, keep_loaded: bool = True,
             timeout_s: float | None = None, purpose: str = "serving") -> dict:
        """Verify once, load on every replica in order, wait for READY on each.

        Args:
            name: Triton model name.
            version: Version to load.
            config: Config to load with (default: the version's signed intended config).
            keep_loaded: Keep the model's desired versions loaded beside this one.
            timeout_s: Seconds to wait for READY per replica.
            purpose: Why it is loaded (recorded).

        Returns:
            ``TritonModelControl.load``'s dict plus ``replicas: {url: {"versions", "load_s",
            "signature_digest"}}``.

        Raises:
            SignatureVerificationError: Nothing sent to any replica.
            ModelLoadRefusedError, ModelLoadError, ServiceUnavailableError: A replica failed (named
                in the message); the replicas changed before it and itself are back to the desired
                set, the later ones untouched.
        """
        from repository_sync.triton.model_control import reconcile

        version = plan_version(name, version).version
        start = time.monotonic()
        kw = {"add": [version]} if keep_loaded else {"exactly": [version]}
        done = reconcile(self, name, config=config, config_version=version, purpose=purpose,
                         timeout_s=timeout_s, **kw)
        return {
            "model_name": name, "version": version, "versions": done["versions"],
            "signature_digest": done["signatures"][str(version)], "key_id": done["key_ids"][str(version)],
            "load_s": round(time.monotonic() - start, 3), "replicas": done["replicas"],
        }

    # ------------------------------------------------------------------ inference
    def infer(self, name: str, version: int, inputs: Mapping[str, np.ndarray],
              outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """One inference on the first replica (the gateway balances live traffic)."""
        return self.replicas[0].infer(name, version, inputs, outputs)

    def smoke_test_each(self, name: str, version: int, sample: Any,
                        expected: Mapping[str, np.ndarray] | None = None, *,
                        atol: float = 1e-5, rtol: float = 1e-5) -> dict[str, SmokeResult]:
        """Smoke-test the version on every replica; ``{url: SmokeResult}``.

        Raises:
            ParityError, DataError, InferenceRequestError: From the first replica that fails,
                with the replica named.
        """
        from repository_sync.triton.model_control import name_replica

        out: dict[str, SmokeResult] = {}
        for i, r in enumerate(self.replicas):
            try:
                out[r.url] = r.smoke_test(name, version, sample, expected, atol=atol, rtol=rtol)
            except Exception as exc:
                named = name_replica(exc, r.url, i, len(self.replicas), "")
                if named is exc:
                    raise
                raise named from exc
        return out

    def smoke_test(self, name: str, version: int, sample: Any, expected: Mapping[str, np.ndarray] | None = None,
                   *, atol: float = 1e-5, rtol: float = 1e-5) -> SmokeResult:
        """Smoke-test on every replica; return the first replica's result (see :meth:`smoke_test_each`)."""
        return next(iter(self.smoke_test_each(name, version, sample, expected, atol=atol, rtol=rtol).values()))

    def load_and_smoke_test(self, name: str, version: int, sample: Any,
                            expected: Mapping[str, np.ndarray] | None = None, *, config: Any = None,
                            keep_loaded: bool = True, timeout_s: float | None = None,
                            atol: float = 1e-5, rtol: float = 1e-5) -> tuple[dict, SmokeResult]:
        """Load on every replica, smoke-test on every replica, remove the version again on failure.

        Returns:
            ``(load_info, first replica's smoke result)``; ``load_info["replicas"][url]["smoke"]``
            is each replica's smoke summary.

        Raises:
            ParityError: A replica's outputs differ (named); the version is removed again from
                every replica unless it was desired before.
        """
        info, each = load_then_smoke(
            self, name, version, config, keep_loaded=keep_loaded, timeout_s=timeout_s,
            smoke=lambda: self.smoke_test_each(name, version, sample, expected, atol=atol, rtol=rtol))
        for url, smoke in each.items():
            info["replicas"].setdefault(url, {})["smoke"] = smoke.summary()
        return info, next(iter(each.values()))


def triton_control(settings: Any, url: str | None = None, **kwargs: Any) -> TritonModelControl | TritonReplicaSet:
    """The model-control client the pipelines use: one server, or every replica.

    Args:
        settings: :class:`ground.settings.Settings` (``triton_replica_http_urls``).
        url: An explicit ``host:port`` (a caller's override): then that server alone, unless it is
            the first replica or ``settings.triton_http_url`` (the default, not an override).
        **kwargs: Passed to the client (repository, trusted_keys, coordination, holder...).

    Returns:
        A :class:`TritonModelControl` when one server is configured (or ``url`` given), else a
        :class:`TritonReplicaSet` over ``TRITONFLOW_TRITON_REPLICA_URLS``.
    """
    urls = settings.triton_replica_http_urls
    if url is not None and url not in urls[:1] and url != settings.triton_http_url:
        urls = [url]
    if len(urls) == 1:
        return TritonModelControl(urls[0], **kwargs)
    return TritonReplicaSet(urls, **kwargs)

