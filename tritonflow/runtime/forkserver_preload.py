"""Last module of the LocalExecutor's forkserver preload: freezes the preloaded objects for the GC.

:data:`tritonflow.runtime.airflow_config.DEFAULT_TASK_PRELOAD_MODULES` ends with this module. The
``multiprocessing`` forkserver imports the preload modules in order, so when this one is imported
every preloaded library is in memory. ``gc.freeze()`` then moves their objects (about 700,000) to
the permanent generation, as Airflow does before it forks LocalExecutor workers with the ``fork``
start method (``LocalExecutor._spawn_workers_with_gc_freeze``). Without it every worker and every
task process forked from one walks all of them on each full collection (1.2-1.4 s measured on two
cores) and, writing their reference counts, copies the shared pages.

Importing this module anywhere else does nothing: it acts only in a ``multiprocessing`` forkserver
(started as ``python -c "from multiprocessing.forkserver import main; ..."``).
"""

from __future__ import annotations

import gc
import sys


def in_forkserver() -> bool:
    """True when this process is a ``multiprocessing`` forkserver."""
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules


def freeze_preloaded() -> bool:
    """Collect, then freeze every object tracked so far; ``True`` when it froze (forkserver only)."""
    if not in_forkserver():
        return False
    gc.collect()
    gc.freeze()
    return True


freeze_preloaded()
