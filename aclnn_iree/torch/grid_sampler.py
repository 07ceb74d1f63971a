"""The grid sampler in PyTorch (the `torch` module of both its Operators, forward and backward):
the custom ops ``torch.ops.aclnn_iree.grid_sampler_2d`` (our forward, differentiated by our
backward) and ``grid_sampler_2d_backward`` (aten's schema; a 0-element tensor for an output
whose output_mask entry is False), their fake implementations and autograd formulas (the
backward op's too, for a double backward), the drop-in ``grid_sample``, and the kernels
`enable()` puts over aten::grid_sampler_2d and aten::grid_sampler_2d_backward on CPU
(ATEN_OVERRIDES).  Devices: aclnn_iree.torch._bridge."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core import aclnn as A
from ..core import api
from ..core.tensors import no_storage
from ..ops.grid_sampler import INTERPOLATION_NAMES, OPERATOR, PADDING_NAMES, call_kind
from ..ops.grid_sampler_forward import OPERATOR as FORWARD
from . import _bridge as B
from . import _cuda as CU
from . import _library as L
from . import override as O

__all__ = ["grid_sampler_2d_backward", "grid_sampler_2d", "grid_sample", "grid_sampler_backward", "ATEN_OVERRIDES",
           "cuda_dispatches", "cuda_operands"]



# ----------------------------------------------------------------------------- the call
def grid_sampler_backward(name, grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                          output_mask):
    """(grad_input, grad_grid) on IREE device `name`: torch tensors over the memory the kernel
    wrote; a masked-out gradient is None.  Inputs are made contiguous (the kernels read NCHW:
    a channels_last or strided input is copied once).  A repeated signature runs its Plan
    (_bridge).  Raises AclnnError."""
    go, x, g = grad_output.contiguous(), input.contiguous(), grid.contiguous()
    mode, padding, align_corners = int(interpolation_mode), int(padding_mode), bool(align_corners)
    mask = (bool(output_mask[0]), bool(output_mask[1]))
    # determinism and form read once: the key's are the ones the first call's phase 1 takes, so a
    # plan never runs another form than its key says (ACLNN_IREE_FORM may change meanwhile)
    deterministic, form = A.call_options()
    key = (OPERATOR.name, name, go.shape, x.shape, g.shape, go.dtype, x.dtype, g.dtype, mode, padding, align_corners, mask,
           deterministic, form)
    # empty_like of the contiguous x and g (contiguous too): a third of torch.empty's host
    # time with shape, dtype and device spelled out
    outs = [torch.empty_like(x) if mask[0] else None, torch.empty_like(g) if mask[1] else None]
    plan = B.plan(key)
    if plan is not None and plan((go, x, g), outs):
        return tuple(outs)
    run = B.Launch(OPERATOR.call_device(name, go.numel() + x.numel(), call_kind(mode)), (go, x, g))
    storages = [run.storage(go), run.storage(x), run.storage(g)]
    storages += [run.storage(t, output=True) if t is not None
                 else no_storage(like.shape, B.numpy_dtype(like.dtype)) for t, like in ((outs[0], x), (outs[1], g))]
    with run.recorded(OPERATOR):
        return tuple(api.run_grid_sampler(run.stream, storages, mode, padding, align_corners, list(mask),
                                          deterministic, read=B.reader(t for t in outs if t is not None),
                                          kept=B.planner(key, run, x.dtype), form=form))


def grid_sampler_forward(name, input, grid, interpolation_mode, padding_mode, align_corners):
    """grid_sample's forward on IREE device `name`: a torch tensor over the memory the kernel
    wrote.  Inputs are made contiguous (the kernels read NCHW).  A repeated signature runs its
    Plan (_bridge).  Raises AclnnError."""
    x, g = input.contiguous(), grid.contiguous()
    mode, padding, align_corners = int(interpolation_mode), int(padding_mode), bool(align_corners)
    form = A.current_form()  # once: the key's is the one phase 1 takes (grid_sampler_backward)
    key = (FORWARD.name, name, x.shape, g.shape, x.dtype, g.dtype, mode, padding, align_corners, form)
    plan = B.plan(key)
    if plan is not None:
        # on the input's device, not the default one (torch.set_default_device); a plain tensor
        # (new_empty would take a subclass's __torch_function__, which the first call does not)
        out = torch.empty((x.shape[0], x.shape[1], g.shape[1], g.shape[2]), dtype=x.dtype, device=x.device)
        if plan((x, g), (out,)):
            return out
    shape = (x.shape[0], x.shape[1], g.shape[1], g.shape[2]) if x.dim() == 4 and g.dim() == 4 else (0, 0, 0, 0)
    out = torch.empty(shape, dtype=x.dtype, device=x.device)  # an invalid call: phase 1 says why
    run = B.Launch(FORWARD.call_device(name, out.numel(), call_kind(mode)), (x, g))
    storages = [run.storage(x), run.storage(g), run.storage(out, output=True)]
    with run.recorded(FORWARD):
        api.run_grid_sampler_forward(run.stream, storages, mode, padding, align_corners, read=B.reader([out]),
                                     kept=B.planner(key, run, x.dtype), form=form)
    return out


# ----------------------------------------------------------------------------- CUDA stream launch
# The GPU dispatches of the grid samplers' exported functions as their templates' host
# functions issue them (_cuda.Dispatch; tests/test_cuda_launch.py holds them to the templates):
# templates/grid_sampler_2d_backward/gpu_host.mlir.j2 (gpu_dx atomic, gpu_dgrid, gpu_points) ...
GRID_DX_ATOMIC = CU.Dispatch("dx_atomic", "NCP", CU.SIZES + ("grad_output", "grid", "acc0"), None)
GRID_DGRID = CU.Dispatch("dgrid_points_gpu", "NP", CU.SIZES + ("grad_output", "input", "grid"), "dgrid")
GRID_POINTS = CU.Dispatch("dx_dgrid_points", "NP", CU.SIZES + ("grad_output", "input", "grid", "acc0"), "dgrid")
# ... and templates/grid_sampler_2d/host.mlir.j2
GRID_FORWARD = CU.Dispatch("sample_gpu", "work", CU.SIZES + ("input", "grid"), "output")


def cuda_dispatches(spec, params: dict, function: str):
    """The dispatches, in order, of `function` of a grid sampler's CUDA module (`params`: its
    template parameters), or None where the stream launch leaves it to IREE's runtime: the
    linalg forms, the deterministic forms (their workspace of dx copies) and dx without float
    atomics."""
    suffix = function[len(spec.kernel_name):]
    if spec.linalg:  # IREE's own dispatches
        return None
    if spec.op == FORWARD.name:
        return (GRID_FORWARD,) if suffix == "" else None
    if suffix not in ("", "_dx", "_dgrid", "_points") or (suffix != "_dgrid" and not params["atomic_dx"]):
        return None
    if suffix == "_points":
        return (GRID_POINTS,)
    steps = () if suffix == "_dgrid" else (GRID_DX_ATOMIC,)
    if suffix != "_dx" and spec.interpolation_mode != "nearest":  # nearest's grad_grid is zeros
        steps += (GRID_DGRID,)
    return steps


def cuda_operands(spec, params: dict, ex=None, device_index: int = 0):
    """operands(inputs, outputs) -> (the dispatches' operands by SSA name, finish or None) of a
    grid sampler's CUDA call (inputs, outputs: as the Plan's).  The backward's accumulator is
    zeroed first: grad_input itself, or (float16, bfloat16) a float32 one that finish() rounds
    into grad_input to nearest even, as the module's arith.truncf; nearest's grad_grid is
    zeroed (it has no dispatch)."""
    if spec.op == FORWARD.name:
        cblock = params["gpu_cblock"]

        def forward(inputs, outputs):
            (x, g), (out,) = inputs, outputs
            (N, C, H, W), (Ho, Wo) = x.shape, g.shape[1:3]
            return {"input": x, "grid": g, "output": out, "work": N * -(-C // cblock) * Ho * Wo,
                    **dict(zip(CU.SIZES, (N, C, H, W, Ho, Wo)))}, None
        return forward
    acc = None if params["accum_type"] == params["storage_type"] else CU.TORCH_DTYPES[params["accum_type"]]
    nearest = spec.interpolation_mode == "nearest"

    def backward(inputs, outputs):
        (go, x, g), (dx, dgrid) = inputs, outputs
        (N, C, H, W), (Ho, Wo) = x.shape, go.shape[2:]
        values = {"grad_output": go, "input": x, "grid": g, "dgrid": dgrid, "NCP": N * C * Ho * Wo,
                  "NP": N * Ho * Wo, **dict(zip(CU.SIZES, (N, C, H, W, Ho, Wo)))}
        finish = None
        if dx is not None:
            if acc is None:
                values["acc0"] = dx.zero_()
            else:
                a = values["acc0"] = torch.zeros(dx.shape, dtype=acc, device=dx.device)
                finish = lambda: dx.copy_(a)  # noqa: E731
        if dgrid is not None and nearest:
            dgrid.zero_()
        return values, finish
    return backward


# ----------------------------------------------------------------------------- backward op
@L.op("grid_sampler_2d_backward(Tensor grad_output, Tensor input, Tensor grid, int interpolation_mode, "
      "int padding_mode, bool align_corners, bool[2] output_mask) -> (Tensor, Tensor)")
def grid_sampler_2d_backward(grad_output: Tensor, input: Tensor, grid: Tensor, interpolation_mode: int,
                             padding_mode: int, align_corners: bool, output_mask: Sequence[bool]):
    """Gradients of grid_sample w.r.t. input and grid (aten::grid_sampler_2d_backward's schema).

    grad_output (N, C, H_out, W_out), input (N, C, H_in, W_in), grid (N, H_out, W_out, 2):
    one dtype of float16, bfloat16, float32, float64, on one device.  Returns (grad_input,
    grad_grid), contiguous; an output whose output_mask entry is False is a 0-element
    tensor and is not computed.  Raises aclnn_iree.AclnnError (a ValueError) for invalid
    arguments (aclnn's checks).
    """
    L.check_dtype("grid_sampler_2d_backward", grad_output, input, grid)
    name = B.iree_device_for(grad_output, input, grid)
    if name is None:  # PyTorch's kernel (it computes grad_grid whatever the mask)
        dx, dg = torch.ops.aten.grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                                                         align_corners, list(output_mask))
        return (dx if output_mask[0] else input.new_empty(0)), (dg if output_mask[1] else grid.new_empty(0))
    dx, dg = grid_sampler_backward(name, grad_output, input, grid, interpolation_mode, padding_mode,
                                     align_corners, output_mask)
    return L.masked(dx, input), L.masked(dg, grid)


@torch.library.register_fake("aclnn_iree::grid_sampler_2d_backward")
def _(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return (input.new_empty(input.shape) if output_mask[0] else input.new_empty(0),
            grid.new_empty(grid.shape) if output_mask[1] else grid.new_empty(0))


# ----------------------------------------------------------------------------- double backward
# A gradient of a gradient (create_graph=True: gradient penalties, Hessian-vector products)
# differentiates the backward ops themselves.  Without these formulas autograd's fallback
# would treat them as constants: silently zero second-order gradients.
def _grid_bw_setup(ctx, inputs, output):
    grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask = inputs
    ctx.save_for_backward(grad_output, input, grid)
    ctx.args = (interpolation_mode, padding_mode, align_corners, [bool(m) for m in output_mask])


def _grid_bw_backward(ctx, grad_grad_input, grad_grad_grid):
    """PyTorch's derivative of aten::grid_sampler_2d_backward, through a recomputation of the
    first backward by PyTorch's kernel (the same semantics as ours): exact, not our kernels."""
    mode, padding, align_corners, mask = ctx.args
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(bool(need)) for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad)]
        dx, dg = torch.ops.aten.grid_sampler_2d_backward(*leaves, mode, padding, align_corners, mask)
    pairs = [(out, g) for out, g, m in ((dx, grad_grad_input, mask[0]), (dg, grad_grad_grid, mask[1]))
             if m and g is not None and out is not None and out.requires_grad]
    wrt = [t for t in leaves if t.requires_grad]
    grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True,
                                     create_graph=torch.is_grad_enabled()) if pairs and wrt else ())
    return (*(next(grads, None) if t.requires_grad else None for t in leaves), None, None, None, None)


