"""Bilinear upsampling in PyTorch (its Operator's `torch` module): the custom ops
``torch.ops.aclnn_iree.upsample_bilinear2d_backward`` (aten's schema) and
``upsample_bilinear2d`` (PyTorch's forward, our backward), their fake implementations and
autograd formulas (the backward op's too, for a double backward), the drop-in
``interpolate`` (mode="bilinear"), and the kernel `enable()` puts over
aten::upsample_bilinear2d_backward on CPU (ATEN_OVERRIDES).  Devices: aclnn_iree.torch._bridge."""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..core import aclnn as A
from ..core import api
from ..core.tensors import read_back
from ..ops.upsample import OPERATOR, call_kind
from ..ops.upsample_forward import OPERATOR as FORWARD
from . import _bridge as B
from . import _cuda as CU
from . import _library as L
from . import override as O

__all__ = ["upsample_bilinear2d_backward", "upsample_bilinear2d", "interpolate", "upsample_backward", "ATEN_OVERRIDES",
           "cuda_dispatches", "cuda_operands"]



# ----------------------------------------------------------------------------- the call
def upsample_backward(name, grad_output, output_size, input_size, align_corners, scales_h, scales_w):
    """grad_input of upsample_bilinear2d on IREE device `name`, in grad_output's memory format:
    a channels_last grad_output takes the NHWC kernel and gives a channels_last gradient,
    any other the NCHW one (a strided grad_output is copied once).  A repeated signature
    runs its Plan (_bridge).  Raises AclnnError."""
    nhwc = B.is_channels_last(grad_output)
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    go = grad_output.contiguous(memory_format=fmt)
    N, C, H, W = (int(v) for v in input_size)
    osz = (int(output_size[0]), int(output_size[1])) if len(output_size) == 2 else tuple(map(int, output_size))
    align_corners = bool(align_corners)
    form = A.current_form()  # once: the key's is the one phase 1 takes (grid_sampler.grid_sampler_backward)
    key = (OPERATOR.name, name, go.shape, go.dtype, nhwc, osz, (N, C, H, W), align_corners, scales_h, scales_w, form)
    out = torch.empty((N, C, H, W), dtype=go.dtype, device=go.device, memory_format=fmt)
    plan = B.plan(key)
    if plan is not None and (plan((go.permute(0, 2, 3, 1),), (out.permute(0, 2, 3, 1),)) if nhwc
                             else plan((go,), (out,))):
        return out
    run = B.Launch(OPERATOR.call_device(name, go.numel() + out.numel(), call_kind(go.shape, out.shape)), (go,))
    if nhwc:  # the kernels take NHWC as (N, H, W, C) arrays, C fastest
        storages = [run.storage(go.permute(0, 2, 3, 1), "NHWC"), run.storage(out.permute(0, 2, 3, 1), "NHWC", True)]
        isz = (N, H, W, C)
    else:
        storages, isz = [run.storage(go, "NCHW"), run.storage(out, "NCHW", True)], (N, C, H, W)
    # A result read back from device memory (a GPU device for CPU tensors) is in the kernel's
    # layout: NHWC goes into the channels_last tensor through its (N, H, W, C) view.
    with run.recorded(OPERATOR):
        api.run_upsample(run.stream, storages, list(osz), isz, align_corners, scales_h, scales_w,
                         read=B.reader([out.permute(0, 2, 3, 1) if nhwc else out]), kept=B.planner(key, run, go.dtype),
                         form=form)
    return out


