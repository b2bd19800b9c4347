"""One-off studies: each asks one question of the registry, the hook or the tuner, and records its answer under
``bench/results/studies/`` (run as ``python -m bench.studies.<name>``). The benchmark suite (``python -m bench all``) is one
level up."""
