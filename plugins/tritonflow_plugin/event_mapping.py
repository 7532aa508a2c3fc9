"""Mapping from MLflow registry changes to the DAGs they start.

A registry change (:class:`RegistryChange`) comes from the webhook receiver
(``model_version.created``, ``model_version_alias.created/deleted``, ``model_version_tag.set``)
or from the registry watcher, the reconciler (every kind, stage transitions included, which
open-source MLflow sends no webhook for; version tags of the keys :func:`mapped_tag_keys` names).
The mapping is an ordered list of rules; **every** matching rule fires.

Rule fields (YAML or JSON file named by ``TRITONFLOW_EVENT_MAPPING_PATH``)::

    rules:
      - on: version_created            # version_created | alias_set | alias_deleted |
                                       # tag_set | stage_changed
        model: "*"                     # optional fnmatch pattern on the registered model name
        alias: challenger              # optional, alias_set/alias_deleted: a name or a list
        stage: Production              # optional, stage_changed: a stage or a list
        tag_key: validation_status     # optional, tag_set
        tag_value: passed              # optional, tag_set
        dags: [model_publish, shadow_evaluation]

``dags`` run in order: the first is started with conf
``{"model_name", "model_version", "alias", "stage", "registry_event": {...}, "then": [rest]}``;
the DAG starts the next one (``then``) when it succeeds. The default mapping
(:data:`DEFAULT_RULES`) is:

====================================  =====================================
registry change                       DAGs
====================================  =====================================
new model version                     model_publish, then shadow_evaluation
alias ``challenger`` set              model_publish, then shadow_evaluation
alias ``champion`` set (by hand)      canary_promotion
stage -> ``Production``               canary_promotion
stage -> ``Archived``                 canary_rollback (unloads the version)
alias ``champion``/``challenger``     canary_rollback (unloads the version)
deleted
====================================  =====================================

``canary_promotion`` sets ``champion`` itself at the end of a canary; the resulting event carries
``registry_event.version`` equal to the version already serving, and the DAG must treat it as a
no-op (idempotent promotion).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ground.exceptions import SettingsError
from tritonflow.registry_events import (  # the kinds of registry change, shared with the CLI
    ALIAS_DELETED,
    ALIAS_SET,
    CHANGE_KINDS,
    STAGE_CHANGED,
    TAG_SET,
    VERSION_CREATED,
)

#: Keys a rule may have.
RULE_KEYS = ("on", "model", "alias", "stage", "tag_key", "tag_value", "dags")

#: The default mapping (see the module docstring).
DEFAULT_RULES: tuple[dict[str, Any], ...] = (
    {"on": VERSION_CREATED, "dags": ["model_publish", "shadow_evaluation"]},
    {"on": ALIAS_SET, "alias": "challenger", "dags": ["model_publish", "shadow_evaluation"]},
    {"on": ALIAS_SET, "alias": "champion", "dags": ["canary_promotion"]},
    {"on": STAGE_CHANGED, "stage": "Production", "dags": ["canary_promotion"]},
    {"on": STAGE_CHANGED, "stage": "Archived", "dags": ["canary_rollback"]},
    {"on": ALIAS_DELETED, "alias": ["champion", "challenger"], "dags": ["canary_rollback"]},
)


@dataclasses.dataclass(frozen=True)
class RegistryChange:
    """One change in the MLflow model registry.

    Attributes:
        kind: One of :data:`CHANGE_KINDS`.
        model: Registered model name.
        version: Model version (string, as MLflow returns it); ``None`` when unknown (an alias
            deletion webhook does not say which version held the alias).
        alias: Alias set or deleted (``alias_*`` kinds).
        stage: New legacy stage (``stage_changed``).
        tag_key: Tag key (``tag_set``).
        tag_value: Tag value (``tag_set``).
        source: ``"webhook"`` or ``"watcher"``.
        change_key: The key tritonflow recorded the change under (:mod:`.change_ledger`), once decided.
        previous_version: The version the alias held before, from tritonflow's record (alias changes).
        version_created_ms: The version's ``creation_timestamp`` (Unix milliseconds, from MLflow);
            ``None`` when unknown or no version is concerned. MLflow numbers the versions of a model
            deleted and registered again from 1 again: this tells its version 1 from the old one's.
    """

    kind: str
    model: str
    version: str | None = None
    alias: str | None = None
    stage: str | None = None
    tag_key: str | None = None
    tag_value: str | None = None
    source: str = "webhook"
    change_key: str | None = None
    previous_version: str | None = None
    version_created_ms: int | None = None

    @property
    def version_ref(self) -> str:
        """The version as one registry object: ``"<version>@<created ms>"`` (just the number when unknown)."""
        return version_ref(self.version, self.version_created_ms)

    @property
    def detail(self) -> str:
        """The value that distinguishes two changes of one kind on one version."""
        if self.kind in (ALIAS_SET, ALIAS_DELETED):
            return self.alias or ""
        if self.kind == STAGE_CHANGED:
            return self.stage or ""
        if self.kind == TAG_SET:
            return f"{self.tag_key}={self.tag_value}"
        return ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (used in DAG run conf and asset event extras)."""
        return dataclasses.asdict(self)


