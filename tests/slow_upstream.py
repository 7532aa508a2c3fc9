"""A version a stand-in upstream answers late: a request still in flight when the gateway's plan changes."""

from __future__ import annotations

import threading
import time


class SlowVersion:
    """Delays inferences of one version in a stand-in upstream's handler and records when they end.

    Args:
        version: The version whose ``.../versions/<version>/infer`` requests are held.
        delay_s: Seconds each is held.
    """

    def __init__(self, version: int = 5, delay_s: float = 3.0):
        self.version = version
        self.delay_s = delay_s
        #: Set once such a request reached the upstream; clear it before each test.
        self.admitted = threading.Event()
        #: ``time.monotonic()`` at which each such request was answered.
        self.answered: list[float] = []

    def hold(self, path: str) -> None:
        """Called by the handler before it answers ``path``: sleeps when it is the slow version's inference."""
        if path.endswith(f"/versions/{self.version}/infer"):
            self.admitted.set()
            time.sleep(self.delay_s)
            self.answered.append(time.monotonic())
