"""Benchmarks: ``python -m speechkernels.bench ctc`` (see ``--help``)."""
