"""``model_publish``'s tasks on any worker.

:func:`shared_staging` wraps a publish stage so that it first fetches the staged files the
attempt's earlier tasks stored and, when it returns, stores what it wrote
(:mod:`tritonflow.pipelines.shared_work`; a no-op unless ``TRITONFLOW_STAGING_URI`` is set).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping


def shared_staging(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a publish stage ``func(state, ...) -> state`` with the shared staging fetch and store."""

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        from ground.settings import get_settings
        from tritonflow.pipelines import shared_work

        settings = get_settings()
        if isinstance(state, Mapping) and state.get("staging_dir"):
            shared_work.fetch(settings, state["staging_dir"])
        out = func(state, *args, **kwargs)
        if isinstance(out, Mapping) and out.get("staging_dir"):
            shared_work.share(settings, out["staging_dir"])
        return out

    return wrapper


__all__ = ["shared_staging"]
