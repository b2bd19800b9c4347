"""Tuning networks: the shipped models and the kernels a model compiles to, what a bulk run covers (plans), the rounds
that tune a network where its time goes, its estimate and its compiled timing, op profiles. Imports ``execution`` and
``workloads``."""
