"""Scheduled kernels' machine code, compiled once per machine and linked into later builds.

In a compile where every kernel hits, most of the time goes to LLVM generating code for the tuned
kernels (unrolled, vectorized loops: on ResNet-18 about 3× the plain build's codegen), not to the
hook. So each kernel the session scheduled is compiled on its own, once, under a symbol of its own
(in the background from the moment its schedule is known: on a first compile, codegen runs while
the hook looks up and replays the kernels after it), and kept as an object file beside the kernel cache (``<cache>/objects/<id>.o``; the id is the
scheduled-kernel cache name: the kernel's key, the trace and the bounds), with the SHA-256 of its bytes beside it
(``<id>.o.sha256``): an object that does not match it (overwritten, truncated) is compiled again before it is
linked, where a damaged one made every later load of the model fail. In the build the Relax
call of such a kernel becomes a call of that symbol (``call_dps_packed``), its PrimFunc leaves the
module, and the object rides in the module's ``external_mods`` as a static library, which TVM links
when the executable is first loaded or exported (``Executable.jit`` / ``export_library``: a C
compiler is needed, so without one nothing changes).

Only llvm targets for this machine's triple are linked this way (not a cross-compile, and not a
``system_lib`` build: compile those with ``use(..., link=False)``); reshape kernels stay (Relax
turns them into views) and so does a kernel called with symbolic shape arguments.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

import tvm
from tvm import relax, tirx
from tvm.relax.analysis import all_global_vars, has_reshape_pattern, post_order_visit

from ..kernels.background import KernelWork
from ..kernels.cache import KernelCache, Untold, atomic_file, digest_path, keep_digest, mark_used, read_if_intact
from ..kernels.errors import TVM_ERRORS
from ..kernels.relax_mutation import mutate_relax_functions

OBJECT_ID = "schedhub.object_id"  # PrimFunc attribute: the cache name of a scheduled kernel's machine code
ELF_MAGIC = b"\x7fELF"
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


def links_here(target: tvm.target.Target) -> bool:
    """Whether objects built for ``target`` link with this machine's C compiler: an llvm target for
    this machine's triple (any CPU model: a build for another one runs or not as it would unlinked)."""
    if target.kind.name != "llvm":
        return False
    triple = str(target.attrs.get("mtriple", "") or "")
    return not triple or triple == str(tvm.target.codegen.llvm_get_system_triple())


def c_compiler_available() -> bool:
    """Whether TVM finds the C compiler it links static libraries with."""
    from tvm.support import cc

    return cc.get_cc() is not None


class Linked(NamedTuple):
    """What one build linked: objects, and of those, compiled in this build (the rest were cached); and the kernels
    whose scheduled code TVM could not build (left in the module, with why: the caller must not build them either)."""

    linked: int
    compiled: int
    unbuildable: tuple[tuple[tvm.ir.GlobalVar, Exception], ...] = ()


