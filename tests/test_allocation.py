"""Where a network's tuning rounds go (tuner.networks.allocation): scripted kernels, no tuning."""

from __future__ import annotations

import math

import pytest

from schedhub.tuner.networks.allocation import EvenPolicy, Goal, GradientPolicy, KernelTuning, network_secs, timed_so_far


def kernel(name: str, calls: int, *rounds: tuple[int, float], default: float | None = None, flops: float = 0.0) -> KernelTuning:
    return KernelTuning(name, name, calls, default_secs=default, rounds=list(rounds), flops=flops)


def test_every_kernel_that_matters_gets_a_first_round_the_costliest_first() -> None:
    kernels = [kernel("a", 1, flops=4e6), kernel("b", 8, flops=1e6), kernel("c", 2, (16, 1e-3), default=2e-3, flops=1e6)]
    policy = GradientPolicy()
    assert policy.pick(kernels).key == "b"  # 8 calls x 1 MFLOP before 1 call x 4 MFLOP
    assert policy.expected_gain(kernels[0]) == math.inf


def test_a_kernel_of_little_work_still_gets_its_first_round_before_any_second() -> None:
    """Its FLOPs do not say what its default schedule costs: deferred, ResNet-18's 1x1 convolutions and classifier
    stayed untuned and the network ran 1.27x slower than with even budgets."""
    conv = kernel("conv", 1, (8, 1e-3), default=4e-3, flops=2e8)
    small = kernel("small", 1, flops=1e5)
    assert GradientPolicy().pick([conv, small]).key == "small"
    assert network_secs([conv, small]) is None  # not timed yet: no estimate


def test_the_next_round_goes_to_the_largest_expected_gain() -> None:
    slow_improving = kernel("slow", 1, (16, 5e-3), default=1e-2)  # 5 ms a call, halved by its first round
    many_calls_default_wins = kernel("called", 4, (16, 1e-4), default=1e-4)  # nothing beat its default
    improved = kernel("improved", 1, (16, 1e-3), default=2e-3)
    kernels = [improved, many_calls_default_wins, slow_improving]
    policy = GradientPolicy()
    gains = {k.key: policy.expected_gain(k) for k in kernels}
    assert gains["slow"] == pytest.approx(1 * 0.8 * 5e-3 / 16)  # one round: no backward gradient yet
    assert gains["called"] == pytest.approx(4 * 0.8 * 1e-4 / 16)
    assert policy.pick(kernels).key == "slow"
    assert EvenPolicy().pick([kernel("x", 1, (32, 1.0)), kernel("y", 9, (16, 1e-9))]).key == "y"


def test_a_slow_default_schedule_does_not_buy_later_rounds() -> None:
    """After the first pass the next round goes where the time is (calls x best), not to the kernel whose default
    schedule was slowest: measured from the default, the backward gradient gave ResNet-18's direct convolutions (100+ ms
    untuned) the rounds the Winograd kernels (defaults not timed) needed more."""
    direct = kernel("direct", 1, (64, 1.5e-3), default=0.12)
    winograd = kernel("winograd", 2, (64, 1.07e-3))
    policy = GradientPolicy()
    assert policy.expected_gain(winograd) == pytest.approx(2 * 0.8 * 1.07e-3 / 64)
    assert policy.pick([direct, winograd]).key == "winograd"
    improving = kernel("improving", 1, (16, 4e-3), (32, 3e-3), (48, 2e-3), (64, 1e-3), default=0.1)  # 3 rounds back: 3 ms
    assert policy.expected_gain(improving) == pytest.approx(0.2 * (4e-3 - 1e-3) / 48 + 0.8 * 1e-3 / 64)


def test_a_kernel_that_stops_improving_loses_its_turn() -> None:
    flat = kernel("flat", 2, (16, 1e-3), (32, 1e-3), (48, 1e-3), (64, 1e-3), default=3e-3)
    moving = kernel("moving", 2, (16, 1e-3), (32, 0.8e-3), default=1.2e-3)
    policy = GradientPolicy()
    assert policy.expected_gain(flat) < policy.expected_gain(moving)
    assert policy.pick([flat, moving]).key == "moving"


def test_a_round_records_the_best_known_and_a_default_that_wins_counts() -> None:
    k = kernel("k", 3)
    k.record(16, None, 2e-3)  # nothing beat the default: the round still counts
    assert k.rounds == [(16, 2e-3)] and k.best_secs == 2e-3
    k.record(16, 1e-3, 2.1e-3)
    k.record(16, 1.5e-3, 2e-3)  # a worse round never raises the best
    assert k.rounds[-1] == (48, 1e-3) and network_secs([k]) == pytest.approx(3e-3)
    assert network_secs([k, kernel("untimed", 1)]) is None


def test_the_goal_stops_at_the_latency_or_the_budget() -> None:
    kernels = [kernel("a", 2, (16, 1e-3)), kernel("b", 1, (32, 2e-3))]  # estimate 4 ms, 48 trials
    assert Goal(latency_secs=4e-3, max_trials=1000).reached(kernels, 0.0).startswith("the network's estimated latency")
    assert Goal(latency_secs=3.9e-3, max_trials=1000).reached(kernels, 0.0) is None
    assert "48 trials" in Goal(latency_secs=1e-3, max_trials=48).reached(kernels, 0.0)
    assert "min spent" in Goal(max_secs=60).reached(kernels, 61.0)
    assert Goal(latency_secs=1.0, max_trials=10).reached([kernel("a", 1)], 0.0) is None  # nothing timed yet: no estimate


def test_a_round_that_would_end_past_the_time_budget_is_not_begun_and_the_estimate_so_far_is_said() -> None:
    """A 12-minute budget ran 13.0 minutes (a round is not stopped once begun), and its progress said only "network not
    yet timed in full" until every kernel had had a round."""
    kernels = [kernel("a", 2, (16, 1e-3)), kernel("b", 1)]
    assert Goal(max_secs=720).reached(kernels, 600.0, next_round_secs=100.0) is None
    assert "the next round (about 2.5 min) would end past the budget of 12.0 min" in Goal(max_secs=720).reached(kernels, 600.0, next_round_secs=150.0)
    assert timed_so_far(kernels) == (1, 2e-3) and network_secs(kernels) is None


def test_a_kernels_later_rounds_replay_only_its_own_records() -> None:
    """Its first round warm-starts in full (neighbours' traces, their twins, synthesized seeds, the rules' schedule: up
    to 20 timings before 16 trials); later rounds continue from its own published best only."""
    from schedhub.tuner.networks.network import round_options
    from schedhub.tuner.workloads.search import TuneOptions

    options = TuneOptions(trials=16, trials_per_iter=16, publish=3)
    kernel = KernelTuning("k", "conv", 1)
    assert round_options(options, kernel) == options and options.warm_measurements() == 20
    kernel.record(16, 1e-3, 2e-3)
    later = round_options(options, kernel)
    assert later.warm_measurements() == 3 and (later.trials, later.publish, later.population) == (16, 3, options.population)
