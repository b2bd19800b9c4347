"""``bench/RESULTS.md`` and its plots, from the JSON the benchmarks recorded (``python -m bench report``)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from .labels import named, rewrites_of
from .stats import overlap, percentile, ratio
from .torch_export import RELAX

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
RESULTS_MD = REPO / "bench" / "RESULTS.md"
PLOTS = REPO / "bench" / "plots"
PACKAGES = ["apache-tvm", "apache-tvm-ffi", "torch", "numpy", "ray", "xgboost-cpu", "lmdb", "msgpack"]


def environment() -> dict[str, Any]:
    """The machine, the package versions and the commit a run was made on."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines() if line.startswith("model name")), platform.processor())
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal")), 0)
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {"machine": {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1), "platform": platform.platform()},
            "versions": versions, "commit": run_commit(REPO, schedhub_source())}  # fmt: skip


def run_commit(bench_tree: Path, source: Path) -> str:
    """The commit a run was made on: the bench's tree's, and where the ``schedhub`` it imports is another tree's (a venv
    shared with another checkout, whose editable install imports that tree), that one's too."""
    # Changed tracked files, except what a benchmark run itself rewrites (its results, the report, the plots).
    commit = tree_commit(bench_tree, [f":(exclude){p.relative_to(REPO)}" for p in (RESULTS, RESULTS_MD, PLOTS)])
    return commit if source == bench_tree else f"{commit} (schedhub imported from {source} at {tree_commit(source, [])})"


