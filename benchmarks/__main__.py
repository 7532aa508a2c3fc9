"""``python -m benchmarks``: every benchmark at its stated size, one results file (:mod:`benchmarks.suite`)."""

from benchmarks.suite import main

raise SystemExit(main())