torch.library.register_autograd("aclnn_iree::grid_sampler_2d_backward", _grid_bw_backward,
                                setup_context=_grid_bw_setup)


# ----------------------------------------------------------------------------- forward op
@L.op("grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, "
      "bool align_corners) -> Tensor")
def grid_sampler_2d(input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> Tensor:
    """grid_sample's forward (aten::grid_sampler_2d's schema) on our aclnnGridSampler2D kernel,
    differentiated by our grid_sampler_2d_backward.

    input (N, C, H_in, W_in), grid (N, H_out, W_out, 2): one dtype of float16, bfloat16,
    float32, float64, on one device.  Returns (N, C, H_out, W_out), contiguous.  Where IREE
    has no device for the tensors, PyTorch's kernel.  Raises aclnn_iree.AclnnError (a
    ValueError) for invalid arguments (aclnn's checks).
    """
    L.check_dtype("grid_sampler_2d", input, grid)
    name = B.iree_device_for(input, grid)
    if name is None:
        return torch.ops.aten.grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners)
    return grid_sampler_forward(name, input, grid, interpolation_mode, padding_mode, align_corners)


@torch.library.register_fake("aclnn_iree::grid_sampler_2d")
def _(input, grid, interpolation_mode, padding_mode, align_corners):
    return input.new_empty((input.shape[0], input.shape[1], grid.shape[1], grid.shape[2]))


