"""Pipelines: plain-Python stage functions that the Airflow DAGs in ``dags/`` call (no Airflow import)."""
