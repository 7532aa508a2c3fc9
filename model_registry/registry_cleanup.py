"""Safe deletion and garbage collection of model versions.

A version is never deleted while it holds an alias, is in a legacy Production/Staging stage, or is
in the caller's set of deployed/READY Triton versions; the check runs under the model's lock right
before the delete, and every attempt is audited. Mixed into
:class:`model_registry.registry.RegistryClient`.
"""

from __future__ import annotations

from typing import Mapping

from ground.exceptions import RegistryError
from model_registry.registry_client import RegistryClientBase
from model_registry.registry_entities import GcPlan, ModelVersionRef, as_version, translate_mlflow_error


class CleanupMixin(RegistryClientBase):
    """Deletion and garbage collection of :class:`~model_registry.registry.RegistryClient`."""

    def _keep_reason(self, ref: ModelVersionRef, aliases: Mapping[str, int], deployed: set[int]) -> str | None:
        held = sorted(a for a, v in aliases.items() if v == ref.version)
        if held:
            return f"holds alias {', '.join(repr(a) for a in held)}"
        if ref.version in deployed:
            return "deployed or READY in Triton"
        if ref.stage in ("Production", "Staging"):
            return f"in stage {ref.stage!r}"
        return None

    def plan_garbage_collection(self, name: str, deployed_versions: set[int | str] | frozenset[int | str],
                                keep_latest: int = 1) -> GcPlan:
        """Plan which versions of ``name`` may be deleted.

        A version is kept when it holds any alias, is in ``deployed_versions`` (deployed or READY
        in Triton, as the caller knows it), is in stage Production/Staging, or is one of the
        newest ``keep_latest`` versions.

        Args:
            name: Registered model name.
            deployed_versions: Versions deployed or READY in Triton (ints or numeric strings).
            keep_latest: How many of the newest versions to keep regardless (>= 0).

        Raises:
            RegistryError: ``keep_latest`` < 0 or a deployed version is not a number.
        """
        if keep_latest < 0:
            raise RegistryError(f"keep_latest={keep_latest!r} must be >= 0")
        deployed = {as_version(v, "deployed_versions item") for v in deployed_versions}
        aliases = self.aliases(name)
        versions = self.versions(name)
        newest = {r.version for r in versions[len(versions) - keep_latest:]} if keep_latest else set()
        keep: dict[int, str] = {}
        delete: list[int] = []
        for r in versions:
            why = self._keep_reason(r, aliases, deployed)
            if why is None and r.version in newest:
                why = f"one of the newest {keep_latest}"
            if why:
                keep[r.version] = why
            else:
                delete.append(r.version)
        return GcPlan(name, tuple(delete), keep)

    def safe_delete_version(self, name: str, version: int | str,
                            deployed_versions: set[int | str] | frozenset[int | str] = frozenset()) -> None:
        """Delete one model version unless something still needs it.

        Checked under the model's lock, right before the delete: the version must hold no alias,
        not be in ``deployed_versions`` and not be in stage Production/Staging. Audited.

        Raises:
            RegistryError: The version is still needed (the message names the reason) or missing.
            ConcurrencyError: Lock not acquired in time.
        """
        v = as_version(version)
        deployed = {as_version(x, "deployed_versions item") for x in deployed_versions}
        with self._attempt(name, "delete", requested_version=v) as rec:
            with self.lock.hold(name, self.lock_timeout_s):
                ref = self.get_version(name, v)
                why = self._keep_reason(ref, self.aliases(name), deployed)
                if why:
                    raise RegistryError(f"refusing to delete model {name!r} version {v}: it {why}")
                try:
                    self.client.delete_model_version(name, str(v))
                except Exception as exc:  # noqa: BLE001
                    raise translate_mlflow_error(exc, f"deleting model {name!r} version {v}") from exc
                rec["outcome"] = "deleted"

    def apply_garbage_collection(self, plan: GcPlan,
                                 deployed_versions: set[int | str] | frozenset[int | str]) -> list[int]:
        """Delete the versions of ``plan`` with :meth:`safe_delete_version` (each re-checked).

        Returns:
            Versions deleted. A version that became needed since planning is skipped.
        """
        done = []
        for v in plan.delete:
            try:
                self.safe_delete_version(plan.name, v, deployed_versions)
                done.append(v)
            except RegistryError:
                continue
        return done
