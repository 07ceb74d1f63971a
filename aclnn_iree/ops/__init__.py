"""The operators: what the package knows of each operator, described once.

Each operator has a module here (grid_sampler.py, upsample.py) that owns its aclnn name,
its vocabulary (the aclnn/PyTorch integer codes of its modes and the names kernel names and
templates use), `check(...)` (its argument checks in aclnn's order, with statuses and
messages) and `bind(...)` (checked arguments bound to a compiled function), and that ends
with its `OPERATOR`: an `Operator` naming those and the rest of what the layers need of it
(its specialisation class, float64 reference, inline-work thresholds, and the modules of its
PyTorch integration and benchmark).  `registry.OPERATORS` lists them, one line each; the
compiler's enumeration, the AOT build, the CLI's `--op`, the benchmark, the roofline and the
PyTorch layer iterate it.  No code outside an operator's own files switches on its name
(tests/test_registry.py).  CONTRIBUTING.md "Adding an operator" says what to write.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Mapping, Optional

__all__ = ["Binding", "Operator"]


@dataclasses.dataclass(frozen=True)
class Binding:
    """What phase 1 decided for one call.

    spec: the specialisation to run, or None when there is nothing to compute;
    function: the name of the exported function; tensors: the aclTensors it takes, in
    its argument order (inputs, then outputs); zero_fill: outputs that are all zeros
    without a kernel (empty inputs: nothing contributes).
    """

    spec: object = None
    function: str = ""
    tensors: tuple = ()
    zero_fill: tuple = ()


@dataclasses.dataclass(frozen=True)
class Operator:
    """One operator, as every layer sees it.

    name (the spec's `op`): its name in kernel names, the manifest ("op"), `aclnn-iree
    list/build/bench --op` and PyTorch's aten namespace (`aten::<name>`);
    aclnn_name: the aclnn API's name (the phase-1 function is `<aclnn_name>GetWorkspaceSize`);
    spec: its compiler/specs.py class (a frozen dataclass: `enumerate(dtypes)` yields its
    specialisations, which name their kernels, functions and template family);
    vocabulary: {aclnn argument name: {integer code: name}} of its enumerated arguments;
    check / bind: its phase-1 argument checks and binding (the operator module's);
    reference: its float64 NumPy reference (ops/reference.py), PyTorch's formulas;
    inline_work: {call kind: elements}: calls with at most this much work (grad_output plus
    grad_input elements) run inline on local-sync where local-task is asked for (call_device);
    "" is every call's kind unless the operator's module names another (a kind missing from
    the mapping takes ""'s);
    torch: the module of its PyTorch integration (the aten kernels `enable()` overrides, its
    custom ops), imported by aclnn_iree.torch;
    bench: the module of its benchmark (cases, inputs, our calls, PyTorch's and the peers'),
    imported by aclnn_iree.tools.bench;
    roofline: the module of its roofline model (`aclnn-iree bench --roofline`), or None.
    """

    aclnn_name: str
    spec: type
    check: Callable
    bind: Callable
    reference: Callable
    inline_work: Mapping[str, int]
    torch: str
    bench: str
    roofline: Optional[str] = None
    vocabulary: Mapping[str, Mapping[int, str]] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.op

    def load(self, part: str):
        """The module named by the field `part` ("torch", "bench", "roofline"), imported."""
        return importlib.import_module(getattr(self, part))

    def call_device(self, device: str, work: int, kind: str = "") -> str:
        """The IREE device that runs a call of this operator with `work` elements: local-sync
        for a small call (inline_work[kind], else inline_work[""]) when `device` is local-task,
        else `device`."""
        if device != "local-task":
            return device
        return "local-sync" if work <= self.inline_work.get(kind, self.inline_work[""]) else device
