"""``model_publish``'s tasks on any worker.

:func:`shared_staging` wraps a publish stage so that it first fetches the staged files the
attempt's earlier tasks stored and, when it returns, stores what it wrote
(:mod:`tritonflow.pipelines.publish_staging`; a no-op unless ``TRITONFLOW_STAGING_URI`` is set).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping


def shared_staging(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a publish stage ``func(state, ...) -> state`` with the shared staging fetch and store."""

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        from tritonflow.pipelines import publish_staging
        from tritonflow.settings import get_settings

        settings = get_settings()
        if isinstance(state, Mapping) and state.get("staging_dir"):
            publish_staging.pull_staging(state, settings)
        out = func(state, *args, **kwargs)
        if isinstance(out, Mapping) and out.get("staging_dir"):
            publish_staging.push_staging(out, settings)
        return out

    return wrapper


__all__ = ["shared_staging"]
