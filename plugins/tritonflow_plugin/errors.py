"""Map tritonflow's exception hierarchy onto Airflow's retry semantics.

* :class:`ground.exceptions.DataError` (bad input) becomes
  :class:`airflow.sdk.exceptions.AirflowFailException`: the task fails at once, no retry.
* :class:`ground.exceptions.TransientError` (a system flaked) propagates unchanged, so Airflow
  applies the task's ``retries``.

Example::

    @task(retries=3, execution_timeout=timedelta(minutes=10))
    @fail_fast_on_bad_data
    def validate(model_uri: str) -> dict: ...
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

from ground.exceptions import DataError
from tritonflow_plugin.loop import quiet_third_party

F = TypeVar("F", bound=Callable[..., Any])


def to_airflow_exception(exc: DataError) -> Exception:
    """Return the ``AirflowFailException`` that stands for ``exc`` (its class name and message).

    Args:
        exc: A tritonflow bad-input error.

    Returns:
        ``AirflowFailException("<ClassName>: <message>")`` chained to ``exc`` by the caller.
    """
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(f"{type(exc).__name__}: {exc}")


def fail_fast_on_bad_data(func: F) -> F:
    """Decorate a task callable so bad data fails the task without retries.

    Works on plain and ``async`` functions; put it *under* ``@task`` so Airflow wraps the
    decorated callable. Every call first quiets third-party output
    (:func:`tritonflow_plugin.loop.quiet_third_party`: no MLflow progress bars on stderr, no
    third-party deprecation warnings).

    Raises:
        AirflowFailException: When ``func`` raises a ``DataError`` (original chained as cause).
        TransientError: Re-raised unchanged so Airflow retries.
    """
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            quiet_third_party()
            try:
                return await func(*args, **kwargs)
            except DataError as exc:
                raise to_airflow_exception(exc) from exc

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        quiet_third_party()
        try:
            return func(*args, **kwargs)
        except DataError as exc:
            raise to_airflow_exception(exc) from exc

    return wrapper  # type: ignore[return-value]


def when_lock_held(then: str = "fail") -> Callable[[F], F]:
    """The one policy for "the lock is held by another run" (a ``ConcurrencyError``).

    Another run holds the model's promotion, alias, model-control or retrain lock (or a cooldown
    is in force): retrying would only wait on it, so the task ends at once, naming the holder.

    * ``then="fail"``: for work a person or a DAG asked for that did not happen (a promotion, a
      rollback): the task fails without retry (``AirflowFailException``).
    * ``then="skip"``: for work another run is already doing (a retraining in flight, or one
      within its cooldown): the task is skipped (``AirflowSkipException``), the run succeeds.

    Put it under ``@task`` (above or below :func:`fail_fast_on_bad_data`).

    Args:
        then: ``"fail"`` or ``"skip"``.

    Raises:
        ValueError: ``then`` is neither (at decoration, i.e. DAG parse time).
    """
    if then not in ("fail", "skip"):
        raise ValueError(f"when_lock_held(then={then!r}): expected 'fail' or 'skip'")

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from ground.exceptions import ConcurrencyError

            try:
                return func(*args, **kwargs)
            except ConcurrencyError as exc:
                from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

                stop = AirflowFailException if then == "fail" else AirflowSkipException
                raise stop(f"{type(exc).__name__}: {exc}") from exc

        return wrapper  # type: ignore[return-value]

    return decorate
