"""Regenerate the measured-figures tables of README.md and docs/benchmarks.md from the latest results file.

Rewrites what lies between the ``<!-- figures:begin -->`` and ``<!-- figures:end -->`` markers of
both pages with :func:`benchmarks.figures.render`'s tables (from the newest file in
``benchmarks/results/``, written by ``python -m benchmarks``); everything outside the markers is
kept. ``--check`` writes nothing and exits 1 when a page's table differs from the generated one.
Run it after ``python -m benchmarks``: ``.venv/bin/python scripts/update_figures.py``. ``--stale``
writes nothing and lists, per benchmark, the commits since its figures were measured that changed
code it measures (a hint for what to rerun; never a failure).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.figures import DOCS, README, RESULTS_DIR, ages, between_markers, render, splice  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) both tables; 1 when markers are missing or a table is stale."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a table differs")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--stale", action="store_true", help="list each benchmark's code changes since it was measured")
    args = ap.parse_args(argv)
    if args.stale:
        for name, age in ages(args.results_dir):
            print(f"{name}: {age}")
        return 0
    readme_table, docs_table = render(args.results_dir)
    rc = 0
    for page, table in ((README, readme_table), (DOCS, docs_table)):
        text = page.read_text()
        try:
            new = splice(text, table, str(page))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            rc = 1
            continue
        if args.check:
            if between_markers(text) != table:
                print(f"{page.name}: the figures table differs from the latest results file; "
                      "run scripts/update_figures.py", file=sys.stderr)
                rc = 1
        elif new != text:
            page.write_text(new)
            print(f"rewrote the figures table of {page.name}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
