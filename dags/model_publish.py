"""DAG ``model_publish``: an MLflow model version becomes a signed, verified, READY Triton version.

Wiring only; the work is in :mod:`tritonflow.pipelines.publish` (imported inside the tasks so the
file parses fast and without network). Started manually (validated params), by other DAGs
(``TriggerDagRunOperator`` with the typed loop context, conf ``{"loop": {...}}``, validated when the
run starts) or by registry events (a run per MLflow webhook delivery, a run per change the
``registry_events`` watcher fires, or an event on asset ``tritonflow_registry__model_publish``).
No settings are read at parse time.
"""

from __future__ import annotations

from airflow.sdk import Param, get_current_context, task

from tritonflow_plugin import params as form
from tritonflow_plugin.dag_defaults import MODEL_PUBLISHED, TIMEOUTS
from tritonflow_plugin.deadlines import run_deadline
from tritonflow_plugin.links import record_link_info
from tritonflow_plugin.registry_watcher import registry_asset
from tritonflow_plugin.staging import shared_staging
from tritonflow_plugin.wiring import data_task, fire_and_forget_mapped, tritonflow_dag
from tritonflow_plugin.xcom import limit_xcom_size

DAG_ID = "model_publish"
#: Largest max_batch_size accepted (the pipeline's limit).
MAX_BATCH_SIZE = 4096
DESCRIPTION = "Publish one MLflow model version to Triton: convert, check, sign, load and smoke-test it."

DOC_MD = """
### Publish a model to Triton

Takes one version of a registered MLflow model and makes it servable by Triton, safely. Nothing
is served until every check has passed.

**To publish by hand**, fill in **Model** and click *Trigger*. Leave **Version or alias** empty to
publish the version with alias `champion`, or the model's latest version when it has no alias
yet (the run's log says which one it took); or type a version number (`3`) or an alias
(`challenger`).

What a run does, one task each:

1. **resolve** - finds the version to publish;
2. **convert_and_validate** - converts it to ONNX (or TorchScript), builds Triton's
   `config.pbtxt` and compares its outputs with the original model (**parity gate**: within
   **Absolute tolerance** + **Relative tolerance**). A version that fails is tagged `rejected`;
3. **profile** - optionally tries a few Triton configurations and keeps the fastest stable one;
4. **perf_gate** - optionally refuses a version whose p99 latency is clearly worse than the
   current champion's;
5. **sign_and_push** - signs the model and copies it to the model repository (a version already
   there is never overwritten; a re-run does nothing);
6. **load_and_smoke** - loads it in Triton and checks a few real predictions;
7. **record** - writes what happened (where, signature, parity, timings) on the MLflow version;
8. **trigger_then** - starts the next DAGs, if any (for example `shadow_evaluation`).

Fields left empty use the deployment's settings (named in each field's help). A failure of
Triton, S3 or MLflow fails the run without marking the model as rejected: re-run it once the
service is back. Runs also start by themselves when a version is registered or an alias is set
in MLflow, and when `retrain` trains a new version.
"""

PARAMS = {
    "model": form.text("Model", "Registered MLflow model to publish (required for a run you start here).",
                         rule=form.MODEL_NAME, max_length=128),
    "version_or_alias": form.text(
        "Version or alias",
        "Version number (e.g. 3) or alias (e.g. champion, challenger). Empty: the champion, or the "
        "latest version when the model has no champion yet.",
        rule=form.VERSION_OR_ALIAS, max_length=128),
    "repository": form.text(
        "Model repository",
        "Where Triton reads models: a folder, or s3://http://host:port/bucket/prefix. Empty: the "
        "deployment's repository (TRITONFLOW_REPOSITORY_URI)."),
    "atol": Param(None, type=["null", "number"], minimum=0, title="Absolute tolerance",
                  description="Parity gate: largest absolute difference allowed per output value "
                              "(|onnx - source| <= atol + rtol * |source|). Empty: TRITONFLOW_PARITY_ATOL."),
    "rtol": Param(None, type=["null", "number"], minimum=0, title="Relative tolerance",
                  description="Parity gate: relative difference allowed per output value. "
                              "Empty: TRITONFLOW_PARITY_RTOL."),
    "max_batch_size": Param(32, type="integer", minimum=0, maximum=MAX_BATCH_SIZE, title="Largest batch",
                            description=f"Largest batch Triton may form, 0 to {MAX_BATCH_SIZE} (0: no batching)."),
    "profile": Param(None, type=["null", "boolean"], title="Profile configurations",
                     description="Try a few Triton configurations and keep the fastest stable one. "
                                 "Empty: TRITONFLOW_PUBLISH_PROFILE."),
    "perf_gate": Param(None, type=["null", "boolean"], title="Latency gate",
                       description="Refuse a version whose p99 latency is clearly worse than the champion's. "
                                   "Empty: TRITONFLOW_PUBLISH_PERF_GATE."),
    "export_format": form.choice(
        "Served format", "ONNX works for every model; TorchScript only for PyTorch models.",
        ["onnx", "torchscript"], default="onnx", labels={"onnx": "ONNX", "torchscript": "TorchScript"}),
    "dataset_uri": form.text(
        "Validation data",
        "CSV or Parquet file (path or MLflow artifact URI) used for the checks and as the drift "
        "reference. Empty: the model's logged input example (then no drift reference is stored)."),
    "loop": form.loop_param(),
}


