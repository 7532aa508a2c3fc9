"""The ground layer of tritonflow: what every other package may import, and which imports none of them.

It holds the exception hierarchy (:mod:`ground.exceptions`, with the retry decision), file
checksums (:mod:`ground.checksums`), the settings (:mod:`ground.settings`, each declared once with its default,
doc and check; the checks and list-valued parsers in :mod:`ground.values`, the rules that relate
two settings in :mod:`ground.settings_checks`) and the shared-database leases and state
(:mod:`ground.coordination`) that serialise what changes serving across processes and hosts.

Nothing here imports ``tritonflow``, ``model_registry``, ``repository_sync``, ``drift_checks`` or
the Airflow plugin; ``scripts/lint.sh`` enforces it with import-linter.
"""