def upsample_forward(name, input, output_size, align_corners, scales_h, scales_w):
    """upsample_bilinear2d on IREE device `name`, in input's memory format: a channels_last
    input takes the NHWC kernel and gives a channels_last output, any other the NCHW one (a
    strided input is copied once).  A repeated signature runs its Plan (_bridge).  Raises
    AclnnError."""
    nhwc = B.is_channels_last(input)
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    x = input.contiguous(memory_format=fmt)
    osz = tuple(int(v) for v in output_size)
    align_corners = bool(align_corners)
    form = A.current_form()  # once: the key's is the one phase 1 takes (grid_sampler.grid_sampler_backward)
    key = (FORWARD.name, name, x.shape, x.dtype, nhwc, osz, align_corners, scales_h, scales_w, form)
    plan = B.plan(key)
    if plan is not None:
        # on the input's device, not the default one (torch.set_default_device)
        out = torch.empty((x.shape[0], x.shape[1], *osz), dtype=x.dtype, device=x.device, memory_format=fmt)
        if plan((x.permute(0, 2, 3, 1),), (out.permute(0, 2, 3, 1),)) if nhwc else plan((x,), (out,)):
            return out
    valid = x.dim() == 4 and len(osz) == 2 and min(osz) >= 0
    shape = (x.shape[0], x.shape[1], *osz) if valid else (0, 0, 0, 0)  # an invalid call: phase 1 says why
    out = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    run = B.Launch(FORWARD.call_device(name, x.numel() + out.numel(), call_kind(x.shape, out.shape)), (x,))
    if nhwc:  # the kernels take NHWC as (N, H, W, C) arrays, C fastest
        storages = [run.storage(x.permute(0, 2, 3, 1), "NHWC"), run.storage(out.permute(0, 2, 3, 1), "NHWC", True)]
    else:
        storages = [run.storage(x, "NCHW"), run.storage(out, "NCHW", True)]
    with run.recorded(FORWARD):
        api.run_upsample_forward(run.stream, storages, list(osz), align_corners, scales_h, scales_w,
                                 read=B.reader([out.permute(0, 2, 3, 1) if nhwc else out]),
                                 kept=B.planner(key, run, x.dtype), form=form)
    return out


# ----------------------------------------------------------------------------- CUDA stream launch
# templates/upsample_bilinear2d/host.mlir.j2's one dispatch (_cuda.Dispatch; tests/test_cuda_launch.py
# holds it to the template).  The backward's host function computes its window lengths and its
# intermediate's shape itself: it stays on IREE's runtime.
UPSAMPLE_FORWARD = CU.Dispatch("upsample", "work", CU.SIZES + ("flat", "scales"), "of")


def cuda_dispatches(spec, params: dict, function: str):
    """The dispatches of `function` of an upsample's CUDA module, or None (the backward, the
    linalg forms)."""
    return (UPSAMPLE_FORWARD,) if spec.op == FORWARD.name and not spec.linalg and function == spec.kernel_name else None


def cuda_operands(spec, params: dict, ex=None, device_index: int = 0, scales=None):
    """operands(inputs, outputs) -> (the dispatch's operands by SSA name, None) of the forward's
    CUDA call (NHWC tensors as their (N, H, W, C) permutation): `scales`, the (rh, rw) CUDA
    tensor in the op-math type, else the kept executor `ex`'s own, copied to the GPU once."""
    if scales is None:
        scales = torch.from_numpy(read_back(ex.bound[1].storage, ex.device).copy()).to(f"cuda:{device_index}")
    nhwc = spec.layout == "NHWC"

    def forward(inputs, outputs):
        (x,), (out,) = inputs, outputs
        (N, H, W, C), (Ho, Wo) = (x.shape, out.shape[1:3]) if nhwc else ((x.shape[0], *x.shape[2:], x.shape[1]),
                                                                          out.shape[2:])
        return {"flat": x, "scales": scales, "of": out, "work": N * C * Ho * Wo,
                **dict(zip(CU.SIZES, (N, C, H, W, Ho, Wo)))}, None
    return forward


# ----------------------------------------------------------------------------- backward op
def _upsample_format(grad_output):
    return torch.channels_last if B.is_channels_last(grad_output) else torch.contiguous_format


@L.op("upsample_bilinear2d_backward(Tensor grad_output, SymInt[2] output_size, SymInt[4] input_size, "
      "bool align_corners, float? scales_h=None, float? scales_w=None) -> Tensor")
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
    L.check_dtype("upsample_bilinear2d_backward", grad_output)
    name = B.iree_device_for(grad_output)
    if name is None:
        return torch.ops.aten.upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners,
                                                           scales_h, scales_w)
    return upsample_backward(name, grad_output, output_size, input_size, align_corners, scales_h, scales_w)