def _flag(value, default: bool) -> bool:
    """A boolean param; empty (None) takes the setting (TRITONFLOW_PUBLISH_PROFILE / _PERF_GATE)."""
    return default if value is None else bool(value)


def _settings():
    from ground.settings import get_settings

    return get_settings()


@data_task(links=True, execution_timeout=TIMEOUTS.short)
def resolve() -> dict:
    """Model + version/alias (params, or the registry event) -> one model version."""
    from ground.exceptions import SettingsError
    from tritonflow.pipelines import publish as pipeline
    from tritonflow_plugin.loop import loop_context
    from tritonflow_plugin.registry_watcher import registry_conf_from_context

    context = get_current_context()
    params = context["params"]
    loop = loop_context(context)  # validated first: a bad conf fails before any work
    event = registry_conf_from_context(context)
    conf = dict(getattr(context.get("dag_run"), "conf", None) or {})
    if event:
        model = event.get("model_name") or ""
        selector = event.get("model_version") or event.get("alias") or ""
    elif loop is not None:
        model, selector = loop.model, loop.version or str(params.get("version_or_alias") or "").strip()
        conf.setdefault("then", list(loop.then))
    else:
        model = (params.get("model") or "").strip()
        selector = str(params.get("version_or_alias") or "").strip()
    if not model:
        raise SettingsError("model is empty; expected the name of a registered MLflow model (field "
                            "'Model'), or a run started by a registry event")
    if not selector:
        selector = pipeline.default_selector(model, settings=_settings())
    then = event.get("then") if event else conf.get("then")
    then = list(then or [])
    if not all(isinstance(d, str) and d.strip() for d in then):
        raise SettingsError(f"then={then!r} is invalid; expected a list of DAG ids")
    state = pipeline.resolve(pipeline.model_reference(model, selector), settings=_settings())
    record_link_info(model_name=state["model"], model_version=str(state["version"]))
    return {**state, "then": then,
            "loop": loop.model_dump(mode="json", exclude_none=True) if loop is not None else None}


@data_task(links=True, execution_timeout=TIMEOUTS.convert)
@shared_staging
def convert_and_validate(state: dict) -> dict:
    """Convert, check, build config.pbtxt, parity gate (rejects the version on failure)."""
    from tritonflow.pipelines import publish_validate
    from tritonflow_plugin.loop import param_or_setting

    record_link_info(model_name=state["model"], model_version=str(state["version"]))
    params = get_current_context()["params"]
    settings = _settings()
    dataset_uri = params.get("dataset_uri") or (state.get("loop") or {}).get("dataset_uri") or None
    return publish_validate.convert_and_validate(
        state, atol=param_or_setting(params, "atol", "parity_atol", settings),
        rtol=param_or_setting(params, "rtol", "parity_rtol", settings),
        max_batch_size=params["max_batch_size"], dataset_uri=dataset_uri,
        export_format=params.get("export_format") or "onnx", settings=settings,
    )


