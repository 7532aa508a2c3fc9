"""Triton model repository layout: pure path planning and validation (no I/O except the walker).

Layout written by tritonflow (Triton's "Repository Layout" documentation)::

    <repository>/
      <model>/
        config.pbtxt                 # the SERVING config (the champion's); written only when absent
        <N>/                         # N = positive-integer MLflow registry version, no leading zero
          model.onnx                 # default file name for the backend (model.pt, model.plan, ...)
          config.pbtxt.intended      # the config this version was built and signed to serve with
          model.onnx.sig             # OpenSSF model-signing bundle over the two files above
        .staging-<N>-<token>/        # transient; Triton ignores it (not an integer, see below)

Why these names are safe for Triton (``model_config_utils.cc``, ``VersionsToLoad``): a version is
any sub-folder whose name ``std::stoll`` parses, so ``7abc`` would be read as version 7 while
``.staging-7`` and ``v7`` are ignored with a warning. Files other than the backend's model file
inside a version folder are not opened by the ONNX Runtime, PyTorch or TensorRT backends, so the
signature and the intended config do not change what Triton loads. Names are restricted to
``[A-Za-z0-9][A-Za-z0-9_.-]*`` so they are valid as folder names on POSIX/NFS/Windows and as S3
key segments without escaping.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ground.exceptions import RepositoryLayoutError

#: Allowed model names: starts with a letter or digit, then letters, digits, ``_``, ``.``, ``-``.
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
#: Longest model name accepted (characters); keeps S3 keys and paths well under their limits.
MAX_MODEL_NAME_LENGTH = 128
#: A version folder name: a positive integer without leading zeros.
VERSION_DIR_RE = re.compile(r"^[1-9][0-9]*$")
#: Largest version number (Triton parses versions as int64).
MAX_VERSION = 2**63 - 1

#: The model-level config Triton reads (one per model).
CONFIG_FILENAME = "config.pbtxt"
#: The per-version copy of the config the version was built for; signed with the model file.
INTENDED_CONFIG_FILENAME = "config.pbtxt.intended"
#: Suffix of the signature bundle placed beside the model file.
SIGNATURE_SUFFIX = ".sig"
#: Prefix of transient staging folders inside a model folder (never an integer for Triton).
STAGING_PREFIX = ".staging-"
#: Sub-folders of a model folder that Triton itself skips when it lists versions.
TRITON_RESERVED_DIRS = frozenset({"warmup", "initial_state", "configs"})

#: Default model file name per Triton platform/backend (Triton model configuration docs,
#: "default_model_filename").
DEFAULT_MODEL_FILENAMES = {
    "onnxruntime_onnx": "model.onnx",
    "onnxruntime": "model.onnx",
    "pytorch_libtorch": "model.pt",
    "pytorch": "model.pt",
    "tensorrt_plan": "model.plan",
    "tensorrt": "model.plan",
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorflow_graphdef": "model.graphdef",
    "python": "model.py",
}


def validate_model_name(name: object) -> str:
    """Return ``name`` if it is a safe Triton model name, else raise.

    Args:
        name: Proposed model name (the Triton model folder and S3 key segment).

    Returns:
        The same name.

    Raises:
        RepositoryLayoutError: Not a string, empty, too long, or with characters outside
            ``[A-Za-z0-9_.-]`` / a leading ``.``, ``_`` or ``-``. The message names the value and
            the rule.
    """
    if not isinstance(name, str) or not name:
        raise RepositoryLayoutError(f"model name {name!r} is invalid: expected a non-empty string")
    if len(name) > MAX_MODEL_NAME_LENGTH:
        raise RepositoryLayoutError(
            f"model name {name!r} is {len(name)} characters; expected at most {MAX_MODEL_NAME_LENGTH}"
        )
    if not MODEL_NAME_RE.match(name):
        raise RepositoryLayoutError(
            f"model name {name!r} is not safe for a Triton repository folder and an S3 key: expected "
            f"letters, digits, '_', '.' or '-', starting with a letter or digit "
            f"(pattern {MODEL_NAME_RE.pattern}); pass a Triton model name explicitly"
        )
    return name


def validate_version(version: object) -> int:
    """Return ``version`` as a positive int (an int or a string of digits without leading zero).

    Raises:
        RepositoryLayoutError: Not a positive integer; the message names the value.
    """
    if isinstance(version, bool):
        raise RepositoryLayoutError(f"model version {version!r} is invalid: expected a positive integer")
    if isinstance(version, str):
        if not VERSION_DIR_RE.match(version):
            raise RepositoryLayoutError(
                f"model version {version!r} is invalid: expected a positive integer without "
                "leading zeros (the MLflow registry version)"
            )
        version = int(version)
    if not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise RepositoryLayoutError(
            f"model version {version!r} is invalid: expected a positive integer (the MLflow "
            "registry version)"
        )
    return version


def default_model_filename(platform_or_backend: str) -> str:
    """Triton's default model file name for a platform or backend name.

    Raises:
        RepositoryLayoutError: Unknown platform/backend; the message lists the known ones.
    """
    try:
        return DEFAULT_MODEL_FILENAMES[platform_or_backend]
    except KeyError:
        raise RepositoryLayoutError(
            f"platform/backend {platform_or_backend!r} has no known default model file name: "
            f"expected one of {sorted(DEFAULT_MODEL_FILENAMES)} or an explicit default_model_filename"
        ) from None


@dataclasses.dataclass(frozen=True)
class VersionLayout:
    """Relative paths of one model version in a repository (POSIX, no leading slash).

    Attributes:
        model_name: Validated Triton model name.
        version: Positive integer version (the MLflow registry version).
        model_filename: The backend's model file name (``model.onnx`` by default).
    """

    model_name: str
    version: int
    model_filename: str = "model.onnx"

    def __post_init__(self) -> None:
        validate_model_name(self.model_name)
        object.__setattr__(self, "version", validate_version(self.version))
        if "/" in self.model_filename or self.model_filename in {"", ".", ".."}:
            raise RepositoryLayoutError(
                f"model file name {self.model_filename!r} is invalid: expected a plain file name"
            )

    @property
    def model_dir(self) -> PurePosixPath:
        """``<model>``."""
        return PurePosixPath(self.model_name)

    @property
    def version_dir(self) -> PurePosixPath:
        """``<model>/<N>``."""
        return self.model_dir / str(self.version)

    @property
    def serving_config(self) -> PurePosixPath:
        """``<model>/config.pbtxt``: the one config Triton reads for the model."""
        return self.model_dir / CONFIG_FILENAME

    @property
    def signature_filename(self) -> str:
        """``model.onnx.sig``."""
        return self.model_filename + SIGNATURE_SUFFIX

    @property
    def version_files(self) -> tuple[str, str, str]:
        """File names inside the version folder: model file, intended config, signature."""
        return (self.model_filename, INTENDED_CONFIG_FILENAME, self.signature_filename)

    def staging_dir_name(self, token: str) -> str:
        """Name of a staging folder for this version inside the model folder."""
        return f"{STAGING_PREFIX}{self.version}-{token}"

    def key(self, prefix: str, *parts: str) -> str:
        """S3 object key under ``prefix`` for ``<model>/<parts...>``, without a leading slash."""
        return join_key(prefix, self.model_name, *parts)


def join_key(*parts: str) -> str:
    """Join S3 key parts with single slashes and no leading/trailing slash.

    Some S3-compatible stores (distributed MinIO, triton-inference-server/server#2403) do not find
    keys written with a leading ``/``, so every key tritonflow writes is normalised here.
    """
    segments: list[str] = []
    for part in parts:
        segments.extend(s for s in str(part).split("/") if s)
    return "/".join(segments)


def plan_version(model_name: str, version: int | str, model_filename: str = "model.onnx") -> VersionLayout:
    """Validate a model name and version and return their layout.

    Raises:
        RepositoryLayoutError: Unsafe model name or non-positive/non-integer version.
    """
    return VersionLayout(model_name, validate_version(version), model_filename)


# --------------------------------------------------------------------------- validation
@dataclasses.dataclass(frozen=True)
class LayoutProblem:
    """One rule broken in a repository tree: the model, the offending path and what is expected."""

    model: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"model '{self.model}': {self.message}"


def find_layout_problems(paths: Iterable[str]) -> list[LayoutProblem]:
    """Check a repository tree given as relative POSIX paths of its files.

    Args:
        paths: File paths relative to the repository root (``fraud_scorer/7/model.onnx``); a path
            ending in ``/`` denotes an empty folder. Works for a local walk and an S3 listing alike.

    Returns:
        Problems, sorted by model and path; empty when the tree follows the layout rules: every
        model folder holds only ``config.pbtxt``, label ``*.txt`` files, hidden entries and
        positive-integer version folders (Triton's reserved ``warmup``/``initial_state``/``configs``
        folders allowed), and has at least one non-empty version folder.
    """
    models, root_files = _group_by_model(paths)
    problems = [
        LayoutProblem(name, name, "is a file at the repository root; expected a model folder")
        for name in sorted(root_files)
        if not name.startswith(".")
    ]
    for model in sorted(models):
        entry = models[model]
        problems.extend(_stray_file_problems(model, entry["files"]))
        version_problems, versions = _version_folder_problems(model, entry["dirs"], entry["nonempty"])
        problems.extend(version_problems)
        if not versions:
            problems.append(
                LayoutProblem(
                    model,
                    f"{model}/",
                    f"no numeric version folder: expected '{model}/<N>/<model file>' with N a "
                    "positive integer (Triton reports 'no model version was found')",
                )
            )
    return problems


def _group_by_model(paths: Iterable[str]) -> tuple[dict[str, dict[str, set[str]]], list[str]]:
    """Sort paths into per-model files, sub-folders and non-empty sub-folders, plus root files.

    Hidden top-level entries are skipped; a model's entry has keys ``files``, ``dirs`` and
    ``nonempty``.
    """
    models: dict[str, dict[str, set[str]]] = {}
    root_files: list[str] = []
    for raw in paths:
        is_dir = raw.endswith("/")
        parts = [p for p in raw.split("/") if p]
        if not parts or parts[0].startswith("."):
            continue
        if len(parts) == 1:
            if is_dir:
                models.setdefault(parts[0], {"files": set(), "dirs": set(), "nonempty": set()})
            else:
                root_files.append(parts[0])
            continue
        entry = models.setdefault(parts[0], {"files": set(), "dirs": set(), "nonempty": set()})
        if len(parts) == 2 and not is_dir:
            entry["files"].add(parts[1])
            continue
        entry["dirs"].add(parts[1])
        if len(parts) > 2:
            entry["nonempty"].add(parts[1])
    return models, root_files


def _stray_file_problems(model: str, files: set[str]) -> list[LayoutProblem]:
    """A problem for each file directly in the model folder other than config, labels and hidden ones."""
    return [
        LayoutProblem(
            model,
            f"{model}/{name}",
            f"file '{name}' sits directly in the model folder '{model}/'; Triton only "
            f"loads model files from a numeric version folder: move it to "
            f"'{model}/<N>/{name}' (N = positive-integer registry version)",
        )
        for name in sorted(files)
        if not (name == CONFIG_FILENAME or name.startswith(".") or name.endswith(".txt"))
    ]


def _version_folder_problems(
    model: str, dirs: set[str], nonempty: set[str]
) -> tuple[list[LayoutProblem], list[str]]:
    """Problems with a model's sub-folders, and the names of its usable (non-empty) version folders."""
    problems: list[LayoutProblem] = []
    versions = []
    for name in sorted(dirs):
        if name.startswith(".") or name in TRITON_RESERVED_DIRS:
            continue
        if not VERSION_DIR_RE.match(name):
            digits = re.sub(r"\D", "", name).lstrip("0")
            hint = f" (e.g. '{model}/{digits}')" if digits else ""
            problems.append(
                LayoutProblem(
                    model,
                    f"{model}/{name}/",
                    f"folder '{model}/{name}/' is not a version folder: expected a positive "
                    f"integer without leading zeros{hint}; Triton ignores or misreads it",
                )
            )
            continue
        if name not in nonempty:
            problems.append(
                LayoutProblem(model, f"{model}/{name}/", f"version folder '{model}/{name}/' is empty")
            )
            continue
        versions.append(name)
    return problems, versions


def walk_local_repository(root: str | os.PathLike[str]) -> list[str]:
    """List a local repository as relative POSIX paths (files; empty folders end with ``/``).

    Raises:
        RepositoryLayoutError: ``root`` is not a folder.
    """
    root = Path(root)
    if not root.is_dir():
        raise RepositoryLayoutError(f"repository {str(root)!r} is not a folder")
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        for f in filenames:
            out.append(prefix + f)
        if not dirnames and not filenames and prefix:
            out.append(prefix)
    return sorted(out)


def check_layout(paths: Iterable[str], *, where: str = "repository") -> None:
    """Raise if :func:`find_layout_problems` finds anything.

    Raises:
        RepositoryLayoutError: One line per problem, each naming the model and the bad or missing
            folder.
    """
    problems = find_layout_problems(paths)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise RepositoryLayoutError(f"{where} breaks the Triton layout rules:\n{lines}")


def check_local_repository(root: str | os.PathLike[str]) -> None:
    """Validate a local repository folder; see :func:`check_layout`.

    Raises:
        RepositoryLayoutError: Not a folder, or layout problems (each naming model and folder).
    """
    check_layout(walk_local_repository(root), where=f"repository {str(root)!r}")
