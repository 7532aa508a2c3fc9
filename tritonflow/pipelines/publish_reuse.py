"""Profile reuse: a challenger like its champion starts from the champion's measured config.

A challenger usually keeps the champion's flavour, tensors and size, so a full Model Analyzer sweep
would measure the same configurations again. :func:`reuse_decision` says whether the staged
version may take the champion's chosen config (the signed ``config.pbtxt.intended`` the champion
serves) instead: every condition below must hold, and the first that fails is the recorded reason
for a full sweep.

1. ``settings.profile_force_sweep`` is off;
2. the p99 gate runs for this publish (it is what confirms the reused config, measured against the
   champion on one Triton, before anything is pushed);
3. the model has a champion, another version, whose config was measured (its ``tritonflow.profile``
   status is ``profiled`` or ``reused``) and which is in the repository;
4. the same source flavour (tag ``tritonflow.source_flavor``), the same served file
   (``model.onnx`` / ``model.pt``), the same input and output tensors (names, dtypes, dims);
5. the larger of the two model files is at most ``settings.profile_reuse_size_factor`` times the
   smaller.

Plain Python (no Airflow import).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Mapping

from ground.exceptions import DataError, RegistryError
from ground.settings import Settings
from tritonflow.pipelines.publish_common import (
    CONFIG_FILENAME,
    GENERATED_CONFIG_FILENAME,
    MODEL_FILENAME,
    open_registry,
    s3_endpoint,
)

__all__ = ["MEASURED_STATUSES", "SOURCE_FLAVOR_TAG", "ReuseDecision", "champion_folder", "reuse_decision",
           "size_difference", "tensor_difference"]

#: Model-version tag: the flavour the version was converted from (``sklearn``, ``pytorch``, ...).
SOURCE_FLAVOR_TAG = "tritonflow.source_flavor"
#: Profile statuses of a champion whose served config was measured (swept, or reused and confirmed).
MEASURED_STATUSES = ("profiled", "reused")


@dataclasses.dataclass
class ReuseDecision:
    """Whether to reuse the champion's config (``reuse``) and why, with what it reuses."""

    reuse: bool
    why: str
    champion_version: int | None = None
    champion_config: str = ""
    champion_profile: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def decision(self) -> str:
        """``reused`` or ``swept``."""
        return "reused" if self.reuse else "swept"


def champion_folder(repository: str, name: str, version: int, dest: Path, s: Settings) -> Path | None:
    """``dest`` with the champion's ``config.pbtxt`` (its signed intended config) and ``1/<model>``.

    Returns:
        ``dest``, or None when the version is not in the repository.
    """
    from repository_sync.layout import INTENDED_CONFIG_FILENAME, plan_version
    from repository_sync.storage.open import open_repository

    storage = open_repository(repository, endpoint_url=s3_endpoint(s))
    for filename in ("model.onnx", "model.pt"):
        layout = plan_version(name, version, filename)
        try:
            with storage.local_version(layout) as local:
                if not (local / filename).is_file():
                    continue
                (dest / "1").mkdir(parents=True)
                shutil.copyfile(local / filename, dest / "1" / filename)
                shutil.copyfile(local / INTENDED_CONFIG_FILENAME, dest / CONFIG_FILENAME)
                return dest
        except DataError:
            return None
    return None


def tensor_difference(challenger: Any, champion: Any) -> str:
    """How two configs' input and output tensors differ (name, dtype, dims); '' when they match."""
    from model_registry.triton_config import data_type_name, iter_io

    def tensors(cfg: Any) -> list[tuple[str, str, str, tuple[int, ...]]]:
        return [(kind, io.name, data_type_name(io.data_type), tuple(int(d) for d in io.dims))
                for kind, io in iter_io(cfg)]

    mine, theirs = tensors(challenger), tensors(champion)
    if mine == theirs:
        return ""
    return f"tensors differ: challenger {mine} vs champion {theirs}"[:500]


