"""Measuring a model on Triton: Model Analyzer sweeps and perf_analyzer passes.

* :mod:`.analyzer`: the entry point: run a bounded Model Analyzer sweep and confirm its choice
  (re-exports the search space and the results reader).
* :mod:`.analyzer_config`: the search space, the ``profile`` config and perf_analyzer's flags.
* :mod:`.analyzer_results`: the results CSV, the stability check and the chosen config.
* :mod:`.perf`: perf_analyzer passes and the p99 regression gate against the champion.
* :mod:`.triton_tools`: :class:`~.triton_tools.TritonTools`, the Triton starter and tool paths the
  runtime hands in (this package never imports the runtime).
"""
