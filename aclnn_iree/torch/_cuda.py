"""CUDA tensors on PyTorch's current stream: our CUDA modules' kernels launched without IREE's
runtime (runtime.cuda), for the calls of a signature after its first.

IREE's runtime cannot wait on or signal a CUDA event of PyTorch's, so a call through it
synchronises PyTorch's stream before and after (the torch layer's general path, _bridge.Launch):
a training step never overlaps and CUDA graphs cannot capture it.  With
``ACLNN_IREE_CUDA_LAUNCH=stream`` a repeated call (the same op, shapes, dtypes and modes: the
torch layer's plan key) instead launches the dispatches of the function the first call's phase 1
chose, in its host function's order, on ``torch.cuda.current_stream()``: outputs and
intermediates from PyTorch's caching allocator on that stream, zero fills and the float16/
bfloat16 rounding of an accumulator as PyTorch ops on it, no host synchronisation.  The first
call of a signature takes the general path (its checks, statuses and errors are aclnn's).
The default, ``iree``, keeps every call on IREE's runtime.  The stream launch has not yet run
on a GPU (issue #49): it is opt-in until it has.

What each exported GPU function dispatches is written in its operator's torch module
(cuda_dispatches, cuda_operands) as its template's host function writes it (`Dispatch`: the
entry, its work-item count, the operands by the template's SSA names);
tests/test_cuda_launch.py compares these with the rendered templates and the entries'
parameters with the PTX each CUDA module embeds.  Functions they do not take (the
deterministic forms, the upsample backward) stay on IREE's runtime.
"""
from __future__ import annotations

import dataclasses
import os

import torch
from torch._C._profiler import _RecordFunctionFast
from torch.autograd import _profiler_enabled

from ..core.errors import ACLNN_ERR_RUNTIME_ERROR, AclnnError
from ..runtime import cuda, kernels

__all__ = ["LAUNCH_ENV", "stream_launch", "Dispatch", "SIZES", "TORCH_DTYPES", "dispatches", "CudaPlan", "plan_for"]

LAUNCH_ENV = "ACLNN_IREE_CUDA_LAUNCH"
_LAUNCHES = ("iree", "stream")


def stream_launch() -> bool:
    """Whether ACLNN_IREE_CUDA_LAUNCH asks for the stream launch ("stream"; default "iree").
    Raises ValueError for another value."""
    value = os.environ.get(LAUNCH_ENV, "iree")
    if value not in _LAUNCHES:
        raise ValueError(f"{LAUNCH_ENV}={value!r}: expected one of {', '.join(_LAUNCHES)}")
    return value == "stream"


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """One `flow.dispatch` of an exported function's GPU host code, as its template writes it.

    entry: the dispatch function (its PTX kernel); work: the SSA name of its work-item count
    (the grid only needs to cover one workgroup: runtime.cuda); operands: the template's SSA
    names of its operands, the i32 push constants first, then the tensors (a binding each, in
    order); result: the SSA name of its new result (one binding more, after the operands'), or
    None where the result is tied to its last operand (written in place).
    """

    entry: str
    work: str
    operands: tuple
    result: str | None

    @property
    def bindings(self) -> int:
        """The bindings the dispatch passes: its tensor operands and its new result."""
        return len(self.operands) - len(SIZES) + (self.result is not None)


SIZES = ("Ni", "Ci", "Hi", "Wi", "Hoi", "Woi")  # every form's push constants: N, C, H, W, H_out, W_out as i32
# the accumulator types of the templates (their !acc) as PyTorch's
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}


def _torch_module(spec):
    """The torch module of `spec`'s operator (its registry entry's `torch`), which describes its
    stream launch: cuda_dispatches(spec, params, function) -> the Dispatches of `function` in
    order, or None where the stream launch does not take it; cuda_operands(spec, params, ex,
    device_index) -> operands(inputs, outputs) -> ({SSA name: tensor or int, the work counts
    too}, finish() or None: what the host function does after its dispatches)."""
    from ..ops.registry import get
    return get(spec.op).load("torch")


