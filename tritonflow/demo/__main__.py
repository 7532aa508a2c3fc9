"""``python -m tritonflow.demo [--quick] [--keep-running] [--home DIR] [--stack compose]``: see the package."""

from __future__ import annotations

import json
import sys

from ground.exceptions import TritonflowError


def benchmark_line(summary: dict) -> str:
    """The demo's last line: ``{"closed_loop_s", "scheduling_latency_s", "wall_s", "alerts", "acted"}``."""
    from tritonflow.demo.runs import acted_count

    alerts = summary.get("alerts") or []
    return json.dumps({
        "closed_loop_s": [loop["seconds"] for loop in summary.get("closed_loops") or []],
        "scheduling_latency_s": (summary.get("scheduling_latency_s") or {}).get("all"),
        "wall_s": round(float(summary.get("wall_s") or 0.0), 1),
        "alerts": len(alerts),
        "acted": acted_count(alerts),
    })


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 on success, 1 when a step failed, 130 when interrupted."""
    from tritonflow.demo.config import Progress, config_from_args
    from tritonflow.demo.driver import Demo

    cfg = config_from_args(argv)
    progress = Progress()
    if cfg.stack == "compose":
        from tritonflow.demo.stack import StackDemo

        demo: Demo = StackDemo(cfg, progress)
    else:
        demo = Demo(cfg, progress)
    code = 0
    summary: dict = {}
    try:
        summary = demo.run()
        (cfg.home / "report" / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    except KeyboardInterrupt:
        progress.step("interrupted")
        code = 130
    except (TritonflowError, TimeoutError) as exc:
        progress.step(f"FAILED: {type(exc).__name__}: {exc}")
        code = 1
    finally:
        demo.teardown()
        progress.step(f"wall time {progress.elapsed():.1f} s")
        summary.setdefault("wall_s", progress.elapsed())
        print(benchmark_line(summary), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
