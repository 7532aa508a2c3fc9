"""DAG ``model_publish``: an MLflow model version becomes a signed, verified, READY Triton version.

Wiring only; the work is in :mod:`tritonflow.pipelines.publish` (imported inside the tasks so the
file parses fast and without network). Started manually (validated params), by other DAGs
(``TriggerDagRunOperator`` with the typed loop context, conf ``{"loop": {...}}``, validated when the
run starts) or by registry events (asset ``tritonflow_registry__model_publish``: the webhook
receiver or the registry watcher). No settings are read at parse time.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, get_current_context, task

from tritonflow_plugin.dag_defaults import DEFAULT_ARGS, MODEL_PUBLISHED, START_DATE, TAG
from tritonflow_plugin.errors import fail_fast_on_bad_data
from tritonflow_plugin.links import record_link_info, task_with_links
from tritonflow_plugin.registry_watcher import registry_asset
from tritonflow_plugin.xcom import limit_xcom_size

DAG_ID = "model_publish"
#: Timeout of registry reads and of the fire-and-forget triggers.
SHORT_TASK_TIMEOUT = timedelta(minutes=10)
#: Timeout of conversion, validation and the parity gate (loads the source model).
CONVERT_TASK_TIMEOUT = timedelta(minutes=30)
#: Timeout of Model Analyzer profiling (its own run timeout is TRITONFLOW_ANALYZER_TIMEOUT_S).
PROFILE_TASK_TIMEOUT = timedelta(minutes=45)
#: Timeout of signing and pushing to the repository (large models on S3).
PUSH_TASK_TIMEOUT = timedelta(minutes=30)
#: Timeout of load + READY wait + smoke inference (READY wait: TRITONFLOW_LOAD_TIMEOUT_S).
LOAD_TASK_TIMEOUT = timedelta(minutes=20)
#: Largest max_batch_size accepted (the pipeline's limit).
MAX_BATCH_SIZE = 4096
#: Model names accepted by the form (Triton-safe: folder names and S3 key segments).
MODEL_NAME_PATTERN = r"^$|^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
#: A version number, an alias or a legacy stage.
SELECTOR_PATTERN = r"^([1-9][0-9]*|[A-Za-z_][A-Za-z0-9_\-]*)$"

DOC_MD = """
### Model publish

Delivers one MLflow model version to Triton safely:

1. **resolve**: `model` + `version_or_alias` (a version such as `3`, an alias such as `champion` or
   `challenger`, or a legacy stage) to one READY model version; later tasks use the immutable
   `models:/<name>/<version>`. A run started by a registry event takes the model and version from
   the event (`registry_watcher.registry_conf_from_context`); a run triggered by another DAG (e.g.
   `retrain`) from its loop context (`conf.loop`: model, version, drift event and window, training
   window as `dataset_uri`), validated first: an unknown conf key fails naming the closest valid one;
2. **convert_and_validate**: conversion to ONNX (scikit-learn without ZipMap, PyTorch with a dynamic
   batch axis, ONNX passthrough), IR/opset check against the target Triton release, `config.pbtxt`
   built with protobuf, batch 1 and >= 2, tensors only, finite outputs, and the **blocking parity
   gate** against the MLflow pyfunc (`atol`, `rtol`); a failure tags the version `rejected`;
3. **profile**: Model Analyzer with a bounded sweep (settings `TRITONFLOW_ANALYZER_*`) on the local
   Triton tools; the best **stable** config under the p99 latency constraint is adopted (`profile`
   off, or a host without the tools: the generated config is kept and the run says so);
3b. **perf_gate**: before a challenger is pushed beside a champion, perf_analyzer measures both on
   one local Triton at the champion's concurrency, in interleaved passes (>= 3 each); a median p99
   worse by more than `TRITONFLOW_MAX_P99_REGRESSION` (10 %) beyond the noise band rejects it;
