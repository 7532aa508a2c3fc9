"""The publish pipeline: an MLflow model version becomes a signed, verified, READY Triton version.

Plain Python (no Airflow import). The ``model_publish`` DAG calls one function per task, in order:

====================  =========================================================================
stage                 what it does
====================  =========================================================================
:func:`resolve`       resolves ``<name>@<alias>`` / ``<name>/<version>`` to ONE model version
                      (later stages use the immutable ``models:/<name>/<version>``)
:func:`convert_and_   converts (ZipMap off), checks IR/opset against the target Triton release,
validate`             builds ``config.pbtxt`` with protobuf, runs the pre-push checks (tensor
                      outputs, config vs model, batch 1 and >= 2, finite outputs) and the
                      blocking parity gate against the MLflow pyfunc on the validation sample
:func:`profile`       Model Analyzer with a bounded sweep on the local Triton tools; picks the
                      best config among stable measurements (or keeps the generated config and
                      says why)
:func:`sign_and_push` signs (OpenSSF model-signing) and pushes atomically to the repository
:func:`load_and_      verifies the signature, loads in explicit mode, waits READY, sends the
smoke`                validation sample and compares with the source model's outputs again
:func:`record`        writes the publish record (tags + artifacts) on the MLflow model version
                      and stores the drift reference sample
====================  =========================================================================

This module holds :func:`resolve` (with the selector helpers the DAG uses: :func:`default_selector`,
:func:`model_reference`, :func:`triton_model_name`), :func:`load_and_smoke` and :func:`publish`
(every stage in one process). The other stages live beside it:
:mod:`~tritonflow.pipelines.publish_validate` (:func:`convert_and_validate`, the validation sample
and drift reference frame), :mod:`~tritonflow.pipelines.publish_profile` (:func:`profile` and the
p99 regression gate :func:`perf_gate`), :mod:`~tritonflow.pipelines.publish_signing`
(:func:`sign_and_push` and the signing keys), :mod:`~tritonflow.pipelines.publish_record`
(:func:`record` and the drift reference store); :mod:`~tritonflow.pipelines.publish_common` holds
the staged file names and the helpers they share.

Every function takes and returns a small JSON-serialisable dict (the running *state*, well under
the XCom limit); bulky artefacts travel by path under
``<settings.home>/staging/<model>/<version>/<attempt>/`` (``model.onnx``, ``config.pbtxt``,
``parity_report.json``, ``validation_sample.npz``, ``source_outputs.npz``,
``reference_frame.parquet``, the Model Analyzer and perf-gate work folders). ``<attempt>`` is a
token :func:`resolve` draws for each publish (``state["staging_attempt"]``; the later stages find
the folder as ``state["staging_dir"]``), so two publishes of one version never share a folder.
The folder is removed when the publish ends (:func:`publish`, success or failure; the DAG's
``record`` task); folders of abandoned attempts (a failed DAG run, a killed worker) are removed by
:func:`~tritonflow.pipelines.publish_common.sweep_staging` at the next :func:`resolve` once older
than a day, never a running attempt's. Each stage adds its wall time in seconds to
``state["timings_s"][<stage>]``.

Two publishes of the same version at once (``model_publish`` and ``shadow_evaluation``'s own
publish of the challenger, or two ``model_publish`` runs) do the work once: every stage from
:func:`convert_and_validate` on is a claimed stage (:mod:`~tritonflow.pipelines.publish_claim`):
the first attempt claims the version in the shared coordination database and renews the claim
while its stages run (also across the DAG's separate tasks); another attempt waits for it and
returns its record (``joined_attempt``), converting, profiling, pushing and loading nothing. A
claim whose holder stopped renewing it (``settings.publish_claim_ttl_s``) or whose stage failed is
taken over. Each attempt still has its own folder, the push stays atomic and never overwrites a
version, and the load goes through the model-control lease. Every path profiles (or reuses the
champion's measured config, :mod:`~tritonflow.pipelines.publish_reuse`) as its settings say, so
the config that serves is the one the record names.

Failures: a :class:`~ground.exceptions.DataError` in conversion/validation/parity, profiling or
load/smoke tags the model version ``tritonflow.status = rejected`` with the stage and the reason
(:meth:`model_registry.registry.RegistryClient.record_rejection`) and is re-raised; nothing is
pushed when conversion, validation or parity fails, and nothing stays loaded when the load or the
smoke test fails. Transient failures (a service not answering, a timeout) and failures of our tools
(:class:`~ground.exceptions.ToolingError`: the profiling environment, Model Analyzer, a local
Triton) are re-raised untagged: they are infrastructure errors, never a verdict on the model, and
may be retried. A successful publish removes an earlier rejection's ``rejected_*`` tags; a version
rejected by the health sentinel or a failed canary is refused from :func:`resolve` on (no publish
lifts that rejection: a person deletes the version's tag ``tritonflow.status`` in MLflow).

Re-running a publish is idempotent: the same content is already in the repository (the push is a
no-op), the load is repeated with the same signed config, and the tags are rewritten. A version is
immutable once pushed: when a re-run produces the same model file but a different config (e.g. a
new profiling result), the version already in the repository is kept, verified and loaded, and the
state says ``config_differs: true``.

Example::

    state = resolve("churn@challenger")
    state = convert_and_validate(state, atol=1e-5, rtol=1e-4, max_batch_size=32)
    state = profile(state, enabled=False)
    state = sign_and_push(state)
    state = load_and_smoke(state)
    summary = record(state)
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any, Mapping

from ground.exceptions import DataError, ServiceUnavailableError, SettingsError
from ground.settings import Settings, get_settings
from tritonflow.pipelines.loop_context import refuse_lasting_rejection
from tritonflow.pipelines.publish_claim import claimed_stage
from tritonflow.pipelines.publish_common import (
    DEFAULT_MAX_BATCH_SIZE,
    PublishState,
    json_safe,
    new_attempt,
    open_registry,
    read_npz,
    reject_version,
    remove_staging,
    s3_endpoint,
    staging_dir,
    sweep_staging,
    timed,
    unload_version_if_ready,
    version_ref,
)
from tritonflow.pipelines.publish_profile import perf_gate, profile
from tritonflow.pipelines.publish_record import record
from tritonflow.pipelines.publish_signing import ensure_signing_keys, sign_and_push
from tritonflow.pipelines.publish_validate import convert_and_validate

log = logging.getLogger(__name__)

_SEL_VERSION = re.compile(r"^[1-9][0-9]*$")
_SEL_ALIAS = re.compile(r"^[A-Za-z_][\w\-]*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def default_selector(model: str, *, settings: Settings | None = None) -> str:
    """The version or alias published when a run names none: alias ``champion``, else the latest version.

    A freshly registered model has no alias yet, so a fixed default of ``champion`` would fail
    for it; the choice made is logged (it appears in the run's log).

    Args:
        model: Registered model name.
        settings: Settings (default: from the environment); the MLflow tracking URI comes from them.

    Returns:
        ``"champion"`` when the alias is set, else the highest version number as a string.

    Raises:
        RegistryError: The model does not exist or has no version.
        ServiceUnavailableError: MLflow did not answer.
    """
    from ground.exceptions import RegistryError
    from model_registry.registry import CHAMPION_ALIAS

    reg = open_registry(settings or get_settings())
    aliases = reg.aliases(model)
    if CHAMPION_ALIAS in aliases:
        log.info("version_or_alias empty: model %r has alias %r (version %s); publishing it", model,
                 CHAMPION_ALIAS, aliases[CHAMPION_ALIAS])
        return CHAMPION_ALIAS
    versions = reg.versions(model)
    if not versions:
        raise RegistryError(f"model {model!r} has no version; register one before publishing")
    latest = max(v.version for v in versions)
    log.info("version_or_alias empty: model %r has no alias %r (aliases: %s); publishing its latest "
             "version %s", model, CHAMPION_ALIAS, sorted(aliases) or "none", latest)
    return str(latest)


def model_reference(model: str, version_or_alias: str | int) -> str:
    """Build the reference :func:`resolve` takes from a model name and a version or alias.

    Args:
        model: Registered model name.
        version_or_alias: ``3`` / ``"3"`` (a version), ``"champion"`` (an alias) or a legacy stage
            (``"Production"``, ``"Staging"``).

    Returns:
        ``"<model>/<version>"``, ``"<model>/<Stage>"`` or ``"<model>@<alias>"``.

    Raises:
        SettingsError: Empty model, or a selector that is neither a positive integer nor an
            alias/stage name (``[A-Za-z_][A-Za-z0-9_-]*``); the message names the value.
    """
    from model_registry.registry import LEGACY_STAGES

    if not isinstance(model, str) or not model.strip():
        raise SettingsError(f"model={model!r} is empty; expected a registered model name")
    sel = str(version_or_alias).strip()
    if _SEL_VERSION.match(sel):
        return f"{model.strip()}/{sel}"
    if sel.capitalize() in LEGACY_STAGES[1:]:
        return f"{model.strip()}/{sel.capitalize()}"
    if _SEL_ALIAS.match(sel):
        return f"{model.strip()}@{sel}"
    raise SettingsError(
        f"version_or_alias={version_or_alias!r} is invalid; expected a version number (e.g. 3), an "
        "alias (e.g. champion, challenger) or a legacy stage (Production, Staging)"
    )


def triton_model_name(registered_name: str) -> str:
    """Triton model name for a registered model: the same name when it is safe, else sanitised.

    Safe names match ``[A-Za-z0-9][A-Za-z0-9_.-]*`` (folder names and S3 key
    segments without escaping); any other character becomes ``_`` and leading ``._-`` are dropped.

    Raises:
        DataError: Nothing usable is left of the name.
    """
    from repository_sync.layout import validate_model_name

    cleaned = _UNSAFE.sub("_", registered_name.strip()).lstrip("._-")
    if not cleaned:
        raise DataError(f"model name {registered_name!r} has no character usable in a Triton model name "
                        "(expected letters, digits, '_', '.', '-')")
    return validate_model_name(cleaned[:128])


def resolve(model_ref: str, *, settings: Settings | None = None) -> PublishState:
    """Resolve a model reference to one READY model version.

    Args:
        model_ref: ``<name>@<alias>``, ``<name>/<version>``, ``<name>/<Stage>`` or the same with
            ``models:/`` (see :func:`model_registry.registry.parse_model_reference`); build it with
            :func:`model_reference`.
        settings: Settings (default: from the environment); the MLflow tracking URI comes from
            ``settings.resolved_mlflow_tracking_uri``.

    Returns:
        ``{"model_ref", "model", "version", "model_uri" ("models:/<name>/<version>"), "run_id",
        "aliases", "triton_model_name", "tracking_uri", "staging_attempt", "staging_dir" (this
        attempt's own folder, not created yet), "timings_s"}``. Abandoned attempts' folders are
        swept first (:func:`~tritonflow.pipelines.publish_common.sweep_staging`).

    Raises:
        RegistryError: Bad reference, unknown model/version/alias, dangling alias, a stage
            held by 0 or several versions, a version that is not READY, or one rejected by the
            health sentinel or a canary (:func:`refuse_lasting_rejection`).
        ServiceUnavailableError: MLflow did not answer.
    """
    from ground.exceptions import RegistryError

    t0 = time.perf_counter()
    s = settings or get_settings()
    reg = open_registry(s)
    ref = reg.resolve(model_ref)
    if ref.status != "READY":
        raise RegistryError(f"{ref.uri} (from {model_ref!r}) has status {ref.status!r}; expected 'READY'")
    refuse_lasting_rejection(ref.tags, f"{ref.uri} (from {model_ref!r})")
    name = triton_model_name(ref.name)
    sweep_staging(s)
    attempt = new_attempt()
    log.info("resolved %r to %s (aliases %s); Triton model %r, staging attempt %s", model_ref, ref.uri,
             list(ref.aliases), name, attempt)
    return timed({}, "resolve", t0, model_ref=model_ref, model=ref.name, version=int(ref.version),
                  model_uri=ref.uri, run_id=ref.run_id, aliases=list(ref.aliases),
                  triton_model_name=name, tracking_uri=reg.tracking_uri, staging_attempt=attempt,
                  staging_dir=str(staging_dir(s, name, ref.version, attempt)))


def _is_local(url: str) -> bool:
    host = url.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


@claimed_stage()
def load_and_smoke(
    pushed: Mapping[str, Any],
    *,
    triton_url: str | None = None,
    settings: Settings | None = None,
) -> PublishState:
    """Verify, load (explicit mode), wait READY, send the validation sample, compare with the source.

    Uses :meth:`repository_sync.triton.client.TritonModelControl.load_and_smoke_test`: the version
    is verified against its signature (a local copy for S3), loaded with its signed
    ``config.pbtxt.intended`` through the repository API keeping other READY versions loaded,
    awaited READY within ``settings.load_timeout_s``, then the first ``validation_sample_rows``
    rows of the validation sample are sent and the outputs compared with the source model's
    outputs (same ``atol``/``rtol`` as the parity gate). For a Triton on this host the free memory
    is checked first (:func:`model_registry.hardware.preflight_memory_check`).

    On any failure other than Triton being unreachable the model is put back as it was (a version
    that was READY from an earlier run but no longer verifies is unloaded too), the version is
    tagged rejected with the reason, and the error is re-raised.

    Args:
        pushed: State from :func:`sign_and_push`.
        triton_url: ``host:port`` of Triton's HTTP endpoint (default ``settings.triton_http_url``).
        settings: Settings (default: from the environment).

    Returns:
        ``pushed`` plus ``load`` (``versions``, ``load_s``, ``signature_digest``, ``key_id``),
        ``smoke`` (rows sent, invalid requests, max abs error per output), ``triton_url`` and
        ``fallback`` (the INT8 replica, :func:`tritonflow.pipelines.publish_fallback.publish_fallback`).

    Raises:
        SignatureVerificationError: Tampered, unsigned or untrusted version (names the file).
        ModelLoadRefusedError: Triton refused the load. ParityError: Served outputs differ from
            the source model's. (These are tagged rejected.)
        ModelLoadError: not READY in time. InsufficientMemoryError: not enough free memory now.
        ServiceUnavailableError: Triton unreachable. (Infrastructure: not tagged, retried.)
    """
    from repository_sync.triton.replicas import triton_control

    t0 = time.perf_counter()
    s = settings or get_settings()
    url = triton_url or s.triton_http_url
    name, version = pushed["triton_model_name"], int(pushed["version"])
    keys = ensure_signing_keys(s, create=False)
    rows = max(1, int(s.validation_sample_rows))
    feeds = {k: v[:rows] for k, v in read_npz(pushed["sample_path"]).items()}
    expected = {k: v[:rows] for k, v in read_npz(pushed["expected_path"]).items()}
    reg = open_registry(s, pushed.get("tracking_uri"))
    ctl = None
    try:
        preflight = _preflight(pushed, s) if _is_local(url) else {"skipped": "Triton is not on this host"}
        from ground.coordination import coordination_store

        ctl = triton_control(s, triton_url, repository=pushed["repository_uri"],  # every replica
                             trusted_keys=str(keys.trusted_dir), endpoint_url=s3_endpoint(s),
                             load_timeout_s=s.load_timeout_s, coordination=coordination_store(s),
                             holder=f"model_publish/{name}")
        info, smoke = ctl.load_and_smoke_test(name, version, feeds, expected,
                                              atol=float(pushed["atol"]), rtol=float(pushed["rtol"]))
    except ServiceUnavailableError:
        raise
    except Exception as exc:
        if ctl is not None:
            unload_version_if_ready(ctl, name, version)
        if isinstance(exc, DataError):  # a verdict on the model; tool/service failures are not
            reject_version(reg, version_ref(reg, pushed), exc, "load_and_smoke")
        raise
    finally:
        if ctl is not None:
            ctl.close()
    log.info("model %s version %s READY on %s (versions %s) and served the validation sample (%s)",
             name, version, url, info["versions"], smoke.summary())
    from tritonflow.pipelines.publish_fallback import (
        publish_fallback,  # the INT8 <model>__fallback (skipped with a reason)
    )

    return timed(pushed, "load_and_smoke", t0, triton_url=url, preflight=json_safe(preflight),
                  load=json_safe(info), smoke=json_safe(smoke.summary()),
                  fallback=publish_fallback(pushed, settings=s, triton_url=url))


def _preflight(state: Mapping[str, Any], s: Settings) -> dict[str, int]:
    from model_registry.hardware import preflight_memory_check

    groups = state.get("config_summary", {}).get("instance_groups") or [{"kind": "KIND_CPU", "count": 1}]
    size = Path(state["model_path"]).stat().st_size
    kind = groups[0].get("kind", "KIND_CPU")
    count = sum(int(g.get("count", 1)) for g in groups)
    need = int(size * s.instance_memory_factor * max(count, 1))
    return preflight_memory_check(need, kind=kind, gpus=groups[0].get("gpus") or ())


def publish(
    model_ref: str,
    *,
    repository_uri: str | None = None,
    triton_url: str | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    profile_enabled: bool = False,
    bounds: Mapping[str, Any] | None = None,
    dataset_uri: str | None = None,
    schema: Any = None,
    export_format: str = "onnx",
    perf_gate_enabled: bool = True,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Run every stage in order (what the DAG does, in one process); returns :func:`record`'s summary.

    The attempt's staging folder is removed when this returns or raises (the parity report, the
    configs and the profile stay as MLflow artifacts). When another attempt is publishing the same
    version, this waits for it and returns its summary (plus ``joined_attempt``).

    Raises:
        Whatever the failing stage raises (see each stage).
    """
    s = settings or get_settings()
    state = resolve(model_ref, settings=s)
    try:
        state = convert_and_validate(state, atol=atol, rtol=rtol, max_batch_size=max_batch_size,
                                     dataset_uri=dataset_uri, schema=schema, export_format=export_format,
                                     settings=s)
        state = profile(state, enabled=profile_enabled, bounds=bounds, settings=s,
                        perf_gate_enabled=perf_gate_enabled, repository_uri=repository_uri)
        state = perf_gate(state, enabled=perf_gate_enabled, repository_uri=repository_uri, settings=s)
        state = sign_and_push(state, repository_uri=repository_uri, settings=s)
        state = load_and_smoke(state, triton_url=triton_url, settings=s)
        return record(state, settings=s)
    finally:
        remove_staging(state)
