"""Run-time wiring every loop DAG shares: the typed conf, params from the settings, quiet logs.

* :func:`loop_context` -- validates the running DAG run's conf when the run starts: top-level keys
  are the DAG's params, the loop context (:data:`tritonflow.pipelines.loop_context.LOOP_CONF_KEY`)
  or a registry event's keys (an unknown key fails naming the closest valid one), and the loop
  context is a valid :class:`~tritonflow.pipelines.loop_context.LoopContext`.
* :func:`param_or_setting` -- a param left empty (``None``) takes the setting in effect when the
  task runs (never a constant in the DAG file, never at parse time); which one was used is
  logged.
* :func:`quiet_third_party` -- at task start: MLflow's artifact progress bars off (they are
  written to stderr, which Airflow logs as ERROR ``task.stderr``), third-party deprecation
  warnings of known categories filtered once.

Nothing here runs at import time; DAG files import it cheaply.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Any, Mapping

log = logging.getLogger(__name__)

#: Third-party modules whose ``DeprecationWarning``/``FutureWarning`` are not ours to act on in a
#: task log. Each ``convert_and_validate`` logged 1,160 of them: skops (loading the scikit-learn
#: model) probes every loaded module's attributes, which fires Airflow's
#: ``DeprecatedImportWarning`` (a ``FutureWarning``) once per deprecated ``airflow.*`` alias.
QUIET_WARNING_MODULES = ("skops", "onnx", "skl2onnx", "onnxconverter_common", "onnxmltools", "sklearn", "mlflow",
                         "torch", "pydantic", "google.protobuf", "setuptools", "pkg_resources",
                         "whylogs", "evidently", "great_expectations", "pandas", "numpy", "scipy")

def quiet_third_party() -> None:
    """Progress bars off and third-party deprecation warnings filtered (idempotent).

    ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` is set only when the environment does not set it
    already (an operator can turn the bars back on). The filters are (re)installed on every call:
    ``warnings.filterwarnings`` replaces an identical filter instead of adding a second one, and a
    caller's ``warnings.catch_warnings`` block may have reset them since the last call.
    """
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for module in QUIET_WARNING_MODULES:
        pattern = re.escape(module) + r"(\..*)?$"
        for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", category=category, module=pattern)


def dag_param_names(context: Mapping[str, Any]) -> list[str]:
    """The running DAG's declared param names."""
    dag = context.get("dag")
    params = getattr(dag, "params", None)
    if params is None:
        params = context.get("params") or {}
    return list(params.keys())


def loop_context(context: Mapping[str, Any]):
    """The validated loop context of the running DAG run (``None`` when it carries none).

    Raises:
        SettingsError: An unknown conf key (the closest valid key named), or an invalid context.
    """
    from tritonflow.pipelines.loop_context import LOOP_CONF_KEY, check_conf_keys, parse_loop_context

    dag_run = context.get("dag_run")
    conf = dict(getattr(dag_run, "conf", None) or {})
    dag_id = str(getattr(context.get("dag"), "dag_id", None) or getattr(dag_run, "dag_id", "?"))
    check_conf_keys(conf, dag_param_names(context), dag_id)
    ctx = parse_loop_context(conf.get(LOOP_CONF_KEY))
    if ctx is not None:
        log.info("loop context from %s: model %s version %s, window %s .. %s, dataset %s", ctx.triggered_by,
                 ctx.model, ctx.version, ctx.window_start, ctx.window_end, ctx.dataset_uri)
    return ctx


def param_or_setting(params: Mapping[str, Any], name: str, setting: str, settings: Any = None) -> Any:
    """``params[name]``, or the setting ``setting`` in effect when the param is empty (``None``).

    Args:
        params: The run's params.
        name: Param name.
        setting: Attribute of :class:`ground.settings.Settings` (env ``TRITONFLOW_<SETTING>``).
        settings: Settings (default: :func:`ground.settings.get_settings`, read now).

    Returns:
        The param's value, or the setting's (logged either way).
    """
    value = params.get(name)
    if value is not None:
        log.info("param %s=%r (given)", name, value)
        return value
    if settings is None:
        from ground.settings import get_settings

        settings = get_settings()
    value = getattr(settings, setting)
    log.info("param %s empty: setting in effect TRITONFLOW_%s=%r", name, setting.upper(), value)
    return value


__all__ = ["QUIET_WARNING_MODULES", "dag_param_names", "loop_context", "param_or_setting", "quiet_third_party"]
