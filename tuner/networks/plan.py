"""What a bulk tuning run covers: models, their input shapes, shape sweeps, and their kernels.

A model reference is a string or a mapping (both plain data, from the command line or YAML):

- ``"resnet18"`` or ``"resnet18:batch=8,image=112"`` or ``{"name": "resnet18", "image": 112}``:
  a model shipped with schedhub (:mod:`.models`) and its shape options;
- ``{"onnx": "model.onnx", "inputs": {"x": [1, 3, 224, 224]}}`` (or ``"onnx:model.onnx"``): an
  ONNX file, imported by ``tvm.relax.frontend.onnx`` (needs ``pip install onnx``);
- ``{"torch": "package.module:factory", "inputs": {"x": [1, 16]}}``: a PyTorch module returned by
  an importable zero-argument factory, through ``torch.export`` (needs ``pip install torch``).

A sweep ``{"batch": [1, 8]}`` is a mutation rule: every model is planned once per value; for
shipped models it sets the shape option of that name, for ONNX/PyTorch ``batch`` sets dimension
0 of every input. Nothing is evaluated: values are integers.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import tvm

from . import models
from .models import Kernel

if TYPE_CHECKING:
    from schedhub.hooks.rewrites import Rewrites


class PlanError(ValueError):
    """A model reference, sweep or target that cannot be planned; the message says which."""


#: How a PyTorch model is named (a string cannot carry its input shapes).
TORCH_FORM = '{"torch": "pkg.module:factory", "inputs": {"x": [1, 16]}}'


@dataclass(frozen=True)
class ModelRef:
    source: str  # "shipped" | "onnx" | "torch"
    name: str  # model name, file path or "module:factory"
    shape: dict[str, int] = field(default_factory=dict)  # shipped models' shape options
    inputs: dict[str, list[int]] = field(default_factory=dict)  # ONNX / PyTorch input shapes

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.shape.items()))
        dims = ",".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.inputs.items())
        return f"{self.name}" + (f"[{opts or dims}]" if opts or dims else "")


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, str) and value.isdigit()):
        raise PlanError(f"{what} must be a positive integer, got {value!r}")
    if int(value) <= 0:
        raise PlanError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _inputs(value: Any) -> dict[str, list[int]]:
    if not isinstance(value, dict) or not value:
        raise PlanError("'inputs' must map input names to shapes, e.g. {x: [1, 3, 224, 224]}")
    return {str(k): [_int(d, f"a dimension of input {k!r}") for d in v] for k, v in value.items()}


def parse_model(spec: str | dict[str, Any]) -> ModelRef:
    """A model reference from its string or mapping form (see the module docstring)."""
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                return parse_model(json.loads(text))
            except json.JSONDecodeError as exc:
                raise PlanError(f"model {text!r} is not valid JSON: {exc}") from None
        if text.startswith(("onnx:", "torch:")):
            source, _, name = text.partition(":")
            return ModelRef(source, name)
        name, _, opts = text.partition(":")
        shape = {}
        for part in filter(None, opts.split(",")):
            key, eq, value = part.partition("=")
            if not eq:
                raise PlanError(f"shape option {part!r} of model {name!r} must be name=value")
            shape[key.strip()] = _int(value.strip(), f"shape option {key!r}")
        return _shipped(name, shape)
    if not isinstance(spec, dict):
        raise PlanError(f"a model is a name or a mapping, not {type(spec).__name__}")
    spec = dict(spec)
    for source in ("onnx", "torch"):
        if source in spec:
            name = spec.pop(source)
            inputs = _inputs(spec.pop("inputs")) if "inputs" in spec else {}
            if spec:
                raise PlanError(f"unknown fields {sorted(spec)} for a {source} model")
            return ModelRef(source, str(name), inputs=inputs)
    if "name" not in spec:
        raise PlanError("a model mapping needs 'name' (shipped), 'onnx' or 'torch'")
    name = str(spec.pop("name"))
    return _shipped(name, {k: _int(v, f"shape option {k!r}") for k, v in spec.items()})


def _shipped(name: str, shape: dict[str, int]) -> ModelRef:
    if name not in models.MODELS:
        raise PlanError(f"unknown model {name!r}; shipped models: {', '.join(models.model_names())} (or onnx:FILE, or a PyTorch module as a mapping: {TORCH_FORM})")
    unknown = set(shape) - set(models.MODELS[name].defaults)
    if unknown:
        raise PlanError(f"model {name!r} takes shape options {sorted(models.MODELS[name].defaults)}, not {sorted(unknown)}")
    return ModelRef("shipped", name, shape)


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """``"batch=1,8"`` → ``("batch", [1, 8])``."""
    name, eq, values = text.partition("=")
    if not eq or not values:
        raise PlanError(f"sweep {text!r} must be name=v1,v2,… (e.g. batch=1,8)")
    return name.strip(), [_int(v.strip(), f"sweep value of {name!r}") for v in values.split(",")]


def expand(refs: list[ModelRef], sweeps: dict[str, list[int]]) -> list[ModelRef]:
    """Every model once per combination of sweep values (a model ignores sweeps it has no option for)."""
    out: list[ModelRef] = []
    names = sorted(sweeps)
    for ref in refs:
        for values in itertools.product(*(sweeps[n] for n in names)) if names else [()]:
            setting = dict(zip(names, values))
            out.append(_mutated(ref, setting))
    return list({(r.source, r.label): r for r in out}.values())


def _mutated(ref: ModelRef, setting: dict[str, int]) -> ModelRef:
    if ref.source == "shipped":
        known = models.MODELS[ref.name].defaults
        return replace(ref, shape={**ref.shape, **{k: v for k, v in setting.items() if k in known}})
    if "batch" in setting and ref.inputs:
        return replace(ref, inputs={k: [setting["batch"], *v[1:]] for k, v in ref.inputs.items()})
    return ref


def load(ref: ModelRef) -> tvm.IRModule:
    """The model as a Relax module with its weights bound."""
    if ref.source == "shipped":
        return models.export_with_weights(ref.name, **ref.shape)[0]
    if ref.source == "onnx":
        try:
            import onnx
        except ImportError:
            raise PlanError(f"model {ref.name}: ONNX models need `pip install onnx`") from None
        from tvm.relax.frontend.onnx import from_onnx

        return from_onnx(onnx.load(ref.name), shape_dict=ref.inputs or None, keep_params_in_input=False)
    if ref.source == "torch":
        try:
            import torch
        except ImportError:
            raise PlanError(f"model {ref.name}: PyTorch models need `pip install torch`") from None
        module_name, _, factory = ref.name.partition(":")
        if not factory or not ref.inputs:
            raise PlanError(f"torch model {ref.name!r} needs 'module:factory' and input shapes: write it as a mapping, {TORCH_FORM}")
        module = torch_factory(module_name, factory)().eval()
        args = tuple(torch.randn(*shape) for shape in ref.inputs.values())
        return from_torch_export(torch.export.export(module, args))
    raise PlanError(f"unknown model source {ref.source!r}")


def torch_factory(module_name: str, factory: str) -> Any:
    """``module_name``'s ``factory``, the module found as ``python`` finds it from the current folder too (where a user's
    own ``mynet.py`` lies), or a :class:`PlanError` that says which part is missing."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.append(here)  # after the installed packages: a folder's file never shadows one of theirs
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PlanError(f"torch model {module_name}:{factory}: no module {exc.name!r} in {here} or the installed packages") from None
    finally:
        if added:
            sys.path.remove(here)
    if not callable(found := getattr(module, factory, None)):
        raise PlanError(f"torch model {module_name}:{factory}: {module_name} ({getattr(module, '__file__', '?')}) has no function {factory!r}")
    return found


