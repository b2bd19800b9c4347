"""The benchmark's baselines are the same computation as the kernels and models they are compared with."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from bench import report, torch_models
from bench.stats import ratio, summary
from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.tuner.compare import baselines
from schedhub.tuner.execution import kernels
from schedhub.tuner.networks import models
from schedhub.tuner.execution.tvm_env import host_target

SMALL = {"mlp": {}, "resnet18": {"image": 32}, "mobilenetv2": {"image": 32}, "bert_layer": {"seq": 8}}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_pytorch_twin_loads_the_relax_weights_and_computes_the_same_outputs(name: str) -> None:
    mod, weights, input_shape = models.export_with_weights(name, batch=2, **SMALL[name])
    net = torch_models.build(name, weights, batch=2, **SMALL[name])  # strict: every name and shape must match
    x = np.random.default_rng(3).standard_normal(input_shape).astype("float32")
    expected = relax.VirtualMachine(tvm.compile(mod, tvm.target.Target(host_target())), tvm.cpu())["forward"](tvm.runtime.tensor(x)).numpy()
    got = torch_models.forward(net, x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


def test_pytorch_twin_refuses_weights_of_another_shape() -> None:
    _, weights, _ = models.export_with_weights("mlp", hidden=64)
    with pytest.raises(RuntimeError, match="size mismatch"):
        torch_models.build("mlp", weights)  # default hidden 512


def test_kernel_baselines_compute_what_the_tvm_kernel_computes() -> None:
    """numpy and PyTorch baselines of every matmul/conv kernel (strided, depthwise, 1×1, batched) match TVM's build."""
    target = tvm.target.Target(host_target())
    checked = 0
    for name, shape in (("mobilenetv2", {"image": 32}), ("bert_layer", {"seq": 8}), ("resnet18", {"image": 32})):
        mod, _, _ = models.export_with_weights(name, **shape)
        for k in models.kernels(mod, target, NO_REWRITES):
            if not baselines.supported(k.identity.op, k.identity.args_info):
                continue
            from schedhub.hooks.kernels.identity import workload_module

            lib = tvm.compile(workload_module(k.identity.workload), target)
            args = [tvm.runtime.tensor(a) for a in kernels.random_arguments(k.identity.args_info)]
            lib["main"](*args)
            for library in ("numpy", "torch"):
                got = baselines.kernel_baseline(k.identity.op, k.identity.args_info, library)()
                np.testing.assert_allclose(np.asarray(got), args[-1].numpy(), rtol=1e-3, atol=1e-3, err_msg=f"{library} {k.name}")
            checked += 1
    assert checked >= 30
    assert baselines.kernel_baseline("fused_softmax", [["TENSOR", "float32", [2, 2]]] * 2, "torch") is None
    scaled = [["TENSOR", "float32", [1, 12, 8, 64]], ["TENSOR", "float32", [1, 12, 64, 8]], ["TENSOR", "float32", [1, 12, 8, 8]]]
    assert baselines.kernel_baseline("fused_matmul1_multiply", scaled, "numpy") is None  # its constant is inside the kernel


def test_baselines_and_kernels_are_timed_on_the_same_inputs() -> None:
    """The TVM-free copy the PyTorch process uses makes the arrays the hook's measurements make."""
    from schedhub.hooks.kernels.measure import random_inputs

    info = [["TENSOR", "float32", [3, 5]], ["TENSOR", "int64", [4]], ["TENSOR", "bool", [6]], ["TENSOR", "float16", [2, 2]], ["TENSOR", "uint8", [3]],
            ["TENSOR", "float32", [7]]]  # a mask drew from the stream in the copy, so every array after it differed
    for seed in (0, 3):
        got, want = kernels.random_arguments(info, seed), random_inputs(info, seed)
        assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert np.any(kernels.random_arguments(info, 0)[0] != kernels.random_arguments(info, 3)[0])


def test_a_paired_ratio_uses_the_per_round_ratios_and_an_unpaired_one_the_widest_bounds() -> None:
    slow, fast = summary([10.0, 20.0, 12.0]), summary([5.0, 10.0, 6.0])  # a machine slowed in round 2: both sides alike
    paired = ratio(slow, fast, paired=True)
    assert (paired["min"], paired["median"], paired["max"]) == (2.0, 2.0, 2.0)
    unpaired = ratio(slow, fast, paired=False)
    assert (unpaired["min"], unpaired["max"]) == (1.0, 4.0) and unpaired["median"] == pytest.approx(2.0)


def test_agreement_compares_claims_and_absolute_figures_by_overlap_of_their_ranges() -> None:
    def run(scale: float, tuned: list[float]) -> dict[str, object]:
        timing = {"untuned": summary([scale * x for x in (10.0, 10.5, 9.5)]), "tuned": summary([scale * x for x in tuned]),
                  "pytorch": summary([scale * x for x in (2.0, 2.1, 1.9)])}  # fmt: skip
        return {"models": {"rows": [{"network": "mlp", "batch": 1, "timing": timing}]}}

    before, drifted, better = run(1.0, [1.0, 1.05, 0.95]), run(1.3, [1.0, 1.05, 0.95]), run(1.0, [0.5, 0.52, 0.48])
    found = report.agreement(before, drifted)  # the whole machine 30% slower: absolute times move, the claims do not
    absolute = {r["figure"]: r for r in found["absolute"]}
    assert not absolute["models: mlp b1 tuned ms"]["agree"] and absolute["models: mlp b1 tuned ms"]["change"] == pytest.approx(0.3)
    assert all(r["agree"] and r["change"] == pytest.approx(0) for r in found["comparisons"])
    assert {r["figure"] for r in found["comparisons"]} == {"models: mlp b1 tuned vs PyTorch ×", "models: mlp b1 tuned vs untuned ×"}
    claims = {r["figure"]: r for r in report.agreement(before, better)["comparisons"]}  # a schedule twice as fast is a different claim
    assert not claims["models: mlp b1 tuned vs PyTorch ×"]["agree"] and claims["models: mlp b1 tuned vs PyTorch ×"]["change"] == pytest.approx(1.0, rel=0.05)


def test_the_run_to_run_noise_is_measured_on_same_code_figures_and_judges_the_tuned_ones() -> None:
    def run(pytorch_scale: float, tuned: float) -> dict[str, object]:
        rows = [{"network": f"net{i}", "batch": 1, "timing": {"untuned": summary([10.0, 10.1, 9.9]), "tuned": summary([tuned, tuned * 1.01, tuned * 0.99]),
                 "pytorch": summary([pytorch_scale * (2.0 + i / 10) * x for x in (1.0, 1.01, 0.99)])}} for i in range(5)]  # fmt: skip
        return {"models": {"rows": rows}}

    # PyTorch (same code in both runs) moved 10% between the runs: that is the machine's run-to-run noise.
    found = report.agreement(run(1.0, 1.0), run(1.1, 1.08))
    assert found["noise"]["comparisons"] == pytest.approx(0.1)
    claims = {r["figure"]: r for r in found["comparisons"]}
    moved = claims["models: net0 b1 tuned vs untuned ×"]  # tuned 8% slower: outside its ranges, inside the noise
    assert not moved["agree"] and moved["within_noise"]
    found = report.agreement(run(1.0, 1.0), run(1.1, 1.5))  # a schedule 50% slower is more than noise
    assert not any(r["within_noise"] for r in found["comparisons"] if "tuned vs untuned" in r["figure"])
    assert report.agreement(run(1.0, 1.0), run(1.1, 1.0))["noise"]["absolute"] == pytest.approx(0.1)