@data_task(links=True, execution_timeout=TIMEOUTS.profile)
@shared_staging
def profile(state: dict) -> dict:
    """Model Analyzer bounded sweep, or the champion's measured config reused; generated config when off."""
    from tritonflow.pipelines import publish_profile

    record_link_info(model_name=state["model"], model_version=str(state["version"]))
    params = get_current_context()["params"]
    settings = _settings()
    return publish_profile.profile(state, enabled=_flag(params.get("profile"), settings.publish_profile),
                                   perf_gate_enabled=_flag(params.get("perf_gate"), settings.publish_perf_gate),
                                   repository_uri=params.get("repository") or None, settings=settings)


@data_task(execution_timeout=TIMEOUTS.profile)
@shared_staging
def perf_gate(state: dict) -> dict:
    """p99 regression gate: challenger vs champion on one Triton, interleaved perf_analyzer passes."""
    from tritonflow.pipelines import publish_profile

    params = get_current_context()["params"]
    return publish_profile.perf_gate(
        state, enabled=_flag(params.get("perf_gate"), _settings().publish_perf_gate),
        repository_uri=params.get("repository") or None, settings=_settings())


@data_task(execution_timeout=TIMEOUTS.push)
@shared_staging
def sign_and_push(state: dict) -> dict:
    """Sign (model-signing) and push atomically; verified at the destination."""
    from tritonflow.pipelines import publish_signing

    params = get_current_context()["params"]
    return publish_signing.sign_and_push(state, repository_uri=params.get("repository") or None,
                                         settings=_settings())


@data_task(links=True, execution_timeout=TIMEOUTS.load)
@shared_staging
def load_and_smoke(state: dict) -> dict:
    """Verify, load (explicit mode), wait READY, smoke inference vs the source model."""
    from tritonflow.pipelines import publish as pipeline

    record_link_info(model_name=state["model"], model_version=str(state["version"]))
    out = pipeline.load_and_smoke(state, settings=_settings())
    record_link_info(triton_model=out["triton_model_name"], triton_version=str(out["version"]),
                     triton_http_url=out.get("triton_url"))
    return out


@data_task(links=True, execution_timeout=TIMEOUTS.short, outlets=[MODEL_PUBLISHED])
@shared_staging
def record(state: dict) -> dict:
    """Publish record on the MLflow version, drift reference; event on MODEL_PUBLISHED.

    The run's staging folder is removed once recorded (a failed run's is swept after a day).
    """
    from tritonflow.pipelines import publish_record
    from tritonflow.pipelines.publish_common import remove_staging
    from tritonflow.pipelines.shared_work import discard

    context = get_current_context()
    record_link_info(model_name=state["model"], model_version=str(state["version"]),
                     triton_model=state["triton_model_name"], triton_version=str(state["version"]),
                     triton_http_url=state.get("triton_url"))
    summary = publish_record.record(state, settings=_settings())
    remove_staging(state)
    discard(_settings(), state["staging_dir"])
    record_link_info(mlflow_run_id=summary["publish_run_id"],
                     mlflow_experiment_id=summary["publish_experiment_id"])
    context["outlet_events"][MODEL_PUBLISHED].extra = {
        k: summary[k] for k in ("model", "version", "triton_model_name", "repository_uri",
                                "signature_digest", "key_id")
    }
    return {**summary, "then": state.get("then") or [], "loop": state.get("loop")}


@task(execution_timeout=TIMEOUTS.short)
@limit_xcom_size
def then_triggers(summary: dict) -> list[dict]:
    """One trigger per DAG in the ``then`` list; conf: the loop context handed on."""
    from tritonflow.pipelines.loop_context import publish_handoff

    run_id = get_current_context()["run_id"]
    conf = publish_handoff(summary, triggered_by=DAG_ID, run_id=run_id)
    return [{"trigger_dag_id": dag_id, "conf": conf} for dag_id in summary.get("then") or []]


@tritonflow_dag(DAG_ID, schedule=registry_asset(DAG_ID), topics=["publish"], description=DESCRIPTION,
                doc_md=DOC_MD, params=PARAMS, deadline=run_deadline("publish"))
def model_publish():
    """Convert, validate, sign and publish a registered model version to Triton."""
    summary = record(load_and_smoke(sign_and_push(perf_gate(profile(convert_and_validate(resolve()))))))
    fire_and_forget_mapped("trigger_then").expand_kwargs(then_triggers(summary))


model_publish()
