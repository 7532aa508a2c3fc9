"""Promotion and rollback: moving the ``champion`` alias under the model's lock, audited.

:class:`PromotionMixin` re-reads the champion after taking the :class:`~model_registry.registry.locks.PromotionLock`
(compare-and-set), moves ``previous_champion`` then ``champion`` in one call each, and rolls back only
to the version ``previous_champion`` names, never "latest". Mixed into
:class:`model_registry.registry.RegistryClient`.
"""

from __future__ import annotations

import contextlib
import warnings

from ground.exceptions import ConcurrencyError, RegistryError
from model_registry.registry.client import RegistryClientBase
from model_registry.registry.entities import (
    CHAMPION_ALIAS,
    PREVIOUS_CHAMPION_ALIAS,
    PREVIOUS_CHAMPION_TAG,
    UNCHECKED,
    ModelVersionRef,
    PromotionResult,
    Unchecked,
    as_version,
    now_iso,
    translate_mlflow_error,
)

#: Tag tritonflow writes on a version it published and signed (the OpenSSF model-signing digest).
SIGNATURE_TAG = "tritonflow.signature_digest"


class PromotionMixin(RegistryClientBase):
    """Promotion and rollback of :class:`~model_registry.registry.RegistryClient`."""

    def _set_alias(self, name: str, alias: str, version: int) -> None:
        try:
            self.client.set_registered_model_alias(name, alias, str(version))
        except Exception as exc:  # noqa: BLE001
            raise translate_mlflow_error(
                exc, f"setting alias {alias!r} of model {name!r} to version {version}") from exc

    def _transition_production(self, name: str, version: int) -> None:
        with warnings.catch_warnings():
            # Stages are deprecated since MLflow 2.9 (FutureWarning); used only on request.
            warnings.simplefilter("ignore", FutureWarning)
            try:
                self.client.transition_model_version_stage(
                    name, str(version), "Production", archive_existing_versions=True
                )
            except Exception as exc:  # noqa: BLE001
                raise translate_mlflow_error(
                    exc, f"moving model {name!r} version {version} to stage Production") from exc

    def promote(self, name: str, version: int | str, *, expected_champion: int | None | Unchecked = UNCHECKED,
                use_stages: bool = False, reason: str = "") -> PromotionResult:
        """Make ``version`` the champion of model ``name``.

        Under the model's :class:`PromotionLock`, the champion is re-read (compare-and-set),
        ``previous_champion`` is moved to the old champion, then ``champion`` is moved to
        ``version`` in one call; the version numbers are also kept in registered-model tag
        :data:`PREVIOUS_CHAMPION_TAG`. With ``use_stages`` the version also goes to Production
        with ``archive_existing_versions=True`` and exactly one Production version is checked.
        The attempt is recorded in the audit trail whatever happens.

        Args:
            name: Registered model name.
            version: Version to promote (must exist and be READY).
            expected_champion: The champion the caller decided against (e.g. the one a canary
                compared with; None = "no champion yet"). If another promotion changed it in the
                meantime, this one fails instead of overwriting. :data:`UNCHECKED` skips the check.
            use_stages: Also maintain the legacy Production/Archived stages.
            reason: Free text for the audit trail.

        Returns:
            :class:`PromotionResult`.

        Raises:
            ConcurrencyError: The lock was not acquired in time, or the champion is no longer
                ``expected_champion`` (names both versions).
            RegistryError: The version does not exist or is not READY, or the stage check failed.
        """
        v = as_version(version)
        exp = None if isinstance(expected_champion, Unchecked) else expected_champion
        with self._attempt(name, "promote", requested_version=v, reason=reason, use_stages=use_stages,
                           expected_champion="unchecked" if isinstance(expected_champion, Unchecked) else exp) as rec:
            with self.lock.hold(name, self.lock_timeout_s):
                rec["lock_acquired_at"] = now_iso()
                target = self.get_version(name, v)
                if target.status != "READY":
                    raise RegistryError(f"model {name!r} version {v} has status {target.status!r}, expected 'READY'")
                aliases = self.aliases(name)  # re-read under the lock: compare-and-set
                current = aliases.get(CHAMPION_ALIAS)
                rec["observed_champion"] = current
                if not isinstance(expected_champion, Unchecked) and current != exp:
                    rec["outcome"] = "conflict"
                    raise ConcurrencyError(
                        f"model {name!r}: champion is version {current}, not the expected version "
                        f"{exp}; another promotion ran meanwhile, so version {v} was not promoted"
                    )
                previous = aliases.get(PREVIOUS_CHAMPION_ALIAS)
                changed = current != v
                if changed:
                    if current is not None:
                        self._set_alias(name, PREVIOUS_CHAMPION_ALIAS, current)
                        self.client.set_registered_model_tag(name, PREVIOUS_CHAMPION_TAG, str(current))
                        previous = current
                    self._set_alias(name, CHAMPION_ALIAS, v)  # one step: the alias moves
                    now = now_iso()
                    self.set_version_tags(target, {"tritonflow.promoted_at": now,
                                                   "tritonflow.promotion_attempt": rec["attempt_id"],
                                                   "tritonflow.replaced_version": str(current or "")})
                    if current is not None:
                        with contextlib.suppress(RegistryError):
                            self.set_version_tags(self.get_version(name, current), {"tritonflow.demoted_at": now})
                if use_stages:
                    self._transition_production(name, v)
                    self.check_production_consistency(name, expected_version=v)
                rec["outcome"] = "promoted" if changed else "unchanged"
                rec["champion"], rec["previous_champion"] = v, previous
        return PromotionResult(name, v, previous, changed, rec["attempt_id"])

    def signed_versions(self, name: str) -> list[dict]:
        """The versions of ``name`` tritonflow published and signed: the choices of a rollback.

        Returns:
            One ``{"version", "aliases", "status", "rejected_stage", "rejection_reason", "published_at"}``
            per version with tag :data:`SIGNATURE_TAG`, ascending; ``rejected_stage`` is ``None``
            unless the version was rejected after it was published (by the sentinel, a canary, an
            approval).
        """
        out = []
        for ref in self.versions(name):
            tags = dict(ref.tags or {})
            if not tags.get(SIGNATURE_TAG) or ref.status != "READY":
                continue
            rejected = tags.get("tritonflow.status") == "rejected"
            out.append({"version": ref.version, "aliases": list(ref.aliases), "status": tags.get("tritonflow.status"),
                        "rejected_stage": tags.get("tritonflow.rejected_stage") if rejected else None,
                        "rejection_reason": tags.get("tritonflow.rejection_reason") if rejected else None,
                        "published_at": tags.get("tritonflow.published_at")})
        return out

    def signed_version(self, name: str, version: int | str) -> ModelVersionRef:
        """Version ``version`` of ``name`` as an explicit rollback target.

        It must exist, be READY, and carry tritonflow's signature (tag :data:`SIGNATURE_TAG`).

        Raises:
            RegistryError: It does not exist, is not READY, or carries no signature (names the
                version and what it lacks).
        """
        ref = self.get_version(name, version)  # a missing version: names model and version
        if ref.status != "READY":
            raise RegistryError(f"rollback of model {name!r} to version {ref.version} refused: its status is "
                                f"{ref.status!r}, expected 'READY'")
        if not dict(ref.tags or {}).get(SIGNATURE_TAG):
            raise RegistryError(
                f"rollback of model {name!r} to version {ref.version} refused: the version is not published "
                f"and signed (no tag {SIGNATURE_TAG!r}); publish it with model_publish first, or pick one of "
                f"the signed versions: {[v['version'] for v in self.signed_versions(name)] or 'none'}")
        return ref

    def rollback_target(self, name: str, version: int | str | None = None) -> ModelVersionRef:
        """The version to roll back to.

        ``version`` when given (:meth:`signed_version`), else the version ``previous_champion`` names.

        Never falls back to "latest" or any other version.

        Raises:
            RegistryError: ``version`` is not a published, signed, READY version; or, without it,
                the alias is not set, or names a deleted version; the message names the alias and
                the version it (last) named, from the alias or from tag :data:`PREVIOUS_CHAMPION_TAG`.
        """
        if version is not None:
            return self.signed_version(name, version)
        known = self.aliases(name)
        if PREVIOUS_CHAMPION_ALIAS in known:
            v = known[PREVIOUS_CHAMPION_ALIAS]
            try:
                ref = self.get_version(name, v)
            except RegistryError:
                raise RegistryError(
                    f"rollback of model {name!r} stopped: alias {PREVIOUS_CHAMPION_ALIAS!r} points to "
                    f"version {v}, which no longer exists; not falling back to another version. "
                    f"Choose an explicit version and promote it."
                ) from None
            if ref.status != "READY":
                raise RegistryError(
                    f"rollback of model {name!r} stopped: alias {PREVIOUS_CHAMPION_ALIAS!r} names version "
                    f"{v} with status {ref.status!r}, expected 'READY'"
                )
            return ref
        try:
            recorded = dict(self.client.get_registered_model(name).tags or {}).get(PREVIOUS_CHAMPION_TAG)
        except Exception as exc:  # noqa: BLE001
            raise translate_mlflow_error(exc, f"reading registered model {name!r}") from exc
        if recorded:
            exists = True
            try:
                self.get_version(name, recorded)
            except RegistryError:
                exists = False
            state = "was deleted" if not exists else "still exists but no longer holds the alias"
            raise RegistryError(
                f"rollback of model {name!r} stopped: alias {PREVIOUS_CHAMPION_ALIAS!r} cannot be "
                f"resolved; it last named version {recorded}, which {state}. Not falling back to "
                f"another version: promote an explicit version instead."
            )
        raise RegistryError(
            f"rollback of model {name!r} stopped: alias {PREVIOUS_CHAMPION_ALIAS!r} is not set and no "
            f"previous champion was recorded; not falling back to another version."
        )

    def rollback(self, name: str, *, use_stages: bool = False, reason: str = "",
                 version: int | str | None = None) -> PromotionResult:
        """Move ``champion`` back to the :meth:`rollback_target`, under the lock, audited.

        The target is ``version`` when given, else ``previous_champion``.

        The rolled-back version is tagged ``tritonflow.rolled_back_at``; ``previous_champion`` is
        removed so that a second rollback stops instead of re-promoting the bad version.

        Raises:
            RegistryError: No resolvable rollback target (see :meth:`rollback_target`).
            ConcurrencyError: Lock not acquired in time.
        """
        with self._attempt(name, "rollback", reason=reason) as rec:
            with self.lock.hold(name, self.lock_timeout_s):
                target = self.rollback_target(name, version)
                aliases = self.aliases(name)
                current = aliases.get(CHAMPION_ALIAS)
                if current == target.version and version is not None:
                    raise RegistryError(f"rollback of model {name!r} to version {target.version} refused: it "
                                        "already is the champion")
                rec.update(observed_champion=current, requested_version=target.version)
                self._set_alias(name, CHAMPION_ALIAS, target.version)
                try:  # a rollback to an explicit version may find no previous_champion to clear
                    if PREVIOUS_CHAMPION_ALIAS in aliases:
                        self.client.delete_registered_model_alias(name, PREVIOUS_CHAMPION_ALIAS)
                    if PREVIOUS_CHAMPION_TAG in self.model_tags(name):
                        self.client.delete_registered_model_tag(name, PREVIOUS_CHAMPION_TAG)
                except Exception as exc:  # noqa: BLE001
                    raise translate_mlflow_error(
                        exc, f"clearing {PREVIOUS_CHAMPION_ALIAS!r} of model {name!r}") from exc
                if current is not None and current != target.version:
                    with contextlib.suppress(RegistryError):
                        self.set_version_tags(self.get_version(name, current),
                                              {"tritonflow.rolled_back_at": now_iso(),
                                               "tritonflow.rolled_back_to": str(target.version)})
                if use_stages:
                    self._transition_production(name, target.version)
                    self.check_production_consistency(name, expected_version=target.version)
                rec.update(outcome="rolled_back", champion=target.version)
        return PromotionResult(name, target.version, None, current != target.version, rec["attempt_id"])
