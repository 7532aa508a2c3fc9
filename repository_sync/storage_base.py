"""The repository storage interface every backend implements, and the helpers they share.

:class:`RepositoryStorage` (push a version atomically and immutably, read it back, list the
repository, read and write the serving config), :class:`PushOutcome`, the SHA-256 file digest
and the comparison that turns a re-publish with different content into a
:class:`~ground.exceptions.RepositoryConflictError`. The guarantees are described in
:mod:`repository_sync.storage`.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path

from ground.checksums import sha256_file
from ground.exceptions import DataError, RepositoryConflictError
from repository_sync.layout import VersionLayout, check_layout

#: Age (seconds) after which a staging folder/prefix left by a crashed push is removed by the next
#: push of the same version. Long enough that a concurrent, slow push is not disturbed.
STALE_STAGING_AGE_S = 3600.0

ProgressCallback = Callable[[str], None]
VerifyCallback = Callable[[Path], object]


@dataclasses.dataclass(frozen=True)
class PushOutcome:
    """Result of a push.

    Attributes:
        version_uri: Where the version lives (folder path or ``s3://...`` URI).
        status: ``"published"`` (this push made it visible) or ``"unchanged"`` (identical content
            was already published).
        files: File names in the version folder.
        bytes: Total size of those files.
        serving_config_written: Whether this push wrote ``<model>/config.pbtxt`` (first version).
    """

    version_uri: str
    status: str
    files: tuple[str, ...]
    bytes: int
    serving_config_written: bool


def _source_files(layout: VersionLayout, source_dir: Path) -> list[Path]:
    """Files of a staged version folder, the model file last; refuses sub-folders and symlinks."""
    if not source_dir.is_dir():
        raise DataError(f"staged version folder {str(source_dir)!r} does not exist")
    files = []
    for p in sorted(source_dir.iterdir()):
        if p.is_symlink() or not p.is_file():
            raise DataError(
                f"staged version folder {str(source_dir)!r} holds {p.name!r}, which is not a plain "
                "file; expected only plain files (model file, intended config, signature)"
            )
        files.append(p)
    names = [p.name for p in files]
    if layout.model_filename not in names:
        raise DataError(
            f"staged version folder {str(source_dir)!r} lacks the model file "
            f"{layout.model_filename!r}; it holds {names}"
        )
    files.sort(key=lambda p: p.name == layout.model_filename)
    return files



@dataclasses.dataclass(frozen=True)
class StagedPush:
    """One push, its staged folder read and hashed: what every backend uploads.

    Attributes:
        layout: Model name, version and model file name.
        files: The staged files, the model file last (it makes the version loadable).
        digests: SHA-256 hex of each file, by file name.
        serving_config: Bytes for ``<model>/config.pbtxt`` when the model has none yet.
        verify: Called with a local path of the staged copy before it is made visible.
        on_progress: Called with each file name once written.
    """

    layout: VersionLayout
    files: list[Path]
    digests: dict[str, str]
    serving_config: bytes | None = None
    verify: VerifyCallback | None = None
    on_progress: ProgressCallback | None = None

    def outcome(self, uri: str, status: str, config_written: bool) -> PushOutcome:
        """The :class:`PushOutcome` of this push (sorted file names, total bytes)."""
        return PushOutcome(uri, status, tuple(sorted(self.digests)),
                           sum(p.stat().st_size for p in self.files), config_written)

    def progress(self, name: str) -> None:
        """Report one file written (no-op without ``on_progress``)."""
        if self.on_progress is not None:
            self.on_progress(name)


def compare_digests(
    layout: VersionLayout, where: str, existing: dict[str, str], staged: dict[str, str]
) -> None:
    """Refuse to publish over an existing version whose files differ from the staged ones.

    Args:
        layout: The version being published (its signature file is left out of the comparison).
        where: The existing version's location, for the message (path or ``s3://`` URI).
        existing: ``{relative path: SHA-256 hex digest}`` of the files already there.
        staged: The same map for the staged files.

    Raises:
        RepositoryConflictError: The existing version has no signature file, or a file differs,
            is missing or is extra; the message names them.
    """
    sig = layout.signature_filename
    if sig not in existing:
        raise RepositoryConflictError(
            f"model '{layout.model_name}' version {layout.version} already exists at {where} "
            f"without its signature file {sig!r}; versions are immutable: remove it by hand or "
            "publish a new version"
        )
    a = {k: v for k, v in existing.items() if k != sig}
    b = {k: v for k, v in staged.items() if k != sig}
    if a == b:
        return
    differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    raise RepositoryConflictError(
        f"model '{layout.model_name}' version {layout.version} already exists at {where} with "
        f"different content (files differing: {', '.join(differing)}); published versions are "
        "immutable: register and publish a new model version instead"
    )


class RepositoryStorage(abc.ABC):
    """A Triton model repository that versions can be pushed to and read from.

    A backend registers itself for the URIs of one scheme with
    ``class MyStorage(RepositoryStorage, scheme="gs")`` (``""``: a local folder); its constructor
    takes ``(uri, endpoint_url=None)``. :func:`repository_sync.storage.open_repository` picks it.
    """

    #: The repository URI as Triton is given it (folder path or normalised ``s3://`` URL).
    uri: str
    #: Backends by URI scheme, filled by ``__init_subclass__``.
    BACKENDS: dict[str, type[RepositoryStorage]] = {}

    def __init_subclass__(cls, scheme: str | None = None, **kwargs: object) -> None:
        """Register a backend for the repository URIs of ``scheme`` (``None``: no registration)."""
        super().__init_subclass__(**kwargs)
        if scheme is not None:
            RepositoryStorage.BACKENDS[scheme] = cls

    def push_version(
        self,
        layout: VersionLayout,
        source_dir: Path,
        *,
        serving_config: bytes | None = None,
        verify: VerifyCallback | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> PushOutcome:
        """Publish a staged version folder atomically (see the module docstring).

        Args:
            layout: Model name, version and model file name.
            source_dir: Local folder with the version's files (model file, intended config,
                signature); plain files only.
            serving_config: Bytes for ``<model>/config.pbtxt``, written only if the model has no
                serving config yet.
            verify: Called with a local path of the staged copy at the destination before it is
                made visible (e.g. the signature check); raising aborts the push.
            on_progress: Called with each file name after it has been written/copied.

        Returns:
            :class:`PushOutcome`.

        Raises:
            RepositoryConflictError: The version exists with different content.
            DataError: Bad staged folder, or ``verify`` refused it.
            ServiceUnavailableError: The store could not be reached (S3).
        """
        source_dir = Path(source_dir)
        files = _source_files(layout, source_dir)
        return self._push_staged(StagedPush(layout, files, {p.name: sha256_file(p) for p in files},
                                            serving_config, verify, on_progress))

    @abc.abstractmethod
    def _push_staged(self, push: StagedPush) -> PushOutcome:
        """The backend's part of :meth:`push_version`: make the staged files a version, atomically."""

    @abc.abstractmethod
    def local_version(self, layout: VersionLayout) -> contextlib.AbstractContextManager[Path]:
        """Context manager yielding a local folder with the version's files (S3: a temp copy).

        Raises:
            DataError: The version does not exist.
        """

    @abc.abstractmethod
    def list_paths(self) -> list[str]:
        """Repository content as relative POSIX file paths (for :func:`layout.check_layout`)."""

    @abc.abstractmethod
    def read_serving_config(self, model_name: str) -> bytes | None:
        """``<model>/config.pbtxt`` bytes, or None if absent."""

    @abc.abstractmethod
    def write_serving_config(self, model_name: str, data: bytes) -> None:
        """Replace ``<model>/config.pbtxt`` (promotion only; publishing never calls this)."""

    @abc.abstractmethod
    def version_uri(self, layout: VersionLayout) -> str:
        """URI of the version folder."""

    @abc.abstractmethod
    def delete_version(self, layout: VersionLayout) -> bool:
        """Remove a published version (garbage collection, an operator's clean-up).

        The version stops being loadable first (folder: one rename to a hidden staging name that
        Triton ignores; S3: the model file goes first), then its files are removed; a process that
        dies midway leaves nothing loadable, only what the next push of that version cleans up.
        Whether anything still serves the version is the caller's decision (the registry's safe
        delete, Triton's READY list): the storage does not check.

        Returns:
            True when the version was there and is gone, False when there was nothing to delete.

        Raises:
            DataError: The version path exists but is not a version folder.
            ServiceUnavailableError: The store could not be reached (S3).
        """

    def check_layout(self) -> None:
        """Validate the whole repository.

        Raises:
            RepositoryLayoutError: One line per problem, naming the model and the folder.
        """
        check_layout(self.list_paths(), where=f"repository {self.uri!r}")