@torch.library.register_fake("aclnn_iree::upsample_bilinear2d_backward")
def _(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return grad_output.new_empty(tuple(input_size)).contiguous(memory_format=_upsample_format(grad_output))


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


# ----------------------------------------------------------------------------- forward op
@L.op("upsample_bilinear2d(Tensor input, SymInt[2] output_size, bool align_corners, float? scales_h=None, "
      "float? scales_w=None) -> Tensor")
def upsample_bilinear2d(input: Tensor, output_size: Sequence[int], align_corners: bool,
                        scales_h: Optional[float] = None, scales_w: Optional[float] = None) -> Tensor:
    """Bilinear 2-D resampling (aten::upsample_bilinear2d's schema) on our aclnnUpsampleBilinear2d
    kernel, differentiated by our upsample_bilinear2d_backward.

    input (N, C, H_in, W_in) of float16, bfloat16, float32 or float64, contiguous or
    channels_last (the output keeps its memory format: channels_last takes the NHWC kernel);
    output_size (H_out, W_out); scales: the scale factors or None (a given scale must satisfy
    H_out == floor(H_in * scale)).  Where IREE has no device for the tensor, PyTorch's kernel.
    Raises aclnn_iree.AclnnError for invalid arguments.
    """
    L.check_dtype("upsample_bilinear2d", input)
    name = B.iree_device_for(input)
    if name is None:
        return torch.ops.aten.upsample_bilinear2d(input, output_size, align_corners, scales_h, scales_w)
    return upsample_forward(name, input, output_size, align_corners, scales_h, scales_w)


@torch.library.register_fake("aclnn_iree::upsample_bilinear2d")
def _(input, output_size, align_corners, scales_h=None, scales_w=None):
    shape = (input.shape[0], input.shape[1], *output_size)
    return input.new_empty(shape).contiguous(memory_format=_upsample_format(input))


def _up_setup(ctx, inputs, output):
    input, output_size, align_corners, scales_h, scales_w = inputs
    ctx.args = (list(output_size), list(input.shape), align_corners, scales_h, scales_w)


def _up_backward(ctx, grad):
    output_size, input_size, align_corners, scales_h, scales_w = ctx.args
    dx = L.below_autograd(torch.ops.aclnn_iree.upsample_bilinear2d_backward, upsample_bilinear2d_backward, grad,
                      output_size, input_size, align_corners, scales_h, scales_w)
    return dx, None, None, None, None


torch.library.register_autograd("aclnn_iree::upsample_bilinear2d", _up_backward, setup_context=_up_setup)


# ----------------------------------------------------------------------------- interpolate
_UpsampleBilinear2d = L.autograd_function("_UpsampleBilinear2d", torch.ops.aclnn_iree.upsample_bilinear2d,
                                          upsample_bilinear2d, _up_setup, _up_backward)


def _scale(s) -> float:
    """One scale factor as F.interpolate takes it: a real number (not a tensor or a string)."""
    if isinstance(s, torch.Tensor) or not isinstance(s, numbers.Real):
        raise TypeError(f"interpolate(): expected scale_factor to be a float or a tuple of floats, got "
                        f"{type(s).__name__}")
    return float(s)


def _is_integer(x) -> bool:
    return isinstance(x, int) or (isinstance(x, torch.Tensor) and not x.is_floating_point() and x.dim() == 0)


def _same_rank(input, values, what: str, got: str, form: str):
    """F.interpolate's ValueError (its words) where `values` has not one entry per spatial axis."""
    if len(values) != input.dim() - 2:
        raise ValueError(f"Input and {what} must have the same number of spatial dimensions, but got input with "
                         f"spatial dimensions of {list(input.shape[2:])} and {got}. Please provide input tensor "
                         f"in (N, C, d1, d2, ...,dK) format and {form} format.")


def interpolate(input, size=None, scale_factor=None, mode: str = "bilinear", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False):
    """torch.nn.functional.interpolate(mode="bilinear") on our kernels: aclnnUpsampleBilinear2d
    forward, aclnnUpsampleBilinear2dBackwardV2 backward.

    input (N, C, H, W), contiguous or channels_last (the gradient keeps its layout and
    takes the NHWC kernel); exactly one of size ((H_out, W_out) or an int) and
    scale_factor (a float or two); align_corners defaults to False; recompute_scale_factor
    as in PyTorch.  The output size and the scales given to the backward are computed
    exactly as F.interpolate computes them, so the gradients match autograd's.  Raises
    ValueError for another mode (naming the supported one), for antialias=True, and for
    the argument errors F.interpolate raises.
    """
    if mode != "bilinear":
        raise ValueError(f"aclnn_iree.torch.interpolate supports mode='bilinear' only, got mode={mode!r}; use "
                         "torch.nn.functional.interpolate for other modes")
    if antialias:
        raise ValueError("aclnn_iree.torch.interpolate has no antialias=True form (aclnn's upsample backward has "
                         "none); use torch.nn.functional.interpolate")
    if input.dim() != 4:
        raise NotImplementedError(f"Got {input.dim()}D input, but bilinear mode needs 4D input")
    if align_corners is None:
        align_corners = False
    L.check_bool("interpolate", align_corners)
    dim = 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        if isinstance(size, (list, tuple)):
            _same_rank(input, size, "output", f"output size of {size}", "output size in (o1, o2, ...,oK)")
            if not all(_is_integer(x) for x in size):
                raise TypeError("expected size to be one of int or Tuple[int] or Tuple[int, int] or "
                                f"Tuple[int, int, int], but got size with types {[type(x) for x in size]}")
            output_size = [int(x) for x in size]
        else:
            output_size = [int(size)] * dim
        scale_factors = None
    elif scale_factor is not None:
        if isinstance(scale_factor, (list, tuple)):
            _same_rank(input, scale_factor, "scale_factor", f"scale_factor of shape {scale_factor}",
                       "scale_factor in (s1, s2, ...,sK)")
            scale_factors = [_scale(s) for s in scale_factor]
        else:
            scale_factors = [_scale(scale_factor)] * dim
        output_size = None
    else:
        raise ValueError("either size or scale_factor should be defined")
    if recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    if output_size is None:  # as F.interpolate and ATen's upsample_compute_output_size: truncate in double
        sizes = [input.size(i + 2) * scale_factors[i] for i in range(dim)]
        if any(isinstance(v, float) and not abs(v) < 2.0 ** 63 for v in sizes):  # NaN, inf, beyond int64
            raise RuntimeError("value cannot be converted to type int64_t without overflow")
        output_size = [torch.sym_int(v) for v in sizes]
        if recompute_scale_factor:
            scale_factors = None
    scales_h, scales_w = scale_factors if scale_factors is not None else (None, None)
    return _UpsampleBilinear2d.apply(input, output_size, align_corners, scales_h, scales_w)


# ----------------------------------------------------------------------------- enable()
def _consistent(scale, in_size, out_size) -> bool:
    """Whether aclnn takes this scale: none, <= 0 (not given), or one that agrees with the sizes.
    A NaN or infinite scale, which PyTorch accepts, is not (PyTorch's kernel runs)."""
    if scale is None or scale <= 0:
        return True
    product = in_size * scale
    return math.isfinite(product) and out_size == math.floor(product)


def _device_for(t, in_hw, output_size, scales_h, scales_w):
    """override.device_for(t) where aclnn takes the sizes and scales (`in_hw`: the input's H and
    W, empty when it has no 4 dimensions), else None: PyTorch's kernel runs."""
    if len(in_hw) != 2 or len(output_size) != 2 or not (_consistent(scales_h, in_hw[0], output_size[0])
                                                       and _consistent(scales_w, in_hw[1], output_size[1])):
        return None
    return O.device_for(t)


def _upsample_kernel(keyset, grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    name = _device_for(grad_output, input_size[2:] if len(input_size) == 4 else (), output_size, scales_h, scales_w)
    if name is None:
        return O.original(f"aten::{OPERATOR.name}").call_boxed(keyset, grad_output, output_size, input_size,
                                                              align_corners, scales_h, scales_w)
    return upsample_backward(name, grad_output, output_size, input_size, align_corners, scales_h, scales_w)


def _upsample_forward_kernel(keyset, input, output_size, align_corners, scales_h=None, scales_w=None):
    name = _device_for(input, input.shape[2:] if input.dim() == 4 else (), output_size, scales_h, scales_w)
    if name is None:
        return O.original(f"aten::{FORWARD.name}").call_boxed(keyset, input, output_size, align_corners, scales_h,
                                                             scales_w)
    return upsample_forward(name, input, output_size, align_corners, scales_h, scales_w)


# aten::upsample_bilinear2d.vec (F.interpolate's) is CompositeImplicitAutograd: it decomposes
# into aten::upsample_bilinear2d, whose kernel this is.
ATEN_OVERRIDES = {f"aten::{OPERATOR.name}": _upsample_kernel, f"aten::{FORWARD.name}": _upsample_forward_kernel}