def from_torch_export(exported: Any) -> tvm.IRModule:
    """A ``torch.export`` program as Relax for inference: weights as constants, and each BatchNorm
    folded into the convolution before it (``torch.export`` keeps them apart: eleven bare conv2d
    kernels and separate batch-norm kernels in ResNet-18, where ONNX's importer fuses them)."""
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    mod = from_exported_program(exported, keep_params_as_input=False)
    return relax.transform.FoldConstant()(relax.transform.FoldBatchnormToConv2D()(mod))


def resolve_target(spec: str | dict[str, Any] | None) -> dict[str, Any]:
    """``"host"``/None → this CPU; a JSON object or a mapping → as given; TVM's string forms too."""
    from ..execution.tvm_env import host_target

    if spec is None or spec == "host":
        return host_target()
    if isinstance(spec, dict):
        return _known_cpu(spec)
    if spec.strip().startswith("{"):
        try:
            return _known_cpu(json.loads(spec))
        except json.JSONDecodeError as exc:
            raise PlanError(f"target {spec!r} is not valid JSON: {exc}") from None
    from schedhub.hooks.kernels.identity import plain_json

    return _known_cpu(plain_json(tvm.target.Target(spec).export()))


def _known_cpu(spec: Any) -> Any:
    """``spec``, where its CPU (an llvm target's ``mcpu``) is one LLVM knows; else a :class:`PlanError` in one line."""
    from schedhub.hooks.kernels.threads import UnknownCPU, check_cpu

    try:
        check_cpu(spec)
    except UnknownCPU as exc:
        raise PlanError(f"target: {exc}") from None
    return spec


@dataclass
class PlannedKernel:
    kernel: Kernel
    models: list[str]


def plan(refs: list[ModelRef], target: dict[str, Any], rewrites: Rewrites | None = None, modules: Sequence[tvm.IRModule] | None = None) -> list[PlannedKernel]:
    """Every distinct kernel of the models on ``target`` after ``rewrites`` (by key), with the models that use it;
    ``modules``: the models already loaded (:func:`load`), one for each of ``refs``."""
    found: dict[str, PlannedKernel] = {}
    for ref, mod in zip(refs, modules if modules is not None else [load(ref) for ref in refs], strict=True):
        for kernel in models.kernels(mod, target, rewrites):
            entry = found.setdefault(kernel.identity.key, PlannedKernel(kernel, []))
            entry.models.append(ref.label)
    return list(found.values())


#: What ``schedhub tune`` leaves to the target where a rewrite is not named (``--layout auto``, no ``--prepack`` flag).
AUTO = "auto"


def tuning_rewrites(target: dict[str, Any], layout: str, math: str, prepack: bool | None, conv: str, modules: Sequence[tvm.IRModule] = ()) -> Rewrites:
    """The rewrites a tuning run takes: those named, and where the layout is ``"auto"`` or the packing None, those
    ``target``'s kernels are best tuned with (``hooks.serving.choice.tuned_best``: NHWC and prepacked on a CPU with AVX2 or AVX-512, none
    elsewhere), the given layout where that one converts nothing in ``modules`` (no convolution: the same keys, said as
    they are). A compile finds either by default (``use(...)``'s ``"auto"``)."""
    from schedhub.hooks.serving.choice import compiled_first

    first = compiled_first(target, modules, math, conv)  # type: ignore[arg-type]
    return dataclasses.replace(first, layout=first.layout if layout == AUTO else layout, prepack=first.prepack if prepack is None else prepack)
