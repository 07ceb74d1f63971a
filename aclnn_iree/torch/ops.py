"""Our kernels as PyTorch custom ops (torch.library, namespace `aclnn_iree`), with aten's schemas.

* ``torch.ops.aclnn_iree.grid_sampler_2d_backward(grad_output, input, grid,
  interpolation_mode, padding_mode, align_corners, output_mask) -> (Tensor, Tensor)``
* ``torch.ops.aclnn_iree.upsample_bilinear2d_backward(grad_output, output_size,
  input_size, align_corners, scales_h=None, scales_w=None) -> Tensor``
* ``torch.ops.aclnn_iree.grid_sampler_2d(input, grid, interpolation_mode, padding_mode,
  align_corners) -> Tensor`` and ``torch.ops.aclnn_iree.upsample_bilinear2d(input,
  output_size, align_corners, scales_h=None, scales_w=None) -> Tensor``: PyTorch's own
  forward, whose autograd formula is our backward (a gradient autograd does not need is
  not computed: ``ctx.needs_input_grad`` becomes the output mask).

Each op has a fake (meta) implementation, so torch.compile, torch.export and FakeTensor
tracing see through them, and an autograd formula: the backward ops too, so that a double
backward (create_graph=True) is right (README "PyTorch").  The backward ops return a 0-element tensor for an output whose
output_mask entry is False (a custom op cannot return an undefined tensor; aten's
grid_sampler_2d_backward returns an undefined grad_input there and always computes
grad_grid).  Devices: see aclnn_iree.torch._bridge.  Semantics: README "Semantics".
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from . import _bridge as B

__all__ = ["grid_sampler_2d_backward", "upsample_bilinear2d_backward", "grid_sampler_2d", "upsample_bilinear2d"]


_lib = torch.library.Library("aclnn_iree", "DEF")
# aten's own schemas (the backward ops' output_mask is bool[2], as aten's)
_lib.define("grid_sampler_2d_backward(Tensor grad_output, Tensor input, Tensor grid, int interpolation_mode, "
            "int padding_mode, bool align_corners, bool[2] output_mask) -> (Tensor, Tensor)")
_lib.define("upsample_bilinear2d_backward(Tensor grad_output, SymInt[2] output_size, SymInt[4] input_size, "
            "bool align_corners, float? scales_h=None, float? scales_w=None) -> Tensor")
_lib.define("grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, "
            "bool align_corners) -> Tensor")
_lib.define("upsample_bilinear2d(Tensor input, SymInt[2] output_size, bool align_corners, float? scales_h=None, "
            "float? scales_w=None) -> Tensor")


def _impl(name):
    """Registers a Python kernel for every backend (Library.impl: about 5 us per call, a
    quarter of torch.library.custom_op's wrapper); each kernel picks its device itself."""
    def register(fn):
        _lib.impl(name, fn, "CompositeExplicitAutograd")
        return fn
    return register


def _check_dtype(op, *tensors):
    for t in tensors:
        if t.dtype not in B.SUPPORTED_DTYPES:
            raise ValueError(f"aclnn_iree.{op}: dtype {t.dtype} is not supported; supported: "
                             + ", ".join(str(d) for d in B.SUPPORTED_DTYPES))


def _masked(t: Optional[Tensor], like: Tensor) -> Tensor:
    return t if t is not None else like.new_empty(0)


# ----------------------------------------------------------------------------- backward ops
@_impl("grid_sampler_2d_backward")
def grid_sampler_2d_backward(grad_output: Tensor, input: Tensor, grid: Tensor, interpolation_mode: int,
                             padding_mode: int, align_corners: bool, output_mask: Sequence[bool]):
    """Gradients of grid_sample w.r.t. input and grid (aten::grid_sampler_2d_backward's schema).

    grad_output (N, C, H_out, W_out), input (N, C, H_in, W_in), grid (N, H_out, W_out, 2):
    one dtype of float16, bfloat16, float32, float64, on one device.  Returns (grad_input,
    grad_grid), contiguous; an output whose output_mask entry is False is a 0-element
    tensor and is not computed.  Raises aclnn_iree.AclnnError (a ValueError) for invalid
    arguments (aclnn's checks).
    """
    _check_dtype("grid_sampler_2d_backward", grad_output, input, grid)
    name = B.iree_device_for(grad_output, input, grid)
    if name is None:  # PyTorch's kernel (it computes grad_grid whatever the mask)
        dx, dg = torch.ops.aten.grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                                                         align_corners, list(output_mask))
        return (dx if output_mask[0] else input.new_empty(0)), (dg if output_mask[1] else grid.new_empty(0))
    dx, dg = B.grid_sampler_backward(name, grad_output, input, grid, interpolation_mode, padding_mode,
                                     align_corners, output_mask)
    return _masked(dx, input), _masked(dg, grid)


