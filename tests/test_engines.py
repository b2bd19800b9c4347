"""The engines a user would pick instead of schedhub (tuner/compare/engines.py), each in a process of its own: their outputs
checked against eager PyTorch's, their absence said in one line, and ``schedhub tune --until ENGINE`` aiming at one."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pytest

from schedhub.cli.tune_network import goal_secs, parse_until
from schedhub.tuner.compare.engines import ENGINES, EngineUnavailable, check_engine
from schedhub.tuner.networks.plan import ModelRef
from schedhub.tuner.compare.torch_process import TorchProcess, TorchProcessError

REPO = Path(__file__).resolve().parent.parent
CONV_NET = ModelRef("torch", "tests.engine_nets:conv_net", inputs={"x": [1, 3, 16, 16]})


def _installed(engine: str) -> bool:
    try:
        check_engine(engine)
    except EngineUnavailable:
        return False
    return True


@pytest.mark.parametrize("engine", ENGINES)
def test_until_an_engine_times_it_in_its_own_process_once_its_output_matches_eager_pytorchs(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if not _installed(engine):
        pytest.skip(f"{engine} is not installed (pip install 'schedhub[engines]')")
    monkeypatch.setenv("SCHEDHUB_INDUCTOR_MODE", "default")  # max-autotune's search takes minutes: what is checked here is the route
    monkeypatch.chdir(REPO)  # where the child imports the factory from, as a user's folder
    secs, label = goal_secs(engine, [CONV_NET], 2)
    assert label == engine and 0 < secs < 1.0


def test_an_engine_whose_output_differs_from_eager_pytorchs_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _installed("onnxruntime"):
        pytest.skip("onnxruntime is not installed (pip install 'schedhub[engines]')")
    with TorchProcess(cwd=REPO, engine="onnxruntime") as engine_proc:
        with pytest.raises(TorchProcessError, match="onnxruntime's output is .* from eager PyTorch's"):
            engine_proc.load_module("tests.engine_nets:exports_otherwise", [[2, 3]], 1)
    with TorchProcess(cwd=REPO) as eager:  # eager PyTorch is its own reference
        eager.load_module("tests.engine_nets:exports_otherwise", [[2, 3]], 1)


def test_a_missing_engine_is_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what importlib finds of a package that is not installed
    with pytest.raises(EngineUnavailable, match=r"^onnxruntime is not installed \(onnxruntime missing\): pip install 'schedhub\[engines\]'$"):
        TorchProcess(engine="onnxruntime")
    with pytest.raises(click.ClickException) as raised:
        goal_secs("onnxruntime", [CONV_NET], 2)
    assert "\n" not in raised.value.message and "not installed" in raised.value.message


def test_until_takes_an_engine_the_fastest_or_a_latency() -> None:
    assert [parse_until(t) for t in ("onnxruntime", "OpenVINO", "inductor", "pytorch", "fastest")] == ["onnxruntime", "openvino", "inductor", "pytorch", "fastest"]
    assert parse_until("12.5") == pytest.approx(0.0125)
    with pytest.raises(click.BadParameter, match="an engine .*onnxruntime.*'fastest' or a latency"):
        parse_until("tensorrt")
    assert goal_secs(0.0125, [CONV_NET], 2) == (0.0125, "the goal")