def test_pytorch_runs_in_its_own_process_without_tvm() -> None:
    import numpy as np

    from schedhub.tuner.networks import models
    from schedhub.tuner.compare.torch_process import TorchProcess, TorchProcessError

    _, weights, input_shape = models.export_with_weights("mlp", batch=2, features=32, hidden=64)
    x = np.random.default_rng(0).standard_normal(input_shape).astype("float32")
    with TorchProcess() as torch_proc:
        out = torch_proc.load_network("mlp", weights, x, batch=2, features=32, hidden=64)
        w1, b1, w2, b2, w3, b3 = (weights[k] for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "head.weight", "head.bias"))
        expected = np.maximum(np.maximum(x @ w1.T + b1, 0) @ w2.T + b2, 0) @ w3.T + b3
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
        assert torch_proc.time_network() > 0
        assert torch_proc.time_kernel("fused_matmul_add_relu", [["TENSOR", "float32", [2, 32]], ["TENSOR", "float32", [32, 64]],
                                                                 ["TENSOR", "float32", [64]], ["TENSOR", "float32", [2, 64]]]) > 0  # fmt: skip
        with pytest.raises(TorchProcessError, match="nosuchnet"):
            torch_proc.load_network("nosuchnet", weights, x, batch=2, features=32, hidden=64)
        assert torch_proc.time_network() > 0  # still serving after an error
    from pathlib import Path

    with TorchProcess(cwd=Path(__file__).resolve().parent.parent) as torch_proc:  # the benchmarks' twins, by factory name
        twin = torch_proc.load_network("mlp", weights, x, factory="bench.torch_models:build", batch=2, features=32, hidden=64)
        np.testing.assert_allclose(twin, expected, rtol=1e-4, atol=1e-4)


def test_each_ranking_is_judged_by_the_time_of_its_own_pick_and_later_rankings_merge_into_the_same_run() -> None:
    from bench import transfer

    def candidate(us: float, order: int, gflops: float, predicted: float, retiled: int) -> dict:
        return {"us": us, "relation": "shape", "order": order, "distance": float(order), "source_gflops": gflops, "source_speed": gflops * 1e9,
                "source_us": 10.0, "predicted_log2_gflops": predicted, "retiled": retiled}

    measured = {"a": candidate(300.0, 0, 10.0, 2.0, 2), "b": candidate(100.0, 1, 50.0, 1.0, 1), "c": candidate(200.0, 2, 20.0, 5.0, 1)}
    candidates = {f"k:{t}": {k: v for k, v in c.items() if k != "us"} for t, c in measured.items()}
    row = {"op": "conv", "key": "k", "served_us": 200.0, "best_us": 100.0, "measured": [{"tid": t, "us": c["us"]} for t, c in measured.items()]}
    summary = transfer.ranking_summary([transfer.alternative_picks(row, candidates)])
    assert summary["served_is_best"] == 0 and summary["time_served_vs_best"] == pytest.approx(2.0)
    assert summary["alternatives"]["nearest_first"]["time_nearest_first_vs_best"] == pytest.approx(3.0)  # a: first in the registry's order
    assert summary["alternatives"]["fit"]["fit_is_best"] == 1  # b: fewest tiles re-derived, then the most GFLOPS
    assert summary["alternatives"]["source_gflops"]["source_gflops_is_best"] == 1  # b: the most GFLOPS on its own workload
    assert summary["alternatives"]["xgboost"]["time_xgboost_vs_best"] == pytest.approx(2.0)  # c: the highest prediction

    ranked = [("net", {"alternatives": {"source_gflops": summary["alternatives"]["source_gflops"]}})]
    later = {"started": "run 1", "cost_model": {"samples": 9}, "rows": {"net": {"alternatives": summary["alternatives"]}}}
    assert report._rejudged(ranked, later, "run 2") == "" and "xgboost" not in ranked[0][1]["alternatives"]  # another run's judgement
    assert "xgboost" in report._rejudged(ranked, later, "run 1") and ranked[0][1]["alternatives"]["xgboost"]["compared"] == 1


def test_a_gpu_run_is_reported_against_dlight_not_as_untuned() -> None:
    """``python -m bench gpu`` records the same shapes as the CPU run, with DLight as the default: the report says so."""
    import copy
    import json
    from pathlib import Path

    from bench import report

    recorded = Path(report.RESULTS) / "quick"
    models = json.loads((recorded / "models.json").read_text())
    tuner = json.loads((recorded / "tuner.json").read_text())
    gpu_models = {**copy.deepcopy(models), "default": "DLight", "device": "cuda", "device_name": "NVIDIA H100", "kernels": []}
    gpu_tuner = {**copy.deepcopy(tuner), "device": "cuda", "device_name": "NVIDIA H100", "cpus": 16}
    cpu_text = "\n".join(report._models(models, {}, "CPU") + report._tuner(tuner))
    gpu_text = "\n".join(report._models(gpu_models, {}, "GPU") + report._tuner(gpu_tuner))
    assert "untuned TVM ms" in cpu_text and "2-CPU node" in cpu_text
    assert "| DLight ms |" in gpu_text and "tuned vs DLight" in gpu_text and "DLight's schedule" in gpu_text
    assert "untuned" not in gpu_text and "16-CPU node with NVIDIA H100" in gpu_text
    assert "Heaviest kernels" not in gpu_text  # no per-kernel CPU baselines on a GPU run


def test_a_gpu_transfer_run_is_reported_against_dlight_with_tuned_columns_only_where_one_was_timed() -> None:
    import copy
    import json
    from pathlib import Path

    from bench import report

    recorded = json.loads((Path(report.RESULTS) / "gpu" / "gpu_transfer.json").read_text())
    plain = copy.deepcopy(recorded)  # a run that neither measured nor tuned
    for row in plain["rows"]:
        row["timing"] = {k: v for k, v in row["timing"].items() if k not in ("measured", "tuned")}
    text = "\n".join(report._gpu_transfer(plain))
    assert "| DLight ms | transferred ms | transferred vs DLight |" in text and "tuned ms" not in text and "measured" not in text.split("\n\n")[2]
    first = recorded["rows"][0]
    assert report.times(first["dlight_vs_transferred"]) in text and f"{first['transfers']}/{first['kernels']}" in text
    lines = report._gpu_transfer(recorded)  # batch 16 measured, batch 256 measured and tuned
    assert "| measured ms | tuned ms |" in lines[4] and "| transferred / tuned | measured / tuned |" in lines[4]
    untuned, tuned = lines[6].split(" | "), lines[7].split(" | ")
    assert untuned[-4:-2] == ["–", "–"] and "–" not in tuned[-4:-2]  # a row not tuned says so
    timing = recorded["rows"][1]["timing"]
    assert report.times(report.ratio(timing["transferred"], timing["tuned"], paired=True)) in lines[7]
    assert report._gpu_transfer(None) == []


@pytest.mark.slow
def test_the_gpu_transfer_bench_runs_through_on_the_cpu(tmp_path: Path) -> None:
    """``bench.gpu_transfer`` needs a GPU for its figures; on the CPU (a minute) its steps still run: fill, transfer, tune, time;
    and a second run takes the first one's filled registry instead of tuning again."""
    from bench import gpu_transfer

    small = {"features": 32, "hidden": 64}
    found = gpu_transfer.run(16, [8, 32], [32], trials=4, rounds=2, say=lambda _: None, device="cpu", shape=small, source_store=tmp_path / "store")
    few, tuned = found["rows"]
    assert found["fill_secs"] > 0 and few["transfers"] == few["kernels"] == 3 and "tuned" not in few["timing"] and few["timing"]["measured"]["median"] > 0
    assert few["timing"]["measured_recorded"]["median"] > 0 and few["recorded_vs_measured"]["median"] > 0
    assert tuned["transfers"] == 3 and tuned["timing"]["tuned"]["median"] > 0 and tuned["transferred_vs_tuned"]["median"] > 0
    again = gpu_transfer.run(16, [8], [], trials=4, rounds=2, say=lambda _: None, device="cpu", shape=small, source_store=tmp_path / "store")
    assert again["fill_secs"] is None and again["rows"][0]["outcomes"] == few["outcomes"]  # the same records, transferred the same way


