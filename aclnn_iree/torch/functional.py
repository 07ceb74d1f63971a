"""Drop-in replacements for torch.nn.functional.grid_sample and interpolate (bilinear).

Same signatures, defaults, argument checks and semantics as PyTorch 2.13's; the forward
is PyTorch's own, the backward ours (through the custom ops in aclnn_iree.torch.ops),
so the gradients match autograd's (README "PyTorch").
"""
from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from . import ops  # registers torch.ops.aclnn_iree.*; its autograd formulas are used below

__all__ = ["grid_sample", "interpolate"]


# The functions' autograd: an autograd.Function around PyTorch's forward whose setup and
# backward are the formulas registered for the forward ops (ops._grid_* / ops._up_*), so the
# same gradients through the same backward ops.  Outside the op rather than through it: the
# op's register_autograd kernel costs ~65 us a call here, most of it torch._library's
# fill_defaults (quadratic in the schema's arity, pytorch/pytorch#195110), against ~15 us for
# an autograd.Function whose forward takes ctx (one with a separate setup_context binds its
# arguments with inspect.signature on every call, another ~60 us); torch.compile traces either,
# and the compiled backward graph holds our backward ops all the same (tests/test_torch.py).
def _function(name, aten_forward, setup_context, backward):
    """An autograd.Function: PyTorch's forward `aten_forward`, then the op's setup_context."""
    def forward(ctx, *inputs):
        output = aten_forward(*inputs)
        setup_context(ctx, inputs, output)
        return output
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})


_GridSampler2d = _function("_GridSampler2d", torch.ops.aten.grid_sampler_2d, ops._grid_setup, ops._grid_backward)
_UpsampleBilinear2d = _function("_UpsampleBilinear2d", torch.ops.aten.upsample_bilinear2d, ops._up_setup,
                                ops._up_backward)

_MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
_PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}


def grid_sample(input, grid, mode: str = "bilinear", padding_mode: str = "zeros", align_corners=False):
    """torch.nn.functional.grid_sample whose backward runs our aclnnGridSampler2DBackward kernel.

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
    _check_bool("grid_sample", align_corners)
    if input.dim() != 4:
        return F.grid_sample(input, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    return _GridSampler2d.apply(input, grid, _MODES[mode], _PADDINGS[padding_mode], align_corners)


def _check_bool(fn: str, align_corners):
    """align_corners must be a bool, as PyTorch's bindings insist (TypeError, not a truthiness)."""
    if not isinstance(align_corners, bool):
        raise TypeError(f"{fn}(): argument 'align_corners' must be bool, not {type(align_corners).__name__}")


def _scale(s) -> float:
    """One scale factor as F.interpolate takes it: a real number (not a tensor or a string)."""
    if isinstance(s, torch.Tensor) or not isinstance(s, numbers.Real):
        raise TypeError(f"interpolate(): expected scale_factor to be a float or a tuple of floats, got "
                        f"{type(s).__name__}")
    return float(s)


def _is_integer(x) -> bool:
    return isinstance(x, int) or (isinstance(x, torch.Tensor) and not x.is_floating_point() and x.dim() == 0)


def interpolate(input, size=None, scale_factor=None, mode: str = "bilinear", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False):
    """torch.nn.functional.interpolate(mode="bilinear") whose backward is our
    aclnnUpsampleBilinear2dBackwardV2 kernel.

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
    _check_bool("interpolate", align_corners)
    dim = 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                raise ValueError(
                    "Input and output must have the same number of spatial dimensions, but got "
                    f"input with spatial dimensions of {list(input.shape[2:])} and output size of {size}. "
                    "Please provide input tensor in (N, C, d1, d2, ...,dK) format and "
                    "output size in (o1, o2, ...,oK) format.")
            if not all(_is_integer(x) for x in size):
                raise TypeError("expected size to be one of int or Tuple[int] or Tuple[int, int] or "
                                f"Tuple[int, int, int], but got size with types {[type(x) for x in size]}")
            output_size = [int(x) for x in size]
        else:
            output_size = [int(size)] * dim
        scale_factors = None
    elif scale_factor is not None:
        if isinstance(scale_factor, (list, tuple)):
            if len(scale_factor) != dim:
                raise ValueError(
                    "Input and scale_factor must have the same number of spatial dimensions, but "
                    f"got input with spatial dimensions of {list(input.shape[2:])} and "
                    f"scale_factor of shape {scale_factor}. "
                    "Please provide input tensor in (N, C, d1, d2, ...,dK) format and "
                    "scale_factor in (s1, s2, ...,sK) format.")
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
