-- Databases of the tritonflow stack, created once when the PostgreSQL volume is first initialised
-- (docker-entrypoint-initdb.d). All are owned by POSTGRES_USER, whose password comes from .env.
--   airflow     Airflow metadata DB (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN) and Celery result backend
--   mlflow      MLflow tracking + model registry backend store (MLFLOW_BACKEND_STORE_URI)
--   tritonflow  drift statistics history (TRITONFLOW_DRIFT_HISTORY_DB_URL)
CREATE DATABASE airflow;
CREATE DATABASE mlflow;
CREATE DATABASE tritonflow;