def test_the_tuner_report_splits_each_search_by_phase_where_the_run_recorded_it() -> None:
    import copy
    import json
    from pathlib import Path

    from bench import report

    tuner = json.loads((Path(report.RESULTS) / "quick" / "tuner.json").read_text())
    run = next(iter(tuner["workloads"].values()))["runs"][0]
    run["ray"]["phases"] = {"search": 1.0, "build": 7.25, "measure": 2.0, "cost model": 0.5, "rest": 0.25}
    text = "\n".join(report._tuner(tuner))
    assert "| search s | build s | measure s | cost model s | rest s |" in text and "| 7.2 | 2.0 | 0.5 | 0.2 |" in text
    assert "inside Ray's tasks" not in text  # recorded before the tasks' own seconds
    run["ray"]["tasks"] = {"build": {"tasks": 16, "candidates": 16, "secs": 9.5, "workers": 2}, "measure": {"tasks": 2, "candidates": 16, "secs": 1.5, "workers": 1}}
    lines = report._tuner(tuner)
    ray_row = next(line for line in lines if line.startswith("| `") and "| ray | " in line and "7.2" in line)
    assert any("inside Ray's tasks s (build / measure) |" in line for line in lines) and ray_row.endswith("| 9.5 / 1.5 |")
    older = copy.deepcopy(tuner)  # recorded before the profiler: no table, no error
    for entry in older["workloads"].values():
        for r in entry["runs"]:
            for tuner_name in ("ray", "plain"):
                r[tuner_name].pop("phases", None)
    assert "Where the search's seconds went" not in "\n".join(report._tuner(older))


def test_pooled_rankings_are_judged_against_fit_network_by_network_on_fully_recorded_kernels() -> None:
    """``bench.studies.ranking --pool``: each ranking's pick recomputed from what recorded runs kept; a kernel missing an
    attribute some ranking reads is left out for all of them."""
    from bench.studies import ranking

    def candidate(us: float, order: int, gflops: float, predicted: float, retiled: int) -> dict:
        return {"tid": f"t{order}", "us": us, "relation": "shape", "order": order, "distance": float(order), "source_gflops": gflops,
                "source_speed": gflops * 1e9, "source_us": 10.0, "predicted_log2_gflops": predicted, "retiled": retiled}  # fmt: skip

    fit_wins = [candidate(100.0, 0, 50.0, 1.0, 1), candidate(300.0, 1, 10.0, 5.0, 2)]  # fit picks 100, xgboost 300
    model_wins = [candidate(400.0, 0, 50.0, 1.0, 1), candidate(100.0, 1, 10.0, 5.0, 2)]  # fit picks 400, xgboost 100
    unrecorded = [{k: v for k, v in c.items() if k != "predicted_log2_gflops"} for c in model_wins]
    run_a = {"rows": [{"label": "net1", "ranking": {"kernels": [{"measured": fit_wins}, {"measured": unrecorded}]}}]}  # transfer.json
    run_b = {"rows": {"net2": {"kernels": [{"measured": model_wins}]}, "net3": {"kernels": [{"measured": unrecorded}]}}}  # ranking_held_out.json
    pooled = ranking.pool({"a": run_a, "b": run_b})
    assert [(r["run"], r["network"], r["kernels"]) for r in pooled["rows"]] == [("a", "net1", 1), ("b", "net2", 1)]
    xgb = pooled["rankings"]["xgboost"]
    assert xgb["rows"] == 2 and xgb["faster_rows"] == 1 and xgb["slower_rows"] == 1
    assert xgb["vs_fit_geomean"] == pytest.approx(math.sqrt(3.0 * 0.25))
    assert xgb["vs_best_pooled"] == pytest.approx((300.0 + 100.0) / 200.0)
    assert pooled["rankings"]["fit"]["vs_best_pooled"] == pytest.approx((100.0 + 400.0) / 200.0)


def test_how_soon_an_order_of_first_passes_closes_the_gap_is_read_off_its_curve() -> None:
    from bench.studies.miss_order import closing, summarize

    points = [(0.0, 10.0), (10.0, 6.0), (30.0, 2.0)]  # 8 ms to gain: half in the first 10 s, the rest by 30 s
    figures = closing(points)
    assert figures["to_close"] == {"50%": 10.0, "80%": 30.0, "90%": 30.0}
    assert figures["closed_after"]["30 s"] == 1.0 and figures["closed_after"]["60 s"] == 1.0
    assert figures["mean_gap_left"] == pytest.approx((10 * 8 + 20 * 4) / 8 / 30)
    assert closing([(0.0, 5.0), (10.0, 5.5)])["mean_gap_left"] is None  # slower after: nothing to close
    slow = [(0.0, 10.0), (20.0, 6.0), (30.0, 2.0)]
    runs = [{"networks": [{"network": "net", "orders": {"reported": {"points": p}}}]} for p in (points, slow, slow)]
    assert summarize(runs)["net"]["reported"]["to_close"]["50%"] == 20.0  # the median run's


def test_a_budget_study_summarizes_each_configuration_by_its_median_run() -> None:
    from bench.studies.budget import _summary

    def row(ranked: float, budget: float, measured: int) -> dict:
        timing = {"ranked": {"median": ranked}, "costliest 5 s": {"median": budget}, "all measured": {"median": 4.0}}
        share = {label: (ranked - t["median"]) / (ranked - 4.0) for label, t in timing.items()}
        return {"network": "net", "timing": timing, "gain_share": share, "compile_secs": {k: 1.0 for k in timing},
                "kernels_measured": {"ranked": 0, "costliest 5 s": measured, "all measured": 9}}

    found = _summary([[row(8.0, 6.0, 3)], [row(8.0, 8.0, 2)], [row(6.0, 5.0, 4)]])["net"]
    assert found["costliest 5 s"]["gain_share_runs"] == [0.5, 0.0, 0.5] and found["costliest 5 s"]["gain_share"] == 0.5
    assert found["costliest 5 s"]["ms"] == 6.0 and found["costliest 5 s"]["measured"] == 3 and found["all measured"]["gain_share"] == 1.0


def test_a_growth_study_compares_each_registry_to_the_tuned_bar_and_the_two_to_each_other() -> None:
    from bench.studies.growth import ONE, TUNED, TWO, summarize

    def row(ranked_one: float, ranked_two: float) -> dict:
        ratios = {f"ranked, {ONE}": ranked_one, f"ranked, {TWO}": ranked_two, f"fit, {ONE}": 2.0, f"fit, {TWO}": 2.0,
                  f"fastest, {ONE}": 1.0, f"fastest, {TWO}": 0.5, TUNED: 1.0}  # fmt: skip
        return {"network": "net", "over_tuned": ratios}

    found = summarize([row(2.0, 1.0), row(1.5, 1.5), row(3.0, 2.4)])["net"]
    assert found[f"ranked, {ONE}"] == {"median": 2.0, "min": 1.5, "max": 3.0}
    assert found["ranked: two over one"] == pytest.approx({"median": 0.8, "min": 0.5, "max": 1.0})
    assert found["fastest: two over one"]["median"] == 0.5 and found[TUNED]["max"] == 1.0
    assert found[f"ranked over fit, {TWO}"] == pytest.approx({"median": 0.75, "min": 0.5, "max": 1.2})  # the served model's picks over the fit ranking's


def test_a_served_model_study_summarizes_the_models_latency_over_the_fit_rankings_and_the_compile_seconds() -> None:
    from bench.studies.served_model import _summary

    def row(over: float, model_secs: float) -> dict:
        return {"network": "net", "model_over_fit": over, "picked_differently": 3, "compile_secs": {"default": 1.0, "fit": 4.0, "model": model_secs}}

    found = _summary([[row(0.9, 5.0)], [row(1.1, 7.0)], [row(0.8, 6.0)]])["net"]
    assert found["model_over_fit"] == 0.9 and found["model_over_fit_runs"] == [0.9, 1.1, 0.8]
    assert found["compile_s model"] == 6.0 and found["compile_s fit"] == 4.0 and found["picked_differently"] == 3


