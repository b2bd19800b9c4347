"""``schedhub tune --until …``: a network tuned where its time goes until it beats a reference (tuner.networks.network)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from .common import console, out


FASTEST = "fastest"


def parse_until(text: str) -> str | float:
    """An engine's name (``pytorch``, ``inductor``, ``onnxruntime``, ``openvino``: :mod:`schedhub.tuner.compare.engines`),
    ``fastest`` (the fastest of those installed), or a latency in milliseconds (returned in seconds)."""
    from schedhub.tuner.compare.engines import ENGINES

    name = text.strip().lower()
    if name in (*ENGINES, FASTEST):
        return name
    try:
        ms = float(text)
    except ValueError:
        raise click.BadParameter(f"--until takes an engine ({', '.join(ENGINES)}), '{FASTEST}' or a latency in milliseconds, not {text!r}") from None
    if not 0 < ms < 1e7:
        raise click.BadParameter("--until's latency must be a positive number of milliseconds")
    return ms / 1e3


def engine_secs(engine: str, refs: list[Any], threads: int) -> float:
    """The one PyTorch model's latency as ``engine`` runs it, timed in a process of its own that never imports TVM, on
    ``threads`` threads, its output checked against eager PyTorch's."""
    from schedhub.tuner.compare.torch_process import TorchProcess

    if len(refs) != 1 or refs[0].source != "torch":
        raise click.BadParameter(f"--until {engine} needs exactly one PyTorch model (a mapping {{\"torch\": \"pkg.mod:factory\", \"inputs\": …}}); "
                                 "for other models state a latency in milliseconds")  # fmt: skip
    with TorchProcess(engine=engine) as engine_proc:
        engine_proc.load_module(refs[0].name, list(refs[0].inputs.values()), threads)
        return engine_proc.time_network(repeat=5, min_secs=0.2)


def goal_secs(until: str | float, refs: list[Any], threads: int) -> tuple[float, str]:
    """The latency to beat and what it is called: an engine's, the fastest installed engine's, or the one stated."""
    from schedhub.tuner.compare.engines import ENGINES, EngineUnavailable, check_engine

    if not isinstance(until, str):
        return float(until), "the goal"
    if until != FASTEST:
        try:
            return engine_secs(until, refs, threads), until
        except EngineUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    timed: dict[str, float] = {}
    for engine in ENGINES:
        try:
            check_engine(engine)
        except EngineUnavailable as exc:
            console.print(f"not timed: {exc}")
            continue
        timed[engine] = engine_secs(engine, refs, threads)
        console.print(f"{engine}: {timed[engine] * 1e3:.3f} ms")
    fastest = min(timed, key=timed.__getitem__)
    return timed[fastest], fastest


def network_measure(reg: Any, modules: list[Any], target: dict[str, Any], rewrites: Any, threads: int) -> Callable[[], float] | None:
    """The one model (loaded: ``modules``) compiled through the hook from ``reg`` and timed on this machine's CPU on
    ``threads`` threads, as PyTorch is (None: several models, or a target this machine does not run, where the estimate
    alone decides)."""
    from schedhub.tuner.networks.network_timing import hooked_network_secs

    if len(modules) != 1 or target.get("kind") != "llvm":
        return None
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))  # before this process's TVM thread pool starts
    mod = modules[0]
    return lambda: hooked_network_secs(mod, reg, target, rewrites)


def report(reg: Any, kernels: list[tuple[Any, int]], name: str, reference: float, label: str) -> None:
    """Tell the registry the network (its kernels and calls), its name and its goal, so that its page shows where the
    network stands against the goal as the tuning goes (a registry that refuses says one line; the tuning goes on)."""
    from schedhub.registry import MAX_NETWORK_KERNELS, RegistryError

    called = sorted(((i.key, calls) for i, calls in kernels), key=lambda kc: -kc[1])[:MAX_NETWORK_KERNELS]
    try:
        reg.report_network(called, name=name[:80].strip(), goal={"label": label[:40], "secs": reference})
    except RegistryError as exc:
        console.print(f"the network was not reported to the registry's page: {exc}")


def run(reg: Any, planned: list[Any], modules: list[Any], options: Any, goal_timed: tuple[float, str], policy_name: str, round_trials: int,
        max_trials: int | None, max_minutes: float | None, threads: int, target: dict[str, Any], rewrites: Any, name: str | None = None) -> None:  # fmt: skip
    """Tune the network in rounds until it beats ``goal_timed`` (the latency and its name, :func:`goal_secs`) or the
    budget is spent, saying each round's estimate against it; ``name``: the network's, reported with its goal."""
    from schedhub.tuner.networks.allocation import POLICIES, Goal, timed_so_far
    from schedhub.tuner.networks.network import Check, Round, tune_network

    reference, label = goal_timed
    kernels = [(p.kernel.identity, p.kernel.calls) for p in planned]
    if name:
        report(reg, kernels, name, reference, label)
    goal = Goal(latency_secs=reference, max_trials=max_trials if max_trials is not None else options.trials * len(kernels),
                max_secs=max_minutes * 60 if max_minutes else None)  # fmt: skip
    measure = network_measure(reg, modules, target, rewrites, threads)
    console.print(f"{len(kernels)} kernels; {label}: {reference * 1e3:.3f} ms; budget {goal.max_trials} trials"
                  + (f", {max_minutes:g} min" if max_minutes else "") + f"; policy {policy_name}, {round_trials} trials a round; "
                  + ("the compiled network is timed when the estimate meets the goal" if measure else "the estimate alone decides (one CPU model is timed)"))

    def checked(c: Check) -> None:
        out.print(f"check at {c.trials_spent} trials: the compiled network {c.measured_secs * 1e3:.3f} ms ({reference / c.measured_secs:.2f}× {label}), "
                  f"the estimate {c.estimate_secs * 1e3:.3f} ms", highlight=False, soft_wrap=True)  # fmt: skip

    def said(r: Round) -> None:
        estimate = (f"{r.network_secs * 1e3:.3f} ms ({reference / r.network_secs:.2f}× {label})" if r.network_secs else
                    f"≥ {r.timed_secs * 1e3:.3f} ms so far ({r.timed_kernels} of {len(kernels)} kernels timed; {label} {reference * 1e3:.3f} ms)")  # fmt: skip
        best = r.kernel.best_secs
        out.print(f"round {r.number:>3}  {r.trials_spent:>5} trials  {r.elapsed_secs / 60:5.1f} min  {r.kernel.op:<36} "
                  f"{(best or 0) * 1e6:10.1f} µs ×{r.kernel.calls}  network {estimate}", highlight=False)

    state = tune_network(reg, kernels, options, POLICIES[policy_name], goal, round_trials=round_trials, on_round=said, measure=measure, on_check=checked)
    final = state.network_secs
    timed, so_far = timed_so_far(state.kernels)
    verdict = (f"{final * 1e3:.3f} ms, {reference / final:.2f}× {label}" if final else
               f"at least {so_far * 1e3:.3f} ms: {timed} of {len(kernels)} kernels were timed, the rest keep their default schedules")  # fmt: skip
    out.print(f"stopped: {state.stopped_because}; the network's estimate {verdict} (Σ calls × each kernel's best)", highlight=False, soft_wrap=True)
    if measure is not None and final and (not state.checks or state.checks[-1].trials_spent != state.trials):
        checked(Check(state.trials, final, measure()))
    for k in state.kernels:
        if k.failed:
            out.print(f"{k.op} could not be tuned and keeps its default schedule: {k.failed}", highlight=False, soft_wrap=True)
