"""The LocalExecutor's forkserver preload: the last preloaded module freezes the GC, only in a forkserver."""

from __future__ import annotations

import gc
import multiprocessing
import sys

from tritonflow.runtime import forkserver_preload
from tritonflow.runtime.airflow_config import DEFAULT_TASK_PRELOAD_MODULES


def _report(queue) -> None:
    queue.put((gc.get_freeze_count(), "pandas" in sys.modules))


def test_freeze_is_the_last_preloaded_module_and_the_others_are_third_party():
    assert DEFAULT_TASK_PRELOAD_MODULES[-1] == "tritonflow.runtime.forkserver_preload"
    others = DEFAULT_TASK_PRELOAD_MODULES[:-1]
    assert not any(m.split(".")[0] in ("tritonflow", "model_registry", "drift_checks", "repository_sync", "ground",
                                       "tritonflow_plugin") for m in others)


def test_outside_a_forkserver_nothing_is_frozen():
    before = gc.get_freeze_count()
    assert forkserver_preload.in_forkserver() is False
    assert forkserver_preload.freeze_preloaded() is False
    assert gc.get_freeze_count() == before


def test_a_process_forked_by_the_forkserver_inherits_the_preload_frozen():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pandas", "tritonflow.runtime.forkserver_preload"])
    queue = ctx.Queue()
    proc = ctx.Process(target=_report, args=(queue,))
    proc.start()
    try:
        frozen, has_pandas = queue.get(timeout=120)
    finally:
        proc.join(30)
    assert has_pandas  # inherited from the forkserver, not imported by the child
    assert frozen > 10_000  # pandas' objects and everything before it are in the permanent generation