def test_a_dynamic_shape_study_summarizes_each_size_over_runs() -> None:
    from bench.studies.dynamic import _summary

    def row(size: int, dynamic_ms: float) -> dict:
        timing = {"static": {"median": 2.0}, "dynamic": {"median": dynamic_ms}, "default": {"median": 80.0}}
        return {"network": "net", "size": {"seq": size}, "timing": timing, "dynamic_over_static": dynamic_ms / 2.0, "default_over_dynamic": 80.0 / dynamic_ms,
                "compile_secs": {"default": 1.0, "dynamic": 1.5, "static": 1.2}, "dynamic_report": {"transfers": 8, "misses": 6}}  # fmt: skip

    found = _summary([[row(17, 3.0), row(64, 4.0)], [row(17, 5.0), row(64, 8.0)], [row(17, 4.0), row(64, 6.0)]])
    assert set(found) == {"net seq=17", "net seq=64"}
    assert found["net seq=17"]["dynamic_over_static"] == 2.0 and found["net seq=64"]["dynamic ms"] == 6.0
    assert found["net seq=64"]["default_over_dynamic"] == 80.0 / 6.0 and found["net seq=17"]["dynamic misses"] == 6


def test_a_side_by_side_study_summarizes_each_network_over_runs() -> None:
    from bench.studies import postprocessing, relocation
    from bench.studies.side_by_side import over_tuned, summary

    def row(seq: int, relocated_ms: float) -> dict:
        timing = {"relocated": {"median": relocated_ms}, "recorded": {"median": 10.0}}
        return {"network": "bert", "shape": {"seq": seq}, "timing": timing, "compile_secs": {"relocated": 1.5, "recorded": 1.4}}

    found = summary([[row(64, 10.0), row(256, 3.0)], [row(64, 11.0), row(256, 5.0)], [row(64, 9.0), row(256, 4.0)]], relocation.derived)
    assert set(found) == {"bert {'seq': 64}", "bert {'seq': 256}"}
    assert found["bert {'seq': 256}"]["relocated_over_recorded"] == 0.4 and found["bert {'seq': 64}"]["relocated ms"] == 10.0
    assert found["bert {'seq': 256}"]["compile_s recorded"] == 1.4
    kernels = [{"detail": "postprocessed here:ab:conv"}, {"detail": "shape:cd:conv"}, {"detail": "postprocessed here:ef:conv"}]
    measured = {"timing": {"repostprocessed": {"median": 8.0}, "recorded": {"median": 10.0}}, "kernels": {"repostprocessed": kernels, "recorded": []}}
    assert postprocessing.derived(measured) == {"repostprocessed_over_recorded": 0.8, "served_postprocessed_here": 2}
    measured["timing"]["tuned"] = {"median": 4.0}
    assert over_tuned(measured) == {"repostprocessed_over_tuned": 2.0, "recorded_over_tuned": 2.5}


def test_a_report_of_a_mode_with_no_recorded_run_says_so_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import __main__ as bench_main

    (tmp_path / "results" / "full").mkdir(parents=True)
    (tmp_path / "results" / "full" / "hook.json").write_text("{}")  # a section recorded on its own, no run
    monkeypatch.setattr(report, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(report, "RESULTS_MD", tmp_path / "RESULTS.md")
    monkeypatch.setattr(sys, "argv", ["python -m bench", "report"])
    with pytest.raises(SystemExit) as exited:
        bench_main.main()
    assert "no full run is recorded" in str(exited.value.code) and "report --quick" in str(exited.value.code)
    assert not (tmp_path / "RESULTS.md").exists()


def test_outputs_further_apart_than_the_tolerance_stop_a_bench() -> None:
    from bench.models import MAX_REL_ERROR, check_agreement

    check_agreement("net", {"tuned": MAX_REL_ERROR, "transferred": 0.0})
    with pytest.raises(AssertionError, match="net: outputs disagree"):
        check_agreement("net", {"tuned": 0.0, "transferred": 2 * MAX_REL_ERROR})


def test_a_growth_study_refuses_the_registries_of_another_family(tmp_path: Path) -> None:
    from bench.studies.growth import _claim

    (tmp_path / "old" / "one").mkdir(parents=True)  # filled before families: the convnets
    _claim(tmp_path / "old", "convnets")
    with pytest.raises(SystemExit, match="holds the convnets registries, not the transformers"):
        _claim(tmp_path / "old", "transformers")
    (tmp_path / "new").mkdir()
    _claim(tmp_path / "new", "transformers")
    with pytest.raises(SystemExit, match="holds the transformers registries"):
        _claim(tmp_path / "new", "convnets")


def test_a_loadaware_run_reads_quality_off_each_kernels_best_timed_alone() -> None:
    """N jobs' speed is the serial wall over theirs; their quality each kernel's best *alone* against the serial run's;
    how far each mode's search saw its candidates off, from their ``seen / alone``."""
    from bench.loadaware import summarize

    def kernel(serial_us: float, shared_us: float, seen: list[float]) -> dict:
        return {"modes": {"1 at once": {"alone_us": serial_us, "seen_us": serial_us, "seen_vs_alone": [1.0, 1.02]},
                          "4 at once": {"alone_us": shared_us, "seen_us": 2 * shared_us, "seen_vs_alone": seen}}}  # fmt: skip

    def run(serial_wall: float, shared_wall: float, kernels: list) -> dict:
        return {"modes": {"1 at once": {"wall_secs": serial_wall, "trials_per_sec": 64 / serial_wall},
                          "4 at once": {"wall_secs": shared_wall, "trials_per_sec": 64 / shared_wall}}, "kernels": kernels}

    runs = [run(120, 60, [kernel(100, 100, [1.5]), kernel(50, 60, [1.1, 1.3])]), run(100, 80, [kernel(100, 105, [2.0]), kernel(50, 50, [])])]
    summary = summarize(runs, 4)
    shared = summary["shared"]["4 at once"]
    assert shared["sooner"] == pytest.approx((2.0 + 1.25) / 2)
    assert shared["best_vs_serial_worst"] == pytest.approx(1.2) and shared["best_vs_serial_median"] == pytest.approx(1.025)
    assert summary["sum_of_bests_us"] == {"1 at once": 150, "4 at once": pytest.approx((160 + 155) / 2)}
    assert summary["seen_vs_alone"]["4 at once"] == {"median": pytest.approx(1.4), "worst": 2.0}
    assert summary["seen_vs_alone"]["1 at once"]["median"] == pytest.approx(1.01)


def test_loadaware_times_again_the_fastest_the_slowest_and_a_spread_of_a_searchs_candidates() -> None:
    from bench.loadaware import sampled

    measured = [(f"t{i}", float(i)) for i in (5, 1, 9, 3, 7, 2, 8)]
    assert [m[1] for m in sampled(measured, 4)] == [1.0, 3.0, 7.0, 9.0]
    assert sampled(measured[:2], 4) == [("t1", 1.0), ("t5", 5.0)]


@pytest.mark.slow
def test_the_loadaware_bench_runs_through_on_the_cpu() -> None:
    """Both modes on this CPU's measurement resource; the shared mode's jobs split the node's search threads; every kernel's
    best of each mode is timed again beside the default."""
    from dataclasses import replace

    from bench.loadaware import OPTIONS, run

    out = run("cpu", 2, 1, replace(OPTIONS, trials=2, trials_per_iter=2), 1)
    (only,) = out["runs"]
    assert only["modes"]["1 at once"]["search_threads"] == ["physical"] and only["modes"]["2 at once"]["search_threads"] == ["1"]
    (k,) = only["kernels"]
    assert k["default_us"] > 0 and all(m["alone_us"] and m["alone_us"] > 0 for m in k["modes"].values())
    assert all(m["seen_vs_alone"] and min(m["seen_vs_alone"]) > 0 for m in k["modes"].values())
    assert out["summary"]["shared"]["2 at once"]["sooner"] > 0


def test_runs_recorded_one_network_at_a_time_merge_into_one_table_that_says_how_each_was_tuned(tmp_path: Path) -> None:
    import json

    from bench.models import merge

    def run(name: str, command: str, tuning: dict | None) -> Path:
        row = {"network": name, "batch": 1, "shape": {}, "kernels": 2, "trials": 32, "tune_secs": 120.0, "layout": "given", "tuning": tuning,
               "timing": {k: {"median": 1.0, "min": 1.0, "max": 1.0} for k in ("pytorch", "untuned", "tuned")},
               "speedup_vs_pytorch": {"median": 1.0, "min": 1.0, "max": 1.0}, "speedup_vs_untuned": {"median": 1.0, "min": 1.0, "max": 1.0}}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"mode": "full", "command": command, "recorded": "now", "commit": "abc", "wall_secs": 60.0, "rows": [row],
                                    "kernels": [{"network": name}]}))
        return path

    merged = merge([run("a", "python -m bench.models --networks a --policy gradient --warm-model", {"policy": "gradient", "trials": 32, "stopped_because": "budget"}),
                    run("b", "python -m bench.models --networks b", None),
                    run("d", "python -m bench.models --networks d --seed-store DIR --policy gradient --round-trials 64",
                        {"policy": "gradient", "round_trials": 64, "trials": 128, "stopped_because": "budget"})])  # fmt: skip
    assert [r["network"] for r in merged["rows"]] == ["a", "b", "d"] and len(merged["kernels"]) == 3 and merged["wall_secs"] == 180.0
    lines = report._tuning_runs(merged["rows"])
    assert len(lines) == 5 and "a b1: gradient policy" in lines[2] and "started from the registry's log" in lines[2] and "--networks a" in lines[2]
    assert "rounds of" not in lines[2] and "rounds of 64, resuming an earlier run's registry" in lines[3]
    table = tmp_path / "table.json"
    table.write_text(json.dumps(merged))
    merged["kernels"][0]["peak_gflops"] = 111.0  # the peak of the run that recorded it
    merged["peak_gflops"] = {"numpy": 222.0}
    table.write_text(json.dumps(merged))
    fast = run("c", "python -m bench.models --networks c --math fast", {"policy": "gradient", "trials": 8, "stopped_because": "budget"})
    recorded = json.loads(fast.read_text())
    fast.write_text(json.dumps({**recorded, "spending": {"rewrites": {"layout": "given", "math": "fast", "prepack": False}}}))
    again = merge([table, fast])
    assert [r["command"] for r in again["rows"]] == [r["command"] for r in merged["rows"]] + ["python -m bench.models --networks c --math fast"]
    assert [k.get("peak_gflops") for k in again["kernels"]] == [111.0, 222.0, 222.0, None]  # each kernel keeps its own run's peak
    assert [k.get("math") for k in again["kernels"]] == [None, None, None, "fast"]  # and says what its run's compile rewrote