def size_difference(challenger_bytes: int, champion_bytes: int, factor: float) -> str:
    """Why two model sizes are too far apart ('' when the larger is at most ``factor`` x the smaller)."""
    small, large = sorted((max(1, int(challenger_bytes)), max(1, int(champion_bytes))))
    ratio = large / small
    if ratio <= factor:
        return ""
    return (f"model sizes differ {ratio:.2f}x (challenger {challenger_bytes} B, champion {champion_bytes} B), "
            f"more than TRITONFLOW_PROFILE_REUSE_SIZE_FACTOR={factor:g}")


def _champion_profile(tags: Mapping[str, str]) -> dict[str, Any]:
    try:
        value = json.loads(tags.get("tritonflow.profile") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def reuse_decision(staged: Mapping[str, Any], work: Path, *, perf_gate_enabled: bool,
                   repository_uri: str | None, settings: Settings) -> ReuseDecision:
    """Decide between reusing the champion's measured config and a full sweep (see the module).

    Args:
        staged: State from :func:`~tritonflow.pipelines.publish_validate.convert_and_validate`.
        work: An empty folder for the champion's files (created).
        perf_gate_enabled: Whether the p99 gate runs for this publish.
        repository_uri: Repository holding the champion (default ``settings.resolved_repository_uri``).
        settings: ``profile_force_sweep``, ``profile_reuse_size_factor``, the registry.

    Returns:
        The decision; ``why`` names the condition that failed, or what matched.
    """
    from model_registry.triton_config import read_config

    if settings.profile_force_sweep:
        return ReuseDecision(False, "TRITONFLOW_PROFILE_FORCE_SWEEP is set")
    if not perf_gate_enabled:
        return ReuseDecision(False, "the p99 gate is off for this publish, so a reused config could not be "
                                    "confirmed")
    reg = open_registry(settings, staged.get("tracking_uri"))
    try:
        champion = reg.resolve(f"{staged['model']}@champion")
    except RegistryError as exc:
        return ReuseDecision(False, f"no champion to reuse a config from ({exc})"[:300])
    version = int(champion.version)
    if version == int(staged["version"]):
        return ReuseDecision(False, "this version is the champion")
    profile = _champion_profile(champion.tags)
    if profile.get("status") not in MEASURED_STATUSES:
        return ReuseDecision(False, f"champion version {version}'s config was not measured (profile status "
                                    f"{profile.get('status', 'unknown')!r})", version)
    flavor, theirs = str(staged.get("source_flavor") or ""), str(champion.tags.get(SOURCE_FLAVOR_TAG) or "")
    if not flavor or flavor != theirs:
        return ReuseDecision(False, f"flavour differs: challenger {flavor or 'unknown'!r}, champion version "
                                    f"{version} {theirs or 'not recorded'!r}", version)
    folder = champion_folder(repository_uri or settings.resolved_repository_uri, staged["triton_model_name"],
                             version, work, settings)
    filename = staged.get("model_filename") or MODEL_FILENAME
    if folder is None or not (folder / "1" / filename).is_file():
        return ReuseDecision(False, f"champion version {version} has no {filename} in the repository", version)
    champion_config = (folder / CONFIG_FILENAME).read_text()
    why = tensor_difference(read_config(Path(staged["staging_dir"]) / GENERATED_CONFIG_FILENAME),
                            read_config(folder / CONFIG_FILENAME))
    why = why or size_difference(Path(staged["model_path"]).stat().st_size,
                                 (folder / "1" / filename).stat().st_size, settings.profile_reuse_size_factor)
    if why:
        return ReuseDecision(False, why, version)
    return ReuseDecision(True, f"champion version {version}: same flavour {flavor!r}, same tensors and dtypes, "
                               f"model sizes within {settings.profile_reuse_size_factor:g}x; its measured config "
                               "is confirmed by the p99 gate", version, champion_config, profile)
