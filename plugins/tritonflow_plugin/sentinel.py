"""Health sentinel trigger: probes one champion from Airflow's triggerer (no worker slot held).

:class:`ChampionSentinelTrigger` runs :func:`repository_sync.sentinel.watch` (the probing and
judging live there, without Airflow) and yields one ``TriggerEvent`` when it decides:

* ``{"status": "unhealthy", ...}`` -- ``failures`` probes in a row failed; the deferred task
  resumes in ``execute_complete`` and rolls back (``champion_sentinel`` DAG);
* ``{"status": "unloaded", ...}`` -- ``failures`` probes in a row found the version not loaded in
  Triton (a restarted Triton comes back empty); ``execute_complete`` loads back the model's
  desired versions and defers again (``resume`` carries the trigger's kwargs), at most
  :data:`MAX_RELOADS` times per sentinel run;
* ``{"status": "superseded", ...}`` -- the watched version no longer holds ``champion`` (a
  promotion or a manual rollback moved it); the task ends and the run started by the
  ``CHAMPION_CHANGED`` asset event watches the new champion.

The champion check reads the ``champion`` alias from MLflow every ``champion_check_s`` seconds in
a worker thread; a registry that does not answer counts as "still champion" (logged), never as
a verdict.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import BaseOperator

try:  # The trigger needs Airflow core (the triggerer); the DAG side only needs the class path.
    from airflow.triggers.base import BaseTrigger, TriggerEvent
except ImportError:  # pragma: no cover - core not installed (task-SDK-only worker)
    BaseTrigger = object  # type: ignore[assignment,misc]
    TriggerEvent = None  # type: ignore[assignment,misc]  # fallback for a class name

#: Reloads one sentinel run makes after ``unloaded`` outcomes before it fails as an
#: infrastructure error (a Triton that keeps forgetting its models needs a person).
MAX_RELOADS = 3


class ChampionSentinelTrigger(BaseTrigger):
    """Probe one champion every ``policy["interval_s"]`` until it is unhealthy or superseded.

    Args:
        golden: :meth:`repository_sync.sentinel.GoldenSet.to_dict` (model, version, samples, ranges).
        policy: :meth:`repository_sync.sentinel.SentinelPolicy.to_dict`.
        gateway_url: Base URL of the gateway (``http://host:port``).
        tracking_uri: MLflow URI for the champion check (``None``/empty: no check).
        champion_check_s: Seconds between two champion checks.
        max_probes: Stop after this many probes (``stopped``; tests), ``None`` forever.
        until: Wall-clock time after which the sentinel ends ``renew`` (the DAG's next scheduled
            run starts a fresh one), ``None`` never.
        reloads: Reloads this sentinel run already made after ``unloaded`` outcomes.
    """

    def __init__(self, golden: dict[str, Any], policy: dict[str, Any], gateway_url: str,
                 tracking_uri: str | None = None, champion_check_s: float = 30.0,
                 max_probes: int | None = None, until: float | None = None, reloads: int = 0) -> None:
        super().__init__()
        self.golden = golden
        self.policy = policy
        self.gateway_url = gateway_url
        self.tracking_uri = tracking_uri
        self.champion_check_s = champion_check_s
        self.max_probes = max_probes
        self.until = until
        self.reloads = reloads

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and kwargs, as the triggerer stores them."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"golden": self.golden, "policy": self.policy, "gateway_url": self.gateway_url,
             "tracking_uri": self.tracking_uri, "champion_check_s": self.champion_check_s,
             "max_probes": self.max_probes, "until": self.until, "reloads": self.reloads},
        )

    def _champion_version(self) -> int | None:
        from model_registry.registry import RegistryClient

        client = RegistryClient(self.tracking_uri, actor="sentinel")
        return client.aliases(self.golden["model"]).get("champion")

    async def _still_champion(self) -> bool:
        try:
            current = await asyncio.to_thread(self._champion_version)
        except Exception as exc:  # registry down: keep watching, never a verdict
            self.log.warning("sentinel %s: champion check failed (%s); still watching",
                             self.golden["model"], exc)
            return True
        return current == int(self.golden["version"])

    def _on_probe(self, result: Any) -> None:
        if result.status != "ok":
            self.log.warning("sentinel %s v%s probe %s: %s", self.golden["model"], self.golden["version"],
                             result.status, "; ".join(result.reasons))

    async def run(self) -> AsyncIterator[Any]:
        """Watch until a decision, then yield one event with the outcome."""
        from repository_sync.sentinel import GoldenSet, SentinelPolicy, watch

        golden = GoldenSet.from_dict(self.golden)
        policy = SentinelPolicy(**self.policy)
        self.log.info("sentinel watching %s (Triton %s v%s) every %s s through %s", golden.model,
                      golden.triton_model, golden.version, policy.interval_s, self.gateway_url)
        outcome = await watch(self.gateway_url, golden, policy,
                              still_champion=self._still_champion if self.tracking_uri else None,
                              champion_check_s=self.champion_check_s, max_probes=self.max_probes, until=self.until,
                              on_probe=self._on_probe)
        event = outcome.to_dict()
        if outcome.status == "unloaded":  # the task reloads, then defers again with these kwargs
            event["resume"] = self.serialize()[1]
        yield TriggerEvent(event)


def renewal_time(now: float, period_s: float) -> float:
    """Next multiple of ``period_s`` seconds since the Unix epoch after ``now`` (UTC boundary).

    Every sentinel started between two scheduled runs of ``champion_sentinel`` ends at the same
    boundary, when the next scheduled run starts the fresh set: at most one sentinel per champion.
    """
    return (int(now // period_s) + 1) * period_s


class ChampionSentinelOperator(BaseOperator):
    """Deferrable task: build the champion's golden set, defer to the sentinel, roll back if unhealthy.

    ``execute`` reads the champion, its golden samples and validation ranges
    (:func:`tritonflow.pipelines.sentinel.golden_set`) and defers to
    :class:`ChampionSentinelTrigger` (the worker slot is released). When the trigger fires
    ``unhealthy``, ``execute_complete`` rolls back through the ``canary_rollback`` path
    (:func:`tritonflow.pipelines.sentinel.sentinel_rollback`); after ``unloaded`` it loads the
    model's desired versions back (:func:`tritonflow.pipelines.sentinel.reload_serving`) and
    watches again; ``superseded`` and ``renew`` end the task successfully. A model without a
    champion or without a stored reference is skipped with the reason in the log.

    Args:
        model: Registered model name.
        renew_period_s: Sentinels end at the next multiple of this many seconds (UTC) so the
            scheduled run restarts them with fresh golden sets.
    """

    template_fields = ("model",)

    def __init__(self, *, model: str, renew_period_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.renew_period_s = renew_period_s

    def execute(self, context: Any) -> Any:
        """Build the golden set and defer (never returns normally unless the model is skipped)."""
        import time

        from airflow.sdk.exceptions import AirflowSkipException

        from ground.exceptions import DataError
        from repository_sync.sentinel import SentinelPolicy
        from tritonflow.pipelines.canary import CanaryEnvironment
        from tritonflow.pipelines.sentinel import golden_set

        env = CanaryEnvironment.from_settings()
        try:
            golden = golden_set(self.model, env=env)
        except DataError as exc:
            raise AirflowSkipException(f"sentinel not started for {self.model!r}: {exc}") from None
        policy = SentinelPolicy.from_settings(env.settings)
        self.log.info("sentinel for %s v%s: %s", self.model, golden["version"], golden["source"])
        self.defer(
            trigger=ChampionSentinelTrigger(
                golden, policy.to_dict(), env.gateway_url, tracking_uri=env.tracking_uri,
                until=renewal_time(time.time(), self.renew_period_s)),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Roll back on ``unhealthy``, reload and watch again on ``unloaded``; otherwise return the outcome.

        Raises:
            ServiceUnavailableError: ``unloaded`` again after :data:`MAX_RELOADS` reloads.
        """
        from tritonflow.pipelines.sentinel import sentinel_rollback

        event = dict(event or {})
        if event.get("status") == "unloaded":
            self._reload_and_watch(context, event)
        if event.get("status") != "unhealthy":
            self.log.info("sentinel for %s ended: %s", self.model, event.get("reason") or event.get("status"))
            return event
        self.log.error("%s", event.get("reason"))
        ti = context["ti"]
        result = sentinel_rollback(event, holder=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}")
        return {"outcome": event, "rollback": result}

    def _reload_and_watch(self, context: Any, event: dict[str, Any]) -> None:
        from ground.exceptions import ServiceUnavailableError
        from tritonflow.pipelines.sentinel import reload_serving

        resume = dict(event["resume"])
        if int(resume.get("reloads") or 0) >= MAX_RELOADS:
            raise ServiceUnavailableError(
                f"{event.get('reason')}; already loaded back {resume.get('reloads')} times in this "
                f"sentinel run (at most {MAX_RELOADS}): Triton keeps losing the model, see its log")
        self.log.warning("%s", event.get("reason"))
        ti = context["ti"]
        done = reload_serving(event, holder=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}")
        self.log.info("loaded back %s v%s; watching again", done["triton_model"], done["versions"])
        resume["reloads"] = int(resume.get("reloads") or 0) + 1
        self.defer(trigger=ChampionSentinelTrigger(**resume), method_name="execute_complete")


__all__ = ["MAX_RELOADS", "ChampionSentinelOperator", "ChampionSentinelTrigger", "renewal_time"]