def test_runs_on_different_cpus_merge_into_a_table_that_says_each_rows_cpu(tmp_path: Path) -> None:
    """Rows measured on another machine than the first run's say so: each against PyTorch on its own machine."""
    import json

    from bench.models import merge

    def run(name: str, cpu: str | None) -> Path:
        row = {"network": name, "batch": 1, "shape": {}, "kernels": 2, "trials": 32, "tune_secs": 120.0, "layout": "given",
               "timing": {k: {"median": 1.0, "min": 1.0, "max": 1.0} for k in ("pytorch", "untuned", "tuned")},
               "speedup_vs_pytorch": {"median": 1.0, "min": 1.0, "max": 1.0}, "speedup_vs_untuned": {"median": 1.0, "min": 1.0, "max": 1.0}}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"mode": "full", "command": f"python -m bench.models --networks {name}", "recorded": "now", "commit": "abc",
                                    "target": {"kind": "llvm", "mcpu": cpu}, "options": {}, "rows": [row], "kernels": [],
                                    **({"device_name": cpu} if cpu else {})}))  # fmt: skip
        return path

    older = merge([run("a", None)])  # merged before rows carried their CPU
    older["device_name"] = "rocketlake"
    table = tmp_path / "table.json"
    table.write_text(json.dumps(older))
    merged = merge([table, run("b", "rocketlake"), run("c", "znver5")])
    assert [r["cpu"] for r in merged["rows"]] == [None, "rocketlake", "znver5"]
    assert [r["cpu"] for r in merge([tmp_path / "c.json", run("d", "znver5")])["rows"]] == ["znver5", "znver5"]
    options = {"trials": 64, "trials_per_iter": 16, "population": 128, "genetic_iters": 2, "search_threads": 0, "seed": 0, "publish": 3, "warm_start": 8}
    lines = report._models({**merged, "options": options, "rounds": 5}, {}, "Models")
    assert "Rows from 2 CPUs (rocketlake, znver5" in lines[2]
    assert lines[0] == "## Models" and "Each run's command is listed under the table." in lines[2]  # not a heading of commands
    header, _, *rows = first_table(lines)
    assert "| CPU |" in header and [row.split(" | ")[1] for row in rows] == ["rocketlake", "rocketlake", "znver5"]
    one = report._models({**merge([run("e", "znver5")]), "options": options, "rounds": 5}, {}, "Models")
    assert "Target `" in one[2] and "| CPU |" not in next(line for line in one if line.startswith("|"))
    assert one[0] == "## Models (`python -m bench.models --networks e`)"


def first_table(lines: list[str]) -> list[str]:
    """The rows of the first markdown table in ``lines``."""
    start = next(n for n, line in enumerate(lines) if line.startswith("|"))
    end = next((n for n in range(start, len(lines)) if not lines[n].startswith("|")), len(lines))
    return lines[start:end]


def test_a_merged_table_says_where_each_cpu_stands_by_its_newest_row_of_each_network() -> None:
    """Every configuration measured stays in the table; the summary takes each CPU's newest row of each network and
    batch by when its run was recorded (not its best), in the table's order, with their geometric mean."""
    def row(cpu: str, network: str, batch: int, speedup: float, recorded: str) -> dict:
        return {"cpu": cpu, "network": network, "batch": batch, "recorded": recorded, "speedup_vs_pytorch": {"median": speedup, "min": speedup, "max": speedup}}

    rows = [row("rocketlake", "resnet18", 1, 1.5, "2026-11-28 10:00 UTC"), row("rocketlake", "bert", 1, 0.9, "2026-11-28 12:00 UTC"),
            row("rocketlake", "resnet18", 1, 0.8, "2026-11-28 11:00 UTC"), row("znver5", "resnet18", 1, 2.0, "2026-11-27 09:00 UTC"),
            row("rocketlake", "mlp", 16, 4.0, "2026-11-28 12:00 UTC"), row("rocketlake", "mlp", 1, 2.0, "2026-11-28 12:00 UTC")]  # fmt: skip
    newest = report.latest_rows(rows)
    assert {cpu: [(r["network"], r["batch"], r["speedup_vs_pytorch"]["median"]) for r in kept] for cpu, kept in newest.items()} == {
        "rocketlake": [("bert", 1, 0.9), ("resnet18", 1, 0.8), ("mlp", 16, 4.0), ("mlp", 1, 2.0)], "znver5": [("resnet18", 1, 2.0)]}
    _, _, rocketlake, znver5 = first_table(report._latest_rows(rows))
    assert "| 2 of 4 |" in rocketlake and f"{math.exp((math.log(0.9) + math.log(0.8) + math.log(4.0) + math.log(2.0)) / 4):.2f}×" in rocketlake
    assert "resnet18 b1 2" in znver5 and "| 1 of 1 | 2.00× |" in znver5


