"""How the hook ranks transfer candidates without timing them.

A candidate is a record tuned for another kernel of the same structure. Replayed on the user's
kernel, every tile size that no longer multiplies out to its loop's new extent is re-derived by
TVM, and a re-derived tiling is where a transferred schedule loses its speed (a convolution tuned
at 4×4 pixels ran at 66 GFLOPS; replayed at 6×6, 5). So the hook serves, in order:

1. a record of the very workload under another compiler build (relation ``compiler``);
2. the candidate with the fewest tile sizes re-derived on this kernel;
3. among those, the one with the fewest re-derived tilings that were all ones where it was tuned (a
   loop of extent 1, such as a batch of 1: such a tiling decided nothing, and TVM puts the whole new
   extent in its outermost loop; a matmul tuned at batch 1 is a matrix-vector schedule);
4. among those, the fastest for its work on its own workload (:func:`work` over the record's
   seconds, which a verifier measured for a verified record);
5. then the registry's order (nearest shapes first);
6. last, a schedule synthesized here (relation ``synthesized``, :mod:`.synthesis`): it is only
   ever served once measured, so its place only orders what is measured first.

Step 3 decides only between candidates that re-derive as many tiles, some tuned with a loop of extent 1 and
others with it larger (the MLP tuned at batch 1 and at 64). Judged on every candidate measured at 8 held-out
shapes, each on two registries (``bench.studies.ranking --held-out``), it changed none of the 213 kernels' fit-ranking
picks. What it changes is which candidates a
served model ranks (step 4 competes only within steps 1-3): at batch 16 the model had ranked the MLP's
batch-1 records with its batch-64 ones and run it 1.055x the fit ranking's latency (``bench.studies.growth --family
transformers``, 3 runs); now the batch-64 records are its only contenders and it is the fit ranking's pick.

Where the registry serves a cost model for the kernel's target (trained by a worker on the measurement log,
:mod:`schedhub.tuner.workloads.publish`) that the session trusts, step 4 is the speed the model predicts for the
candidate replayed on this kernel instead (:func:`model_rank_key`), for the kernels whose competing candidates
hold the kernel's own layer at two shapes or more (:func:`model_decides`; ``use(..., rank_by_model=True)``: for
every kernel, False: never). A record's speed at home says little once records of the same layer at
several shapes compete; the model's prediction here does. Where the layer was tuned at one shape, the model
picked no better than the fit ranking: judged on the recorded measurements of every candidate (sums of the
picks' times over the fit ranking's, geometric means over networks), 0.81x on six networks from a registry
that had tuned two shapes, 0.97x from one that had tuned one, 1.00-1.01x on the five recorded quick runs;
through the hook, from a registry that had tuned ResNet-18 and MobileNet-V2 at one shape, ResNet-18 ran
1.05-1.09x the fit ranking's latency in three studies of one fill (1.00x on an earlier fill), and ResNet-18
through torch.export picked 1.19x the fit ranking's kernel time on the quick bench's registry. Asked only
where its layer was tuned at two shapes (none of the one-shape registry's kernels, 15 of ResNet-18's and
28 of MobileNet-V2's on the two-shape one), it ran them 0.89x and 0.94x the fit ranking's latency and
matched it on the one-shape registry (``python -m bench.studies.growth``, ``decides``). Without a served model
the compile does not train one (14-29 s).

bench/ (``python -m bench.studies.ranking``) judges this against nearest-first and the others on
measured candidates.
"""

from __future__ import annotations

import ast
import functools
import math
import re
from typing import Any, NamedTuple

from schedhub.registry import COMPILER, dotted_name

SYNTHESIZED = "synthesized"  # a candidate drawn from the kernel's own design space, not a neighbour's record
REPOSTPROCESSED = "postprocessed here"  # a neighbour's sketch with the target's postprocessors applied again on the kernel
MEASURED_ONLY = (SYNTHESIZED, REPOSTPROCESSED)  # candidates served only once timed on this machine


