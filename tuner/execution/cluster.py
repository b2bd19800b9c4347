"""Ray: joining or starting a cluster, and the three kinds of task the tuner runs on it.

- build tasks take one CPU each and run in parallel;
- measurement tasks of CPU kernels take one unit of :data:`MEASURE_RESOURCE`, which each node
  offers once, so two kernels are never timed at once on one device, *and* as many CPUs as the
  kernel runs threads (the target's ``num-cores``, at most a node's CPUs): builds only use the
  cores the measurement leaves free, so they cannot disturb its timings (on a 2-core node timing
  a 2-thread kernel, nothing else runs beside it);
- measurement tasks of CUDA kernels take one of Ray's ``GPU`` units: a node offers one per GPU,
  and Ray pins the task to its GPU (``CUDA_VISIBLE_DEVICES``), so a node with several GPUs times
  several kernels at once, each alone on its device. Builds of CUDA kernels run on nodes that
  offer :data:`CUDA_BUILD_RESOURCE`: TVM without the CUDA runtime keeps CUDA C source that no GPU
  can load (see :func:`placement`);
- tuning-job tasks run one search each (several jobs share the cluster and its devices).

Every task takes and returns canonical msgpack bytes (``registry.packb``): Ray moves only bytes
and references to importable functions, never pickled application objects.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from schedhub.registry import packb, target_kind, unpackb

from . import cores
from .tvm_env import compiles_cuda, import_tvm_without_torch

#: One unit per node: the right to time kernels on its CPU.
MEASURE_RESOURCE = "schedhub_measure_cpu"
#: Offered by nodes whose TVM compiles CUDA to machine code (it has the CUDA runtime); a CUDA build takes a sliver.
CUDA_BUILD_RESOURCE = "schedhub_build_cuda"
_CUDA_BUILD_SHARE = 0.001
_NODE_SHARE = 0.001  # a sliver of a node's own "node:<address>" resource: a bundle that asks for it lands there
_TEMP_ROOT = "/tmp/schedhub-ray"  # short: Ray's socket paths must stay under 107 bytes
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
log = logging.getLogger("schedhub.tuner")


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


def start(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None, resources: dict[str, float] | None = None) -> dict[str, Any]:
    """Join the cluster at ``address`` (``"auto"``, ``ray://…``, ``host:port``) or start a local one.

    A local cluster offers this machine's CPUs, one :data:`MEASURE_RESOURCE`, its GPUs (``num_gpus``;
    by default the ones Ray detects) and, when this machine's TVM compiles CUDA,
    :data:`CUDA_BUILD_RESOURCE`, and ``resources`` besides (as ``ray start --resources`` does).
    Returns Ray's context information; a second call in one process returns the running connection's.
    """
    configure_environment()
    if address is None:  # inside a Ray Job (or a shell that chose a cluster): join that cluster
        address = os.environ.get("RAY_ADDRESS")
    import ray

    if not ray.is_initialized():
        try:
            if address in (None, "", "local"):
                _loopback_only()
                os.makedirs(_TEMP_ROOT, exist_ok=True)
                cpus = num_cpus or os.cpu_count() or 1
                offered = {MEASURE_RESOURCE: 1, **({CUDA_BUILD_RESOURCE: cpus} if compiles_cuda() else {}), **(resources or {})}
                ray.init(
                    address="local", num_cpus=cpus, num_gpus=num_gpus, resources=offered,
                    include_dashboard=False, _temp_dir=tempfile.mkdtemp(dir=_TEMP_ROOT), log_to_driver=False,
                    _node_ip_address="127.0.0.1",  # embedded: loopback only (other local drivers may join)
                    configure_logging=False,
                )  # fmt: skip
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # Ray raises RuntimeError, ConnectionError, TimeoutError… (a loaded machine's slow start among them)
            ray.shutdown()  # nothing half-started left behind
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            where = "start a local Ray cluster" if address in (None, "", "local") else f"join the Ray cluster at {address}"
            raise ClusterError(f"could not {where} ({first}); try again, or start one with `ray start --head` and pass "
                               f"--ray-address auto") from exc
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
    "build": ("schedhub.tuner.execution.kernels", "build", {"num_cpus": 1, "max_retries": 2}),
    "measure": ("schedhub.tuner.execution.kernels", "measure", {"num_cpus": 1, "max_retries": 2}),  # placed by placement()
    "probe": ("schedhub.tuner.execution.kernels", "probe_gpu", {"num_cpus": 0, "num_gpus": 1, "max_retries": 0}),
    "tune": ("schedhub.tuner.workloads.search", "tune_job", {"num_cpus": 1, "max_retries": 0}),
    "verify": ("schedhub.tuner.workloads.verify", "verify_job", {"num_cpus": 1, "max_retries": 1}),
}


#: Kinds of task that run on the cores a GPU node leaves them (:mod:`.cores`): a measurement alone on its GPU's core.
_CONFINED = frozenset({"build", "measure", "tune", "verify"})


def run_task(kind: str, payload: bytes) -> bytes:
    """The body of every task: the kind's function on msgpack keyword arguments, its dict result as msgpack."""
    module, name, _ = TASKS[kind]
    import_tvm_without_torch()  # no task handles a PyTorch tensor: a worker starts seconds sooner
    if kind in _CONFINED:
        cores.confine(measures_on_gpu=kind == "measure")
    fn: Callable[..., dict[str, Any]] = getattr(importlib.import_module(module), name)
    return packb(fn(**unpackb(payload)))


