"""``schedhub tune | worker | demo``: tuning on Ray (TVM and Ray are imported only when these run)."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from typing import Any

import click
from rich.table import Table

from .common import EXIT_UNAVAILABLE, console, labelled, open_registry, out, progress, registry_option, reports_errors

#: ``schedhub.hooks.rewrites.layouts.LAYOUTS``, ``schedhub.hooks.rewrites.MATHS`` and ``schedhub.hooks.rewrites.winograd.CONVS``, spelled
#: here: importing the hooks imports TVM, which a command's --help must not.
LAYOUTS = ("given", "NHWC")
AUTO = "auto"  # ``schedhub.tuner.networks.plan.AUTO``: the target decides (``plan.tuning_rewrites``)
MATHS = ("exact", "fast")
CONVS = ("direct", "winograd")


def ray_option(f: Any) -> Any:
    f = click.option("--num-gpus", type=int, default=None, help="GPUs of the embedded local Ray cluster (default: those Ray detects).")(f)
    f = click.option("--num-cpus", type=int, default=None, help="CPUs of the embedded local Ray cluster (default: all).")(f)
    return click.option(
        "--ray-address", default=None, metavar="ADDR",
        help="Ray cluster to join ('auto', host:port, ray://…); default: start a local one.",
    )(f)  # fmt: skip


def budget_options(f: Any) -> Any:
    f = click.option("--final-repeat-ms", type=click.IntRange(1, 10_000), default=100, show_default=True,
                     help="Least milliseconds of each timing repeat when the schedules to publish are measured again "
                          "(less is quicker and noisier: smoke runs).")(f)
    f = click.option("--population", type=int, default=512, show_default=True,
                     help="Evolutionary search population (MetaSchedule's default); a budget of a few trials needs far fewer.")(f)
    f = click.option("--seed", type=int, default=0, show_default=True, help="Search seed.")(f)
    f = click.option("--trials-per-iter", type=int, default=16, show_default=True, help="Candidates measured per search round.")(f)
    f = click.option("--warm-model/--cold-model", default=True, show_default=True,
                     help="Start each search's cost model trained on the registry's verified log of the kernel's structure "
                          "(its other shapes, its earlier searches); cold: MetaSchedule's own start, ranking at random until "
                          "100 trials.")(f)  # fmt: skip
    return click.option("--trials", type=int, default=64, show_default=True, help="Measured candidates per workload.")(f)


def _options(trials: int, trials_per_iter: int, seed: int, population: int, final_repeat_ms: int, warm_model: bool) -> Any:
    from schedhub.tuner.execution.kernels import final_timing
    from schedhub.tuner.workloads.search import TuneOptions

    if trials < 1 or trials_per_iter < 1:
        raise click.BadParameter("--trials and --trials-per-iter must be at least 1")
    if population < min(trials_per_iter, trials):
        raise click.BadParameter("--population must be at least the candidates measured per round (--trials-per-iter)")
    return TuneOptions(trials=trials, trials_per_iter=min(trials_per_iter, trials), seed=seed, population=population,
                       final_timing=final_timing(final_repeat_ms), warm_model=warm_model)


def rewrite_options(f: Any) -> Any:
    """The network rewrites a run plans its kernels under (``plan.tuning_rewrites``): shared by ``tune``, ``submit`` and
    ``profile``, so a profile sees the kernels a tuning run tuned."""
    f = click.option("--layout", type=click.Choice((AUTO, *LAYOUTS)), default=AUTO, show_default=True,
                     help="Convert the models' 2-D convolutions to this layout first (given: as the frontend gives them; auto: NHWC on "
                          "a CPU with AVX2 or AVX-512 and direct convolutions, given elsewhere); a compile finds either by default "
                          "(hooks.use(..., layout=\"auto\")).")(f)  # fmt: skip
    f = click.option("--math", type=click.Choice(MATHS), default="exact", show_default=True,
                     help="fast: GELU, erf, exp, tanh and softmax by TVM's vectorizable approximations (a few float32 ulps from exact); "
                          "compile with hooks.use(..., math=) the same, or the records are not found.")(f)  # fmt: skip
    f = click.option("--prepack/--no-prepack", default=None,
                     help="Let each kernel's schedule choose its weights' layout, packed at compile time (CPU); default: on a CPU "
                          "with AVX2 or AVX-512. A compile finds either by default (hooks.use(..., prepack=\"auto\")).")(f)  # fmt: skip
    f = click.option("--conv", type=click.Choice(CONVS), default="direct", show_default=True,
                     help="winograd: 3×3 stride-1 convolutions by Winograd's F(4×4, 3×3), F(2×2, 3×3) on small images (float32 rounding apart from direct); "
                          "compile with hooks.use(..., conv=) the same, or the records are not found.")(f)  # fmt: skip
    return f


def work_options(f: Any) -> Any:
    """What a bulk run covers: shared by ``tune`` and ``submit``."""
    f = click.option("--retune", is_flag=True, help="Tune workloads that already have records too.")(f)
    f = click.option("--concurrency", type=int, default=2, show_default=True, help="Workloads tuned at once (they share the devices).")(f)
    f = budget_options(f)
    f = click.option("--target", default="host", show_default=True, help="'host', a target JSON object, or a TVM target string.")(f)
    f = rewrite_options(f)
    f = click.option("--sweep", multiple=True, help="A shape sweep, name=v1,v2 (e.g. batch=1,8); repeatable.")(f)
    return click.option(
        "--model", "-m", "model_specs", multiple=True, required=True,
        help="A shipped model (mlp, resnet18, mobilenetv2, bert_layer) with shape options ('resnet18:batch=8,image=112'), "
             "onnx:FILE, or a JSON mapping ({\"torch\": \"pkg.mod:factory\", \"inputs\": {\"x\": [1, 16]}}); repeatable.",
    )(f)  # fmt: skip


def network_options(f: Any) -> Any:
    """Tuning a network where its time goes (``--until``): :mod:`.tune_network`."""
    f = click.option("--max-minutes", type=click.FloatRange(min=0, min_open=True), default=None, help="With --until: stop after this many minutes.")(f)
    f = click.option("--max-trials", type=click.IntRange(min=1), default=None,
                     help="With --until: stop after this many trials in all (default: --trials times the kernels).")(f)
    f = click.option("--round-trials", type=click.IntRange(1, 1024), default=16, show_default=True, help="With --until: trials a round gives one kernel.")(f)
    f = click.option("--policy", type=click.Choice(["gradient", "even"]), default="gradient", show_default=True,
                     help="With --until: which kernel each round goes to: where tuning is expected to lower the network's latency most "
                          "(calls x how fast its best time falls), or evenly.")(f)  # fmt: skip
    return click.option("--until", "until_text", default=None, metavar="ENGINE|fastest|MS",
                        help="Tune the network in rounds, each to the kernel where it is expected to gain most, until its estimated "
                             "latency beats ENGINE's (pytorch, inductor, onnxruntime or openvino, running the one PyTorch model in a "
                             "process of its own, its output checked against eager PyTorch's), the fastest of those installed, or MS "
                             "milliseconds, or the budget (--max-trials, --max-minutes) is spent.")(f)  # fmt: skip


@click.command()
@registry_option
@work_options
@network_options
@click.option("--dry-run", is_flag=True, help="List the workloads and stop.")
@ray_option
@reports_errors
def tune(registry: str, token: str | None, model_specs: tuple[str, ...], sweep: tuple[str, ...], target: str, layout: str, math: str, prepack: bool | None, conv: str, trials: int, trials_per_iter: int,
         seed: int, population: int, final_repeat_ms: int, warm_model: bool, concurrency: int, retune: bool, until_text: str | None, policy: str, round_trials: int,
         max_trials: int | None, max_minutes: float | None, dry_run: bool, ray_address: str | None, num_cpus: int | None, num_gpus: int | None) -> None:  # fmt: skip
    """Tune every kernel of the given models and push the results (resumable: tuned keys are skipped); with --until, tune
    the network in rounds where its time goes until it beats a reference."""
    from schedhub.hooks.serving.choice import has_wide_vectors
    from schedhub.hooks.kernels.errors import error_line
    from schedhub.tuner.execution import cluster
    from schedhub.tuner.networks import plan

    from . import tune_network
    from schedhub.tuner.workloads.dispatch import tune_many

    options = _options(trials, trials_per_iter, seed, population, final_repeat_ms, warm_model)
    refs = plan.expand([plan.parse_model(m) for m in model_specs], dict(plan.parse_sweep(s) for s in sweep))
    tgt = plan.resolve_target(target)
    modules = [plan.load(ref) for ref in refs]
    rewrites = plan.tuning_rewrites(tgt, layout, math, prepack, conv, modules)
    try:
        planned = plan.plan(refs, tgt, rewrites, modules)
    except Exception as exc:  # the layout the target chose, where TVM cannot convert these models: the given one, as a compile's "auto" does
        if layout != AUTO or rewrites.layout == "given":
            raise
        console.print(f"convolutions {rewrites.layout} not taken: TVM could not convert these models ({error_line(exc)})")
        rewrites = dataclasses.replace(rewrites, layout="given")
        planned = plan.plan(refs, tgt, rewrites, modules)
    model = "each search's cost model started from the registry's log" if options.warm_model else "each search's cost model started cold"
    chosen = rewrites.describe() + (" (this CPU's AVX2 or AVX-512: --layout given --no-prepack for none)" if (layout == AUTO or prepack is None) and has_wide_vectors(tgt) else "")
    said = [text for text in (chosen, model) if text]
    console.print(f"{len(refs)} model shape(s), {len(planned)} distinct kernels for {tgt}" + "".join(f", {text}" for text in said))
    if dry_run:
        for p in planned:
            out.print(f"{p.kernel.identity.key[:16]}  {p.kernel.identity.op:<40} {', '.join(p.models)}")
        return
    until = tune_network.parse_until(until_text) if until_text is not None else None
    reg = open_registry(registry, token)
    if until is not None:
        threads = int(tgt.get("num-cores") or num_cpus or 0) or os.cpu_count() or 1
        goal = tune_network.goal_secs(until, refs, threads)  # before Ray starts: its start-up would slow the engines timed
        cluster.start(ray_address, num_cpus, num_gpus)
        tune_network.run(reg, planned, modules, options, goal, policy, round_trials, max_trials, max_minutes, threads, tgt, rewrites,
                         name=refs[0].label if len(refs) == 1 else None)  # fmt: skip
        return
    cluster.start(ray_address, num_cpus, num_gpus)
    with progress("tuning", total=len(planned)) as bar:
        task = bar.add_task("tuning", total=len(planned))
        summary = tune_many(reg, [p.kernel.identity for p in planned], options, concurrency=concurrency, retune=retune,
                            on_done=lambda *_: bar.advance(task))  # fmt: skip
        bar.update(task, completed=len(planned))
    table = Table("op", "untuned ms", "tuned ms", "speedup", "key", title=f"tuned {len(summary.tuned)}, skipped {len(summary.skipped)} (already tuned), failed {len(summary.failed)}")
    for r in summary.tuned:
        table.add_row(r.identity.op, f"{r.untuned_secs * 1e3:.3f}", f"{(r.best_secs or 0) * 1e3:.3f}", f"{r.untuned_secs / (r.best_secs or 1):.1f}×", r.identity.key[:12])
    out.print(table)
    for m in summary.models:
        what = f"published ({m.trials} logged trials, {m.nodes} tree nodes)" if m.stored else f"kept: {m.reason}"
        out.print(f"cost model of {m.target}: {what}", highlight=False, soft_wrap=True)
    for key, error in summary.failed.items():
        console.print(labelled("failed", f"{key[:12]}: {error}"))
    if summary.failed:
        raise SystemExit(1)


@click.command()
@registry_option
@work_options
@click.option("--address", required=True, envvar="RAY_API_SERVER_ADDRESS", help="The cluster's Jobs API (http://head:8265).")
@click.option("--attempt", type=int, default=1, show_default=True, help="Bump to run the same work again after a failed job.")
@click.option("--python", default=None, help="Interpreter on the cluster (default: this one's path).")
@click.option("--follow", is_flag=True, help="Stream the job's logs until it ends.")
@reports_errors
def submit(registry: str, token: str | None, model_specs: tuple[str, ...], sweep: tuple[str, ...], target: str, layout: str, math: str, prepack: bool | None, conv: str, trials: int, trials_per_iter: int,
           seed: int, population: int, final_repeat_ms: int, warm_model: bool, concurrency: int, retune: bool, address: str, attempt: int, python: str | None, follow: bool) -> None:  # fmt: skip
    """Submit a bulk tuning run as a Ray Job (idempotent: the same work is one job)."""
    from schedhub.tuner.workloads import jobs
    from schedhub.tuner.networks import plan

    models = [plan.parse_model(m) for m in model_specs]  # fail here, not on the cluster
    sweeps = dict(plan.parse_sweep(s) for s in sweep)
    _options(trials, trials_per_iter, seed, population, final_repeat_ms, warm_model)  # refuse a bad budget here, not on the cluster
    work = {"models": [m.__dict__ for m in models], "sweeps": sweeps, "target": target, "trials": trials, "trials_per_iter": trials_per_iter,
            "seed": seed, "population": population, "final_repeat_ms": final_repeat_ms, "retune": retune, "registry": registry}  # fmt: skip
    args = ["--registry", registry, "--target", target, "--trials", str(trials), "--trials-per-iter", str(trials_per_iter), "--seed", str(seed),
            "--population", str(population), "--final-repeat-ms", str(final_repeat_ms), "--concurrency", str(concurrency), *(a for m in model_specs for a in ("--model", m)), *(a for s in sweep for a in ("--sweep", s))]  # fmt: skip
    if retune:
        args.append("--retune")
    for name, value, default in (("layout", layout, AUTO), ("math", math, "exact"), ("conv", conv, "direct")):
        if value != default:  # the work's identity (and so its submission id) is unchanged for the defaults
            work[name] = value
            args += [f"--{name}", value]
    if prepack is not None:  # named: the cluster's target does not decide
        work["prepack"] = prepack
        args.append("--prepack" if prepack else "--no-prepack")
    if not warm_model:
        work["cold_model"] = True
        args.append("--cold-model")
    try:
        sub = jobs.submit(address, args, work, attempt=attempt, python=python, env={"SCHEDHUB_TOKEN": token} if token else None)
    except jobs.ClusterNotReady as exc:
        console.print(labelled("error:", exc))
        raise SystemExit(EXIT_UNAVAILABLE) from None
    verb = "submitted" if sub.created else "already submitted"
    out.print(f"{verb} {sub.submission_id} ({sub.status})", highlight=False)
    if follow:
        out.print(f"finished: {jobs.follow(address, sub.submission_id)}", highlight=False)


@click.group(name="jobs")
def jobs_group() -> None:
    """Follow Ray Jobs started by `schedhub submit`."""


@jobs_group.command(name="status")
@click.argument("submission_id")
@click.option("--address", required=True, envvar="RAY_API_SERVER_ADDRESS", help="The cluster's Jobs API (http://head:8265).")
@reports_errors
def job_status(submission_id: str, address: str) -> None:
    from schedhub.tuner.workloads import jobs

    info = jobs.status(address, submission_id)
    out.print(f"{info['submission_id']}: {info['status']} {info['message']}", highlight=False)


@jobs_group.command(name="logs")
@click.argument("submission_id")
@click.option("--address", required=True, envvar="RAY_API_SERVER_ADDRESS", help="The cluster's Jobs API (http://head:8265).")
@click.option("--follow", "-f", is_flag=True, help="Stream until the job ends.")
@reports_errors
def job_logs(submission_id: str, address: str, follow: bool) -> None:
    from schedhub.tuner.workloads import jobs

    if follow:
        jobs.follow(address, submission_id, out.file.write)
    else:
        out.file.write(jobs.logs(address, submission_id))


@click.command()
@registry_option
@budget_options
@click.option("--concurrency", type=int, default=1, show_default=True, help="Jobs tuned at once by this worker.")
@click.option("--lease-secs", type=float, default=120.0, show_default=True, help="Lease length; renewed every third of it.")
@click.option("--poll-secs", type=float, default=5.0, show_default=True, help="Wait between polls of an empty queue.")
@click.option("--max-job-secs", type=float, default=4 * 3600.0, show_default=True,
              help="A job still running this long after it started is stopped and failed with why (it is retried up to the queue's attempts).")
@click.option("--max-jobs", type=int, default=None, help="Stop after this many jobs.")
@click.option("--until-idle", is_flag=True, help="Stop when the queue has nothing left to lease.")
@click.option("--wait-for-registry", type=float, default=None, help="Seconds to wait for a registry that does not answer while "
              "this worker holds no work, then exit with an error (default: forever, or 600 with --until-idle). Results of "
              "jobs that ended while it was away are always kept until it answers.")
@click.option("--name", default=None, help="Worker name in the queue (default host:pid).")
@click.option("--first-pass/--no-first-pass", default=True, show_default=True,
              help="Before a job's search, measure what the registry offers for it (transfers, synthesized schedules) and push the best, "
                   "so every queued miss gets a measured schedule before any gets a full search (only with more --trials than a first pass "
                   "measures at most: 8 registry schedules, each also postprocessed here, and 8 seeds).")
@click.option("--refine/--no-refine", default=True, show_default=True,
              help="When the queue has nothing for this worker, search again the kernel whose tuning is expected to lower a network's "
                   "time most, of the networks compiles reported (each kernel at most 4 searches, while it is 2% of its network or more).")
@click.option("--device", default=None, help="The CPU model (the targets' mcpu) whose jobs this worker takes, besides generic ones "
              "(default: this machine's; kernels built for another model may not run here, and would be timed on the wrong one).")
@ray_option
@reports_errors
def worker(registry: str, token: str | None, trials: int, trials_per_iter: int, seed: int, population: int, final_repeat_ms: int, warm_model: bool, concurrency: int, lease_secs: float, poll_secs: float,
           max_job_secs: float, max_jobs: int | None, until_idle: bool, wait_for_registry: float | None, name: str | None, first_pass: bool, refine: bool, device: str | None,
           ray_address: str | None, num_cpus: int | None, num_gpus: int | None) -> None:  # fmt: skip
    """Lease jobs from the registry's queue (verifications of pushed claims first, then misses), run them on Ray, push and ack.

    SIGTERM or SIGINT: stop leasing, give held leases back at once, stop Ray."""
    from schedhub.tuner.execution import cluster
    from schedhub.tuner.worker import Worker

    options = _options(trials, trials_per_iter, seed, population, final_repeat_ms, warm_model)
    reg = open_registry(registry, token)
    info = cluster.start(ray_address, num_cpus, num_gpus)
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):  # stop leasing, give held leases back, stop Ray
        signal.signal(signum, lambda sig, _frame: stopping.append(sig))

    def event(kind: str, data: dict[str, Any]) -> None:
        details = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items() if v != "")  # an empty field says nothing
        out.print(f"{kind} {details}", highlight=False, soft_wrap=True)

    w = Worker(reg, options, name=name, concurrency=concurrency, lease_secs=lease_secs, poll_secs=poll_secs, on_event=event, device=device, first_pass=first_pass,
               max_job_secs=max_job_secs, refine=refine)
    kinds = ", ".join(f"{kind} {device}" for kind, device in w.devices) or "no device it can time"
    passes = ("first passes (each miss's transfers measured), then searches" if w.first_pass
              else "searches only (no first pass of measured transfers: --no-first-pass)")  # fmt: skip
    out.print(f"worker {w.name} ({kinds} jobs; {passes}) on ray {info['address']}; registry {registry}", highlight=False)
    try:
        away_limit = wait_for_registry if wait_for_registry is not None else (600.0 if until_idle else None)
        stats = w.run(max_jobs=max_jobs, until_idle=until_idle, should_stop=lambda: bool(stopping), away_limit=away_limit)
    finally:
        w.release_all("worker interrupted")  # leases still held after an error: back to the queue now
        cluster.stop()
    out.print(f"worker done: {stats.done} tuned, {stats.first_passes} first passes, {stats.verified} verified, {stats.failed} failed, {stats.lost} lost, "
              f"{stats.released} released", highlight=False)  # fmt: skip
    for line in w.left_behind():
        console.print(labelled("left", line))


@click.command()
@click.option("--trials", type=int, default=32, show_default=True, help="Measured candidates per kernel.")
@click.option("--registry-dir", default=None, help="LMDB directory for the demo registry (default: a fresh temporary one).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True, help="cuda: tune and run on this machine's GPU (DLight is the default there).")
@ray_option
@reports_errors
def demo(trials: int, registry_dir: str | None, device: str, ray_address: str | None, num_cpus: int | None, num_gpus: int | None) -> None:
    """Compile a shipped model through the hook, tune its misses on Ray, recompile, compare."""
    from schedhub.tuner import demo as demo_run
    from schedhub.tuner.execution import cluster, tvm_env

    logging.getLogger("schedhub").setLevel(logging.WARNING)
    try:
        tvm_env.device_target(device)
    except tvm_env.NoDevice as exc:
        raise click.UsageError(f"--device {device}: {exc}") from None
    cluster.start(ray_address, num_cpus, num_gpus)
    with progress("tuning the misses in the background", total=None) as bar:
        task = bar.add_task("tune", total=None)
        report = demo_run.run(trials=trials, registry_dir=registry_dir, ray_address=ray_address, say=lambda s: out.print(s, highlight=False),
                              on_queue=lambda done, total: bar.update(task, completed=done, total=total), device=device)  # fmt: skip
    table = Table("kernel", f"{report.default} ms", "schedhub-tuned ms", "numpy ms (CPU)" if device != "cpu" else "numpy ms", "speedup",
                  title=f"{demo_run.DEMO_MODEL} {demo_run.DEMO_SHAPE} on {device}, {trials} trials per kernel")  # fmt: skip
    for row in demo_run.render(report):
        table.add_row(*row)
    out.print(table)
    kept = f"; registry kept at {report.registry}" if registry_dir is not None else ""
    out.print(f"demo finished in {report.seconds:.0f} s{kept}", highlight=False)
