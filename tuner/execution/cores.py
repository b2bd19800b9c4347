"""Which CPUs of a GPU node each tuning task runs on: every GPU's measurement alone on a core of its own.

A GPU kernel is timed by CUDA events around ``number`` launches from one host thread: when that thread is
preempted between launches the GPU idles and the idle time is counted as the kernel's. On a GPU node the
builds of several tuning jobs and their searches (each job's search threads) run beside the measurement on
the same CPUs, so under load the timings the searches learn from are off. On a node that offers GPUs, a
task that times kernels on GPU ``i`` runs on core ``reserved_cores(...)[i]`` alone and every other task
(builds, searches, verification) runs on the remaining cores. Nodes without GPUs are left alone: there a
CPU measurement holds as many of Ray's CPUs as its kernel runs threads (``cluster.placement``).

``SCHEDHUB_MEASURE_CORE=shared`` in the environment the cluster starts with turns the reservation off
(``bench loadaware`` compares both).
"""

from __future__ import annotations

import functools
import os

#: The environment setting that turns the reservation off ("shared"); anything else, or unset, keeps it.
SETTING = "SCHEDHUB_MEASURE_CORE"
SHARED = "shared"
#: The CPUs this process could run on when this module was imported: a reused Ray worker narrows its own
#: affinity per task, and the next task (of another kind) starts from these again.
_NODE_CPUS: tuple[int, ...] = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()


def reserved_cores(cpus: tuple[int, ...], gpus: int) -> tuple[int, ...]:
    """The cores a node of ``cpus`` keeps for its ``gpus`` GPUs' measurements, GPU ``i``'s at index ``i``: the last
    ones, one each, and never all of them (a node with as many GPUs as cores reserves all but one)."""
    count = max(0, min(gpus, len(cpus) - 1))
    return tuple(reversed(cpus[len(cpus) - count :]))


def cores_for(measuring_gpu: int | None, cpus: tuple[int, ...], gpus: int) -> tuple[int, ...]:
    """The cores a task runs on: GPU ``measuring_gpu``'s reserved core for its measurement, the rest for any other
    task (``measuring_gpu`` None); every core where nothing is reserved, or a GPU index past the reservation."""
    reserved = reserved_cores(cpus, gpus)
    if not reserved:
        return cpus
    if measuring_gpu is not None:
        return (reserved[measuring_gpu],) if 0 <= measuring_gpu < len(reserved) else cpus
    return tuple(c for c in cpus if c not in reserved)


def enabled() -> bool:
    return os.environ.get(SETTING, "").strip().lower() != SHARED


def confine(measures_on_gpu: bool) -> tuple[int, ...] | None:
    """Narrow this Ray worker process (all its threads) to the cores its task may use on this node (:func:`cores_for`):
    ``measures_on_gpu`` for a task that holds a GPU and times kernels on it. Returns the cores, or None where nothing
    changed (no GPU on this node, the reservation off, or not in a Ray worker)."""
    if not _NODE_CPUS or not enabled():
        return None
    gpus = _node_gpus()
    if not gpus:
        return None
    gpu = _assigned_gpu() if measures_on_gpu else None
    cores = cores_for(gpu, _NODE_CPUS, gpus)
    _set_affinity(cores)
    return cores


@functools.lru_cache(maxsize=1)
def _node_gpus() -> int:
    """The GPUs the Ray node this worker runs on offers (0 outside Ray)."""
    import ray

    if not ray.is_initialized():
        return 0
    node_id = ray.get_runtime_context().get_node_id()
    return next((int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["NodeID"] == node_id), 0)


def _assigned_gpu() -> int | None:
    """The index of the GPU Ray gave this task on its node (None if none)."""
    import ray

    ids = ray.get_gpu_ids()
    try:
        return int(ids[0]) if ids else None
    except (TypeError, ValueError):  # a GPU named by UUID: no index to reserve by
        return None


def _set_affinity(cores: tuple[int, ...]) -> None:
    """Every thread of this process (TVM's pools and MetaSchedule's search threads start from the calling one's) on ``cores``."""
    wanted = set(cores)
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, wanted)
        except OSError:  # the thread ended meanwhile
            continue


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]