@functools.lru_cache(maxsize=1)
def tasks() -> dict[str, Any]:
    """The Ray remote function of each kind in :data:`TASKS`."""
    configure_environment()
    import ray

    return {kind: ray.remote(**options)(run_task) for kind, (_, _, options) in TASKS.items()}


def submit(kind: str, *, placed: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Start a task of ``kind`` with keyword arguments (plain values); returns its ObjectRef.

    ``placed``: Ray options that override the kind's (:func:`placement` of a build or measurement).
    """
    fn = tasks()[kind]
    if placed:
        fn = fn.options(**placed)
    return fn.remote(kind, packb(kwargs))


class UnsupportedKind(ClusterError):
    """A target kind the tuner cannot build and time kernels for."""


def placement(task: str, target_text: str) -> dict[str, Any]:
    """Ray options of a ``"build"`` or ``"measure"`` task for kernels of a canonical target."""
    from schedhub.registry import target_kind

    kind = target_kind(target_text)
    if kind == "llvm":
        if task == "build":
            return {"num_cpus": 1}
        return {"num_cpus": measure_cpus(target_text), "resources": {MEASURE_RESOURCE: 1}}
    if kind == "cuda":
        if task == "build":
            return {"num_cpus": 1, "resources": {CUDA_BUILD_RESOURCE: _CUDA_BUILD_SHARE}}
        return {"num_cpus": 1, "num_gpus": 1}
    raise UnsupportedKind(f"the tuner builds and times llvm and cuda kernels, not {kind or 'unknown'!r} ones")


def check_feasible(target_text: str) -> None:
    """Raise :class:`ClusterError` unless the cluster offers what building and timing kernels of the
    target take (Ray would otherwise wait forever for a node that does not exist)."""
    import ray

    offered = ray.cluster_resources()
    for task in ("build", "measure"):
        lacking = _lacking(task, target_text, offered)
        if lacking:
            raise ClusterError(
                f"no node of this Ray cluster can {task} kernels for {target_text}: none offers {', '.join(lacking)}"
                + (f" (a GPU node whose TVM has the CUDA runtime offers {CUDA_BUILD_RESOURCE} when started by schedhub, or with "
                   f"ray start --resources '{{\"{CUDA_BUILD_RESOURCE}\": <CPUs>}}')" if CUDA_BUILD_RESOURCE in lacking else "")
            )  # fmt: skip


def _lacking(task: str, target_text: str, offered: dict[str, float]) -> list[str]:
    """The resources a :func:`placement` of ``task`` needs that no node of the cluster (``offered``) has."""
    placed = placement(task, target_text)
    wanted = {**placed.get("resources", {}), **({"GPU": placed["num_gpus"]} if placed.get("num_gpus") else {})}
    return sorted(name for name in wanted if not offered.get(name))


def measurable(host_cpu: str, probe_secs: float = 180.0) -> list[tuple[str, str]]:
    """The (target kind, device model) pairs this cluster can time kernels for, as the queue names them.

    CPU: ``host_cpu`` when some node offers :data:`MEASURE_RESOURCE`. CUDA: the architectures a
    GPU runs code for (``kernels.probe_gpu``), asked of the GPU itself by a task that holds one,
    when the cluster offers GPUs and a node that compiles CUDA; a GPU that is declared
    but cannot be used (no driver, no runtime) or no answer within ``probe_secs`` gives none.
    """
    import ray

    offered = ray.cluster_resources()

    def feasible(kind: str) -> bool:
        return not any(_lacking(task, f'{{"kind":"{kind}"}}', offered) for task in ("build", "measure"))

    out = [("llvm", host_cpu)] if feasible("llvm") else []
    if feasible("cuda"):
        try:
            answer = result(submit("probe"), timeout=probe_secs)
        except Exception:  # all GPUs busy for minutes, or the task died: no CUDA work this time
            answer = {"archs": []}
        out += [("cuda", arch) for arch in answer["archs"]]
    return out


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


def search_threads(target_text: str, jobs: int) -> int:
    """MetaSchedule's search threads for each of ``jobs`` tuning jobs that may share one node (0: one job, all its
    physical cores, as MetaSchedule's default). Several jobs split the CPUs of the smallest node that times the
    target's kernels, less those a measurement holds there: each job's search otherwise starts a thread per core,
    so four jobs ran four times the node's cores in threads beside the builds and the measurement they wait for."""
    if jobs <= 1:
        return 0
    import ray

    gpu = target_kind(target_text) == "cuda"
    sizes = [int(n["Resources"].get("CPU", 0)) for n in ray.nodes()
             if n.get("Alive") and (n["Resources"].get("GPU") if gpu else n["Resources"].get(MEASURE_RESOURCE))]  # fmt: skip
    cpus = min(sizes, default=1)
    return share_of(cpus, 1 if gpu else measure_cpus(target_text), jobs)


def share_of(cpus: int, measuring: int, jobs: int) -> int:
    """Each of ``jobs`` searches' threads on a node of ``cpus`` CPUs whose measurement holds ``measuring``: at least one."""
    return max(1, (cpus - measuring) // max(1, jobs))


@contextlib.contextmanager
def holding_driver_cpu(wait_secs: float = 60.0) -> Iterator[bool]:
    """Hold one CPU of this process's own Ray node while the block does CPU work outside Ray (the driver
    drawing synthesized seeds): a CPU measurement holds every CPU its kernel runs threads on, so with this
    held none starts on this node until the block ends, and none is running when it begins. Without it a
    1.7 ms convolution was timed at 68 ms beside the sampling (2 cores; TVM's threads wait for each other).

    Yields whether the CPU is held: not when Ray is not running, when this node times no kernels, or when
    no CPU came free within ``wait_secs`` (the block runs anyway; it is logged).
    """
    import ray

    if not ray.is_initialized():
        yield False
        return
    node_id = ray.get_runtime_context().get_node_id()
    node = next((n for n in ray.nodes() if n["NodeID"] == node_id and n.get("Alive")), None)
    if node is None or not node["Resources"].get(MEASURE_RESOURCE) or not node["Resources"].get("CPU"):
        yield False
        return
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1, f"node:{node['NodeManagerAddress']}": _NODE_SHARE}])
    try:
        try:
            ray.get(group.ready(), timeout=wait_secs)
            held = True
        except ray.exceptions.GetTimeoutError:
            log.warning("schedhub: no CPU of this node came free in %.0f s: drawing seeds beside whatever runs", wait_secs)
            held = False
        yield held
    finally:
        remove_placement_group(group)


def result(ref: Any, timeout: float | None = None) -> dict[str, Any]:
    """Wait for a task started by :func:`submit` and decode its answer."""
    import ray

    return unpackb(ray.get(ref, timeout=timeout))


BUILD_TIMEOUT_SECS = 60.0  # LLVM can take practically forever on some unrolled kernels; MetaSchedule's LocalBuilder gives each 30 s


def build_result(ref: Any, timeout: float = BUILD_TIMEOUT_SECS) -> dict[str, Any]:
    """The answer of a ``"build"`` task (``{"artifact", "error", "start", "end", ...}``), or one without an artifact that
    says why: still building ``timeout`` seconds after the wait began (the task is cancelled), or lost (after Ray's retries)."""
    import ray

    try:
        return result(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        return {"artifact": None, "error": f"build timed out after {timeout:.0f} s"}
    except Exception as exc:  # the task itself died
        return {"artifact": None, "error": f"build task lost: {exc}"}
