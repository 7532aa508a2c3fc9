"""The main job: tritonflow's whole loop on real NOAA weather data, on a real local Airflow.

``bash scripts/demo.sh`` (the README's first command) runs ``python -m tritonflow.demo``, which:

1. starts the serving services (:mod:`tritonflow.demo.serving`: MLflow on SQLite, Triton over a
   local folder repository, the NGINX gateway) and, beside them, a real Airflow 3 deployment from
   :mod:`tritonflow.runtime.airflow` (scheduler, dag-processor, triggerer, api-server;
   LocalExecutor with 4 slots; SQLite metadata DB in WAL mode, PostgreSQL with ``--airflow-db``),
   all under the demo's state folder (``TRITONFLOW_HOME=.tritonflow/demo``) on the default ports
   or free ones;
2. trains a champion on the early years of the NOAA series, registers it in MLflow with the alias
   ``champion`` and publishes it with the publish pipeline (serving has to start somewhere; this
   is the only publish that is not a DAG run);
3. plays the world (:mod:`tritonflow.demo.driver`): replays the following years as production
   traffic *through the gateway* (real HTTP inference requests, ``X-Request-Id`` logged), writes
   the labels when they "arrive", and creates each logical hour's ``drift_monitor`` run through
   Airflow's REST API (data interval = that hour). Every other run is the scheduler's: the drift
   asset event starts ``shadow_evaluation``, which triggers ``retrain`` or ``canary_promotion``;
   ``retrain`` triggers ``model_publish``, which triggers the next ``shadow_evaluation``. While a
   canary runs the driver sends steady traffic (with labels) so that it can be judged;
4. reads back what happened through the REST API (:mod:`tritonflow.demo.runs`): every DAG run
   with what triggered it, every alert with the DAGs' decision, the closed loops (drift alert ->
   promoted challenger) and the scheduling latency; writes ``<home>/report/index.html`` and
   ``summary.json``. The last printed line is one JSON object with the benchmarks.
"""

from tritonflow.demo.config import DayHourMapping, DemoConfig, config_from_args, quick_config

__all__ = ["DayHourMapping", "DemoConfig", "config_from_args", "main", "quick_config"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tritonflow.demo``; see :mod:`tritonflow.demo.__main__`."""
    from tritonflow.demo.__main__ import main as run

    return run(argv)