def test_the_page_opens_with_where_schedhub_stands_beside_every_engine_timed(tmp_path: Path) -> None:
    """RESULTS.md's summary: each CPU's newest tuned row of each network, and each first-compile study (its newest per
    network, shape and CPU), with the fastest engine timed beside it over schedhub's time."""
    def summary(ms: float) -> dict:
        return {"median": ms, "min": ms, "max": ms}

    full = {"rows": [{"cpu": "znver5", "network": "resnet18", "batch": 1, "recorded": "2026-11-28 10:00 UTC", "tune_secs": 1500,
                      "timing": {"tuned": summary(10.0), "pytorch": summary(12.5)}, "speedup_vs_pytorch": summary(1.25)}]}  # fmt: skip
    for name, timing in (("first-compile-unet-znver3.json", {"ruled": summary(40.0), "pytorch": summary(50.0)}),
                         ("first-compile-unet-znver3b.json", {"ruled": summary(40.0), "pytorch": summary(50.0)}),
                         ("first-compile-mobilenetv2-znver3.json", {"ruled": summary(9.0), "pytorch": summary(36.0), "onnxruntime": summary(8.1)}),
                         ("first-compile-old-znver3.json", {"default": summary(900.0), "pytorch": summary(30.0)})):  # fmt: skip
        network = "bench.networks:" + name.split("-")[2]
        (tmp_path / name).write_text(json.dumps({"network": network, "shape": {"input": [1, 3, 224, 224]}, "timing": timing}))
    studies = report.first_compiles(tmp_path)
    assert [s["cpu"] for s in studies][:2] == ["znver3", "znver3"]
    rows = report.standing_rows(full, studies)
    assert rows[0] == ["resnet18", "znver5", "tuned 25 min", "10", "12.5", "", "", "", "1.25×"]
    assert [r[0] for r in rows[1:]] == ["mobilenetv2", "unet", "unet"]  # two CPUs named by their files: both kept; no rules timed: left out
    assert rows[1] == ["mobilenetv2", "znver3", "first compile, untuned", "9", "36", "8.1", "", "", "0.90×"]
    assert {r[1] for r in rows[2:]} == {"znver3", "znver3b"}
    page = report._standing(full, studies)
    assert page[0] == "## Where schedhub stands" and "| mobilenetv2 | znver3 |" in "\n".join(page)
    run = {"target": {"mcpu": "znver3"}, "engines": ["onnxruntime"], "rows": [{"network": "resnet18", "batch": 1, "tune_secs": 2400,
           "timing": {"tuned": summary(40.0), "pytorch": summary(44.0), "onnxruntime": summary(28.0)}}]}  # fmt: skip
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r.json").write_text(json.dumps(run))
    (tmp_path / "runs" / "plain.json").write_text(json.dumps({**run, "engines": []}))  # eager only: in the model table already
    assert report.standing_rows(None, [], report.engine_runs(tmp_path / "runs")) == [["resnet18", "znver3", "tuned 40 min", "40", "44", "28", "", "", "0.70×"]]
    tuned = {"network": "bench.networks:resnet50", "cpu": "znver3", "starter_label": "tuned 60 min", "shape": {"input": [1, 3, 224, 224]},
             "timing": {"ruled": summary(98.0), "starter": summary(90.0), "pytorch": summary(120.0), "openvino": summary(60.0)}}  # fmt: skip
    assert report.standing_rows(None, [tuned])[1] == ["resnet50", "znver3", "tuned 60 min", "90", "120", "", "60", "", "0.67×"]  # a study's own tuned store
    (tmp_path / "first-compile-resnet50-tuned-znver3.json").write_text(json.dumps({**tuned, "recorded": "2026-12-07 21:06 UTC"}))
    (tmp_path / "first-compile-resnet50-znver3.json").write_text(json.dumps({**tuned, "timing": {"ruled": summary(99.0), "pytorch": summary(130.0)}}))
    assert [r[3] for r in report.standing_rows(None, report.first_compiles(tmp_path)) if r[0] == "resnet50"] == ["98", "90"]  # the recorded one is newer


def test_the_gap_study_replays_every_kernel_call_of_a_forward_pass_on_the_vms_own_tensors() -> None:
    """``bench.studies.gap``: the calls an instrumented forward pass records, replayed from Python, compute the pass's
    output again in the VM's own output tensor (a call left out, or replayed on copies, and they do not); each arm
    times every call; huge pages are asked for every 2 MB span under the tensors."""
    from bench.studies import gap

    mod, _, input_shape = models.export_with_weights("mlp")
    vm = relax.VirtualMachine(tvm.compile(mod, tvm.target.Target(host_target())), tvm.cpu())
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(input_shape).astype("float32"))
    expected = vm["forward"](x).numpy()
    calls = gap.kernel_calls(vm, x, "forward")
    assert len(calls) >= 3 and not any(c.name.startswith("vm.builtin") for c in calls), [c.name for c in calls]
    for call in calls:  # every buffer the pass wrote, wiped
        call.arrays[-1][...] = np.nan
    for prepare in gap.ARMS[1:]:
        times = gap.replay(calls, prepare)
        assert len(times) == len(calls) and all(t > 0 for t in times), (prepare, times)
        np.testing.assert_allclose(calls[-1].arrays[-1], expected, rtol=1e-5, atol=1e-5)
    pages = gap.collapse(calls)
    assert pages["spans"] >= 1 and 0 <= pages["collapsed"] <= pages["spans"], pages


def test_a_report_says_where_a_tuned_kernel_outran_the_libraries_sgemm_peak(tmp_path: Path) -> None:
    """"of peak" is against numpy's and PyTorch's sgemm; on a CPU where a tuned matmul ran faster than both, the
    report says that peak understates the machine (and only there)."""
    import json

    from bench.models import merge

    def run(name: str, cpu: str, tuned_ms: float) -> Path:
        timing = {k: {"median": 1.0, "min": 1.0, "max": 1.0} for k in ("pytorch", "untuned", "tuned")}
        row = {"network": name, "batch": 1, "shape": {}, "kernels": 1, "trials": 32, "tune_secs": 120.0, "layout": "given", "timing": timing,
               "speedup_vs_pytorch": timing["tuned"], "speedup_vs_untuned": timing["tuned"]}  # fmt: skip
        kernel = {"network": name, "batch": 1, "op": "fused_matmul", "key": name * 8, "calls": 1, "flops": 2e9, "untuned_ms": 100.0, "tuned_ms": tuned_ms,
                  "numpy_ms": 10.0, "torch_ms": 12.0}  # fmt: skip
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"mode": "full", "command": f"python -m bench.models --networks {name}", "recorded": "now", "commit": "abc",
                                    "target": {"kind": "llvm", "mcpu": cpu}, "options": {}, "rows": [row], "kernels": [kernel], "device_name": cpu,
                                    "peak_gflops": {"numpy": 200.0, "pytorch": 190.0}, "peak_sgemm_n": 2048}))  # fmt: skip
        return path

    options = {"trials": 64, "trials_per_iter": 16, "population": 128, "genetic_iters": 2, "search_threads": 0, "seed": 0, "publish": 3, "warm_start": 8}

    def said(*runs: Path) -> list[str]:
        return [line for line in report._models({**merge(list(runs)), "options": options, "rounds": 5}, {}, "Models") if "understates" in line]

    assert said(run("a", "rocketlake", 12.0)) == []  # 167 GFLOPS: below the 200 of numpy's sgemm
    assert len(beyond := said(run("a", "rocketlake", 12.0), run("b", "znver5", 5.0))) == 1 and "On znver5 " in beyond[0], beyond  # 400 GFLOPS