def version_ref(version: str | None, created_ms: int | None) -> str:
    """``"<version>@<created ms>"``: a model version told apart from an earlier one of the same number.

    ``""`` without a version, the bare number when the creation time is unknown.
    """
    if not version:
        return ""
    return version if created_ms is None else f"{version}@{int(created_ms)}"


def split_version_ref(ref: str) -> tuple[str, int | None]:
    """``(version, created ms)`` of a :func:`version_ref` (``None``: the ref holds no creation time)."""
    version, _, created = ref.partition("@")
    return version, (int(created) if created.lstrip("-").isdigit() else None)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One validated mapping rule (see the module docstring for the fields)."""

    on: str
    dags: tuple[str, ...]
    model: str = "*"
    alias: tuple[str, ...] = ()
    stage: tuple[str, ...] = ()
    tag_key: str | None = None
    tag_value: str | None = None

    def matches(self, change: RegistryChange) -> bool:
        """Whether ``change`` satisfies every filter of this rule."""
        if change.kind != self.on or not fnmatch.fnmatchcase(change.model, self.model):
            return False
        if self.alias and change.alias not in self.alias:
            return False
        if self.stage and (change.stage or "").lower() not in {s.lower() for s in self.stage}:
            return False
        if self.tag_key is not None and change.tag_key != self.tag_key:
            return False
        if self.tag_value is not None and change.tag_value != self.tag_value:
            return False
        return True


@dataclasses.dataclass(frozen=True)
class Action:
    """A DAG to start for a change: ``dag_id`` now, ``then`` after it succeeds."""

    dag_id: str
    conf: dict[str, Any]
    then: tuple[str, ...] = ()


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise SettingsError(f"{where}={value!r} is invalid: expected a non-empty string or list of strings")
    return tuple(value)


def parse_rules(raw: Any, *, source: str = "mapping") -> tuple[Rule, ...]:
    """Validate a mapping document and return its rules.

    Args:
        raw: ``{"rules": [...]}`` or a bare list of rules.
        source: Name of the file or object (used in error messages).

    Raises:
        SettingsError: The message names the key (``rules[2].on``), its value and what was
            expected.
    """
    rules = raw.get("rules") if isinstance(raw, Mapping) else raw
    if isinstance(raw, Mapping) and set(raw) - {"rules"}:
        unknown = sorted(set(raw) - {"rules"})
        raise SettingsError(f"{source}: unknown top-level key(s) {unknown}: expected only 'rules'")
    if not isinstance(rules, list) or not rules:
        raise SettingsError(f"{source}: rules={rules!r} is invalid: expected a non-empty list of rules")
    out = []
    for i, item in enumerate(rules):
        where = f"{source}: rules[{i}]"
        if not isinstance(item, Mapping):
            raise SettingsError(f"{where}={item!r} is invalid: expected a mapping with 'on' and 'dags'")
        # YAML 1.1 (PyYAML) reads a bare ``on:`` key as the boolean True.
        item = {("on" if k is True else k): v for k, v in item.items()}
        unknown = sorted(set(item) - set(RULE_KEYS))
        if unknown:
            raise SettingsError(f"{where} has unknown key(s) {unknown}: expected keys among {RULE_KEYS}")
        on = item.get("on")
        if on not in CHANGE_KINDS:
            raise SettingsError(f"{where}.on={on!r} is invalid: expected one of {CHANGE_KINDS}")
        if "dags" not in item:
            raise SettingsError(f"{where}.dags is missing: expected a list of DAG ids")
        dags = _str_list(item["dags"], f"{where}.dags")
        model = item.get("model", "*")
        if not isinstance(model, str) or not model:
            raise SettingsError(f"{where}.model={model!r} is invalid: expected a name or fnmatch pattern")
        alias = _str_list(item["alias"], f"{where}.alias") if "alias" in item else ()
        stage = _str_list(item["stage"], f"{where}.stage") if "stage" in item else ()
        if alias and on not in (ALIAS_SET, ALIAS_DELETED):
            raise SettingsError(f"{where}.alias is set but on={on!r}: 'alias' needs on alias_set/alias_deleted")
        if stage and on != STAGE_CHANGED:
            raise SettingsError(f"{where}.stage is set but on={on!r}: 'stage' needs on stage_changed")
        for key in ("tag_key", "tag_value"):
            if key in item and (on != TAG_SET or not isinstance(item[key], str)):
                raise SettingsError(
                    f"{where}.{key}={item[key]!r} is invalid: expected a string on a tag_set rule"
                )
        out.append(
            Rule(on=on, dags=dags, model=model, alias=alias, stage=stage,
                 tag_key=item.get("tag_key"), tag_value=item.get("tag_value"))
        )
    return tuple(out)


def load_mapping(path: str | Path | None = None) -> tuple[Rule, ...]:
    """Load the mapping from a YAML/JSON file, or the default mapping.

    Args:
        path: File to read (default ``Settings.event_mapping_path``; empty: :data:`DEFAULT_RULES`).

    Raises:
        SettingsError: The file is missing, unparsable or a rule is invalid (key named).
    """
    if path is None:
        from ground.settings import get_settings

        path = get_settings().event_mapping_path
    if not path:
        return parse_rules(list(DEFAULT_RULES), source="default mapping")
    p = Path(path)
    if not p.is_file():
        raise SettingsError(f"TRITONFLOW_EVENT_MAPPING_PATH={str(p)!r} is not a file: expected a YAML/JSON file")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix.lower() == ".json":
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text)
    except Exception as exc:
        raise SettingsError(f"{p}: cannot be parsed ({exc}): expected YAML or JSON") from None
    return parse_rules(raw, source=str(p))


def actions_for(change: RegistryChange, rules: Sequence[Rule]) -> list[Action]:
    """Return the DAGs to start for ``change``, one :class:`Action` per matching rule.

    Two rules naming the same first DAG yield one action (the first rule's ``then`` wins).
    """
    out: list[Action] = []
    seen: set[str] = set()
    for rule in rules:
        if not rule.matches(change) or rule.dags[0] in seen:
            continue
        seen.add(rule.dags[0])
        conf = {
            "model_name": change.model,
            "model_version": change.version,
            "alias": change.alias,
            "stage": change.stage,
            "registry_event": change.to_dict(),
            "then": list(rule.dags[1:]),
        }
        out.append(Action(dag_id=rule.dags[0], conf=conf, then=tuple(rule.dags[1:])))
    return out


def mapped_tag_keys(rules: Iterable[Rule]) -> frozenset[str] | None:
    """The version tag keys ``tag_set`` rules act on: what the reconciler must read of the registry.

    Returns:
        The keys named by ``tag_set`` rules (empty: no rule acts on tags); ``None`` when a ``tag_set``
        rule names no ``tag_key`` (every key).
    """
    keys: set[str] = set()
    for rule in rules:
        if rule.on == TAG_SET:
            if rule.tag_key is None:
                return None
            keys.add(rule.tag_key)
    return frozenset(keys)


def mapped_dag_ids(rules: Iterable[Rule]) -> set[str]:
    """Every DAG id a mapping can start (to check against the parsed DagBag)."""
    return {d for r in rules for d in r.dags}


def registry_asset_name(dag_id: str) -> str:
    """Name of the asset whose events start ``dag_id`` for registry changes."""
    return f"tritonflow_registry__{dag_id}"


def registry_asset_uri(dag_id: str) -> str:
    """URI of the asset whose events start ``dag_id`` for registry changes."""
    return f"tritonflow://registry/{dag_id}"
