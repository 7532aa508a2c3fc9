"""tritonflow: Airflow pipelines that deliver MLflow models to NVIDIA Triton and keep them honest.

This package holds what the domain packages share: typed settings (:mod:`ground.settings`),
the exception hierarchy (:mod:`ground.exceptions`) and the local runtime
(:mod:`tritonflow.runtime`). It never imports Airflow.
"""

__version__ = "0.1.0"