def test_a_convolution_compiled_in_nhwc_gets_its_library_baselines_in_nchw() -> None:
    """The NHWC kernels' arguments (data NHWC, weights OHWI) are given to numpy and PyTorch in NCHW and OIHW: as
    given, numpy's im2col took an NHWC input for NCHW and failed, and a 45-minute run lost its table with it."""
    from schedhub.hooks.rewrites import Rewrites

    mod, _, _ = models.export_with_weights("resnet18", image=32)
    target = tvm.target.Target(host_target())
    given = {k.identity.op: k for k in models.kernels(mod, target, Rewrites())}
    convs = [k for k in models.kernels(mod, target, Rewrites("NHWC")) if k.identity.op.startswith("fused_conv2d")]
    assert convs
    for kernel in convs:
        args = kernel.identity.args_info
        nchw = baselines.in_nchw(kernel.identity.op, args, "NHWC")
        assert [a[2] for a in nchw] == [[s[0], s[3], s[1], s[2]] if len(s) == 4 else s for s in (a[2] for a in args)]
        baselines.kernel_baseline(kernel.identity.op, nchw, "numpy")()  # runs: the shapes agree
        twin = given.get(kernel.identity.op)
        assert twin is None or [a[2] for a in twin.identity.args_info] == [a[2] for a in nchw], kernel.identity.op
    assert baselines.in_nchw("fused_matmul_add", [["TENSOR", "float32", [1, 2, 3, 4]]], "NHWC") == [["TENSOR", "float32", [1, 2, 3, 4]]]


def test_the_log_rank_study_counts_schedules_measured_in_the_models_order_until_one_near_the_best() -> None:
    from bench.studies.logrank import measured_until_best, random_until_best

    secs = np.array([3.0, 1.0, 2.0, 1.04, 5.0])
    assert measured_until_best(np.array([0, 2, 3, 1, 4]), secs) == 3  # 1.04 is within 5% of 1.0
    assert measured_until_best(np.array([4, 0, 2, 1, 3]), secs) == 4
    assert measured_until_best(np.array([4, 0, 2, 3, 1]), secs, within=1.0) == 5
    assert 1 < random_until_best(secs) < 5  # two of five near the best: a random order finds one in about two


def test_a_rounds_stages_are_the_spans_of_its_tasks_and_the_rest_is_other() -> None:
    """A round's publishing is the span of its builds (which overlap) plus that of its measurement; the search is the
    job's own total; "other" is the wall time none of them covers. A revision's trials/s is a run's trials over the
    seconds of its rounds."""
    from types import SimpleNamespace

    from bench.rounds import arm_summary, round_row

    def event(stage: str, kind: str, start: float, end: float) -> dict:
        return {"stage": stage, "kind": kind, "start": start, "end": end}

    events = [event("warm start", "build", 0.0, 1.0), event("warm start", "measure", 1.0, 1.5), event("search", "build", 2.0, 9.0),
              event("publish", "build", 10.0, 12.0), event("publish", "build", 10.5, 13.0), event("publish", "measure", 13.0, 14.0)]
    records = [SimpleNamespace(mean_secs=0.002), SimpleNamespace(mean_secs=0.001)]
    result = SimpleNamespace(events=events, search_secs=7.5, trials=16, warm_started=2, phases={"search": 2.0, "build": 4.0}, records=records)
    row = round_row(3, "conv", 20.0, result)
    assert row["stages"] == {"warm start": 1.5, "publish": 4.0, "search": 7.5, "other": 7.0}
    assert row["publishing"] == {"build": 3.0, "measure": 1.0}  # the two overlapping builds' span, then the measurement
    assert row["phases"] == {"search": 2.0, "build": 4.0, "measure": 0.0, "cost model": 0.0} and row["best_secs"] == 0.001
    crowded = round_row(1, "conv", 10.0, result)
    assert crowded["stages"]["other"] == 0.0  # never negative
    arm = arm_summary([{"rounds": [row, row]}, {"rounds": [crowded]}])
    assert arm["trials_per_sec"]["samples"] == [32 / 40, 16 / 10]
    assert arm["stage_secs"]["publish"] == 4.0 and arm["round_secs"]["median"] == 20.0 and arm["publishing_secs"] == {"build": 3.0, "measure": 1.0}
    assert not row["reference_recalled"] and arm["reference_recalled"] == {"rounds": 0, "of": 3}
    recalled = round_row(4, "conv", 20.0, SimpleNamespace(**{**vars(result), "events": [*events[:-1], {**events[-1], "recalled": True}]}))
    searched = round_row(5, "conv", 20.0, SimpleNamespace(**{**vars(result), "events": [*events, {**event("search", "measure", 3.0, 4.0), "recalled": True}]}))
    assert recalled["reference_recalled"] and not searched["reference_recalled"]  # publishing's measurement alone says it
    assert arm_summary([{"rounds": [row, recalled]}])["reference_recalled"] == {"rounds": 1, "of": 2}


def test_a_models_run_at_another_batch_keeps_each_network_once() -> None:
    from bench.models import networks_of

    assert [(n.name, n.batch) for n in networks_of("full", ["mlp"])] == [("mlp", 1), ("mlp", 16)]
    assert [(n.name, n.batch, n.shape, n.frontend) for n in networks_of("full", ["resnet18", "mlp"], batch=4)] == [
        ("resnet18", 4, {"image": 224}, "torch.export"), ("mlp", 4, {}, "relax")]  # fmt: skip
    with pytest.raises(ValueError, match="no full network is named"):
        networks_of("full", ["vgg"])


def test_a_models_run_refuses_a_kept_store_it_would_lose_before_tuning_and_updates_its_seed_in_place(tmp_path: Path) -> None:
    """``--keep-store`` holding another store failed only after the tuning, at the backup, and the run's registry (a
    temporary folder) went with it: it is refused up front now. Naming the ``--seed-store`` updates that store in place."""
    from bench.models import check_keep_store, keep_registry
    from schedhub.registry import LocalRegistry

    from .conftest import make_record

    seed, other = tmp_path / "seed", tmp_path / "other"
    for root in (seed, other):
        LocalRegistry(root).close()
    assert check_keep_store(other, seed) is not None and "already holds a store" in str(check_keep_store(other, seed))
    assert check_keep_store(seed, seed) is None and check_keep_store(tmp_path / "new", seed) is None and check_keep_store(None, None) is None
    with LocalRegistry(tmp_path / "run") as run:  # the run: the seed's copy, tuned further
        run.put(make_record(1, 1e-3))
        assert keep_registry(run, seed) > 0
    with LocalRegistry(seed) as kept:
        assert len(kept.summaries()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "run", "seed"]  # no half-made or replaced folder left


