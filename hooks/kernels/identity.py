"""Workload identity on the TVM side: canonical strings → the registry's content address.

- canonical workload: the PrimFunc's TVMScript with its parameters renamed ``arg0..argN`` and
  comment lines dropped. Parameter names come from Relax variable names (``x``, ``l1_bias``), so
  without the rename one dense layer in two models would get two keys.
- canonical target: the target's ``export()`` as sorted JSON (see registry.canonical_target).
- compiler fingerprint: TVM and tvm-ffi versions plus the hashes of the loaded libtvm builds.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

import tvm
from tvm import tirx

from schedhub.registry import SCHEMA_VERSION, Identity, canonical_target, check_workload_source, fit_op, record_key, vouch_for

from .cache import KernelCache
from .renaming import rename_parameters

_SBLOCK = re.compile(r'T\.sblock\("([^"]+)"\)')


def plain_json(obj: Any) -> Any:
    """A TVM value made of FFI containers and IntImm/FloatImm, as plain JSON values."""
    return json.loads(json.dumps(obj, default=_ffi_default))


def _ffi_default(obj: Any) -> Any:
    if hasattr(obj, "value") and isinstance(obj.value, (int, float, bool)):
        return obj.value
    if hasattr(obj, "items"):
        return {str(k): v for k, v in obj.items()}
    if hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes)):
        return list(obj)
    return str(obj)


def as_module(func: tvm.IRModule | tirx.PrimFunc) -> tvm.IRModule:
    """One PrimFunc as a module whose function is ``main``, without its ``global_symbol``.

    The compile path hands MetaSchedule kernels with ``global_symbol = "main"``, task extraction
    without: a name, not semantics, so the identity leaves it out.
    """
    if isinstance(func, tvm.IRModule):
        prim = [f for _, f in func.functions_items() if isinstance(f, tirx.PrimFunc)]
        if len(prim) != 1:
            raise ValueError(f"expected a module of one PrimFunc, found {len(prim)}")
        func = prim[0]
    if func.attrs is not None and "global_symbol" in func.attrs:
        func = func.without_attr("global_symbol")
    return tvm.IRModule({"main": func})


def canonical_workload(func: tvm.IRModule | tirx.PrimFunc) -> str:
    """TVMScript of the workload, parameters renamed ``arg0..argN``, comment lines dropped."""
    return rename_parameters(as_module(func).script())


def workload_module(text: str) -> tvm.IRModule:
    """Parse a canonical workload text back into MetaSchedule's workload form (``main``, public), a module of the
    caller's own.

    TVMScript's parser evaluates Python, so a text that is not plain TVMScript data is refused
    first (``InvalidRecord``), whoever sent it."""
    return tvm.IRModule({"main": _workload_main(text)})


@functools.lru_cache(maxsize=128)
def _workload_main(text: str) -> tvm.tirx.PrimFunc:
    """``text``'s PrimFunc, parsed once a process: 0.1–0.2 s a convolution, which a tuning worker paid again for every
    workload of its warm cost model's log each round. A PrimFunc is immutable; a refused text is not kept."""
    check_workload_source(text)
    parsed = tvm.script.from_source(text)
    func = parsed["main"] if isinstance(parsed, tvm.IRModule) else parsed
    return func.with_attr("global_symbol", "main")


def target_text(target: tvm.target.Target | dict[str, Any] | str) -> str:
    """The canonical text of a target as TVM completes it (a dict or a string is made a Target first, so
    ``{"kind": "llvm"}`` and ``Target({"kind": "llvm"})`` name the same target: the keys TVM adds included)."""
    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    return canonical_target(plain_json(target.export()))


def target_from_text(text: str) -> tvm.target.Target:
    return tvm.target.Target(json.loads(text))


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """What decides the code TVM emits: versions and the hashes of the libtvm builds in use."""
    parts = [f"tvm={tvm.__version__}"]
    try:
        import tvm_ffi

        parts.append(f"tvm-ffi={tvm_ffi.__version__}")
    except ImportError:  # a source build without the separate ffi package
        pass
    parts.append(f"libtvm={_library_digest()}")
    return ";".join(parts)