4. **sign_and_push**: OpenSSF model-signing signature over the model and its config, atomic push to
   `repository` (folder/NFS or `s3://http://host:port/bucket/prefix`), verified at the destination;
   a version is never overwritten, re-runs are no-ops. A failure of the tools or services (Model
   Analyzer's environment, a local Triton, S3) is an infrastructure error: the run fails, the
   version is **not** tagged rejected;
5. **load_and_smoke**: signature verified again, explicit load through Triton's repository API,
   READY within `TRITONFLOW_LOAD_TIMEOUT_S`, validation sample served and compared with the source
   model; any failure unloads and tags the version `rejected`;
6. **record**: repository URI, Triton model/version, signature digest and key id, parity errors,
   chosen config, timings per stage as `tritonflow.*` tags and artifacts on the MLflow version; the
   drift reference sample is stored; an event is emitted on asset `tritonflow_model_published`;
7. **trigger_then**: the DAGs named in the conf's `then` list (e.g. `shadow_evaluation`) are
   triggered fire-and-forget (`wait_for_completion=False, deferrable=False`) with the loop
   context handed on: `{"loop": {model, version: <published version>, drift_event, window_start,
   window_end, dataset_uri, ...}}`.

Params left empty (`atol`, `rtol`) take the settings in effect when the run starts
(`TRITONFLOW_PARITY_ATOL`, `TRITONFLOW_PARITY_RTOL`); the values used are logged.
"""

PARAMS = {
    "model": Param("", type="string", pattern=MODEL_NAME_PATTERN, maxLength=128,
                   description="Registered model name (letters, digits, '_', '.', '-'); empty only for "
                               "runs started by a registry event."),
    "version_or_alias": Param("champion", type="string", pattern=SELECTOR_PATTERN,
                              description="Model version (e.g. '3'), alias (e.g. 'champion', 'challenger') "
                                          "or legacy stage ('Production')."),
    "repository": Param(None, type=["null", "string"],
                        description="Triton model repository: a folder or s3://http://host:port/bucket/prefix "
                                    "(empty: TRITONFLOW_REPOSITORY_URI, else the local repository)."),
    "atol": Param(None, type=["null", "number"], minimum=0,
                  description="Parity gate absolute tolerance per output element "
                              "(|onnx - source| <= atol + rtol*|source|); empty: TRITONFLOW_PARITY_ATOL in effect."),
    "rtol": Param(None, type=["null", "number"], minimum=0,
                  description="Parity gate relative tolerance per output element "
                              "(empty: TRITONFLOW_PARITY_RTOL in effect)."),
    "max_batch_size": Param(32, type="integer", minimum=0, maximum=MAX_BATCH_SIZE,
                            description="Largest batch Triton may form (0: no batching); also the ceiling "
                                        "of the profiling sweep."),
    "profile": Param(None, type=["null", "boolean"],
                     description="Profile with Model Analyzer (bounded sweep) and adopt the best stable config "
                                 "(empty: TRITONFLOW_PUBLISH_PROFILE)."),
    "perf_gate": Param(None, type=["null", "boolean"],
                       description="p99 latency regression gate against the champion before the push "
                                   "(TRITONFLOW_MAX_P99_REGRESSION beyond the measured noise band; empty: "
                                   "TRITONFLOW_PUBLISH_PERF_GATE)."),
    "export_format": Param("onnx", type="string", enum=["onnx", "torchscript"],
                           description="Served format: ONNX (every flavour), or TorchScript for PyTorch models "
                                       "(platform pytorch_libtorch, model.pt)."),
    "dataset_uri": Param(None, type=["null", "string"],
                         description="Validation dataset (CSV/Parquet path or MLflow artifact URI), also the drift "
                                     "reference; empty: the loop context's training window, else the logged "
                                     "input example plus seeded perturbations (then no drift reference is stored)."),
    "loop": Param(None, type=["null", "object"],
                  description="Context handed on by the DAG that triggered this run (validated; leave empty)."),
}


def _flag(value, default: bool) -> bool:
    """A boolean param; empty (None) takes the setting (TRITONFLOW_PUBLISH_PROFILE / _PERF_GATE)."""
    return default if value is None else bool(value)


def _settings():
    from tritonflow.settings import get_settings

    return get_settings()


@dag(
    dag_id=DAG_ID,
    schedule=registry_asset(DAG_ID),
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[TAG, "publish"],
    doc_md=DOC_MD,
    params=PARAMS,
)
def model_publish():
    """Convert, validate, sign and publish a registered model version to Triton."""
    @task_with_links(execution_timeout=SHORT_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def resolve() -> dict:
        """Model + version/alias (params, or the registry event) -> one model version."""
        from tritonflow.exceptions import SettingsError
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
            raise SettingsError("model='' ; expected the registered model name (param 'model') or a run "
                                "started by a registry event")
        then = event.get("then") if event else conf.get("then")
        then = list(then or [])
        if not all(isinstance(d, str) and d.strip() for d in then):
            raise SettingsError(f"then={then!r} is invalid; expected a list of DAG ids")
        state = pipeline.resolve(pipeline.model_reference(model, selector), settings=_settings())
        record_link_info(model_name=state["model"], model_version=str(state["version"]))
        return {**state, "then": then,
                "loop": loop.model_dump(mode="json", exclude_none=True) if loop is not None else None}

    @task_with_links(execution_timeout=CONVERT_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def convert_and_validate(state: dict) -> dict:
        """Convert, check, build config.pbtxt, parity gate (rejects the version on failure)."""
        from tritonflow.pipelines import publish as pipeline
        from tritonflow_plugin.loop import param_or_setting

        record_link_info(model_name=state["model"], model_version=str(state["version"]))
        params = get_current_context()["params"]
        settings = _settings()
        dataset_uri = params.get("dataset_uri") or (state.get("loop") or {}).get("dataset_uri") or None
        return pipeline.convert_and_validate(
            state, atol=param_or_setting(params, "atol", "parity_atol", settings),
            rtol=param_or_setting(params, "rtol", "parity_rtol", settings),
            max_batch_size=params["max_batch_size"], dataset_uri=dataset_uri,
            export_format=params.get("export_format") or "onnx", settings=settings,
        )

    @task_with_links(execution_timeout=PROFILE_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def profile(state: dict) -> dict:
        """Model Analyzer bounded sweep; keeps the generated config when off or unavailable."""
        from tritonflow.pipelines import publish as pipeline

        record_link_info(model_name=state["model"], model_version=str(state["version"]))
        params = get_current_context()["params"]
        return pipeline.profile(state, enabled=_flag(params.get("profile"), _settings().publish_profile),
                                settings=_settings())

    @task(execution_timeout=PROFILE_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def perf_gate(state: dict) -> dict:
        """p99 regression gate: challenger vs champion on one Triton, interleaved perf_analyzer passes."""
        from tritonflow.pipelines import publish as pipeline

        params = get_current_context()["params"]
        return pipeline.perf_gate(state, enabled=_flag(params.get("perf_gate"), _settings().publish_perf_gate),
                                  repository_uri=params.get("repository") or None, settings=_settings())

    @task(execution_timeout=PUSH_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def sign_and_push(state: dict) -> dict:
        """Sign (model-signing) and push atomically; verified at the destination."""
        from tritonflow.pipelines import publish as pipeline

        params = get_current_context()["params"]
        return pipeline.sign_and_push(state, repository_uri=params.get("repository") or None, settings=_settings())

    @task_with_links(execution_timeout=LOAD_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def load_and_smoke(state: dict) -> dict:
        """Verify, load (explicit mode), wait READY, smoke inference vs the source model."""
        from tritonflow.pipelines import publish as pipeline

        record_link_info(model_name=state["model"], model_version=str(state["version"]))
        out = pipeline.load_and_smoke(state, settings=_settings())
        record_link_info(triton_model=out["triton_model_name"], triton_version=str(out["version"]),
                         triton_http_url=out["triton_url"])
        return out

    @task_with_links(execution_timeout=SHORT_TASK_TIMEOUT, outlets=[MODEL_PUBLISHED])
    @fail_fast_on_bad_data
    @limit_xcom_size
    def record(state: dict) -> dict:
        """Publish record on the MLflow version, drift reference; event on MODEL_PUBLISHED."""
        from tritonflow.pipelines import publish as pipeline

        context = get_current_context()
        record_link_info(model_name=state["model"], model_version=str(state["version"]),
                         triton_model=state["triton_model_name"], triton_version=str(state["version"]),
                         triton_http_url=state.get("triton_url"))
        summary = pipeline.record(state, settings=_settings())
        record_link_info(mlflow_run_id=summary["publish_run_id"],
                         mlflow_experiment_id=summary["publish_experiment_id"])
        context["outlet_events"][MODEL_PUBLISHED].extra = {
            k: summary[k] for k in ("model", "version", "triton_model_name", "repository_uri",
                                    "signature_digest", "key_id")
        }
        return {**summary, "then": state.get("then") or [], "loop": state.get("loop")}

    @task(execution_timeout=SHORT_TASK_TIMEOUT)
    @limit_xcom_size
    def then_triggers(summary: dict) -> list[dict]:
        """One trigger per DAG in the ``then`` list; conf: the loop context handed on."""
        from tritonflow.pipelines.loop_context import publish_handoff

        run_id = get_current_context()["run_id"]
        conf = publish_handoff(summary, triggered_by=DAG_ID, run_id=run_id)
        return [{"trigger_dag_id": dag_id, "conf": conf} for dag_id in summary.get("then") or []]

    summary = record(load_and_smoke(sign_and_push(perf_gate(profile(convert_and_validate(resolve()))))))
    TriggerDagRunOperator.partial(
        task_id="trigger_then",
        wait_for_completion=False,
        deferrable=False,
        execution_timeout=SHORT_TASK_TIMEOUT,
    ).expand_kwargs(then_triggers(summary))


model_publish()
