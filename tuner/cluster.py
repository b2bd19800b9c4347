"""Ray: joining or starting a cluster, and the three kinds of task the tuner runs on it.

- build tasks take one CPU each and run in parallel;
- measurement tasks take one unit of :data:`MEASURE_RESOURCE`, which each node offers once, so
  two kernels are never timed at once on one device, *and* as many CPUs as the kernel runs
  threads (the target's ``num-cores``, at most a node's CPUs): builds only use the cores the
  measurement leaves free, so they cannot disturb its timings (on a 2-core node timing a
  2-thread kernel, nothing else runs beside it);
- tuning-job tasks run one search each (several jobs share the cluster and its devices).

Every task takes and returns canonical msgpack bytes (``registry.packb``): Ray moves only bytes
and references to importable functions, never pickled application objects.
"""

from __future__ import annotations

import functools
import importlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

from schedhub.registry import packb, unpackb

#: One unit per node: the right to time kernels on its CPU.
MEASURE_RESOURCE = "schedhub_measure_cpu"
_TEMP_ROOT = "/tmp/schedhub-ray"  # short: Ray's socket paths must stay under 107 bytes
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class ClusterError(RuntimeError):
    """Ray could not be started or joined, or it lacks what tuning needs."""


def configure_environment() -> None:
    """Ray settings that must be in the environment before ``import ray``."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray 2.60's ray.init() turns token auth on and then `ray job submit` needs it: one mode
    # everywhere; the embedded default is a loopback-only local cluster.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # A tuning task waits in ray.get for its builds, so a node runs more workers than CPUs. Ray's
    # default keeps only num_cpus idle workers and kills the rest after a second; each replacement
    # re-imports TVM (seconds) on the CPUs the measurements need. Keeping a few more idle workers
    # made tuning a ResNet-18's 22 kernels 3.4x faster (117 s -> 34 s at 4 trials each).
    os.environ.setdefault("RAY_num_workers_soft_limit", str(2 * (os.cpu_count() or 1) + 4))


def start(address: str | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Join the cluster at ``address`` (``"auto"``, ``ray://…``, ``host:port``) or start a local one.

    A local cluster offers this machine's CPUs and one :data:`MEASURE_RESOURCE`. Returns Ray's
    context information; a second call in one process returns the running connection's.
    """
    configure_environment()
    if address is None:  # inside a Ray Job (or a shell that chose a cluster): join that cluster
        address = os.environ.get("RAY_ADDRESS")
    import ray

    if not ray.is_initialized():
        if address in (None, "", "local"):
            _loopback_only()
            os.makedirs(_TEMP_ROOT, exist_ok=True)
            ray.init(
                address="local", num_cpus=num_cpus or os.cpu_count() or 1, resources={MEASURE_RESOURCE: 1},
                include_dashboard=False, _temp_dir=tempfile.mkdtemp(dir=_TEMP_ROOT), log_to_driver=False,
                _node_ip_address="127.0.0.1",  # embedded: loopback only (other local drivers may join)
                configure_logging=False,
            )  # fmt: skip
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    if not ray.cluster_resources().get(MEASURE_RESOURCE):
        raise ClusterError(
            f"the Ray cluster offers no {MEASURE_RESOURCE!r} resource: start each node with "
            f"ray start ... --resources '{{\"{MEASURE_RESOURCE}\": 1}}'"
        )
    return {"address": ray.get_runtime_context().gcs_address, "resources": ray.cluster_resources()}


def _loopback_only() -> None:
    """Confine the embedded cluster to 127.0.0.1.

    Ray's servers listen on every interface and advertise the node's outward address, and the
    embedded cluster runs without Ray's token auth: anyone who could reach it could run code.
    In Ray's single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) the node address is
    127.0.0.1 and every Ray server binds the loopback interface only. Ray reads the variable on
    import (its servers read it from their environment): when Ray was imported before, its
    constant is switched here too.
    """
    from ray._private import ray_constants

    os.environ[_LOOPBACK_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def stop() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


#: What each kind of task runs (module, function) and how Ray schedules it. Named, not imported:
#: the task bodies (search, verify) submit tasks themselves, so importing them here would be a cycle.
#: A killed Ray worker re-runs a build or measurement; a candidate that fails to build is a result, not an error.
TASKS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "build": ("schedhub.tuner.kernels", "build", {"num_cpus": 1, "max_retries": 2}),
    "measure": ("schedhub.tuner.kernels", "measure", {"num_cpus": 1, "resources": {MEASURE_RESOURCE: 1}, "max_retries": 2}),
    "tune": ("schedhub.tuner.search", "tune_job", {"num_cpus": 1, "max_retries": 0}),
    "verify": ("schedhub.tuner.verify", "verify_job", {"num_cpus": 1, "max_retries": 1}),
}


def run_task(kind: str, payload: bytes) -> bytes:
    """The body of every task: the kind's function on msgpack keyword arguments, its dict result as msgpack."""
    module, name, _ = TASKS[kind]
    fn: Callable[..., dict[str, Any]] = getattr(importlib.import_module(module), name)
    return packb(fn(**unpackb(payload)))


@functools.lru_cache(maxsize=1)
def tasks() -> dict[str, Any]:
    """The Ray remote function of each kind in :data:`TASKS`."""
    configure_environment()
    import ray

    return {kind: ray.remote(**options)(run_task) for kind, (_, _, options) in TASKS.items()}


def submit(kind: str, *, cpus: int | None = None, **kwargs: Any) -> Any:
    """Start a task of ``kind`` with keyword arguments (plain values); returns its ObjectRef.

    ``cpus`` overrides the CPUs the task holds (measurement: the kernel's threads).
    """
    fn = tasks()[kind]
    if cpus is not None:
        fn = fn.options(num_cpus=cpus)
    return fn.remote(kind, packb(kwargs))


def measure_cpus(target_text: str) -> int:
    """CPUs a measurement holds: the threads the target's kernels run (num-cores), capped by a node's CPUs."""
    import json

    cores = int(json.loads(target_text).get("num-cores") or 1)
    return max(1, min(cores, _largest_measuring_node()))


@functools.lru_cache(maxsize=1)
def _largest_measuring_node() -> int:
    import ray

    sizes = [int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive") and n["Resources"].get(MEASURE_RESOURCE)]
    return max(sizes, default=1)


def result(ref: Any, timeout: float | None = None) -> dict[str, Any]:
    """Wait for a task started by :func:`submit` and decode its answer."""
    import ray

    return unpackb(ray.get(ref, timeout=timeout))