def _library_digest() -> str:
    """sha256 (16 hex) over the libtvm libraries: from the wheel's RECORD, else from the files."""
    hashes = []
    try:
        for f in importlib.metadata.distribution("apache-tvm").files or []:
            if f.name.startswith("libtvm") and f.name.endswith(".so") and f.hash is not None:
                hashes.append(f"{f.name}:{f.hash.value}")
    except importlib.metadata.PackageNotFoundError:
        pass
    if not hashes:  # a source build: hash the loaded libraries themselves (slower, once a process)
        lib_dir = Path(tvm.__file__).parent
        for path in sorted(lib_dir.rglob("libtvm*.so")):
            hashes.append(f"{path.name}:{hashlib.sha256(path.read_bytes()).hexdigest()}")
    return hashlib.sha256("\n".join(sorted(hashes)).encode()).hexdigest()[:16]


def block_names(mod: tvm.IRModule) -> list[str]:
    """The names of a module's blocks in the order its TVMScript writes them (traces address blocks by them)."""
    return _SBLOCK.findall(mod.script())


def op_name(func: tvm.IRModule | tirx.PrimFunc, script: str | None = None) -> str:
    """A readable op name when TVM gave none (e.g. a MetaSchedule database): its block names."""
    names = [n for n in dict.fromkeys(_SBLOCK.findall(script or as_module(func).script())) if n != "root"]
    return ("fused_" if len(names) > 1 else "") + "_".join(names) if names else "main"


def args_info(func: tvm.IRModule | tirx.PrimFunc) -> list[Any]:
    """MetaSchedule ArgInfo JSON of the kernel; ``[["DYNAMIC", "", []]]`` for symbolic shapes, which
    MetaSchedule cannot tune (the compile goes on: such kernels are looked up, never reported)."""
    from tvm.s_tir import meta_schedule as ms

    try:
        return [plain_json(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(as_module(func)["main"])]
    except (TypeError, ValueError, RuntimeError):  # the FFI raises TypeError for symbolic dimensions
        return [["DYNAMIC", "", []]]


def workload_identity(func: tvm.IRModule | tirx.PrimFunc, target: tvm.target.Target | dict[str, Any] | str, op: str | None = None,
                      cache: KernelCache | None = None) -> Identity:  # fmt: skip
    """The registry identity of one kernel for one target under this compiler; ``cache`` keeps the
    canonical text and ArgInfo of a kernel's exact TVMScript (parameter names included) per machine."""
    module = as_module(func)
    script = module.script()
    tgt = target_text(target)
    fingerprint = compiler_fingerprint()
    entry = cache.get("identity", fingerprint, script) if cache is not None else None
    if entry is not None and isinstance(entry.get("workload"), str) and isinstance(entry.get("args_info"), list):
        workload, info = entry["workload"], entry["args_info"]
    else:
        workload, info = rename_parameters(script), args_info(module)
        if cache is not None:
            cache.put("identity", (fingerprint, script), {"workload": workload, "args_info": info})
    identity = Identity(
        key=record_key(fingerprint, tgt, workload), schema=SCHEMA_VERSION, fingerprint=fingerprint,
        target=tgt, workload=workload, op=fit_op(op or op_name(module, script)), args_info=info,
    )  # fmt: skip
    vouch_for(identity)  # printed here: a record carrying it is read without its workload parsed again
    return identity


def kept_identity(obj: Any) -> Identity | None:
    """An identity as this machine's kernel cache kept it (``Identity.to_dict()``): read as written, as the cache's
    identity entries are (the cache is this machine's own), its key derived again from its fields, so that an entry of
    another shape is none; None for one that is not."""
    fields = ("key", "schema", "fingerprint", "target", "workload", "op")
    if not isinstance(obj, dict) or not all(isinstance(obj.get(name), str) for name in fields) or not isinstance(obj.get("args_info"), list):
        return None
    if obj["schema"] != SCHEMA_VERSION or record_key(obj["fingerprint"], obj["target"], obj["workload"]) != obj["key"]:
        return None
    identity = Identity(**{name: obj[name] for name in fields}, args_info=obj["args_info"])
    vouch_for(identity)
    return identity
