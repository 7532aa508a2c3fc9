"""Registry watcher, the reconciler: every registry change the webhook did not start, started once.

Open-source MLflow sends no webhook for stage transitions (and webhooks need a SQL backend and a
reachable receiver, and MLflow drops a delivery its few retries could not make), so this module
polls the registry and turns what changed into
:class:`~tritonflow_plugin.event_mapping.RegistryChange` objects.

Design:

* :func:`take_snapshot` reads the registry into a set of *facts* ``(model, version@created, kind,
  value)`` with ``kind`` in ``version`` (the version exists), ``stage`` (its legacy stage),
  ``alias`` (an alias points at it) and ``tag`` (``key=value`` of a version tag, for the tag keys
  the mapping acts on: :func:`~tritonflow_plugin.event_mapping.mapped_tag_keys`). A version is
  named with its creation time (:func:`~tritonflow_plugin.event_mapping.version_ref`): a model
  deleted and registered again numbers its versions from 1 again, and the new version 1 and its
  aliases and tags are new facts.
* :func:`diff_facts` (pure) turns two fact sets into changes: new version -> ``version_created``,
  new stage fact -> ``stage_changed``, new tag fact -> ``tag_set``, new alias fact -> ``alias_set``,
  alias fact gone and the alias on no other version -> ``alias_deleted``. A mapped tag a new version
  was registered with counts as set (the registry cannot tell it from one set just after).
* :class:`SeenStateStore` keeps, per consumer (the DAG a trigger feeds), the facts already
  acted on, in the shared coordination database (``ground.coordination``; PostgreSQL in
  production). :meth:`~SeenStateStore.advance` diffs and stores in one transaction holding the
  consumer's row locked, so two pollers (or a restarted triggerer, on any host) never report one
  transition twice. The first poll of a consumer records a baseline
  and reports nothing (no storm of events for the existing registry); so does the first poll that
  reads a tag key (the mapping gained a ``tag_set`` rule), for that key's tags, and seen facts an
  earlier tritonflow stored (versions by number alone, no tags) are read as the versions of that
  number that exist now. An alias moved back to a version it held earlier is a new transition and
  fires again.
* :func:`poll_once` decides each change in the change ledger (:mod:`.change_ledger`), under the
  one change key the webhook receiver uses too: a change the webhook already started is left out,
  one it stored but failed to start (or a trigger crashed before handing on) is started now, with
  the change's run id, so each change gives one run whichever path saw it first.
* A change is ``started`` once its runs exist, and for the ``registry_events`` watcher
  (``await_confirmation``) that is when its run's ``fire`` task has created them, not when the
  trigger yielded the event: Airflow 3.3 closes an asset-triggered run's event window at the time
  the DAG was first queued, so an event written while a run is pending (the scheduler down, or
  busy) is left out of that run and waits for a later event. The trigger therefore sends again a
  change still unconfirmed ``TRITONFLOW_REGISTRY_RESEND_AFTER_S`` after its last send; the
  change's run id keeps a second send from starting a second run.
* :class:`RegistryEventTrigger` is an Airflow 3 ``BaseEventTrigger`` for an ``AssetWatcher``:
  it polls every ``poll_interval_s`` and yields one ``TriggerEvent`` per mapped action for its
  ``dag_id`` (payload = the DAG run conf of :func:`~tritonflow_plugin.event_mapping.actions_for`).

Usage in a DAG file (see :func:`registry_asset`)::

    schedule = registry_asset("canary_promotion", watch=True)
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Sequence, cast

from tritonflow_plugin.change_ledger import STARTED, ChangeLedger
from tritonflow_plugin.event_mapping import (
    ALIAS_DELETED,
    ALIAS_SET,
    STAGE_CHANGED,
    TAG_SET,
    VERSION_CREATED,
    RegistryChange,
    Rule,
    actions_for,
    registry_asset_name,
    registry_asset_uri,
    split_version_ref,
    version_ref,
)

Fact = tuple[str, str, str, str]
#: Tag keys to read: a set of keys, or ``None`` for every key.
TagKeys = frozenset[str] | None
#: Fact kinds.
FACT_VERSION, FACT_STAGE, FACT_ALIAS, FACT_TAG = "version", "stage", "alias", "tag"
#: Format of the stored seen facts: 2 names versions ``version@created`` and may hold tags; 1 (no
#: ``format`` stored) named them by number and held no tags.
FACTS_FORMAT = 2
#: Legacy stage that means "no stage" (not a transition target worth an event).
NO_STAGE = "None"
#: Page size of registry searches.
SEARCH_PAGE_SIZE = 200
#: Payload key of a batched trigger event: the confs of every change one poll found.
BATCH_KEY = "registry_events"


def _watched(key: str, tag_keys: TagKeys) -> bool:
    return tag_keys is None or key in tag_keys


def _model_names(client: Any) -> list[str]:
    names: list[str] = []
    token = None
    while True:
        page = client.search_registered_models(max_results=SEARCH_PAGE_SIZE, page_token=token)
        names.extend(m.name for m in page)
        token = page.token
        if not token:
            return names


def _model_facts(client: Any, name: str, tag_keys: TagKeys) -> set[Fact]:
    # Aliases first: a version an alias names exists when the versions are listed after (unless
    # deleted meanwhile, which removes the alias too). search_model_versions leaves ``aliases``
    # empty; the registered model holds them.
    aliases = getattr(client.get_registered_model(name), "aliases", None) or {}
    if not isinstance(aliases, dict):  # older clients: list of RegisteredModelAlias
        aliases = {a.alias: a.version for a in aliases}
    escaped = name.replace("'", "\\'")
    facts: set[Fact] = set()
    refs: dict[str, str] = {}
    token = None
    while True:
        page = client.search_model_versions(f"name='{escaped}'", max_results=SEARCH_PAGE_SIZE, page_token=token)
        for mv in page:
            # 0 for a store that keeps no creation time, as the receiver and the champion guard read it
            created = int(getattr(mv, "creation_timestamp", None) or 0)
            ref = refs[str(mv.version)] = version_ref(str(mv.version), created)
            facts.add((name, ref, FACT_VERSION, ""))
            facts.add((name, ref, FACT_STAGE, getattr(mv, "current_stage", None) or NO_STAGE))
            for key, value in (getattr(mv, "tags", None) or {}).items():
                if _watched(key, tag_keys):
                    facts.add((name, ref, FACT_TAG, f"{key}={value}"))
        token = page.token
        if not token:
            break
    for alias, version in aliases.items():
        if str(version) in refs:
            facts.add((name, refs[str(version)], FACT_ALIAS, alias))
    return facts


def take_snapshot(client: Any, models: Sequence[str] | None = None, tag_keys: TagKeys = frozenset()) -> set[Fact]:
    """Read the registry's versions, stages, aliases and the tags of ``tag_keys`` as facts.

    Args:
        client: An ``mlflow.MlflowClient``.
        models: Registered model names to watch (default: every registered model).
        tag_keys: Version tag keys to read (default none; ``None``: every key). A tag key may not
            hold ``=`` in MLflow, so ``key=value`` splits at the first one.

    Returns:
        ``{(model, version@created, kind, value)}``: ``("m", "3@1700000000000", "version", "")``,
        ``("m", "3@1700000000000", "stage", "Production")``, ``("m", "3@1700000000000", "alias",
        "champion")``, ``("m", "3@1700000000000", "tag", "validation_status=passed")``.

    Raises:
        mlflow.exceptions.MlflowException: the registry cannot be read (the trigger retries on
            its next poll).
    """
    facts: set[Fact] = set()
    for name in (_model_names(client) if models is None else list(models)):
        facts |= _model_facts(client, name, tag_keys)
    return facts


def _change(kind: str, fact: Fact, **fields: Any) -> RegistryChange:
    version, created = split_version_ref(fact[1])
    return RegistryChange(kind=kind, model=fact[0], version=version, version_created_ms=created, source="watcher",
                          **fields)


def diff_facts(previous: Iterable[Fact], current: Iterable[Fact]) -> list[RegistryChange]:
    """Return the registry changes that lead from ``previous`` to ``current`` facts.

    Ordered: versions created, then stage changes, then tags set, then aliases set, then aliases
    deleted; within a kind by model and numeric version.
    """
    prev, cur = set(previous), set(current)
    added, removed = cur - prev, prev - cur
    current_aliases = {(m, v) for (m, _ver, k, v) in cur if k == FACT_ALIAS}

    def of(facts: set[Fact], kind: str) -> list[Fact]:
        def order(f: Fact) -> tuple:
            version, created = split_version_ref(f[1])
            return (f[0], int(version) if version.isdigit() else 0, version, created or 0, f[3])

        return sorted((f for f in facts if f[2] == kind), key=order)

    changes = [_change(VERSION_CREATED, f) for f in of(added, FACT_VERSION)]
    changes += [_change(STAGE_CHANGED, f, stage=f[3]) for f in of(added, FACT_STAGE) if f[3] != NO_STAGE]
    for f in of(added, FACT_TAG):
        key, _, value = f[3].partition("=")
        changes.append(_change(TAG_SET, f, tag_key=key, tag_value=value))
    changes += [_change(ALIAS_SET, f, alias=f[3]) for f in of(added, FACT_ALIAS)]
    # moved aliases were reported as alias_set
    changes += [_change(ALIAS_DELETED, f, alias=f[3]) for f in of(removed, FACT_ALIAS)
                if (f[0], f[3]) not in current_aliases]
    return changes


def _carried_over(state: dict[str, Any], current: set[Fact], tag_keys: TagKeys) -> set[Fact]:
    """The stored facts, read in today's terms (the baseline of what was not read before).

    Facts of format 1 name versions by number: each is taken as the version of that number that
    exists now. Tags of a key the last poll did not read (the mapping gained a ``tag_set`` rule, or
    format 1, which read none) are taken as seen.
    """
    stored = {cast(Fact, tuple(f)) for f in state.get("facts", [])}
    if int(state.get("format", 1)) < FACTS_FORMAT:
        refs = {(m, split_version_ref(ref)[0]): ref for m, ref, kind, _ in current if kind == FACT_VERSION}
        stored = {(m, refs.get((m, ver), ver) if "@" not in ver else ver, kind, value)
                  for m, ver, kind, value in stored}
    read_before: TagKeys = None if state.get("tag_keys", []) is None else frozenset(state.get("tag_keys", []))
    stored |= {f for f in current
               if f[2] == FACT_TAG and _watched(f[3].partition("=")[0], tag_keys)
               and not _watched(f[3].partition("=")[0], read_before)}
    return stored


class SeenStateStore:
    """Restart-safe record of the registry facts each consumer has already acted on.

    Kept in the shared coordination database (:mod:`ground.coordination`, scope
    ``registry-watcher``, one row per consumer), so triggerers on several hosts share it.

    Args:
        path: SQLAlchemy URL of the coordination database, or a SQLite file path (default: the
            database of :func:`ground.coordination.database_url`).
    """

    SCOPE = "registry-watcher"

    def __init__(self, path: str | Path | None = None) -> None:
        from ground.coordination import CoordinationStore, database_url

        text = database_url() if path is None else str(path)
        self.url = text if "://" in text else f"sqlite:///{Path(text).resolve()}"
        self.store = CoordinationStore(self.url)

    def facts(self, consumer: str) -> set[Fact]:
        """Facts recorded for ``consumer``."""
        state = self.store.get_state(self.SCOPE, consumer) or {}
        return {tuple(f) for f in state.get("facts", [])}

    def advance(self, consumer: str, current: Iterable[Fact], tag_keys: TagKeys = frozenset()) -> list[RegistryChange]:
        """Record ``current`` as acted on and return what changed since the last call.

        The first call for a consumer records a baseline and returns ``[]``; so does the first call
        that reads a tag key, for that key's tags (:func:`_carried_over`). Diff and write happen in
        one transaction holding the consumer's row locked, so concurrent or repeated calls with the
        same registry state return each change once in total.

        Args:
            consumer: The DAG the facts are acted on for.
            current: The facts of :func:`take_snapshot`.
            tag_keys: The tag keys ``current`` was read with.
        """
        # every field as text; a fact keeps its four fields
        facts = {cast(Fact, tuple(str(x) for x in f)) for f in current}
        with self.store.locked_state(self.SCOPE, consumer) as (conn, state):
            baseline = bool(state)
            changes = diff_facts(_carried_over(state, facts, tag_keys), facts) if baseline else []
            self.store.set_state(self.SCOPE, consumer, {
                "baseline_at": (state or {}).get("baseline_at") or time.time(),
                "facts": sorted(list(f) for f in facts),
                "format": FACTS_FORMAT,
                "tag_keys": None if tag_keys is None else sorted(tag_keys),
            }, conn=conn)
        return changes


def poll_once(
    client: Any,
    store: SeenStateStore,
    consumer: str,
    rules: Sequence[Rule],
    models: Sequence[str] | None = None,
    ledger: ChangeLedger | None = None,
    *,
    mark: bool = True,
    tag_keys: TagKeys = frozenset(),
    resend_after_s: float = 0.0,
) -> list[dict[str, Any]]:
    """One reconciler poll: snapshot, diff, decide each change in the ledger, map to ``consumer``.

    Each change the diff finds is decided in the change ledger (:mod:`.change_ledger`, the same
    key as the webhook receiver's): one the webhook already started is left out; one decided but
    never started (the receiver failed after storing it) is started now, and so is a change this
    reconciler sent more than ``resend_after_s`` ago whose runs were never confirmed. The runs get
    the change's run id.

    Args:
        client: An ``mlflow.MlflowClient``.
        store: The consumers' seen facts.
        consumer: The DAG this poll feeds.
        rules: The mapping.
        models: Registered model names to watch (default: all).
        ledger: The change ledger (default: the one in ``store``'s database).
        mark: Mark the returned changes started (the trigger records them after yielding instead:
            :func:`mark_handed_on`).
        tag_keys: Version tag keys to reconcile (default none; ``None``: every key): the keys the
            mapping's ``tag_set`` rules act on (:func:`~tritonflow_plugin.event_mapping.mapped_tag_keys`).
        resend_after_s: Seconds after which a change sent before (:meth:`ChangeLedger.mark_sent`),
            still unconfirmed, is returned again (0: at every poll).

    Returns:
        The DAG run confs (see ``event_mapping.actions_for``) of actions whose ``dag_id`` is
        ``consumer``, in change order; ``registry_event.change_key`` names the change.
    """
    ledger = ledger or ChangeLedger(store.store)
    decided: dict[str, RegistryChange] = {}
    for change in store.advance(consumer, take_snapshot(client, models, tag_keys), tag_keys):
        recorded = ledger.record(change)
        if recorded.status != STARTED:
            decided[recorded.key] = recorded.change
    for change in ledger.unstarted(resend_after_s):
        if change.change_key and (models is None or change.model in models):
            decided.setdefault(str(change.change_key), change)
    out = []
    for key, change in decided.items():
        for action in actions_for(change, rules):
            if action.dag_id == consumer:
                out.append(action.conf)
        if mark:
            ledger.mark_started(key, [])
    return out


def change_key_of(conf: dict[str, Any]) -> str | None:
    """The change key a registry-started DAG run conf carries (``conf["registry_event"]["change_key"]``), if any."""
    key = (conf.get("registry_event") or {}).get("change_key")
    return str(key) if key else None


def mark_handed_on(store: SeenStateStore, confs: Sequence[dict[str, Any]], *, started: bool) -> None:
    """Record that the changes of ``confs`` were handed to Airflow: ``started``, or only sent."""
    ledger = ChangeLedger(store.store)
    keys = [k for k in map(change_key_of, confs) if k]
    if started:
        for key in keys:
            ledger.mark_started(key, [])
    else:
        ledger.mark_sent(keys)


try:  # The trigger needs Airflow core (the triggerer); the pure parts above do not.
    from airflow.triggers.base import BaseEventTrigger, TriggerEvent
except ImportError:  # pragma: no cover - core not installed (task-SDK-only worker)
    BaseEventTrigger = object  # type: ignore[assignment,misc]
    TriggerEvent = None  # type: ignore[assignment,misc]  # fallback for a class name


class RegistryEventTrigger(BaseEventTrigger):
    """Event trigger that fires when the registry changes in a way mapped to ``dag_id``.

    It reconciles the version tags the event mapping (``TRITONFLOW_EVENT_MAPPING_PATH``, the one the
    webhook receiver and ``registry_events`` apply) has ``tag_set`` rules for, not those of
    ``mapping_path``, which only routes changes to ``dag_id``.

    Args:
        dag_id: The DAG this watcher feeds (its seen-state consumer and mapping target).
        tracking_uri: MLflow tracking/registry URI (default ``Settings.resolved_mlflow_tracking_uri``).
        models: Registered model names to watch (default: all).
        poll_interval_s: Seconds between polls (default ``Settings.registry_poll_interval_s``).
        state_path: Coordination database URL or SQLite file (default: the shared coordination DB).
        mapping_path: Mapping file (default ``Settings.event_mapping_path``).
        max_polls: Stop after this many polls (``None``: forever; tests use a bound).
        batch: Yield one event per poll whose payload is ``{BATCH_KEY: [conf, ...]}`` instead of
            one event per change. Airflow 3.3 closes an asset-triggered run's event window at the
            time its queue row was *created*: of several events that arrive together (one poll's
            changes), those written after the first are left out of the run that the first one
            starts, and the queue row is deleted, so they wait for the next registry change.
            A consumer that reads lists (``registry_events``) should batch.
        await_confirmation: The consumer marks each change started once it has started the
            change's runs (``registry_events`` does, after its ``fire`` task), and a change still
            unconfirmed ``TRITONFLOW_REGISTRY_RESEND_AFTER_S`` after it was sent is sent again.
            ``False``: a change counts as started once its event is handed to Airflow (a DAG
            scheduled on the asset itself has no step that could confirm it).
    """

    def __init__(
        self,
        dag_id: str,
        tracking_uri: str | None = None,
        models: list[str] | None = None,
        poll_interval_s: float | None = None,
        state_path: str | None = None,
        mapping_path: str | None = None,
        max_polls: int | None = None,
        batch: bool = False,
        await_confirmation: bool = False,
    ) -> None:
        super().__init__()
        self.batch = bool(batch)
        self.await_confirmation = bool(await_confirmation)
        self.dag_id = dag_id
        self.tracking_uri = tracking_uri
        self.models = models
        self.poll_interval_s = poll_interval_s
        self.state_path = state_path
        self.mapping_path = mapping_path
        self.max_polls = max_polls

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and kwargs, as the triggerer stores them."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dag_id": self.dag_id,
                "tracking_uri": self.tracking_uri,
                "models": self.models,
                "poll_interval_s": self.poll_interval_s,
                "state_path": self.state_path,
                "mapping_path": self.mapping_path,
                "max_polls": self.max_polls,
                "batch": self.batch,
                "await_confirmation": self.await_confirmation,
            },
        )

    def _poll(self) -> list[dict[str, Any]]:
        from mlflow import MlflowClient

        from ground.settings import get_settings
        from tritonflow_plugin.event_mapping import load_mapping, mapped_tag_keys

        settings = get_settings()
        uri = self.tracking_uri or settings.resolved_mlflow_tracking_uri
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        store = SeenStateStore(self.state_path)
        rules = load_mapping(self.mapping_path)
        # the tags the event mapping acts on (the receiver and registry_events apply it), whatever
        # this consumer's routing rules say
        tag_keys = mapped_tag_keys(load_mapping())
        return poll_once(client, store, self.dag_id, rules, self.models, mark=False, tag_keys=tag_keys,
                         resend_after_s=settings.registry_resend_after_s)

    def _mark(self, confs: list[dict[str, Any]]) -> None:
        mark_handed_on(SeenStateStore(self.state_path), confs, started=not self.await_confirmation)

    async def run(self) -> AsyncIterator[Any]:
        """Poll forever (or ``max_polls`` times), yielding one event per mapped change."""
        from ground.settings import get_settings

        interval = self.poll_interval_s or get_settings().registry_poll_interval_s
        polls = 0
        while self.max_polls is None or polls < self.max_polls:
            polls += 1
            try:
                confs = await asyncio.to_thread(self._poll)
            except Exception as exc:  # registry down: log and try again next poll
                self.log.warning("registry poll for %s failed: %s", self.dag_id, exc)
                confs = []
            for conf in confs:
                self.log.info("registry change for %s: %s", self.dag_id, conf["registry_event"])
            if self.batch and confs:
                yield TriggerEvent({BATCH_KEY: confs})
            elif not self.batch:
                for conf in confs:
                    yield TriggerEvent(conf)
            if confs:  # handed to Airflow: a crash before this line sends them again (same run ids)
                await asyncio.to_thread(self._mark, confs)
            if self.max_polls is None or polls < self.max_polls:
                await asyncio.sleep(interval)


def registry_asset(dag_id: str, *, watch: bool = False, **trigger_kwargs: Any) -> Any:
    """The asset whose events start ``dag_id`` for registry changes.

    The webhook receiver emits events on it; with ``watch=True`` it also carries an
    ``AssetWatcher`` running :class:`RegistryEventTrigger` (use when webhooks are not
    configured, and for stage transitions, which have no webhook).

    Returns:
        ``airflow.sdk.Asset(name="tritonflow_registry__<dag_id>", uri="tritonflow://registry/<dag_id>")``.
    """
    from airflow.sdk import Asset, AssetWatcher

    watchers = []
    if watch:
        watchers.append(
            AssetWatcher(
                name=f"registry_watcher__{dag_id}",
                trigger=RegistryEventTrigger(dag_id=dag_id, **trigger_kwargs),
            )
        )
    return Asset(name=registry_asset_name(dag_id), uri=registry_asset_uri(dag_id), watchers=watchers)


def registry_conf_from_context(context: Any) -> dict[str, Any]:
    """The registry-event conf of the running DAG run, from ``dag_run.conf`` or asset events.

    DAG runs started by the webhook receiver or by ``registry_events`` carry it in
    ``dag_run.conf``; runs scheduled on :func:`registry_asset` carry it in the triggering asset
    event's extra (``payload`` for watcher events, the conf itself for events a custom receiver
    wrote with the conf as their extra).

    Returns:
        The conf dict, or ``{}`` for runs not started by a registry change.

    Raises:
        DataError: The run consumed asset events of several different registry changes (Airflow
            folds queued asset events into one run); acting on one would silently drop the others,
            so the run fails naming them all (send one DAG run per change instead).
    """
    from ground.exceptions import DataError

    dag_run = context.get("dag_run")
    conf = dict(getattr(dag_run, "conf", None) or {})
    if conf.get("registry_event"):
        return conf
    events = context.get("triggering_asset_events") or {}
    try:
        items = list(events.items())
    except Exception:
        items = []
    found: list[dict[str, Any]] = []
    for _asset, evs in items:
        for ev in evs:
            extra = dict(getattr(ev, "extra", None) or {})
            payload = extra.get("payload", extra)
            if isinstance(payload, dict) and payload.get("registry_event") and payload not in found:
                found.append(payload)
    changes = {json.dumps(p["registry_event"], sort_keys=True, default=str) for p in found}
    if len(changes) > 1:
        raise DataError(f"triggering_asset_events hold {len(changes)} registry changes "
                        f"({'; '.join(sorted(changes))}): expected one per run; Airflow folded queued asset events "
                        "into this run, send one DAG run per change (the webhook receiver's default sink, "
                        "or the registry_events DAG)")
    return found[-1] if found else {}
