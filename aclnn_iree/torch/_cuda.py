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

What each exported GPU function dispatches is written below as its template's host function
writes it (`Dispatch`: the entry, its work-item count, the operands by the template's SSA
names); tests/test_cuda_launch.py compares these with the rendered templates and the entries'
parameters with the PTX each CUDA module embeds.  Functions not listed (the deterministic
forms, the upsample backward) stay on IREE's runtime.
"""
from __future__ import annotations

import dataclasses
import os

import torch
from torch._C._profiler import _RecordFunctionFast
from torch.autograd import _profiler_enabled

from ..core.errors import ACLNN_ERR_RUNTIME_ERROR, AclnnError
from ..core.tensors import read_back
from ..runtime import cuda

__all__ = ["LAUNCH_ENV", "stream_launch", "Dispatch", "dispatches", "CudaPlan", "plan_for"]

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


SIZES = ("Ni", "Ci", "Hi", "Wi", "Hoi", "Woi")  # every form's push constants: N, C, H, W, H_out, W_out as i32

# templates/grid_sampler_2d_backward/gpu_host.mlir.j2 (gpu_dx, atomic; gpu_dgrid)
GRID_DX_ATOMIC = Dispatch("dx_atomic", "NCP", SIZES + ("grad_output", "grid", "acc0"), None)
GRID_DGRID = Dispatch("dgrid_points_gpu", "NP", SIZES + ("grad_output", "input", "grid"), "dgrid")
# templates/grid_sampler_2d/host.mlir.j2, templates/upsample_bilinear2d/host.mlir.j2
GRID_FORWARD = Dispatch("sample_gpu", "work", SIZES + ("input", "grid"), "output")
UPSAMPLE_FORWARD = Dispatch("upsample", "work", SIZES + ("flat", "scales"), "of")


def dispatches(spec, params: dict, function: str):
    """The dispatches, in order, of exported `function` of `spec`'s GPU module (`params`: its
    template parameters for the target), or None where the stream launch does not take it."""
    suffix = function[len(spec.kernel_name):]
    if spec.op == "grid_sampler_2d":
        return (GRID_FORWARD,) if suffix == "" else None
    if spec.op == "upsample_bilinear2d":
        return (UPSAMPLE_FORWARD,) if suffix == "" else None
    if spec.op != "grid_sampler_2d_backward" or suffix not in ("", "_dx", "_dgrid"):
        return None  # the deterministic forms, the upsample backward: IREE's runtime
    if suffix != "_dgrid" and not params["atomic_dx"]:
        return None  # dx by the ordered form (no float atomics for the accumulator)
    steps = () if suffix == "_dgrid" else (GRID_DX_ATOMIC,)
    if suffix != "_dx" and spec.interpolation_mode != "nearest":  # nearest's grad_grid is zeros
        steps += (GRID_DGRID,)
    return steps


_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}


class CudaPlan:
    """A call signature's stream launch, called as _bridge.Plan is: `plan(inputs, outputs)`
    launches on the current stream of the inputs' device and returns True, or returns False
    without launching where the call needs the general path (an empty tensor, memory off the
    kernels' 16-byte alignment, ACLNN_IREE_CUDA_LAUNCH no longer "stream").  inputs and outputs as _bridge.Plan's (CUDA tensors, in the
    kernel's layout).  The launches are a torch.profiler event named `event` while a profiler
    records.  Raises AclnnError (ACLNN_ERR_RUNTIME_ERROR) when the driver refuses a launch.

    spec, params: the module's specialisation and its template parameters for the target;
    steps: its function's dispatches (`dispatches`); exe: the module's runtime.cuda.Executable;
    scales: the upsample's (rh, rw) as a CUDA tensor in the op-math type (else None)."""

    __slots__ = ("_op", "_mode", "_layout", "_cblock", "_steps", "_exe", "_acc", "_scales", "_event")

    def __init__(self, spec, params: dict, steps, exe, scales=None, event: str = ""):
        self._op, self._steps, self._exe, self._scales, self._event = spec.op, steps, exe, scales, event
        self._mode = getattr(spec, "interpolation_mode", None)
        self._layout = getattr(spec, "layout", "NCHW")
        self._cblock = params.get("gpu_cblock", 1)
        acc = params.get("accum_type")
        self._acc = _TORCH_DTYPES[acc] if acc and acc != params["storage_type"] else None

    def _operands(self, inputs, outputs) -> dict:
        """The dispatches' operands by the templates' SSA names (tensors, sizes, work counts),
        after the fills that precede them (PyTorch ops on the current stream)."""
        if self._op == "grid_sampler_2d_backward":
            go, x, g = inputs
            dx, dgrid = outputs
            (N, C, H, W), (Ho, Wo) = x.shape, go.shape[2:]
            values = {"grad_output": go, "input": x, "grid": g, "dgrid": dgrid, "NCP": N * C * Ho * Wo, "NP": N * Ho * Wo}
            if dx is not None:  # the zeroed accumulator: dx itself, or a float32 one rounded into dx after
                values["acc0"] = dx.zero_() if self._acc is None else torch.zeros(dx.shape, dtype=self._acc,
                                                                                  device=dx.device)
            if dgrid is not None and self._mode == "nearest":
                dgrid.zero_()
        elif self._op == "grid_sampler_2d":
            x, g = inputs
            (N, C, H, W), (Ho, Wo) = x.shape, g.shape[1:3]
            values = {"input": x, "grid": g, "output": outputs[0], "work": N * -(-C // self._cblock) * Ho * Wo}
        else:  # upsample_bilinear2d; NHWC tensors as their (N, H, W, C) permutation
            (x,), (out,) = inputs, outputs
            if self._layout == "NHWC":
                (N, H, W, C), (Ho, Wo) = x.shape, out.shape[1:3]
            else:
                (N, C, H, W), (Ho, Wo) = x.shape, out.shape[2:]
            values = {"flat": x, "scales": self._scales, "of": out, "work": N * C * Ho * Wo}
        values.update(Ni=N, Ci=C, Hi=H, Wi=W, Hoi=Ho, Woi=Wo)
        return values

    def launches(self, inputs, outputs):
        """[(entry, work items, binding addresses, push constants)] of a call, in order, and
        the operands (by SSA name) they take, after zeroing what the call zeroes."""
        values = self._operands(inputs, outputs)
        n, out = len(SIZES), []
        for step in self._steps:
            args = [values[name] for name in step.operands + ((step.result,) if step.result else ())]
            out.append((step.entry, values[step.work], [t.data_ptr() for t in args[n:]], args[:n]))
        return out, values

    def __call__(self, inputs, outputs) -> bool:
        if not stream_launch():  # switched back to IREE's runtime since the plan was made
            return False
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
        launches, values = self.launches(inputs, outputs)
        try:
            for entry, work, addresses, constants in launches:
                self._exe.launch(entry, work, addresses, constants, stream)
        except cuda.CudaError as e:
            raise AclnnError(ACLNN_ERR_RUNTIME_ERROR, f"launching {self._op} on PyTorch's CUDA stream: {e}") from None
        if self._acc is not None and outputs[0] is not None:
            outputs[0].copy_(values["acc0"])  # rounded to nearest even, as the module's arith.truncf


def plan_for(ex, device_index: int, event: str):
    """The CudaPlan of a kept executor `ex` of a CUDA module (on CUDA device `device_index`),
    or None where the stream launch does not take its function (dispatches).  Raises
    runtime.cuda.CudaError where the driver cannot load the module, ValueError where its PTX
    is not what the launch path launches."""
    module = ex.kernel.module
    spec, params = module.spec, module.spec.template_params(module.target)
    steps = dispatches(spec, params, ex.kernel.name)
    if steps is None:
        return None
    exe = cuda.executable(module.identity, device_index, module.ptx)
    scales = None
    if spec.op == "upsample_bilinear2d":  # the executor's own scales tensor, copied to the GPU once
        scales = torch.from_numpy(read_back(ex.bound[1].storage, ex.device).copy()).to(f"cuda:{device_index}")
    return CudaPlan(spec, params, steps, exe, scales, event)