def tree_commit(tree: Path, excluded: list[str]) -> str:
    """``tree``'s short commit, ``+changes`` after it where tracked files (less ``excluded`` pathspecs) differ from it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *excluded], cwd=tree, capture_output=True, text=True).stdout.strip())
    return commit + ("+changes" if dirty else "")


def schedhub_source() -> Path:
    """The source tree the running ``schedhub`` packages are imported from (an editable install's)."""
    import schedhub.registry

    return Path(schedhub.registry.__file__).resolve().parent.parent


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def load(directory: Path) -> dict[str, Any]:
    """Every ``<name>.json`` of a results directory, by name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))} if directory.is_dir() else {}


def fmt(s: dict[str, float] | None, digits: int = 3) -> str:
    """``median [min–max]`` of a :func:`bench.stats.summary`."""
    if not s:
        return "–"
    if s["median"] >= 100:
        return f"{s['median']:,.0f} [{s['min']:,.0f}–{s['max']:,.0f}]"
    return f"{s['median']:.{digits}g} [{s['min']:.{digits}g}–{s['max']:.{digits}g}]"


def times(s: dict[str, float]) -> str:
    """A speedup ``median× [min–max]``."""
    digits = 2 if s["median"] < 10 else 0
    return f"{s['median']:.{digits}f}× [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def figures(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, float]]]:
    """Every timed figure of a run as ``(name, summary)``: what two runs are compared on."""
    for row in data.get("models", {}).get("rows", []):
        for config, s in row["timing"].items():
            yield f"models: {row['network']} b{row['batch']} {config} ms", s
    for row in data.get("transfer", {}).get("rows", []):
        for config, s in row["timing"].items():
            yield f"transfer: {row['label']} {config} ms", s
    hook = data.get("hook", {})
    for name in ("plain_tvm_ms", "memory_database_ms", "hook_http_cold_ms", "hook_http_warm_ms", "hook_local_lmdb_ms"):
        if name in hook:
            yield f"hook: {name.removesuffix('_ms')} compile ms", hook[name]
    for name, entry in data.get("tuner", {}).get("workloads", {}).items():
        for run in entry["runs"]:
            for config, s in run["timed"].items():
                yield f"tuner: {name} seed {run['seed']} {config} ms", s
    registry = data.get("registry", {})
    for size, entry in registry.get("schedhub", {}).items():
        yield f"registry: schedhub open+lookup ms @{size}", entry["open_first_lookup_ms"]
    for size, entry in registry.get("metaschedule", {}).items():
        yield f"registry: JSONDatabase open+query ms @{size}", entry["open_first_lookup_ms"]
    if "http_one_connection" in registry:
        yield "registry: HTTP GET p50 ms, one connection", registry["http_one_connection"]["p50_ms"]
        yield "registry: HTTP GET/s, 16 threads", registry["http"]["requests_per_s"]
        yield "registry: batch lookup of 50 keys ms", registry["batch"]["lookup_50_ms"]
    for kind, what in (("get", "GET/s"), ("lookup20", "20-key lookups/s")):
        if kind in registry.get("server_load", {}):
            yield f"registry: {what} under wrk, 16 connections", registry["server_load"][kind]["rps"]


def comparisons(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every comparison a run claims, as ``(name, ratio summary)``: per-round ratios where the two
    sides were timed side by side, round by round; otherwise bounds from the two ranges."""
    for row in data.get("models", {}).get("rows", []):
        t = row["timing"]
        yield f"models: {row['network']} b{row['batch']} tuned vs PyTorch ×", ratio(t["pytorch"], t["tuned"], paired=True)
        yield f"models: {row['network']} b{row['batch']} tuned vs untuned ×", ratio(t["untuned"], t["tuned"], paired=True)
    for row in data.get("transfer", {}).get("rows", []):
        yield f"transfer: {row['label']} transferred / tuned latency", row["transferred_vs_tuned"]
        yield f"transfer: {row['label']} default / transferred latency", row["default_vs_transferred"]
    hook = data.get("hook", {})
    for name in ("plain_tvm_ms", "hook_http_cold_ms", "hook_http_warm_ms", "hook_local_lmdb_ms"):
        if name in hook:
            yield f"hook: {name.removesuffix('_ms')} compile / MemoryDatabase's", ratio(hook[name], hook["memory_database_ms"], paired=True)
    for name, entry in data.get("tuner", {}).get("workloads", {}).items():
        for run in entry["runs"]:
            t = run["timed"]
            yield f"tuner: {name} seed {run['seed']} untuned / ray best", ratio(t["untuned"], t["ray"], paired=True)
            yield f"tuner: {name} seed {run['seed']} plain best / ray best", ratio(t["plain"], t["ray"], paired=True)
    registry = data.get("registry", {})
    for size, entry in registry.get("metaschedule", {}).items():
        if size in registry.get("schedhub", {}):
            yield f"registry: JSONDatabase / schedhub open+lookup @{size}", ratio(entry["open_first_lookup_ms"], registry["schedhub"][size]["open_first_lookup_ms"], paired=False)
    if "batch" in registry:
        b = registry["batch"]
        yield "registry: 50 sequential GETs / one batch lookup", ratio(b["sequential_50_gets_ms"], b["lookup_50_ms"], paired=False)


def controls(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Side-by-side ratios of two configurations whose code is identical in every run (no tuned
    schedule in either: a library against TVM's default schedules): how far unchanged code moves
    between runs on this machine."""
    for row in data.get("models", {}).get("rows", []):
        t = row["timing"]
        yield f"models: {row['network']} b{row['batch']} PyTorch / untuned", ratio(t["pytorch"], t["untuned"], paired=True)
    for name, entry in data.get("tuner", {}).get("workloads", {}).items():
        for run in entry["runs"]:
            if "numpy" in run["timed"]:
                yield f"tuner: {name} seed {run['seed']} numpy / untuned", ratio(run["timed"]["numpy"], run["timed"]["untuned"], paired=True)


#: Absolute figures whose code is identical in every run, by the configuration that ends their name.
SAME_CODE_FIGURES = (" untuned ms", " pytorch ms", " numpy ms", " default ms")


def agreement(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Comparisons and absolute figures present in both runs, each judged two ways.

    ``agree``: the two runs' [min, max] ranges overlap (the noise within a run). ``within_noise``:
    they overlap, or the change is within the run-to-run noise: the 90th percentile of the changes
    of the same-code figures (:func:`controls` for comparisons, :data:`SAME_CODE_FIGURES` for
    absolute figures) between these two runs.
    """

    def rows(kind: Callable[[dict[str, Any]], Iterator[tuple[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
        old = dict(kind(before))
        return [{"figure": name, "before": old[name], "after": new, "change": new["median"] / old[name]["median"] - 1, "agree": overlap(old[name], new)}
                for name, new in kind(after) if name in old]  # fmt: skip

    found: dict[str, Any] = {"controls": rows(controls), "comparisons": rows(comparisons), "absolute": rows(figures)}
    same_code = [r for r in found["absolute"] if r["figure"].endswith(SAME_CODE_FIGURES)]
    found["noise"] = {"comparisons": _p90(found["controls"]), "absolute": _p90(same_code)}
    for kind in ("comparisons", "absolute"):
        band = found["noise"][kind]
        for r in found[kind]:
            r["within_noise"] = r["agree"] or (band is not None and abs(r["change"]) <= band)
    return found


def _p90(rows: list[dict[str, Any]]) -> float | None:
    """The 90th percentile of the rows' absolute changes (None with fewer than 5 rows: too few to tell)."""
    return percentile([abs(r["change"]) for r in rows], 90) if len(rows) >= 5 else None


def write(mode: str) -> Path:
    data = load(RESULTS / mode)
    manifest = data.pop("manifest", {})
    plots = PLOTS / mode
    plots.mkdir(parents=True, exist_ok=True)
    from . import plots as draw

    drawn = draw.all_plots(data, plots)
    lines = [f"# schedhub benchmarks ({mode} run)", ""]
    lines += _standing(load(RESULTS / "full").get("models"), first_compiles(RESULTS / "studies"), engine_runs(RESULTS / "full" / "runs"))
    lines += _header(manifest)
    lines += _models(data.get("models"), drawn, "Models: PyTorch vs untuned TVM vs schedhub-tuned")
    if mode != "full":  # the full mode's model table, recorded on its own (hours on 2 cores), beside the quick run's
        full = load(RESULTS / "full").get("models")
        if full:
            (PLOTS / "full").mkdir(parents=True, exist_ok=True)
            lines += _models(full, draw.all_plots({"models": full}, PLOTS / "full"), "Models at real sizes and budget (full mode)")
    lines += _tuner(data.get("tuner"))
    for name, rounds in sorted(load(RESULTS / "full").items()):  # bench.rounds, one file per network (recorded on its own)
        lines += _rounds(rounds) if name.startswith("rounds-") else []
    lines += _isolation(data.get("isolation"))
    gpu = load(RESULTS / "gpu")  # python -m bench gpu, recorded on a machine with an NVIDIA GPU
    if gpu.get("models"):
        lines += _models(gpu["models"], {}, f"GPU ({gpu['models'].get('device_name', 'cuda')}): PyTorch vs DLight vs schedhub-tuned")
    lines += _tuner(gpu.get("tuner"))
    lines += _gpu_transfer(gpu.get("gpu_transfer"))
    lines += _transfer(data.get("transfer"), drawn, data.get("ranking"))
    lines += _hook(data.get("hook"))
    lines += _registry(data.get("registry"))
    lines += _agreement(load(RESULTS / f"{mode}.prev"), {**data, "manifest": manifest}, mode)
    RESULTS_MD.write_text("\n".join(lines) + "\n")
    return RESULTS_MD


ENGINES = {"pytorch": "PyTorch eager", "onnxruntime": "ONNX Runtime", "openvino": "OpenVINO", "inductor": "Inductor"}


def first_compiles(studies: Path) -> list[dict[str, Any]]:
    """The first-compile studies (``bench.studies.first_compile``), oldest first (by when each was ``recorded``; one
    recorded before studies said so counts as older, its file name deciding among those), each with the CPU it ran on:
    its ``cpu``, else its file name's last part (``first-compile-NAME-CPU.json``, as the study's files were named)."""
    found = []
    for path in sorted(studies.glob("first-compile-*.json")):
        study = json.loads(path.read_text())
        found.append({**study, "cpu": study.get("cpu") or path.stem.rsplit("-", 1)[-1]})
    return sorted(found, key=lambda s: s.get("recorded", ""))  # stable: the file order among the unrecorded


def engine_runs(runs: Path) -> list[dict[str, Any]]:
    """The model runs (``bench.models --engines``, ``bench/results/full/runs``) that timed engines beside PyTorch."""
    return [run for run in (json.loads(p.read_text()) for p in sorted(runs.glob("*.json"))) if run.get("engines")]


def standing_rows(full: dict[str, Any] | None, studies: list[dict[str, Any]], engine_run_list: Sequence[dict[str, Any]] = ()) -> list[list[str]]:
    """One row per network, CPU and what schedhub served: each CPU's newest tuned row of each network (the full model
    table) and each first compile from an empty registry (the rules' schedules, untuned), with every engine timed
    beside it in the same run and the fastest of them over schedhub's time (above 1: schedhub is faster). A network
    studied more than once on a CPU keeps its newest study (by file name order: the later file wins)."""
    rows = []
    for cpu, newest in latest_rows(full["rows"] if full else []).items():
        for r in newest:
            t, minutes = r["timing"], r.get("tune_secs", 0) / 60
            rows.append([r["network"] + (f" b{r['batch']}" if r["batch"] != 1 else ""), cpu, f"tuned {minutes:.0f} min", f"{t['tuned']['median']:.3g}",
                         f"{t['pytorch']['median']:.3g}", "", "", "", f"{t['pytorch']['median'] / t['tuned']['median']:.2f}×"])  # fmt: skip
    for run in engine_run_list:
        for r in run["rows"]:
            t = r["timing"]
            engines = {name: t[name]["median"] for name in ENGINES if name in t}
            rows.append([r["network"] + (f" b{r['batch']}" if r["batch"] != 1 else ""), str(r.get("cpu") or run["target"].get("mcpu", "")),
                         f"tuned {r.get('tune_secs', 0) / 60:.0f} min", f"{t['tuned']['median']:.3g}",
                         *(f"{engines[name]:.3g}" if name in engines else "" for name in ENGINES), f"{min(engines.values()) / t['tuned']['median']:.2f}×"])  # fmt: skip
    newest = {(study["network"], json.dumps(study.get("shape", {}), sort_keys=True), study["cpu"]): study for study in studies}
    for study in newest.values():
        t = study["timing"]
        engines = {name: t[name]["median"] for name in ENGINES if name in t}
        if "ruled" not in t or not engines:
            continue
        network = study["network"].rpartition(":")[2] + "".join(f" {k} {v}" for k, v in study.get("shape", {}).items() if k != "input")
        served = [("ruled", "first compile, untuned")] + ([("starter", study["starter_label"])] if study.get("starter_label") and "starter" in t else [])
        for column, how in served:
            rows.append([network, study["cpu"], how, f"{t[column]['median']:.3g}",
                         *(f"{engines[name]:.3g}" if name in engines else "" for name in ENGINES), f"{min(engines.values()) / t[column]['median']:.2f}×"])  # fmt: skip
    return rows


def _standing(full: dict[str, Any] | None, studies: list[dict[str, Any]], runs: Sequence[dict[str, Any]] = ()) -> list[str]:
    rows = standing_rows(full, studies, runs)
    if not rows:
        return []
    return ["## Where schedhub stands", "",
            "Milliseconds a forward pass (batch 1 unless a row says b4 or b16, fp32, 2 threads, medians), schedhub beside each engine timed in the same run "
            "on the same machine, every engine in a process of its own with its output checked. \"speedup\": the fastest engine "
            "timed beside it over schedhub's time (above 1: schedhub is faster). Tuned rows: the full model table's newest "
            "row of each network on each CPU (its section below), most timed against PyTorch eager only, although the engines a "
            "user would pick instead are faster than eager (the encoder layer's first compile below: ONNX Runtime 1.5× eager); "
            "rows with engines are runs of `python -m bench.models --engines` (`bench/results/full/runs`). First compiles: `python -m bench.studies.first_compile` "
            "(docs/hook.md, \"What a miss runs\").", "",
            *table(["network", "CPU", "schedhub", "schedhub ms", *ENGINES.values(), "speedup"], rows, "lllrrrrrr"), ""]  # fmt: skip


def _header(m: dict[str, Any]) -> list[str]:
    if not m:
        return ["(no manifest: run `python -m bench all` to record one)", ""]
    mach, ver = m["machine"], m["versions"]
    sections = ", ".join(f"{n} {s['wall_secs'] / 60:.1f} min" + ("" if s["rc"] == 0 else f" (FAILED, exit {s['rc']})") for n, s in m["sections"].items())
    return [
        f"Reproduce: `.venv/bin/pip install -q -e '.[bench]' && .venv/bin/{m['command']}` "
        f"(the venv from the README's test command has everything but matplotlib).",
        "",
        f"- Recorded {m['started']} at commit `{m['commit']}`, {m.get('wall_secs', 0) / 60:.1f} min in all: {sections}.",
        f"- Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB, {mach['platform']}. Shared and noisy.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in ver.items()) + ".",
        "- Every figure is a median with [min–max] over repeated samples after warm-up; configurations compared "
        "with each other are measured side by side in one process, interleaved round by round.",
        "",
    ]  # fmt: skip


def _default_label(d: dict[str, Any]) -> str:
    """What a run's default schedule is called: TVM's unscheduled kernels on a CPU, DLight's on a GPU."""
    return "DLight" if d.get("default") == "DLight" else "untuned TVM"


def _models(d: dict[str, Any] | None, drawn: dict[str, str], title: str) -> list[str]:
    if not d:
        return []
    o = d["options"]
    default = _default_label(d)
    recorded = f"Recorded {d['recorded']} at commit `{d['commit']}` in {d['wall_secs'] / 60:.0f} min. " if d.get("recorded") else ""
    warm = (f"Warm-started from a copy of another run's registry ({d['seed_keys']} keys: the same ops at other shapes; a kernel it "
            f"already held is tuned again at this budget), up to {o['warm_start']} traces. ") if d.get("seed_keys") else (
            f"Kernels of batch b>1 are warm-started from batch 1's schedules (up to {o['warm_start']} traces). ")  # fmt: skip
    budget = (f"Tuning budget per kernel: {o['trials']} trials in rounds of {o['trials_per_iter']}" if not any(r.get("tuning") for r in d["rows"]) else
              f"Each network tuned where its time goes (`tuner.networks.network`: rounds of {o['trials_per_iter']} trials unless its run says otherwise, each to the kernel the row's policy picks; "
              f"budget {o['trials']} trials × the network's kernels, or the row's minutes), the rows' runs listed below the table")  # fmt: skip
    cpus = sorted({str(r.get("cpu") or d.get("device_name", "")) for r in d["rows"]})
    by_cpu = len(cpus) > 1  # a merged table of runs on different machines: each row says which

    def cpu_of(r: dict[str, Any]) -> list[str]:
        return [str(r.get("cpu") or d.get("device_name", ""))] if by_cpu else []

    target = (f"Rows from {len(cpus)} CPUs ({', '.join(cpus)}: the CPU column), each against PyTorch timed on its own machine in its own run; "
              f"the first run's target `{json.dumps(d['target'])}`" if by_cpu else f"Target `{json.dumps(d['target'])}`")  # fmt: skip
    several = "; " in d["command"]  # a merged table of many runs: each run's command is listed below it
    lines = [f"## {title}" + ("" if several else f" (`{d['command']}`)"), "",
             f"{recorded}{target}. {budget}, "
             f"evolutionary search {_search(o['population'], o['genetic_iters'], o['search_threads'])}, xgboost cost model, seed {o['seed']}, one tuning job at a time; "
             f"the best {o['publish']} candidates re-timed next to {'DLight' + chr(39) + 's schedule' if default == 'DLight' else 'the unscheduled kernel'}. {warm}"
             f"End to end: VM `forward` / PyTorch eager `inference_mode` (in a process of its own) on the same input and weights, "
             f"{d['rounds']} interleaved rounds, each sample the median of 3 repeats of ≥ 100 ms; outputs agree to 1e-3 of their scale."
             + (" Each run's command is listed under the table." if several else ""),
             ""]  # fmt: skip
    rows = []
    for r in d["rows"]:
        t = r["timing"]
        shape = ", ".join(f"{k} {v}" for k, v in r["shape"].items()) or "256→512→512→10"
        if r.get("frontend", RELAX) != RELAX:
            shape += f" ({r['frontend']})"
        shape += "".join(f", {what}" for what in rewrites_of(r))
        rows.append([r["network"], *cpu_of(r), str(r["batch"]), shape, str(r["kernels"]), str(r["trials"]), fmt(t["pytorch"]), fmt(t["untuned"]), fmt(t["tuned"]),
                     times(r["speedup_vs_pytorch"]), times(r["speedup_vs_untuned"])])  # fmt: skip
    lines += table(["network", *(["CPU"] if by_cpu else []), "batch", "shape", "kernels", "trials", "PyTorch ms", f"{default} ms", "schedhub-tuned ms",
                    "tuned vs PyTorch", f"tuned vs {default.split()[0]}"], rows, "l" + ("l" if by_cpu else "") + "rlrrrrrrr")  # fmt: skip
    at_least = sum(r["speedup_vs_pytorch"]["median"] >= 1 for r in d["rows"])
    lines += ["", f"\"trials\": candidates measured for the network's kernels, warm starts included. "
              f"schedhub-tuned is at least as fast as PyTorch on {at_least} of {len(d['rows'])} rows.", ""]  # fmt: skip
    if by_cpu:
        lines += _latest_rows(d["rows"])
    lines += _tuning_runs(d["rows"])
    if "speedup" in drawn:
        lines += [f"![speedups]({drawn['speedup']})", ""]
    if "network_tuning" in drawn:
        lines += [f"![network latency against tuning minutes]({drawn['network_tuning']})", ""]
    if not d.get("kernels"):  # the GPU run has no per-kernel CPU baselines
        return lines
    peak = max(d.get("peak_gflops", {}).values(), default=None)
    lines += ["### Heaviest kernels: GFLOPS (the three matmul/conv kernels with the most untuned time × calls per network and batch)", ""]
    if peak:
        merged = "" if not d.get("commands") else " (of the first run; each row's \"of peak\" is against its own run's: the machine's speed varies)"
        lines += [f"The machine's practical peak, a {d['peak_sgemm_n']}² float32 sgemm timed in the same run{merged}: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in d["peak_gflops"].items()) + " GFLOPS; \"of peak\" is tuned over the better of the two.", ""]  # fmt: skip
    def of_peak(k: dict[str, Any]) -> float:
        """The kernel's tuned GFLOPS over its run's practical peak (call only where there is a peak)."""
        return k["flops"] / (k["tuned_ms"] * 1e-3) / 1e9 / k.get("peak_gflops", peak)

    rows = []
    for k in d["kernels"]:
        if k.get("numpy_ms") is None and k.get("torch_ms") is None:
            continue
        g = k["flops"] / 1e9

        def gf(ms: float | None, g: float = g) -> str:
            return f"{g / (ms * 1e-3):.1f}" if ms else "–"

        share = [f"{of_peak(k):.0%}"] if peak else []
        op = f"`{k['op']}`" + ("†" if k.get("flops_direct_equivalent") else "")
        rows.append([named(k), *cpu_of(k), str(k["batch"]), op, str(k["calls"]), f"{g:.3f}", gf(k["untuned_ms"]), gf(k["tuned_ms"]), *share,
                     gf(k["numpy_ms"]), gf(k["torch_ms"])])  # fmt: skip
    header = ["network", *(["CPU"] if by_cpu else []), "batch", "kernel", "calls", "GFLOP", "untuned", "tuned", *(["of peak"] if peak else []), "numpy", "PyTorch"]
    lines += table(header, rows, ("ll" if by_cpu else "l") + "rlrr" + "r" * (len(header) - 5 - by_cpu))
    lines += ["", "Untuned and tuned are the tuner's own side-by-side re-timing (since f7469da an untuned kernel 10× slower than every "
              "candidate gets 3 calls, not 50: `tuner.workloads.search.BRIEF_DEFAULT_PAST`); numpy (im2col + GEMM for convolutions) and "
              "PyTorch (`F.conv2d` / `torch.matmul`, oneDNN/MKL) run the same kernel shapes with the epilogue, timed here.", ""]  # fmt: skip
    beyond = sorted({k.get("cpu", "") for k in d["kernels"] if peak and not k.get("flops_direct_equivalent") and k.get("flops") and of_peak(k) > 1})
    if beyond:
        lines += [f"On {', '.join(c or 'this CPU' for c in beyond)} a tuned matmul or direct convolution ran faster than the sgemm of "
                  "numpy and PyTorch: there those libraries' peak understates the machine's, and \"of peak\" flatters every kernel.", ""]  # fmt: skip
    if any(k.get("flops_direct_equivalent") for k in d["kernels"]):
        lines += ["† A Winograd convolution (`conv=\"winograd\"`): its GFLOP and GFLOPS are those of the direct convolution it replaces, "
                  "which numpy and PyTorch compute (effective GFLOPS: F(4×4, 3×3) does about 4× fewer multiplications, F(2×2, 3×3) 2.25×, so its "
                  "\"of peak\" may pass 100%; it says how fast the layer runs, not how busy the multipliers are).", ""]  # fmt: skip
    if "curves" in drawn:
        lines += [f"![tuning curves]({drawn['curves']})", ""]
    return lines


def latest_rows(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each CPU's newest row of each network and batch (by when its run was recorded: whatever its configuration or
    result), in the table's order."""
    newest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: r.get("recorded", "")):  # stable: rows of one run keep their order
        newest[(str(r.get("cpu", "")), r["network"], r["batch"])] = r
    by_cpu: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if newest[(str(r.get("cpu", "")), r["network"], r["batch"])] is r:
            by_cpu.setdefault(str(r.get("cpu", "")), []).append(r)
    return by_cpu


def _latest_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The table as it stands on each CPU: every network's newest row, with the geometric mean of their speedups."""
    out = ["Where each CPU stands: its newest row of each network and batch (the rows above are every configuration measured, "
           "older ones kept as the record):", ""]
    summary = []
    for cpu, newest in latest_rows(rows).items():
        speedups = [r["speedup_vs_pytorch"]["median"] for r in newest]
        geomean = math.exp(sum(math.log(x) for x in speedups) / len(speedups))
        each = ", ".join(f"{r['network']} b{r['batch']} {times(r['speedup_vs_pytorch'])}" for r in newest)
        summary.append([cpu, each, f"{sum(x >= 1 for x in speedups)} of {len(speedups)}", f"{geomean:.2f}×"])
    return [*out, *table(["CPU", "tuned vs PyTorch, newest row of each network", "≥ 1.0×", "geometric mean"], summary, "llrr"), ""]


def _tuning_runs(rows: list[dict[str, Any]]) -> list[str]:
    """How each row tuned in rounds was tuned: policy, rewrites, cost model, trials, minutes, why it stopped, and its command."""
    tuned = [r for r in rows if r.get("tuning")]
    if not tuned:
        return []
    out = ["Tuned in rounds:", ""]
    for r in tuned:
        how = r["tuning"]
        warm = "--warm-model" in r.get("command", "")  # a run records its choice; those recorded before warm was the default were cold
        model = "each round's cost model started from the registry's log" if warm else "a cold cost model each round"
        rewrites = ", ".join(rewrites_of(r)) or "nothing rewritten"
        rounds = f"rounds of {how['round_trials']}, " if how.get("round_trials") else ""
        resumed = "resuming an earlier run's registry (`--seed-store`), " if "--seed-store" in r.get("command", "") else ""
        out.append(f"- {r['network']} b{r['batch']}: {how['policy']} policy, {rounds}{resumed}{rewrites}, {model}; {how['trials']} trials in "
                   f"{r['tune_secs'] / 60:.0f} min; stopped: {how['stopped_because']}. `{r.get('command', '')}`")  # fmt: skip
    return [*out, ""]


def _synthesized(d: dict[str, Any]) -> list[str]:
    """The synthesis rows of a transfer run (runs before synthesis have none)."""
    rows = [r for r in d["rows"] if "synthesized" in r["timing"]]
    if not rows:
        return []
    samples = d.get("synthesize", 64)
    lines = ["### Synthesized: each missed kernel's own design space, ranked by the cost model, the best timed here", "",
             f"`use(..., measure=SECONDS, synthesize={samples})`: {samples} design-space samples per missed kernel are scored by the xgboost "
             f"model trained on the registry's measurement log; the best {d.get('timed', 3)} are timed beside the transfer candidates and the fastest that "
             "agrees with the default schedule is served. The first compile draws, trains and times (the model is trained once, in the "
             "first network's compile; the cache is shared, as on one machine); \"again\" is the next compile on this machine. "
             "Timed in the same rounds as the table above.", ""]  # fmt: skip
    body = []
    for r in rows:
        t, c, added = r["timing"], r["compile_secs"], r["synthesis_compile_added_secs"]
        body.append([r["label"], f"{r['synthesized_kernels']} / {r['synthesis_transfers']} / {r['synthesis_misses']}", fmt(t["synthesized"]), fmt(t["tuned"]),
                     times(r["synthesized_vs_tuned"]), times(r["default_vs_synthesized"]), fmt(c["synthesized_cold"]), f"{added['synthesized']:+.2f}"])  # fmt: skip
    lines += table(["network", "synthesized / transfers / misses", "synthesized ms", "tuned ms", "synthesized / tuned", "default / synthesized",
                    "first compile s", "again: added s"], body, "lrrrrrrr")  # fmt: skip
    return lines + [""]


def _first_pass(d: dict[str, Any]) -> list[str]:
    """The first-pass rows of a transfer run (runs before the first pass have none)."""
    rows = [r for r in d["rows"] if "first_pass" in r["timing"]]
    if not rows:
        return []
    lines = ["### The worker's first pass: every miss measured before any is searched", "",
             "A worker leasing the held-out networks' misses first gives each kernel a first pass (`TuneOptions.first_pass`: the registry's "
             "transfers and the log model's best synthesized samples built and timed side by side, the best published; no search) and only "
             "then each kernel's search at the bench budget (warm-started, the first pass's schedule included). \"first pass\" is the "
             "network compiled after the first passes (every kernel a hit); \"s\" is the tuning time on this machine's Ray cluster. "
             "Timed in the same rounds as the tables above.", ""]  # fmt: skip
    body = []
    for r in rows:
        t, c = r["timing"], r["compile_secs"]
        body.append([r["label"], fmt(t["first_pass"]), fmt(c["first_pass_tuning"]), fmt(t["tuned"]), fmt(c["search_tuning"]),
                     times(r["first_pass_vs_tuned"]), times(r["default_vs_first_pass"])])  # fmt: skip
    lines += table(["network", "first pass ms", "first pass s", "tuned ms", "searches s", "first pass / tuned", "default / first pass"], body, "lrrrrrr")
    return lines + [""]


def _transfer(d: dict[str, Any] | None, drawn: dict[str, str], judged: dict[str, Any] | None = None) -> list[str]:
    if not d:
        return []
    o = d["options"]
    source = ", ".join(" ".join([n, *(f"{k} {v}" for k, v in shape.items())]) for n, shape in d["source"].items())
    fill = f"{d['fill_secs'] / 60:.0f} min" if d.get("fill_secs") else "filled by an earlier run"
    rounds = d["rows"][0]["timing"]["default"]["n"] if d["rows"] else 0
    recorded = (f"Recorded {d['started']} at commit `{d['commit']}` on {d['machine']['cpu']}, target `{json.dumps(d['target'])}`. " if "commit" in d
                else f"Recorded in a run of its own, target `{json.dumps(d['target'])}`. ")  # fmt: skip
    lines = [f"## Transfer: held-out networks the registry never tuned (`{d.get('command', 'python -m bench.transfer')}`)", "", recorded +
             f"The registry holds {d['source_keys']} records from tuning {source} at batch 1 ({o['trials']} trials per kernel; {fill}). "
             "Each held-out network compiles plain (TVM's default schedules) and inside `hooks.use(registry)`, where a kernel without "
             f"a record gets a transfer ({d.get('ranked_by', d.get('ranking'))}); \"measured\" serves instead the fastest candidate "
             "timed on this machine (`use(..., measure=SECONDS)`). Then the network's kernels are tuned at the same budget, warm-started "
             f"(after a worker's first pass over all of them, below), and it compiles again with every kernel a hit (\"tuned\"). Latency: {rounds} interleaved rounds, PyTorch in its own process on "
             "the same input and weights; every output agrees with the default's to 1e-3 of its scale.", ""]  # fmt: skip
    rows = []
    for r in d["rows"]:
        t = r["timing"]
        relations = ", ".join(f"{n} {k}" for k, n in sorted(r["relations"].items())) or "–"
        rows.append([r["label"], f"{r['transfers']}/{r['kernels']}", relations, fmt(t["default"]), fmt(t["transferred"]), fmt(t["measured"]),
                     fmt(t["tuned"]), fmt(t["pytorch"]), times(r["transferred_vs_tuned"]), times(r["default_vs_transferred"]),
                     f"{max(r['max_rel_error'].values()):.1e}"])  # fmt: skip
    lines += table(["network", "transferred", "from", "default ms", "transferred ms", "measured ms", "tuned ms", "PyTorch ms",
                    "transferred / tuned", "default / transferred", "max error"], rows, "lrlrrrrrrrr")  # fmt: skip
    lines += ["", "\"transferred\": kernels served by a transfer, of all the network's kernels; \"from\": what the transferred records were "
              "(`shape`: the same structure at other shapes, `compiler`: another TVM build, `target`: another CPU). Ratios are per round "
              "(latency over latency): transferred / tuned ≤ 1.43 is ≥ 70% of the tuned speed.", ""]  # fmt: skip
    if "transfer" in drawn:
        lines += [f"![transfer]({drawn['transfer']})", ""]
    lines += _synthesized(d)
    lines += _first_pass(d)
    lines += ["### Compile time (s until the model can run, medians; \"added\" per round against the plain compile)", ""]
    body = []
    for r in d["rows"]:
        c = r["compile_secs"]
        body.append([r["label"], fmt(c["default"]), fmt(c["transferred_cold"]), fmt(r["compile_added_cold_secs"]), fmt(c["transferred"]),
                     fmt(r["compile_added_secs"]), fmt(c["measured_cold"])])  # fmt: skip
    lines += table(["network", "plain", "transfers, empty kernel cache", "added", "transfers, warm cache", "added", "measuring every candidate"], body)
    hits = [r for r in d["rows"] if "hits" in r["compile_secs"]]
    if hits:
        lines += ["", "Once every kernel is tuned, every kernel hits:", ""]
        body = [[r["label"], fmt(r["compile_secs"]["default_beside_hits"]), fmt(r["compile_secs"]["hits_cold"]), times(r["hit_compile_cold_vs_plain"]),
                 fmt(r["compile_secs"]["hits"]), times(r["hit_compile_vs_plain"])] for r in hits]  # fmt: skip
        lines += table(["network", "plain", "all hits, empty kernel cache", "/ plain", "all hits, warm cache", "/ plain"], body)
    lines += ["", "Each time is the compile and the first load (a VM on the executable), where LLVM's JIT emits a plain build's machine "
              "code and cached kernel objects are linked. Tuned kernels cost LLVM more than default schedules (unrolled, vectorized loops); "
              "with a warm cache the hook neither replays nor compiles them again: each scheduled kernel's object was compiled once on "
              "this machine and is linked (`hooks/build/objects.py`).", ""]  # fmt: skip
    ranked = [(r["label"], r["ranking"]) for r in d["rows"] if r.get("ranking", {}).get("compared")]
    if ranked:
        lines += ["### Ranking: the hook's pick against the fastest candidate measured here", "",
                  f"The hook ranked by: {d.get('ranked_by')}. Kernels with at least two applicable candidates, every one built, "
                  "checked and timed on this machine.", ""]  # fmt: skip
        body = [[label, str(k["compared"]), str(k["served_is_best"]), fmt(k["served_vs_best"]), f"{k['time_served_vs_best']:.3f}"] for label, k in ranked]
        lines += table(["network", "kernels compared", "served was the fastest", "served / fastest, per kernel", "served / fastest, summed kernel time"], body)
        lines += [""]
        names = {"source_gflops": "most GFLOPS on its own workload first", "source_secs": "fastest on its own workload first",
                 "xgboost": "xgboost cost model", "nearest_first": "nearest first", "fit": "fewest tiles re-derived, then most GFLOPS"}  # fmt: skip
        rejudged = _rejudged(ranked, judged, d.get("started"))
        alternatives = sorted({n for _, k in ranked for n in k.get("alternatives", {})})
        if alternatives:
            lines += ["Other rankings on the same measurements (picked the fastest / summed kernel time against the fastest; "
                      "the hook's pick for comparison):", ""]  # fmt: skip
            if rejudged:
                lines += [rejudged, ""]
            if "xgboost" in alternatives:
                lines += [_cost_model_sentence(judged if rejudged else d), ""]
            body = [[label, f"{k['served_is_best']}/{k['compared']}, {k['time_served_vs_best']:.3f}",
                     *(_pick(k["alternatives"].get(n), n) for n in alternatives)] for label, k in ranked]  # fmt: skip
            lines += table(["network", "served", *(names.get(n, n) for n in alternatives)], body) + [""]
    if d.get("warm_vs_cold"):
        lines += ["### Warm-started against cold tuning (same budget, the slowest held-out kernels)", ""]
        body = [[f"`{w['op']}`", str(w["warm_started"]), f"{w['warm_first_us']:.1f}", f"{w['warm_best_us']:.1f}", f"{w['cold_best_us']:.1f}",
                 str(w["warm_trials_to_match_cold"]) if w["warm_trials_to_match_cold"] is not None else f"not within {w['trials']}"]
                for w in d["warm_vs_cold"]]  # fmt: skip
        lines += table(["kernel", "warm traces", "warm first µs", "warm best µs", "cold best µs", "warm trials to match cold's best"], body) + [""]
    return lines


def _rejudged(ranked: list[tuple[str, dict[str, Any]]], judged: dict[str, Any] | None, started: str | None) -> str:
    """Merge the rankings ``python -m bench.studies.ranking`` judged later on the same measurements (``ranking.json``
    of the transfer run that started at ``started``) into ``ranked``; returns a sentence saying so, or ""."""
    if not judged or started is None or judged.get("started") != started:
        return ""
    added: set[str] = set()
    for label, k in ranked:
        later = judged.get("rows", {}).get(label, {}).get("alternatives", {})
        for name, picks in later.items():
            if name not in k.setdefault("alternatives", {}):
                k["alternatives"][name] = picks
                added.add(name)
    if not added:
        return ""
    return f"Judged later by `python -m bench.studies.ranking --source-store DIR` on this run's measurements: {', '.join(sorted(added))}."


def _cost_model_sentence(results: dict[str, Any] | None) -> str:
    """What the xgboost column ranks by, with the sample count of the results that trained it."""
    model = (results or {}).get("cost_model") or {}
    trained_on = ("the source registry's measurement log ({} samples: every logged trial on its own workload)" if model.get("source") == "measurement log"
                  else "the source registry's records ({} samples: each record on its own workload, each workload unscheduled)")  # fmt: skip
    return (f"The xgboost cost model ranks by MetaSchedule's per-store features of each candidate replayed on the held-out kernel, "
            f"trained on {trained_on.format(model.get('samples', '?'))}, predicting GFLOPS.")


def _pick(k: dict[str, Any] | None, name: str) -> str:
    return f"{k[f'{name}_is_best']}/{k['compared']}, {k[f'time_{name}_vs_best']:.3f}" if k and k.get("compared") else "–"


def _tuner(d: dict[str, Any] | None) -> list[str]:
    if not d:
        return []
    search = _search(**d["search"]) if "search" in d else "MetaSchedule's defaults"
    on_gpu = d.get("device") == "cuda"
    default = "DLight" if on_gpu else "untuned"
    where = f"one {d.get('cpus', '?')}-CPU node with {d.get('device_name', 'a GPU')}" if on_gpu else "one 2-CPU node"
    lines = [f"## Tuner{' on the GPU' if on_gpu else ''}: Ray tuner vs plain MetaSchedule (`{d.get('command', 'python -m bench.tuner')}`)", "",
             f"Same budget ({d['trials']} trials, rounds of {d['trials_per_iter']}), seed and search ({search}) on {where}; then the best schedule of each, "
             f"{'DLight' + chr(39) + 's schedule' if on_gpu else 'the unscheduled kernel and numpy'} timed side by side.", ""]  # fmt: skip
    rows = []
    for name, e in d["workloads"].items():
        for r in e["runs"]:
            t = r["timed"]
            rows.append([f"`{name}`", str(r["seed"]), f"{r['ray']['trials_per_sec']:.2f}", f"{r['plain']['trials_per_sec']:.2f}",
                         f"{r['ray']['trials_per_sec'] / r['plain']['trials_per_sec']:.2f}", fmt(t["untuned"]), fmt(t["ray"]), fmt(t["plain"]), fmt(t.get("numpy"))])  # fmt: skip
    lines += table(["kernel", "seed", "ray trials/s", "plain trials/s", "ratio", f"{default} ms", "ray best ms", "plain best ms", "numpy ms"], rows)
    return lines + [""] + _tuner_phases(d)


def _gpu_transfer(d: dict[str, Any] | None) -> list[str]:
    """What a GPU compile got for batches never tuned: DLight, the transfer, tuned where it was, PyTorch."""
    if not d:
        return []
    extra = [c for c in ("measured", "measured_recorded", "tuned") if any(c in r["timing"] for r in d["rows"])]  # columns of later runs
    shape = ", ".join(f"{k} {v}" for k, v in d["shape"].items())
    lines = [f"## GPU ({d['device_name']}): a batch never tuned, DLight vs transferred (`{d.get('command', 'python -m bench.gpu_transfer')}`)", "",
             f"The {d['network']} ({shape}) tuned at batch {d['source_batch']} only ({d['options']['trials']} trials a kernel"
             + (f", {d['fill_secs']:.0f} s" if d.get("fill_secs") else ", an earlier run's registry") + "); "
             "then each batch below compiled with plain `tvm.compile` (DLight) and inside `hooks.use` (a transfer where one replays"
             + ("; measured: with `measure=`, DLight timed beside the candidates" if "measured" in extra else "")
             + (", each transfer's twin postprocessed here among them (measured_recorded: without the twins)" if "measured_recorded" in extra else "") + "). "
             f"Medians of {d['rounds']} interleaved rounds, PyTorch in its own process (TF32 off); every output checked against DLight's. "
             "Compile seconds: one plain and one hooked compile (the kernel cache empty)"
             + (", and one measured" if "measured" in extra else "") + ("; tuned: time over the tuned network's, < 1 faster" if "tuned" in extra else "") + "."
             + (f" {d['runs_note']}." if d.get("runs_note") else ""), ""]  # fmt: skip

    def added(r: dict[str, Any], column: str) -> str:
        return f"{r['compile_secs'][column] - r['compile_secs']['dlight']:+.2f}" if column in r["compile_secs"] else "–"

    def over_tuned(r: dict[str, Any], column: str) -> str:
        return times(ratio(r["timing"][column], r["timing"]["tuned"], paired=True)) if "tuned" in r["timing"] else "–"

    versus_tuned = (["transferred", "measured"] if "measured" in extra else ["transferred"]) if "tuned" in extra else []
    rows = [[r["label"], f"{r['transfers']}/{r['kernels']}", fmt(r["timing"]["pytorch"]), fmt(r["timing"]["dlight"]), fmt(r["timing"]["transferred"]),
             *(fmt(r["timing"].get(c)) for c in extra), times(r["dlight_vs_transferred"]), times(r["pytorch_vs_transferred"]),
             *(over_tuned(r, c) for c in versus_tuned),
             added(r, "transferred"), *([added(r, "measured")] if "measured" in extra else [])] for r in d["rows"]]  # fmt: skip
    head = ["held-out network", "transferred kernels", "PyTorch ms", "DLight ms", "transferred ms", *(f"{c} ms" for c in extra),
            "transferred vs DLight", "transferred vs PyTorch", *(f"{c} / tuned" for c in versus_tuned),
            "compile s added", *(["measured compile s added"] if "measured" in extra else [])]  # fmt: skip
    return lines + table(head, rows) + [""]


def _tuner_phases(d: dict[str, Any]) -> list[str]:
    """Where each search's seconds went, by MetaSchedule's profiler (runs recorded before it have none)."""
    runs = [(name, r, tuner) for name, e in d["workloads"].items() for r in e["runs"] for tuner in ("ray", "plain") if r[tuner].get("phases")]
    if not runs:
        return []
    phases = list(runs[0][1][runs[0][2]]["phases"])  # as ``tuner.workloads.search.tuning_phases`` orders them
    tasks = any(r[tuner].get("tasks") for _, r, tuner in runs)  # runs recorded before the tasks' own seconds have none

    def inside(t: dict[str, Any]) -> str:
        return " / ".join(f"{t[k]['secs']:.1f}" if k in t else "–" for k in ("build", "measure")) if t else "–"

    rows = [[f"`{name}`", str(r["seed"]), tuner, f"{r[tuner]['search_secs']:.1f}", *(f"{r[tuner]['phases'].get(p, 0.0):.1f}" for p in phases),
             *([inside(r[tuner].get("tasks", {}))] if tasks else [])] for name, r, tuner in runs]  # fmt: skip
    return ["Where the search's seconds went (MetaSchedule's profiler; `build`: until a round's candidates are built, `measure`: until they are timed, "
            "`rest`: the task scheduler and everything between its scopes"
            + ("; inside Ray's tasks: the seconds its build and measurement tasks ran their function, summed over tasks (builds run in "
               "parallel, so theirs can exceed the phase; measurements run one at a time, so the measure phase less theirs is Ray's "
               "scheduling, worker starts and transfers)" if tasks else "") + "):", "",
            *table(["kernel", "seed", "tuner", "wall s", *(f"{p} s" for p in phases), *(["inside Ray's tasks s (build / measure)"] if tasks else [])], rows), ""]  # fmt: skip


def _rounds(d: dict[str, Any] | None) -> list[str]:
    """``bench.rounds``: a network's tuning rounds by stage, each revision measured (medians over every round)."""
    if not d:
        return []
    env = d["environment"]
    lines = [f"## Tuning throughput: a network's rounds (`{d['command']}`)", "",
             f"{d['network']}{', convolutions ' + d['layout'] if d['layout'] != 'given' else ''}{', weights prepacked' if d['prepack'] else ''}: "
             f"its {len(d['kernels'])} heaviest kernels "
             "in turn, rounds of 16 trials (population 128 × 2), "
             + (f"from a copy of a registry of {d['seed_store']['keys']} keys and {d['seed_store']['logged_trials']:,} logged trials (a resumed run) "
                "with an empty kernel cache" if d.get("seed_store") else "a fresh registry") +
             " and Ray cluster in a process of its own for each run, "
             f"revisions alternating; {env['machine']['cpu']}{' (' + d['host_cpu'] + ')' if d.get('host_cpu') else ''}, {env['machine']['cores']} cores. A round's stages: the warm start, the search "
             "(MetaSchedule's own total), publishing (the best built, checked and timed beside the default), and the rest.", ""]  # fmt: skip
    stages = list(next(iter(d["arms"].values()))["stage_secs"])
    rows = [[f"`{rev}`" if rev != "worktree" else f"this tree (`{env.get('commit', '?')}`)", fmt(a["trials_per_sec"]), fmt(a["round_secs"]),
             *(f"{a['stage_secs'][s]:.1f}" for s in stages), f"{a['phase_secs']['build']:.1f} / {a['phase_secs']['measure']:.1f}",
             f"{a['publishing_secs']['build']:.1f} / {a['publishing_secs']['measure']:.1f}" if "publishing_secs" in a else "–",
             f"{a['reference_recalled']['rounds']} of {a['reference_recalled']['of']}" if "reference_recalled" in a else "–"]
            for rev, a in d["arms"].items()]  # fmt: skip
    lines += table(["revision", "trials/s", "round s", *(f"{s} s" for s in stages), "search's build / measure s", "publishing's build / measure s",
                    "rounds whose reference was recalled"], rows)  # fmt: skip
    if "this_vs_before" in d:
        lines += ["", f"This tree against the other, run by run: {times(d['this_vs_before'])} the trials/s."]
    return lines + [""]


def _isolation(d: dict[str, Any] | None) -> list[str]:
    if not d:
        return []
    lines = [f"## Measurement isolation: a kernel timed while the tuner's driver works (`{d.get('command', 'python -m bench.isolation')}`)", "",
             f"`{d['kernel']}`, tuned at 8 trials, timed by a measurement task (every CPU of a 2-CPU Ray node held) in {d['rounds']} interleaved rounds: "
             "alone; beside pure-Python work in a driver thread, outside Ray, for the whole measurement (how seeds were drawn before 9b2110c); "
             f"beside the same work ({d['held_work_secs']:.0f} s) inside `cluster.holding_driver_cpu()` (how seeds are drawn now: the measurement waits for it).", ""]  # fmt: skip
    names = {"alone": "alone", "beside": "beside driver work, not held", "held": "beside driver work, held"}
    rows = [[names[c], fmt(d["ms"][c]), fmt(d["over_alone"][c]) + "×" if c in d["over_alone"] else "1"] for c in names]
    return lines + table(["condition", "ms", "÷ alone (per round)"], rows) + [""]


def _search(population: int, genetic_iters: int, threads: int) -> str:
    """The evolutionary search a run used, in words (``threads`` 0: one per physical core)."""
    return (f"population {population} × {genetic_iters} genetic rounds, "
            + (f"{threads} search thread{'s' if threads != 1 else ''}" if threads else "a search thread per physical core"))


def _hook(d: dict[str, Any] | None) -> list[str]:
    if not d:
        return []
    names = {"plain_tvm_ms": "plain `tvm.compile`, no database", "memory_database_ms": "records in a MetaSchedule `MemoryDatabase`",
             "hook_http_cold_ms": "`use(URL)`: one batch lookup over HTTP", "hook_http_warm_ms": "`use(session)`: warm cache, no request",
             "hook_local_lmdb_ms": "`use(DIR)`: local LMDB"}  # fmt: skip
    lines = [f"## Compile hook (`{d['command']}`)", "", f"A 6-layer MLP, {d['kernels']} kernels, all with records; {d['reps']} interleaved rounds.", ""]
    rows = [[label, fmt(d[k]), times(d[k]["vs_memory_database"]) if "vs_memory_database" in d[k] else "1 (the baseline)"] for k, label in names.items() if k in d]
    lines += table(["configuration", "compile ms", "vs MemoryDatabase (per round)"], rows)
    return lines + ["", f"One `POST /v1/lookup` for all kernels: {d['lookup_round_trip_ms']:.2f} ms.", ""]


def _registry(d: dict[str, Any] | None) -> list[str]:
    if not d:
        return []
    recorded = f"Recorded {d['recorded']} at commit `{d['commit']}`. " if d.get("recorded") else ""
    lines = [f"## Registry (`{d['command']}`)", "", recorded + "Open a store in a fresh process and answer the first lookup, against MetaSchedule's JSONDatabase.", ""]
    sizes = sorted({*d["schedhub"], *d["metaschedule"]}, key=int)
    rows = [[f"{int(n):,}", fmt(d["schedhub"].get(n, {}).get("open_first_lookup_ms")), fmt(d["metaschedule"].get(n, {}).get("open_first_lookup_ms"))] for n in sizes]
    lines += table(["records", "schedhub LMDB ms", "JSONDatabase ms"], rows)
    h, one = d["http"], d["http_one_connection"]
    lines += ["", f"HTTP on loopback ({int(h['store_records']):,}-record store): {fmt(h['requests_per_s'])} GET/s with 16 client threads; "
              f"one connection p50 {fmt(one['p50_ms'])} ms; a batch lookup of 50 keys {fmt(d['batch']['lookup_50_ms'])} ms "
              f"against {fmt(d['batch']['sequential_50_gets_ms'])} ms for 50 sequential GETs.", ""]  # fmt: skip
    if d.get("server_load"):
        load = d["server_load"]
        lines += [f"The server under concurrent load (`bench.serverload`: wrk, one thread pinned to a core, 16 connections, msgpack, "
                  f"2,000 keys of one ~2 KB record): `GET /v1/records/{{key}}` {fmt(load['get']['rps'])} req/s (p99 {fmt(load['get']['p99_ms'])} ms), "
                  f"a 20-key `POST /v1/lookup` {fmt(load['lookup20']['rps'])} req/s (p99 {fmt(load['lookup20']['p99_ms'])} ms). "
                  "`python -m bench.serverload --against REV` serves an older revision beside this one.", ""]  # fmt: skip
    if d.get("dashboard"):
        listed = any("op_page_ms" in v for v in d["dashboard"].values())
        lines += ["The dashboard (`GET /`) and the public listings by store size (ms per request, one client)"
                  + (": `/v1/stats` (with the queue's counts), a page of an op's keys (`?op=&limit=100`), a page filtered by a target "
                     "no key has (`?target=cuda`), the same with an op (`?op=&target=cuda`, where recorded), a page of dead jobs (none: every job is done); "
                     "the queue holds one job per key." if listed else ":"), ""]  # fmt: skip
        by_op = any("op_unmatched_target_ms" in v for v in d["dashboard"].values())  # recorded since store format 4
        columns = ["records", "queue jobs", "dashboard ms", "stats ms", "op page ms", "unmatched target ms", *(["op, unmatched target ms"] if by_op else []),
                   "dead jobs ms"] if listed else ["records", "dashboard ms", "stats ms"]  # fmt: skip
        keys = ["page_ms", "stats_ms", "op_page_ms", "unmatched_target_ms", *(["op_unmatched_target_ms"] if by_op else []), "dead_jobs_ms"] if listed else ["page_ms", "stats_ms"]
        lines += table(columns, [[f"{int(n):,}", *([f"{v.get('jobs', 0):,}"] if listed else []), *(fmt(v[k]) for k in keys)] for n, v in d["dashboard"].items()]) + [""]
    if d.get("own_ops"):
        o = d["own_ops"]
        lines += [f"With every key its own op ({o['records']:,} records, {o['ops']:,} ops; a pusher may name a new op with every record): "
                  f"the dashboard {fmt(o['page_ms'])} ms, `/v1/stats` {fmt(o['stats_ms'])} ms (each ranking's first rows, kept counts of names).", ""]
    if d.get("lease"):
        q = d["lease"]
        lines += [f"A worker's lease with {q['unsuitable_jobs']:,} pending jobs of a compiler no worker runs queued before the one it can take "
                  f"(anyone may report a miss for any fingerprint): {fmt(q['naming_device_ms'])} ms naming its compiler, kind and device, as "
                  f"`schedhub worker` does (the queue reads the jobs of its fit), against {fmt(q['naming_no_device_ms'])} ms naming no device "
                  "(every pending job read, in the one write transaction). Medians of 7.", ""]  # fmt: skip
    reads = {n: v["log_read"] for n, v in d.get("dashboard", {}).items() if "log_read" in v}
    if reads:
        lines += ["What a cost model for one CPU reads of the measurement log (`/v1/trials`, pages of 200): the log holds one entry per "
                  "key (4 trials each) and a few entries of a CPU few tuned for; its entries paged with `target=` (the server reads "
                  "its index), against every entry paged and kept by the client, as the hook read them before. Medians of 3.", ""]
        lines += table(["records", "log entries", "that CPU's", "server filters ms", "client filters ms", "client / server"],
                       [[f"{int(n):,}", f"{d['dashboard'][n]['trial_logs']:,}", str(r["entries"]), fmt(r["server_filtered_ms"]),
                         fmt(r["client_filtered_ms"]), times(r["client_over_server"])] for n, r in reads.items()]) + [""]  # fmt: skip
    structures = {n: v["structure_read"] for n, v in d.get("dashboard", {}).items() if "structure_read" in v}
    if structures:
        lines += ["What a search's cost model starts from (`tuner.workloads.logmodel.model_log`): the verified entries of one structure the "
                  "store's target logged a few of, paged with `structure=` (the server reads its index by target and structure), "
                  "against the target's first 2,000 entries paged and kept by the client, as `model_log` read them before (it found "
                  "only those of the structure among them). Medians of 3.", ""]
        lines += table(["records", "log entries", "the structure's", "found by the client", "server filters ms", "client filters ms", "client / server"],
                       [[f"{int(n):,}", f"{d['dashboard'][n]['trial_logs']:,}", str(r["entries"]), str(r["client_found"]), fmt(r["server_filtered_ms"]),
                         fmt(r["client_filtered_ms"]), times(r["client_over_server"])] for n, r in structures.items()]) + [""]  # fmt: skip
    return lines


def _agreement(before: dict[str, Any], after: dict[str, Any], mode: str) -> list[str]:
    found = agreement(before, after)
    if not found["comparisons"] and not found["absolute"]:
        return []
    when = before.get("manifest", {}).get("started", "an earlier run")
    noise = found["noise"]
    lines = [f"## Run-to-run agreement: this run against the previous `{mode}` run ({when})", "",
             f"The previous run's raw results are in `bench/results/{mode}.prev/`. Each figure is judged two ways: do the two runs' "
             "[min–max] ranges overlap (the noise within a run), and is the change within the **run-to-run noise** of this machine. "
             "That noise is measured here, on figures whose code is identical in both runs (PyTorch, numpy and TVM's default "
             "schedules: no tuned schedule in them): the 90th percentile of their changes between the two runs.", ""]  # fmt: skip
    lines += _probe_drift(before.get("manifest", {}), after.get("manifest", {}))
    if found["controls"]:
        lines += [f"### Same-code comparisons: run-to-run noise of a ratio ±{noise['comparisons'] * 100:.0f}%" if noise["comparisons"] is not None
                  else "### Same-code comparisons", ""]  # fmt: skip
        body = [[r["figure"], fmt(r["before"]), fmt(r["after"]), f"{r['change'] * 100:+.1f}%", "yes" if r["agree"] else "no"] for r in found["controls"]]
        lines += table(["figure", "previous run", "this run", "change", "ranges overlap"], body, "lrrrl") + [""]
    for kind, title, note in (
        ("comparisons", "Comparisons (the claims: ratios of configurations timed side by side)",
         "Range: the per-round ratios where both sides ran in the same rounds, else the bounds of the two ranges."),
        ("absolute", "Absolute figures", "Range: min–max over the run's repeated samples."),
    ):  # fmt: skip
        rows = found[kind]
        if not rows:
            continue
        band = noise[kind]
        within = sum(r["within_noise"] for r in rows)
        changes = sorted(abs(r["change"]) for r in rows)
        head = f"{within} of {len(rows)} within the run-to-run noise (±{band * 100:.0f}%)" if band is not None else "no run-to-run noise measured"
        lines += [f"### {title}: {head}; {sum(r['agree'] for r in rows)} of {len(rows)} ranges overlap", "",
                  f"{note} Median change {changes[len(changes) // 2] * 100:.1f}%, largest {changes[-1] * 100:.0f}%.", ""]  # fmt: skip
        body = [[r["figure"], fmt(r["before"]), fmt(r["after"]), f"{r['change'] * 100:+.1f}%", "yes" if r["agree"] else "no",
                 "yes" if r["within_noise"] else "**no**"] for r in rows]  # fmt: skip
        lines += table(["figure", "previous run", "this run", "change", "ranges overlap", "within run-to-run noise"], body, "lrrrll") + [""]
    return lines


def _probe_drift(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The machine probe before each section, in both runs: how much faster or slower the shared machine was."""
    rows = []
    for name, section in after.get("sections", {}).items():
        old = before.get("sections", {}).get(name, {}).get("probe_ms")
        new = section.get("probe_ms")
        if old and new:
            rows.append([name, fmt(old), fmt(new), f"{(new['median'] / old['median'] - 1) * 100:+.1f}%"])
    if not rows:
        return []
    return ["Machine probe (`bench.stats.machine_probe`: a fixed single-threaded pure-Python workload, ms, timed before each section):", "",
            *table(["before section", "previous run", "this run", "change"], rows), ""]  # fmt: skip
