"""Waiting in tests for what a real service does in its own time."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(what: str, probe: Callable[[], Any], timeout_s: float, *, interval_s: float = 2.0,
               state: Callable[[], Any] | None = None) -> Any:
    """``probe()``'s first truthy value, polled every ``interval_s`` seconds.

    Raises:
        AssertionError: Nothing truthy within ``timeout_s`` seconds; the message names ``what``
            and, when given, ``state()`` at that moment.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} not seen within {timeout_s:.0f} s" + (f"; {state()}" if state else ""))