class ObjectCache(KernelWork[str]):
    """Object files of scheduled kernels under ``root``; counts what it linked and compiled.

    Missing objects are compiled in the background, ``workers`` at a time (default: one per CPU):
    LLVM runs without Python's GIL, and a plain build's codegen is one thread. The hook starts each
    kernel's compile as soon as its schedule is known (:meth:`start`), so codegen overlaps the
    lookups and replays of the kernels after it; :meth:`link` waits for what it links."""

    def __init__(self, root: str | os.PathLike[str], workers: int | None = None) -> None:
        super().__init__(workers, "schedhub-objects")  # by file id: compiling (None once the object is written)
        self.root = Path(root)
        self.linked = self.compiled = 0
        self.failed = Untold()  # an object that could not be compiled or written, and why

    @staticmethod
    def symbol(file_id: str) -> str:
        return "schedhub_" + file_id.rsplit("-", 1)[-1][:40]

    @staticmethod
    def build_id(target: tvm.target.Target) -> tuple[str, ...]:
        """What besides the scheduled kernel decides its machine code: the target as given and the build's pass configuration."""
        ctx = tvm.transform.PassContext.current()
        config = sorted((str(k), str(v)) for k, v in dict(ctx.config).items())
        return str(target.export()), str(ctx.opt_level), repr(config)

    @staticmethod
    def file_id(object_id: str, build: tuple[str, ...]) -> str:
        """The object's name: the scheduled kernel (``OBJECT_ID``) under a :meth:`build_id`."""
        return KernelCache.name("object", object_id, *build)

    def start(self, func: tirx.PrimFunc, target: tvm.target.Target) -> None:
        """Begin compiling the object of a scheduled kernel (marked with ``OBJECT_ID``, as it will be
        in the module :meth:`link` gets, under the current pass configuration) unless it is cached."""
        object_id = object_id_of(func)
        if object_id is not None and not has_reshape_pattern(func):
            self._compiling(self.file_id(object_id, self.build_id(target)), func, target)

    def link(self, mod: tvm.IRModule, target: tvm.target.Target, budget: float | None = None) -> tuple[tvm.IRModule, Linked]:
        """``mod`` with every linkable kernel replaced by a call of its cached object (compiled first when
        missing), and how many objects it links and how many of those were compiled now. A kernel whose object has been
        compiling ``budget`` seconds is given up on (:class:`.background.TooSlow`) and reported unbuildable: its compile
        runs on in the background, where nothing waits for it."""
        build = self.build_id(target)
        plain = _plainly_called(mod)
        wanted: dict[tvm.ir.GlobalVar, str] = {}
        funcs: dict[str, tirx.PrimFunc] = {}
        for gv, func in mod.functions_items():
            object_id = object_id_of(func)
            if object_id is None or gv not in plain or has_reshape_pattern(func):
                continue
            wanted[gv] = self.file_id(object_id, build)
            funcs.setdefault(wanted[gv], func)
        compiling = {f: self._compiling(f, func, target) for f, func in funcs.items()}
        outcomes = {f: self.outcome(f, future, budget) for f, future in compiling.items() if future is not None}  # None: written
        built = {f for f, failure in outcomes.items() if failure is None}
        unbuildable = tuple((gv, outcomes[f]) for gv, f in wanted.items() if isinstance(outcomes.get(f), TVM_ERRORS))
        for f in compiling:
            self._started.pop(f, None)
        libraries = {f: tvm.runtime.load_static_library(str(self._path(f)), [self.symbol(f)]) for f in funcs if compiling[f] is None or f in built}
        for f in libraries:
            mark_used(self._path(f))
            mark_used(digest_path(self._path(f)))  # pruned apart, the object would be compiled again
        symbols = {gv: self.symbol(f) for gv, f in wanted.items() if f in libraries}
        if not symbols:
            return mod, Linked(0, 0, unbuildable)
        done = Linked(len(libraries), len(built), unbuildable)
        self.linked += done.linked
        self.compiled += done.compiled
        out = _CallsToSymbols(symbols, mod).run()
        still_used = {gv for _, f in out.functions_items() if isinstance(f, relax.Function) for gv in all_global_vars(f)}
        for gv in symbols:
            if gv not in still_used:
                del out[gv]
        external = list((mod.attrs or {}).get("external_mods", []))
        return out.with_attr("external_mods", external + list(libraries.values())), done

    def _path(self, file_id: str) -> Path:
        return self.root / f"{file_id}.o"

    def _compiling(self, file_id: str, func: tirx.PrimFunc, target: tvm.target.Target) -> Future[Exception | None] | None:
        """The compile of ``file_id``'s object, started now if it is neither cached nor started; None when it is cached.
        Its result is None once the object is written, else what failed: an ``OSError`` (the object could not be
        written: the model's own build compiles the kernel) or TVM's error (the scheduled kernel does not build)."""
        if file_id not in self._started and intact(self._path(file_id)):
            return None

        def compile_one() -> Exception | None:
            try:
                self._compile(func, self.symbol(file_id), target, self._path(file_id))
            except OSError as exc:
                self.failed.note(exc)
                return exc  # that kernel is built in the model's own module, as without the cache
            except TVM_ERRORS as exc:
                return exc
            return None

        return self._submit(file_id, compile_one, target)

    @staticmethod
    def _compile(func: tirx.PrimFunc, symbol: str, target: tvm.target.Target, path: Path) -> None:
        func = func.without_attr(OBJECT_ID).with_attr("global_symbol", symbol)
        lib = tvm.tirx.build(tvm.IRModule({symbol: func}), target=target)
        with atomic_file(path) as tmp:  # TVM writes an object file for the ".o" suffix
            lib.write_to_file(tmp)
        keep_digest(path)


def object_id_of(func: Any) -> str | None:
    """The scheduled-kernel cache name a PrimFunc carries (``OBJECT_ID``), or None."""
    if not isinstance(func, tirx.PrimFunc) or func.attrs is None:
        return None
    object_id = func.attrs.get(OBJECT_ID)
    return None if object_id is None else str(object_id)


def intact(path: Path) -> bool:
    """Whether ``path`` holds an object file whose bytes match the digest written with it."""
    data = read_if_intact(path)
    return data is not None and data[:4] == ELF_MAGIC


def _plainly_called(mod: tvm.IRModule) -> set[tvm.ir.GlobalVar]:
    """PrimFuncs whose every use is ``call_tir(gv, args)`` without symbolic shape arguments."""
    plain: set[tvm.ir.GlobalVar] = set()
    other: set[tvm.ir.GlobalVar] = set()

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call):
            for i, arg in enumerate(expr.args):
                if isinstance(arg, tvm.ir.GlobalVar):
                    (plain if expr.op.same_as(_CALL_TIR) and i == 0 and len(expr.args) == 2 else other).add(arg)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            post_order_visit(func, visit)
    return plain - other


@relax.expr_functor.mutator
class _CallsToSymbols(relax.PyExprMutator):
    def __init__(self, symbols: dict[tvm.ir.GlobalVar, str], mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.symbols, self.mod = symbols, mod

    def run(self) -> tvm.IRModule:
        return mutate_relax_functions(self, self.mod)

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        if call.op.same_as(_CALL_TIR) and call.args[0] in self.symbols:
            symbol = self.symbols[call.args[0]]
            return relax.Call(_CALL_DPS_PACKED, [relax.ExternFunc(symbol), call.args[1]], call.attrs, call.ty_args)
        return call
