"""schedhub benchmarks (not installed): run as ``python -m bench.<name>`` from the repository root."""
