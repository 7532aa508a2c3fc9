"""The serving side the demo drives: its services and the inference log its traffic writes.

:class:`Runtime` starts MLflow, Triton and the NGINX gateway in order (Airflow starts beside
them, :mod:`tritonflow.runtime.airflow`) and stops them together. Requests through the gateway
are logged with :func:`inference_log_writer` as :func:`inference_records` rows: the NOAA features,
:data:`SCORE_COLUMN` and :data:`PREDICTION_COLUMN` (the log the loop DAGs read).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pandas as pd

from ground.exceptions import RuntimeStartError

if TYPE_CHECKING:
    from drift_checks.inference_log import InferenceLogWriter
    from tritonflow.demo.config import Progress

#: Prediction column of the inference log: probability of rain (0-1).
SCORE_COLUMN = "probability_rain"
#: Prediction column of the inference log: predicted class (0/1) at 0.5.
PREDICTION_COLUMN = "rain_predicted"


class Runtime:
    """The serving services (MLflow, Triton, NGINX gateway), started in order and stopped together."""

    def __init__(self, progress: Progress):
        from ground.settings import get_settings
        from tritonflow.runtime.services import MlflowServer, NginxGateway, TritonServer

        self.settings = get_settings()
        self.progress = progress
        self.mlflow = MlflowServer(self.settings)
        self.triton = TritonServer(self.settings)
        self.gateway = NginxGateway(self.settings)
        self.services = [self.mlflow, self.triton, self.gateway]

    def start(self) -> None:
        """Start every service (raises :class:`RuntimeStartError` and stops the others)."""
        started = []
        try:
            for svc in self.services:
                t = time.monotonic()
                svc.start()
                started.append(svc)
                self.progress.step(f"runtime: {svc.name} healthy at {svc.health_url()} "
                                   f"({time.monotonic() - t:.1f} s, log {svc.log_path})")
        except RuntimeStartError:
            for svc in reversed(started):
                svc.stop()
            raise

    def stop(self) -> None:
        """Stop the started services, last started first."""
        for svc in reversed(self.services):
            svc.stop()


def inference_log_writer(root: str, model: str) -> InferenceLogWriter:
    """The demo's inference log writer: NOAA features, rain probability and predicted class.

    Args:
        root: Inference log root (``settings.inference_log_root``: a folder or ``s3://`` URI).
        model: Registered model name the log is kept for.
    """
    from drift_checks.inference_log import InferenceLogWriter, LogSchema
    from model_registry.datasets import FEATURE_COLUMNS

    schema = LogSchema({c: "float" for c in FEATURE_COLUMNS},
                       {SCORE_COLUMN: "float", PREDICTION_COLUMN: "int"})
    return InferenceLogWriter(root, model, schema)


def inference_records(rows: pd.DataFrame, res: pd.DataFrame, stamps: pd.DatetimeIndex) -> pd.DataFrame:
    """Inference log rows of answered gateway requests.

    Args:
        rows: The requests' NOAA rows (feature columns), one per request.
        res: The gateway's answers in the same order (``request_id``, ``version``, ``score``,
            ``prediction``), as :class:`~tritonflow.demo.traffic.GatewayClient` returns them.
        stamps: Logged time of each request (converted to UTC).
    """
    from model_registry.datasets import FEATURE_COLUMNS

    rec = pd.DataFrame({
        "request_id": res["request_id"].astype(str).to_numpy(),
        "timestamp": pd.DatetimeIndex(stamps).tz_convert("UTC"),
        "model_version": res["version"].fillna(-1).astype("int64").to_numpy(),
    })
    for c in FEATURE_COLUMNS:
        rec[c] = rows[c].to_numpy(dtype="float64")
    rec[SCORE_COLUMN] = res["score"].astype("float64").to_numpy()
    rec[PREDICTION_COLUMN] = res["prediction"].astype("int64").to_numpy()
    return rec