@torch.library.register_fake("aclnn_iree::grid_sampler_2d_backward")
def _(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return (input.new_empty(input.shape) if output_mask[0] else input.new_empty(0),
            grid.new_empty(grid.shape) if output_mask[1] else grid.new_empty(0))


def _upsample_format(grad_output):
    return torch.channels_last if B.is_channels_last(grad_output) else torch.contiguous_format


@_impl("upsample_bilinear2d_backward")
def upsample_bilinear2d_backward(grad_output: Tensor, output_size: Sequence[int], input_size: Sequence[int],
                                 align_corners: bool, scales_h: Optional[float] = None,
                                 scales_w: Optional[float] = None) -> Tensor:
    """Gradient of bilinear 2-D upsampling (aten::upsample_bilinear2d_backward's schema).

    grad_output (N, C, H_out, W_out) of float16, bfloat16, float32 or float64;
    output_size (H_out, W_out); input_size (N, C, H_in, W_in); scales: the forward's scale
    factors or None (a given scale must satisfy H_out == floor(H_in * scale)).  Returns
    grad_input in grad_output's memory format (channels_last takes the NHWC kernel).
    Raises aclnn_iree.AclnnError for invalid arguments.
    """
    _check_dtype("upsample_bilinear2d_backward", grad_output)
    name = B.iree_device_for(grad_output)
    if name is None:
        return torch.ops.aten.upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners,
                                                           scales_h, scales_w)
    return B.upsample_backward(name, grad_output, output_size, input_size, align_corners, scales_h, scales_w)


@torch.library.register_fake("aclnn_iree::upsample_bilinear2d_backward")
def _(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return grad_output.new_empty(tuple(input_size)).contiguous(memory_format=_upsample_format(grad_output))


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


def _up_bw_setup(ctx, inputs, output):
    grad_output, output_size, input_size, align_corners, scales_h, scales_w = inputs
    ctx.args = (list(output_size), align_corners, scales_h, scales_w)


def _up_bw_backward(ctx, grad):
    """The backward is linear in grad_output; its adjoint is the forward (as aten's formula)."""
    output_size, align_corners, scales_h, scales_w = ctx.args
    return (torch.ops.aclnn_iree.upsample_bilinear2d(grad, output_size, align_corners, scales_h, scales_w),
            None, None, None, None, None)


torch.library.register_autograd("aclnn_iree::upsample_bilinear2d_backward", _up_bw_backward,
                                setup_context=_up_bw_setup)


# ----------------------------------------------------------------------------- forward ops
@_impl("grid_sampler_2d")
def grid_sampler_2d(input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> Tensor:
    """PyTorch's aten::grid_sampler_2d, differentiated by our grid_sampler_2d_backward."""
    return torch.ops.aten.grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners)


torch.library.register_fake("aclnn_iree::grid_sampler_2d", grid_sampler_2d)


def _grid_setup(ctx, inputs, output):
    input, grid, interpolation_mode, padding_mode, align_corners = inputs
    ctx.save_for_backward(input, grid)
    ctx.args = (interpolation_mode, padding_mode, align_corners)


def _backward_op(op, *args):
    """Calls a backward op from an autograd formula.  In a first-order backward (grad mode off)
    below the Autograd key: its autograd wrapper would only pass the call on, for ~30-70 us
    of Python here (tiny grid_sample step 525 -> 455 us).  Under create_graph=True through
    it, so that the double backward formula is recorded; also while dynamo traces (it cannot
    trace the guard, and its graph is differentiated by AOTAutograd, not by this call)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def _grid_backward(ctx, grad):
    input, grid = ctx.saved_tensors
    mask = [bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])]
    dx, dg = _backward_op(torch.ops.aclnn_iree.grid_sampler_2d_backward, grad, input, grid, *ctx.args, mask)
    return (dx if mask[0] else None), (dg if mask[1] else None), None, None, None


torch.library.register_autograd("aclnn_iree::grid_sampler_2d", _grid_backward, setup_context=_grid_setup)


@_impl("upsample_bilinear2d")
def upsample_bilinear2d(input: Tensor, output_size: Sequence[int], align_corners: bool,
                        scales_h: Optional[float] = None, scales_w: Optional[float] = None) -> Tensor:
    """PyTorch's aten::upsample_bilinear2d, differentiated by our upsample_bilinear2d_backward."""
    return torch.ops.aten.upsample_bilinear2d(input, output_size, align_corners, scales_h, scales_w)


torch.library.register_fake("aclnn_iree::upsample_bilinear2d", upsample_bilinear2d)


def _up_setup(ctx, inputs, output):
    input, output_size, align_corners, scales_h, scales_w = inputs
    ctx.args = (list(output_size), list(input.shape), align_corners, scales_h, scales_w)


def _up_backward(ctx, grad):
    output_size, input_size, align_corners, scales_h, scales_w = ctx.args
    dx = _backward_op(torch.ops.aclnn_iree.upsample_bilinear2d_backward, grad, output_size, input_size,
                      align_corners, scales_h, scales_w)
    return dx, None, None, None, None


torch.library.register_autograd("aclnn_iree::upsample_bilinear2d", _up_backward, setup_context=_up_setup)
