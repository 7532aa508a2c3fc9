"""Local runtime: real Triton, MLflow, S3 (moto) and NGINX processes on loopback.

See :mod:`tritonflow.runtime.services` and the ``tritonflow runtime`` CLI.
"""

from tritonflow.runtime.services import (  # noqa: F401
    MlflowServer,
    NginxGateway,
    S3Server,
    Service,
    TritonServer,
    free_port,
)
