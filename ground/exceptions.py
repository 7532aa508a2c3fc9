"""The one exception hierarchy of tritonflow.

Two branches decide how Airflow treats a failure:

* :class:`DataError` -- the input is bad (model, config, window, artifact, parameters). Retrying
  cannot help, so tasks raise ``AirflowFailException`` for it (see ``plugins``).
* :class:`TransientError` -- a system flaked (a service is down, a timeout). Tasks let Airflow retry.

Every message names the field, the value and what was expected.
"""

from __future__ import annotations


class TritonflowError(Exception):
    """Base class of every error raised by tritonflow."""

    retryable: bool = False


# --------------------------------------------------------------------------- bad data (no retry)
class DataError(TritonflowError):
    """The input is wrong; retrying will not help."""


class SettingsError(DataError):
    """A setting (environment variable or parameter) has an invalid value."""


class ModelConversionError(DataError):
    """A model could not be converted to a Triton-servable format."""


class ModelValidationError(DataError):
    """A converted model or its config.pbtxt failed a pre-push check."""


class ParityError(ModelValidationError):
    """The converted model's outputs differ from the source model beyond tolerance."""


class ModelConfigError(ModelValidationError):
    """A Triton config.pbtxt is malformed or contradicts the model."""


class RepositoryLayoutError(DataError):
    """A Triton model repository does not follow the layout rules."""


class VersionNotInRepositoryError(DataError):
    """A model version has no files in the repository (never published, or its publish failed)."""


class SignatureVerificationError(DataError):
    """An artifact's signature is missing, invalid or does not cover its files."""


class RepositoryConflictError(DataError):
    """A model version already exists in the repository with different content (immutable)."""


class ModelLoadRefusedError(DataError):
    """Triton refused to load a model version (bad model or config); the message carries why."""


class InferenceRequestError(DataError):
    """Triton rejected an inference request (shape, dtype, batch size); the message carries why."""


class RegistryError(DataError):
    """The MLflow registry state is not what the operation needs (missing alias, two champions)."""


class RejectedVersionError(RegistryError):
    """The model version is tagged ``tritonflow.status = rejected``: never evaluated, published or promoted."""


class WindowError(DataError):
    """An inference-log window is empty, malformed or lacks required columns."""


class ContractViolation(DataError):
    """A data contract (Great Expectations suite) failed on a window."""


class TrafficPlanError(DataError):
    """A traffic split plan is invalid (weights not integers 0-100 summing to 100)."""


class GatewayConfigError(DataError):
    """The gateway refused a generated routing config (``nginx -t``); the previous one is live."""


class PreflightError(DataError):
    """The serving target cannot host the challenger beside the champion; traffic untouched."""


class ProfilingError(DataError):
    """Model Analyzer produced no measured, stable configuration within the constraints."""


class PerformanceRegressionError(DataError):
    """The challenger's p99 latency regresses beyond the allowance and the noise band; not pushed."""


class TrainingError(DataError):
    """A training entry point failed or returned no usable model; the registry is unchanged."""


class ChallengerUnavailableError(DataError):
    """A challenger could not be loaded or did not answer in a shadow replay; the champion is untouched."""


# ------------------------------------------------------------------ system flaked (retry allowed)
class TransientError(TritonflowError):
    """A system flaked; the same call may succeed later."""

    retryable = True


class ServiceUnavailableError(TransientError):
    """A service (Triton, MLflow, S3, NGINX) did not answer in time."""


class ToolingError(TransientError):
    """Our tools failed (profiling environment, Model Analyzer, a local Triton that would not start).

    An infrastructure error: the run fails (and may be retried); it is never a verdict on the
    model version (never tagged ``rejected``).
    """


class MeasurementUnstableError(ToolingError):
    """No profiled configuration could be measured stably (a busy host); no verdict on the model.

    Raised when every candidate was dropped for instability (perf_analyzer could not stabilise,
    throughput CV above the threshold, no finite measurement), none for its latency. The publish
    pipeline then keeps the generated config and records the profile as inconclusive.
    """


class ModelLoadError(TransientError):
    """Triton did not bring a model version to READY within the timeout."""


class InsufficientMemoryError(TransientError):
    """Not enough free GPU or host memory to load a model version now (pre-flight check)."""


class GatewayReloadError(ServiceUnavailableError):
    """The gateway could not be reloaded; the previous routing config was restored on disk."""


class MetricsUnavailableError(ServiceUnavailableError):
    """Triton's Prometheus metrics endpoint could not be scraped (a canary analysis then fails)."""


# ------------------------------------------------------------------------- local runtime
class RuntimeStartError(TritonflowError):
    """A local service failed to start; the message says why and nothing was left running."""


class ConcurrencyError(TritonflowError):
    """Another operation already holds the lock for this model (one promotion at a time)."""


class LeaseBusyError(ConcurrencyError):
    """A lease (promotion, retrain, model control, gateway) is held by someone else.

    Attributes:
        purpose: What the lease serialises (e.g. ``"promotion"``).
        name: Whose (the model name).
        holder: The holder's description (dag/run/task, host, pid), or ``""`` if unknown.
        since: When the holder took it (ISO 8601, UTC), or ``""``.
    """

    def __init__(self, message: str, *, purpose: str = "", name: str = "", holder: str = "",
                 since: str = "") -> None:
        super().__init__(message)
        self.purpose, self.name, self.holder, self.since = purpose, name, holder, since


class LeaseLostError(ConcurrencyError):
    """A held lease expired or was taken over (no heartbeat in time); the work must stop."""


class RetrainCooldownError(ConcurrencyError):
    """The model was retrained less than the cooldown ago; this retraining is skipped."""