def test_a_run_names_the_tree_its_schedhub_was_imported_from_where_that_is_not_the_benchs(tmp_path: Path) -> None:
    """A checkout that shares another's venv runs that tree's schedhub (an editable install): its commit alone would
    credit the figures to code that did not run."""
    import subprocess

    from bench import report as bench_report

    other = tmp_path / "checkout"
    other.mkdir()
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    subprocess.run(["git", "-C", str(other), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    source = bench_report.schedhub_source()
    commit = bench_report.run_commit(other, source)
    assert commit.startswith(bench_report.tree_commit(other, [])) and f"schedhub imported from {source} at " in commit, commit
    assert "imported from" not in bench_report.run_commit(source, source)


def test_a_study_of_an_older_cpu_holds_pytorch_to_its_vectors() -> None:
    """``bench.models --mcpu znver3`` on an AVX-512 machine: TVM's code for the older CPU against PyTorch on AVX2 alone."""
    from bench.models import older_cpu
    from schedhub.tuner.compare.torch_process import TorchProcess

    def has_avx512(target: dict | tvm.target.Target) -> bool:
        return bool(tvm.target.codegen.target_has_features("avx512f", tvm.target.Target(target) if isinstance(target, dict) else target))

    with TorchProcess() as plain:
        best = plain.cpu_capability()
    if best not in ("AVX2", "AVX512"):
        pytest.skip(f"PyTorch runs {best} here: no AVX2 to hold it to")
    with TorchProcess(isa="avx2") as held:
        assert held.cpu_capability() == "AVX2"
    with pytest.raises(ValueError, match="an AVX2 CPU without AVX-512"):
        older_cpu("znver4")  # AVX-512: not older on any machine
    if has_avx512(host_target()):
        target, isa = older_cpu("znver3")
        assert str(target.attrs["mcpu"]) == "znver3" and isa == "avx2" and not has_avx512(target)
    with pytest.raises(ValueError, match="held to one of avx2"):
        TorchProcess(isa="sse")


def test_a_reweighted_network_is_the_same_network_with_other_weights() -> None:
    """``bench.compile_cost``'s new checkpoint: every float tensor of the network's weights scaled, nothing else."""
    import tvm_ffi

    from bench.compile_cost import reweighted

    def constants(mod: tvm.IRModule) -> list[np.ndarray]:
        found: list[np.ndarray] = []
        relax.analysis.post_order_visit(mod["forward"], lambda e: found.append(e.value.numpy()) if isinstance(getattr(e, "value", None), tvm.runtime.Tensor) else None)
        return found

    mod = models.export_with_weights("mlp", batch=1)[0]
    other = reweighted(mod, 2.0)
    assert tvm_ffi.structural_hash(other, skip_tensor_content=True) == tvm_ffi.structural_hash(mod, skip_tensor_content=True)
    before, after = constants(mod), constants(other)
    assert len(before) == len(after) >= 6  # three layers' weights and biases
    for was, now in zip(before, after, strict=True):
        np.testing.assert_array_equal(now, was * 2 if was.size > 1 and was.dtype.kind == "f" else was)


def test_two_revisions_kernels_pair_by_their_place_in_the_forward_pass_and_compiles_of_other_calls_do_not_pair() -> None:
    from bench.studies.revision_kernels import paired

    base = [[2e-3, 1e-3], [4e-3, 1e-3], [2e-3, 3e-3]]  # three passes of two calls, seconds
    rev = [[1e-3, 1e-3], [1e-3, 1e-3], [1e-3, 1e-3]]
    result = paired(base, rev)
    assert [c["base_ms"] for c in result["calls"]] == pytest.approx([2.0, 1.0]) and [c["base_over_rev"] for c in result["calls"]] == pytest.approx([2.0, 1.0])
    assert result["sums"] == pytest.approx({"base_ms": 3.0, "rev_ms": 2.0}) and result["base_over_rev"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="different kernel calls"):
        paired(base, [[1e-3, 1e-3, 1e-3]])


def test_the_tuning_plot_reads_each_rounds_estimate_once_every_kernel_was_timed_and_each_check_of_the_compiled_network() -> None:
    from bench.studies.tuning_plot import plot, tuning_rounds

    log = "\n".join([
        "round   1     16 trials    1.4 min  fused_conv2d16_add9_relu71               3035.1 µs ×5  network ≥ 15.176 ms so far (1 of 2 kernels timed; inductor 77.919 ms)",
        "round   2     32 trials    3.6 min  fused_conv2d2_add1_relu11                9237.6 µs ×3  network 142.340 ms (0.55× inductor)",
        "round   3     48 trials    5.2 min  fused_conv2d2_add1_relu11                2165.1 µs ×3  network 106.110 ms (0.73× inductor)",
        "check at 48 trials: the compiled network 100.869 ms (0.77× inductor), the estimate 106.110 ms",
    ])  # fmt: skip
    assert tuning_rounds(log) == ([(32, 3.6, 142.34), (48, 5.2, 106.11)], [(48, 100.869)])
    timing = {arm: {"median": ms} for arm, ms in (("ruled", 94.3), ("starter", 95.6), ("pytorch", 142.0), ("onnxruntime", 67.1))}
    fig = plot(log, {"network": "bench.networks:resnet50", "cpu": "znver3", "timing": timing})
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"ONNX Runtime", "PyTorch eager", "schedhub untuned (CPU rules)"} <= set(labels) and "OpenVINO" not in labels  # an engine not timed: no line
    with pytest.raises(ValueError, match="no round"):
        plot(log.splitlines()[0], {"network": "n", "timing": timing})


def test_the_operator_gap_joins_a_convolution_kernel_with_its_calls_inside_the_network_whatever_the_weights_packing() -> None:
    """``bench.studies.operator_gap --timed network``: a kernel's OHWI weights and its call's prepacked ones hold the same
    elements; a 3x3 kernel of the same channels, or one of another stride, is another key."""
    from bench.studies.operator_gap import call_key

    kernel = [[1, 14, 14, 256], [1024, 1, 1, 256], [1, 1, 1, 1024], [1, 14, 14, 1024]]
    packed_call = [[1, 14, 14, 256], [64, 1, 1, 32, 1, 8, 16], [1, 1, 1, 1024], [1, 14, 14, 1024]]
    assert call_key(kernel, "NHWC") == call_key(packed_call, "NHWC") == (256, 1024, 14, 14, 256 * 1024)
    assert call_key([kernel[0], [1024, 3, 3, 256], kernel[-1]], "NHWC") != call_key(kernel, "NHWC")
    assert call_key([kernel[0], kernel[1], [1, 7, 7, 1024]], "NHWC") != call_key(kernel, "NHWC")
    assert call_key([[1, 256, 14, 14], [1024, 256, 1, 1], [1, 1024, 14, 14]], "NCHW") == call_key(kernel, "NHWC")
    assert call_key([[1, 256], [256, 1024], [1, 1024]], "NHWC") == ()  # not a convolution: joins nothing


def test_the_operator_gap_joins_an_nhwc_kernel_with_onnx_runtimes_node_of_the_same_convolution() -> None:
    """``bench.studies.operator_gap --ort``: a kernel tuned NHWC (OHWI weights) and ONNX Runtime's NCHW node of the same
    convolution share one shape; a node of another stride, or of another group count, does not join."""
    from bench.studies import operator_gap

    args_info = [["TENSOR", "float32", [1, 14, 14, 256]], ["TENSOR", "float32", [1024, 1, 1, 256]], ["TENSOR", "float32", [1, 1, 1, 1024]],
                 ["TENSOR", "float32", [1, 14, 14, 1024]]]  # fmt: skip
    node = {"op": "Conv", "inputs": [[1, 256, 14, 14], [1024, 256, 1, 1], [1024]], "outputs": [[1, 1024, 14, 14]]}
    profile = {"wall_ms": 1.0, "nodes": [{**node, "median_us": 100.0}, {**node, "median_us": 300.0},
                                         {**node, "outputs": [[1, 1024, 7, 7]], "median_us": 5.0},  # stride 2
                                         {**node, "inputs": [[1, 256, 14, 14], [1024, 1, 1, 1], [1024]], "median_us": 1.0}]}  # depthwise
    rows = [{"op": "fused_conv2d_add", "calls": 2, "secs": 4e-4, "flops": 2 * 14 * 14 * 256 * 1024, "args_info": args_info},
            {"op": "fused_matmul", "calls": 1, "secs": 1e-3, "flops": 1.0, "args_info": []}]  # fmt: skip
    joined = operator_gap.ort_rows(rows, "NHWC", profile)
    (conv,) = joined["convs"]
    assert conv["shape"] == [256, 1024, 1, 256, 14, 14] and conv["ort_us"] == 200.0  # the median of its two nodes
    assert joined["schedhub_conv_ms"] == pytest.approx(0.8) and joined["ort_conv_ms"] == pytest.approx(0.4) and joined["unmatched"] == []
