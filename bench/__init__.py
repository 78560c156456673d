"""Benchmarks that compare side by side in one run; each module runs alone with ``python -m bench NAME``."""