def _grid_setup(ctx, inputs, output):
    input, grid, interpolation_mode, padding_mode, align_corners = inputs
    ctx.save_for_backward(input, grid)
    ctx.args = (interpolation_mode, padding_mode, align_corners)


def _grid_backward(ctx, grad):
    input, grid = ctx.saved_tensors
    mask = [bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])]
    dx, dg = L.below_autograd(torch.ops.aclnn_iree.grid_sampler_2d_backward, grid_sampler_2d_backward, grad, input, grid, *ctx.args, mask)
    return (dx if mask[0] else None), (dg if mask[1] else None), None, None, None


torch.library.register_autograd("aclnn_iree::grid_sampler_2d", _grid_backward, setup_context=_grid_setup)


# ----------------------------------------------------------------------------- grid_sample
_GridSampler2d = L.autograd_function("_GridSampler2d", torch.ops.aclnn_iree.grid_sampler_2d, grid_sampler_2d,
                                     _grid_setup, _grid_backward)
_MODES = {name: code for code, name in INTERPOLATION_NAMES.items()}
_PADDINGS = {name: code for code, name in PADDING_NAMES.items()}


def grid_sample(input, grid, mode: str = "bilinear", padding_mode: str = "zeros", align_corners=False):
    """torch.nn.functional.grid_sample on our kernels: aclnnGridSampler2D forward, aclnnGridSampler2DBackward
    backward.

    input (N, C, H_in, W_in), grid (N, H_out, W_out, 2) with (x, y) in [-1, 1]; mode
    "bilinear" | "nearest" | "bicubic"; padding_mode "zeros" | "border" | "reflection";
    align_corners as in PyTorch (default False; None means False, as there).  Returns
    (N, C, H_out, W_out).  A 5-D (volumetric) input goes to F.grid_sample itself (our
    kernels are 2-D).  Raises ValueError for an unknown mode or padding_mode, as
    F.grid_sample does, and aclnn_iree.AclnnError for shapes aclnn refuses.
    """
    if mode not in _MODES:
        raise ValueError(f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', "
                         f"but got: '{mode}'")
    if padding_mode not in _PADDINGS:
        raise ValueError("nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
                         f"'reflection', but got: '{padding_mode}'")
    if align_corners is None:
        align_corners = False
    L.check_bool("grid_sample", align_corners)
    if input.dim() != 4:
        return F.grid_sample(input, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    return _GridSampler2d.apply(input, grid, _MODES[mode], _PADDINGS[padding_mode], align_corners)


# ----------------------------------------------------------------------------- enable()
def _grid_kernel(keyset, grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    name = O.device_for(input, grad_output, grid)
    if name is None:
        return O.original(f"aten::{OPERATOR.name}").call_boxed(keyset, grad_output, input, grid, interpolation_mode,
                                                              padding_mode, align_corners, output_mask)
    # A masked-out gradient is returned undefined (None), as aten returns grad_input.
    return grid_sampler_backward(name, grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                                 output_mask)


def _grid_forward_kernel(keyset, input, grid, interpolation_mode, padding_mode, align_corners):
    name = O.device_for(input, grid)
    if name is None:
        return O.original(f"aten::{FORWARD.name}").call_boxed(keyset, input, grid, interpolation_mode, padding_mode,
                                                             align_corners)
    return grid_sampler_forward(name, input, grid, interpolation_mode, padding_mode, align_corners)


ATEN_OVERRIDES = {f"aten::{OPERATOR.name}": _grid_kernel, f"aten::{FORWARD.name}": _grid_forward_kernel}