def dispatches(spec, params: dict, function: str):
    """The dispatches, in order, of exported `function` of `spec`'s GPU module (`params`: its
    template parameters for the target), or None where the stream launch does not take it."""
    return _torch_module(spec).cuda_dispatches(spec, params, function)


class CudaPlan:
    """A call signature's stream launch, called as _bridge.Plan is: `plan(inputs, outputs)`
    launches on the current stream of the inputs' device and returns True, or returns False
    without launching where the call needs the general path (an empty tensor, memory off the
    kernels' 16-byte alignment, ACLNN_IREE_CUDA_LAUNCH no longer "stream").  inputs and outputs
    as _bridge.Plan's (CUDA tensors, in the kernel's layout).  The launches are a
    torch.profiler event named `event` while a profiler records.  Raises AclnnError
    (ACLNN_ERR_RUNTIME_ERROR) when the driver refuses a launch.

    steps: the function's Dispatches; operands: its operator's (see _torch_module); exe: the
    module's runtime.cuda.Executable.  A plan made before the modules were unloaded
    (runtime.kernels.generation) declines, as _bridge.Plan does."""

    __slots__ = ("_steps", "_operands", "_exe", "_event", "_generation")

    def __init__(self, steps, operands, exe, event: str = ""):
        self._steps, self._operands, self._exe, self._event = steps, operands, exe, event
        self._generation = kernels.generation

    def launches(self, inputs, outputs):
        """([(entry, work items, binding addresses, push constants)] of a call in order, its
        finish() or None), after what the host function does before its dispatches (the
        fills: PyTorch ops on the current stream)."""
        values, finish = self._operands(inputs, outputs)
        n, out = len(SIZES), []
        for step in self._steps:
            args = [values[name] for name in step.operands + ((step.result,) if step.result else ())]
            out.append((step.entry, values[step.work], [t.data_ptr() for t in args[n:]], args[:n]))
        return out, finish

    def __call__(self, inputs, outputs) -> bool:
        if not stream_launch() or self._generation != kernels.generation:
            return False  # switched back to IREE's runtime, or the modules were unloaded, since the plan was made
        for t in (*inputs, *outputs):
            if t is not None and (not t.numel() or t.data_ptr() % 16):
                return False
        if _profiler_enabled():
            with _RecordFunctionFast(self._event):
                self._launch(inputs, outputs)
        else:
            self._launch(inputs, outputs)
        return True

    def _launch(self, inputs, outputs):
        stream = torch.cuda.current_stream(inputs[0].device).cuda_stream
        launches, finish = self.launches(inputs, outputs)
        try:
            for entry, work, addresses, constants in launches:
                self._exe.launch(entry, work, addresses, constants, stream)
        except cuda.CudaError as e:
            raise AclnnError(ACLNN_ERR_RUNTIME_ERROR, f"launching on PyTorch's CUDA stream: {e}") from None
        if finish is not None:
            finish()


def plan_for(ex, device_index: int, event: str):
    """The CudaPlan of a kept executor `ex` of a CUDA module (on CUDA device `device_index`),
    or None where the stream launch does not take its function (a linalg form's, one of those
    cuda_dispatches leaves to IREE).  Raises runtime.cuda.CudaError where the driver cannot load
    the module, ValueError where the module lacks a kernel the steps launch or its PTX is not
    what the launch path launches."""
    module = ex.kernel.module
    spec = module.spec
    if spec.linalg:  # IREE's own dispatches, named and shaped by its code generation
        return None
    params = spec.template_params(module.target)
    op = _torch_module(spec)
    steps = op.cuda_dispatches(spec, params, ex.kernel.name)
    if steps is None:
        return None
    identity, images = module.cuda_image()
    exe = cuda.executable(identity, device_index, images)
    for step in steps:  # the module has each kernel, taking what the step passes
        e = exe.entries.get(step.entry)
        if e is None or (e.bindings, e.constants) != (step.bindings, len(SIZES)):
            raise ValueError(f"module {module.path} has no kernel {step.entry} taking the arguments the stream "
                             "launch passes")
    return CudaPlan(steps, op.cuda_operands(spec, params, ex, device_index), exe, event)
