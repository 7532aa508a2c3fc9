"""tritonflow's Airflow plugin layer: hooks, links, notifier, XCom discipline, registry triggers.

This package lives in Airflow's plugins folder (``plugins/``), which Airflow puts on ``sys.path``,
so DAG files import it as ``tritonflow_plugin``. Importing this package is cheap: every module
keeps heavy imports (MLflow, tritonclient, FastAPI) inside functions so DAG parsing stays fast.

Modules:
    hooks: ``MlflowHook`` (conn type ``mlflow``) and ``TritonHook`` (conn type ``triton``).
    links: operator extra links (MLflow model version and run, Evidently report, Triton model,
        Grafana panel) and the ``@task_with_links`` decorator.
    notifications: ``TritonflowFailureNotifier`` for ``on_failure_callback``.
    xcom: artefact references ``{uri, sha256, bytes}`` and the XCom size check.
    errors: ``fail_fast_on_bad_data`` (``DataError`` -> ``AirflowFailException``).
    event_mapping: registry change -> DAG ids mapping, loaded from YAML/JSON.
    webhook: FastAPI app receiving MLflow's signed webhooks.
    registry_watcher: registry polling diff, restart-safe seen-state, ``RegistryEventTrigger``.
    dag_integrity: static DAG checks shared by the tests and the runtime expected-ids check.
    params: trigger-form Params (titles, rules in words, clearable choices); importing the
        package registers the rules with ``jsonschema`` so every Airflow process validates alike.
"""

from tritonflow_plugin import params as _params  # noqa: F401  (registers the rules' formats)
