"""Benchmarks: each ``<name>.py`` measures one goal against a named baseline; ``python -m benchmarks`` runs them all."""
