"""Repository storage in a local or NFS-mounted folder.

Staging is a hidden folder in the same model folder, every file is fsynced, and
``os.rename(staging, <N>)`` publishes the version atomically; a concurrent publisher that won the
rename makes ours compare contents as for a re-publish. See :mod:`repository_sync.storage`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from typing_extensions import override

from ground.checksums import sha256_file
from ground.exceptions import DataError, RepositoryConflictError, VersionNotInRepositoryError
from repository_sync.layout import (
    CONFIG_FILENAME,
    STAGING_PREFIX,
    VersionLayout,
    validate_model_name,
    walk_local_repository,
)
from repository_sync.storage_base import (
    STALE_STAGING_AGE_S,
    PushOutcome,
    RepositoryStorage,
    StagedPush,
    compare_digests,
)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_fsync(src: Path, dst: Path) -> int:
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())
    return dst.stat().st_size


def _local_digests(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in folder.iterdir() if p.is_file()}


class FileSystemStorage(RepositoryStorage, scheme=""):
    """Repository in a local or NFS-mounted folder (atomic by ``os.rename``).

    Args:
        root: Repository folder (created if missing).
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)

    @override
    def version_uri(self, layout: VersionLayout) -> str:
        return str(self.root / layout.version_dir)

    def _remove_stale_staging(self, model_dir: Path, layout: VersionLayout) -> None:
        now = time.time()
        for p in model_dir.glob(f"{STAGING_PREFIX}{layout.version}-*"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > STALE_STAGING_AGE_S:
                    shutil.rmtree(p)

    def _existing(self, layout: VersionLayout, final: Path, staged: dict[str, str]) -> bool:
        """True if ``final`` holds the same content; raises on a conflict; False if absent/empty."""
        if not final.exists() or (final.is_dir() and not any(final.iterdir())):
            return False
        if not final.is_dir():
            raise RepositoryConflictError(f"{str(final)!r} exists and is not a folder")
        compare_digests(layout, str(final), _local_digests(final), staged)
        return True

    def _write_serving_config_if_absent(self, model_dir: Path, data: bytes | None) -> bool:
        if data is None:
            return False
        target = model_dir / CONFIG_FILENAME
        if target.exists():
            return False
        tmp = model_dir / f".{CONFIG_FILENAME}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, target)  # atomic, refuses to replace a config written meanwhile
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(model_dir)
        return True

    @override
    def _push_staged(self, push: StagedPush) -> PushOutcome:
        layout, files, staged_digests = push.layout, push.files, push.digests
        self.root.mkdir(parents=True, exist_ok=True)
        model_dir = self.root / layout.model_dir
        final = self.root / layout.version_dir
        created_model_dir = not model_dir.exists()
        model_dir.mkdir(exist_ok=True)
        staging = model_dir / layout.staging_dir_name(uuid.uuid4().hex[:12])
        try:
            self._remove_stale_staging(model_dir, layout)
            if self._existing(layout, final, staged_digests):
                written = self._write_serving_config_if_absent(model_dir, push.serving_config)
                return push.outcome(str(final), "unchanged", written)
            staging.mkdir()
            for p in files:
                _copy_fsync(p, staging / p.name)
                push.progress(p.name)
            _fsync_dir(staging)
            if push.verify is not None:
                push.verify(staging)
            try:
                os.rename(staging, final)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # a concurrent push of the same version won the rename
                self._existing(layout, final, staged_digests)
                shutil.rmtree(staging, ignore_errors=True)
                written = self._write_serving_config_if_absent(model_dir, push.serving_config)
                return push.outcome(str(final), "unchanged", written)
            _fsync_dir(model_dir)
            written = self._write_serving_config_if_absent(model_dir, push.serving_config)
            return push.outcome(str(final), "published", written)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if created_model_dir:
                with contextlib.suppress(OSError):
                    model_dir.rmdir()  # only if still empty
            raise

    @override
    def delete_version(self, layout: VersionLayout) -> bool:
        final = self.root / layout.version_dir
        if not final.exists():
            return False
        if not final.is_dir():
            raise DataError(f"{str(final)!r} is not a version folder (expected a folder to delete)")
        model_dir = final.parent
        doomed = model_dir / layout.staging_dir_name(uuid.uuid4().hex[:12])
        os.rename(final, doomed)  # one step: Triton's next scan no longer sees the version
        _fsync_dir(model_dir)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    @override
    @contextlib.contextmanager
    def local_version(self, layout: VersionLayout) -> Iterator[Path]:
        path = self.root / layout.version_dir
        if not path.is_dir():
            raise VersionNotInRepositoryError(
                f"model '{layout.model_name}' version {layout.version} is not in repository "
                f"{self.uri!r} (no folder {str(path)!r})"
            )
        yield path

    @override
    def list_paths(self) -> list[str]:
        return walk_local_repository(self.root) if self.root.exists() else []

    @override
    def read_serving_config(self, model_name: str) -> bytes | None:
        path = self.root / validate_model_name(model_name) / CONFIG_FILENAME
        return path.read_bytes() if path.is_file() else None

    @override
    def write_serving_config(self, model_name: str, data: bytes) -> None:
        model_dir = self.root / validate_model_name(model_name)
        model_dir.mkdir(parents=True, exist_ok=True)
        tmp = model_dir / f".{CONFIG_FILENAME}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, model_dir / CONFIG_FILENAME)
        _fsync_dir(model_dir)
