"""Publish one model version to a Triton repository: stage, sign, push atomically, verify, expose.

Sequence of :func:`publish_version` (the "why" of each step is in
:mod:`repository_sync.storage`):

1. plan the layout (safe model name, positive-integer version);
2. stage ``<tmp>/<N>/``: the model file under the backend's default name and
   ``config.pbtxt.intended`` (the config this version serves with, parsed and re-serialised with
   protobuf so its ``name`` matches the model);
3. sign the staged folder (model file + intended config) into ``<N>/<model file>.sig``;
4. push: the storage copies the folder into a staging location at the destination, the signature
   is verified *there* with the trusted public keys, and only then is the version made visible
   (rename on a filesystem, model file copied last on S3). ``<model>/config.pbtxt`` is written only
   for a model's first version, so the champion's serving config never changes on publish.

Re-running the same publish is a no-op (``already_published=True``); different content for an
existing version raises :class:`~ground.exceptions.RepositoryConflictError`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ground.exceptions import DataError
from repository_sync.layout import (
    INTENDED_CONFIG_FILENAME,
    VersionLayout,
    plan_version,
)
from repository_sync.model_config import model_filename_for, parse_config, to_pbtxt
from repository_sync.signing import SignatureInfo, load_public_keys, sign_version, verify_version
from repository_sync.storage import open_repository
from repository_sync.storage_base import ProgressCallback, RepositoryStorage


@dataclasses.dataclass(frozen=True)
class PublishResult:
    """What a publish did; JSON-serialisable through :meth:`to_dict` (small enough for XCom).

    Attributes:
        repository_uri: Repository as Triton is given it (folder or normalised ``s3://`` URL).
        version_uri: The version folder's URI.
        model_name: Triton model name.
        version: Model version (= MLflow registry version).
        signature_digest: SHA-256 hex of the signature bundle in the repository.
        key_id: SHA-256 hex of the signer's PEM public key.
        signed_files: File names covered by the signature.
        bytes: Size of the version's files (bytes).
        already_published: True when identical content was already there (nothing written).
        serving_config_written: True when this publish created ``<model>/config.pbtxt``.
        timings_s: Seconds per stage: ``stage``, ``sign``, ``push`` (push includes the
            destination-side verification), ``total``.
    """

    repository_uri: str
    version_uri: str
    model_name: str
    version: int
    signature_digest: str
    key_id: str
    signed_files: tuple[str, ...]
    bytes: int
    already_published: bool
    serving_config_written: bool
    timings_s: dict[str, float]

    def to_dict(self) -> dict:
        """Plain dict of JSON types."""
        d = dataclasses.asdict(self)
        d["signed_files"] = list(self.signed_files)
        return d


def publish_version(
    *,
    repository: str | os.PathLike[str] | RepositoryStorage,
    model_name: str,
    version: int | str,
    model_file: str | os.PathLike[str],
    config: str | bytes | object,
    private_key: str | os.PathLike[str] | bytes,
    trusted_keys: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Mapping[str, Path],
    endpoint_url: str | None = None,
    key_password: str | None = None,
    on_progress: ProgressCallback | None = None,
) -> PublishResult:
    """Publish a converted model file as ``<model>/<version>/`` with its signed serving config.

    Args:
        repository: Repository folder, Triton S3 URL, or a :class:`RepositoryStorage`.
        model_name: Triton model name (``[A-Za-z0-9][A-Za-z0-9_.-]*``).
        version: Positive-integer version (the MLflow registry version).
        model_file: The converted model file (e.g. ONNX); stored under the backend's default file
            name (``model.onnx``) unless the config sets ``default_model_filename``.
        config: The config this version serves with (pbtxt text/bytes or ``ModelConfig``).
        private_key: Signing key file path or PEM bytes (never logged).
        trusted_keys: Public key(s) used to verify at the destination (folder, files or the
            mapping from :func:`repository_sync.signing.load_public_keys`).
        endpoint_url: boto3 endpoint for S3; must match the S3 URL's host:port.
        key_password: Password of an encrypted private key.
        on_progress: Called with each file name as it is written (progress reporting).

    Returns:
        :class:`PublishResult`.

    Raises:
        RepositoryLayoutError: Unsafe model name or invalid version.
        ModelConfigError: The config does not parse or names another model.
        SignatureVerificationError: The pushed copy does not verify with the trusted keys
            (nothing is made visible).
        RepositoryConflictError: The version exists with different content.
        SigningKeyError: Missing/unusable key.
        ServiceUnavailableError: S3 unreachable.
    """
    t0 = time.perf_counter()
    model_file = Path(model_file)
    if not model_file.is_file():
        raise DataError(f"model_file {str(model_file)!r} does not exist: expected the converted model file")
    msg = parse_config(config, model_name=model_name)
    layout: VersionLayout = plan_version(model_name, version, model_filename_for(msg))
    config_bytes = to_pbtxt(msg).encode()
    storage = repository if isinstance(repository, RepositoryStorage) else open_repository(
        repository, endpoint_url=endpoint_url
    )
    keys = dict(trusted_keys) if isinstance(trusted_keys, Mapping) else load_public_keys(trusted_keys)

    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tritonflow-publish-") as tmp:
        staged = Path(tmp) / str(layout.version)
        staged.mkdir()
        shutil.copyfile(model_file, staged / layout.model_filename)
        (staged / INTENDED_CONFIG_FILENAME).write_bytes(config_bytes)
        t1 = time.perf_counter()
        timings["stage"] = t1 - t0
        sign_version(staged, private_key, signature_file=layout.signature_filename, password=key_password)
        t2 = time.perf_counter()
        timings["sign"] = t2 - t1

        verified: list[SignatureInfo] = []

        def _verify(path: Path) -> None:
            verified.append(verify_version(path, keys, signature_file=layout.signature_filename))

        outcome = storage.push_version(
            layout, staged, serving_config=config_bytes, verify=_verify, on_progress=on_progress
        )
        if outcome.status == "unchanged":
            # the copy already in the repository is what will be loaded: verify that one
            with storage.local_version(layout) as local:
                _verify(local)
        t3 = time.perf_counter()
        timings["push"] = t3 - t2
    info = verified[-1]
    timings["total"] = time.perf_counter() - t0
    return PublishResult(
        repository_uri=storage.uri,
        version_uri=outcome.version_uri,
        model_name=layout.model_name,
        version=layout.version,
        signature_digest=info.signature_digest,
        key_id=info.key_id,
        signed_files=info.files,
        bytes=outcome.bytes,
        already_published=outcome.status == "unchanged",
        serving_config_written=outcome.serving_config_written,
        timings_s={k: round(v, 4) for k, v in timings.items()},
    )