@functools.lru_cache(maxsize=1024)
def work(workload: str) -> float:
    """A canonical workload's arithmetic, read from its text without TVM: for every block, the
    operators in its stores times the iterations of the loops around it (at least 1, at most 1e30).

    It counts as TVM's FLOP estimate does (equal on 63 of the shipped models' 66 workloads with
    arithmetic; the others differ by a constant within their structure), in ~1 ms where parsing the
    text with TVMScript costs ~180 ms a convolution. Ranking by speed needs only the ratio between
    workloads of one structure.
    """
    return _counted(workload, 0)


@functools.lru_cache(maxsize=1024)
def effort(workload: str) -> float:
    """:func:`work` with every store counted as one operation more, so a kernel that only moves data (a
    transpose, a reshape: no arithmetic) weighs by the elements it writes: what an unscheduled kernel costs."""
    return _counted(workload, 1)


def _counted(workload: str, per_store: int) -> float:
    try:
        tree = ast.parse(workload)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 1.0
    return min(max(_work(tree.body, 1.0, per_store), 1.0), 1e30)


def _work(body: list[ast.stmt], iterations: float, per_store: int) -> float:
    total = 0.0
    for stmt in body:
        if isinstance(stmt, ast.For):
            total += _work(stmt.body, iterations * _trip_count(stmt.iter), per_store)
        elif isinstance(stmt, ast.With) and any(_call_name(item.context_expr) == "T.sblock" for item in stmt.items):
            total += iterations * sum(_operators(s.value) + per_store * _stores(s) for s in stmt.body if isinstance(s, (ast.Assign, ast.AugAssign)))
            total += _work(stmt.body, iterations, per_store)
        elif isinstance(stmt, ast.With) and any(_call_name(item.context_expr) == "T.init" for item in stmt.items):
            continue  # the reduction's initial value: no arithmetic
        elif isinstance(stmt, (ast.With, ast.ClassDef, ast.FunctionDef, ast.If)):
            total += _work(stmt.body, iterations, per_store)
    return total


def _stores(stmt: ast.Assign | ast.AugAssign) -> int:
    """Buffer elements an assignment in a block writes (not its ``T.axis`` bindings)."""
    targets = [stmt.target] if isinstance(stmt, ast.AugAssign) else stmt.targets
    return sum(isinstance(t, ast.Subscript) for t in targets)


def _trip_count(node: ast.expr) -> float:
    """Iterations of ``range(n)`` / ``range(a, b)`` / ``T.grid(n, m, …)`` (``T.int64(n)`` or literals); 1 when not static."""
    if not isinstance(node, ast.Call):
        return 1.0
    sizes = [_literal(a) for a in node.args]
    if _call_name(node) == "range" and len(sizes) == 2:
        return max(sizes[1] - sizes[0], 1.0)
    return math.prod(sizes) if sizes else 1.0


def _literal(node: ast.expr) -> float:
    if isinstance(node, ast.Call) and node.args:
        node = node.args[0]  # T.int64(n)
    value = node.value if isinstance(node, ast.Constant) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 1.0


_NOT_ARITHMETIC = re.compile(r"T\.(u?int\d+|float\d+|bfloat16|bool|Cast|reinterpret|axis\.\w+)")


def _operators(value: ast.expr) -> int:
    """Arithmetic in a block's store, as TVM's FLOP estimate counts it: binary operators and math calls on
    values; not index arithmetic (subscripts), conditions (of ``T.if_then_else``), constants or casts."""
    count, pending = 0, [value]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Subscript, ast.Compare, ast.BoolOp)):
            continue
        name = _call_name(node) if isinstance(node, ast.Call) else ""
        if name == "T.if_then_else":
            pending.extend(node.args[1:])
            continue
        count += isinstance(node, ast.BinOp) or (isinstance(node, ast.Call) and not _NOT_ARITHMETIC.fullmatch(name))
        pending.extend(ast.iter_child_nodes(node))
    return count


def _call_name(node: ast.expr) -> str:
    return dotted_name(node.func) if isinstance(node, ast.Call) else ""


class Retiling(NamedTuple):
    """How a trace's tilings fit a kernel it was not tuned for (:func:`retiled`)."""

    rederived: int  # its SamplePerfectTile decisions TVM re-derived for new extents
    blind: int  # of those, tilings of a loop of extent 1 at home: all ones, they said nothing of how to tile it


