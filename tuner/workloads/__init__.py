"""Tuning workloads: one search (warm start, MetaSchedule on Ray, verification and re-measurement), a list of them
(``schedhub tune``), as Ray Jobs, claims verified, records re-timed, cost models published. Imports only ``execution``."""
