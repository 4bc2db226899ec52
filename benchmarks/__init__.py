"""Benchmarks of the streamproc pipeline (not tests): ``scripts/bench`` runs :mod:`benchmarks.pipeline`."""