def retiled(recorded: list[Any], replayed_trace: Any) -> Retiling:
    """Which ``SamplePerfectTile`` decisions of a trace (its JSON form, ``recorded``) changed when it was
    replayed (``replayed_trace``, the schedule's Trace): tile sizes TVM re-derived for new extents, and how
    many of those had been all ones (a loop of extent 1 where it was tuned, such as a batch of 1)."""
    decisions = {int(i): d for i, d in recorded[1]} if len(recorded) > 1 else {}
    rederived = blind = 0
    for i, inst in enumerate(replayed_trace.insts):
        if inst.kind.name == "SamplePerfectTile" and i in decisions:
            now = replayed_trace.decisions.get(inst)
            was = [int(x) for x in decisions[i]]
            if now is None or [int(x) for x in now] != was:
                rederived += 1
                blind += all(x == 1 for x in was)
    return Retiling(rederived, blind)


def speed(amount: float, secs: float) -> float:
    """Work per second of a record on its own workload; 0 for a time that is not a positive finite number."""
    return amount / secs if math.isfinite(secs) and secs > 0 else 0.0


def rank_key(relation: str, retiling: Retiling, speed: float, order: int) -> tuple[int, int, int, float, int]:
    """Sort key of a candidate (see the module's docstring): smaller is served first. ``retiling``: its tile
    sizes re-derived on this kernel (:func:`retiled`); ``speed``: its work per second on its own workload;
    ``order``: its place in the registry's answer."""
    return (_relation_rank(relation), retiling.rederived, retiling.blind, -speed, order)


def model_rank_key(relation: str, retiling: Retiling, predicted: float, order: int) -> tuple[int, int, int, float, int]:
    """Sort key of a candidate where a cost model ranks (see the module's docstring): as :func:`rank_key`, with
    the speed the model predicts for the candidate on this kernel (log₂ GFLOPS) in place of its speed on its own
    workload."""
    return (_relation_rank(relation), retiling.rederived, retiling.blind, -predicted, order)


def same_layer(args_info: list[Any], other: list[Any]) -> bool:
    """Whether two kernels of one structure are one layer at two shapes: every argument between the first
    input and the output is either of the same dtype and shape in both (a weight, a bias) or shaped as each
    kernel's output (a residual), at least one is the same, and the output shrinks the input alike (a
    convolution's stride). Another layer of the structure differs in a weight (other channels, another
    width) or in its stride, even where its weights' shape is the same."""
    if len(args_info) != len(other) or len(args_info) < 3 or _shrinks(args_info) != _shrinks(other):
        return False
    pairs = list(zip(args_info[1:-1], other[1:-1]))
    same = [a == b for a, b in pairs]
    return any(same) and all(eq or (a == args_info[-1] and b == other[-1]) for eq, (a, b) in zip(same, pairs))


def _shrinks(args_info: list[Any]) -> tuple[int, ...]:
    """How many times each dimension of the first input is its output's, rounded (a convolution's strides); ()
    where the two differ in rank or a shape is not a list of positive integers."""
    try:
        first, out = args_info[0][2], args_info[-1][2]
        if len(first) != len(out):
            return ()
        return tuple(round(a / b) for a, b in zip(first, out))
    except (TypeError, IndexError, ValueError, ArithmeticError):  # a record's shapes are someone else's data
        return ()


def model_decides(args_info: list[Any], contenders: list[list[Any]]) -> bool:
    """Whether a served cost model ranks a kernel's transfers when asked to decide only where it helps
    (``use(..., rank_by_model=None)``): where the candidates that compete on it (``contenders``, the argument
    lists of those that re-derive the fewest tiles) hold the kernel's own layer (:func:`same_layer`) at two
    shapes or more. There a record's speed at home misleads (the nearer shape need not be the faster one
    here) and the model's prediction here does not; where the own layer was tuned at one shape, the fit
    ranking serves it as well."""
    own = {repr(a) for a in contenders if same_layer(args_info, a) and a != args_info}
    return len(own) >= 2


def _relation_rank(relation: str) -> int:
    return {COMPILER: 0, SYNTHESIZED: 2}.get(relation, 1)
