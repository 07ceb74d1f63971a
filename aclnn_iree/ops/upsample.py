"""aclnnUpsampleBilinear2dBackwardV2: the gradient of bilinear 2-D up- (or down-)sampling.

Semantics: PyTorch 2.13 upsample_bilinear2d_backward (docs/semantics.md#bilinear-upsampling,
its scales: #scale-consistency-check); the checks and their order:
docs/status-codes.md#upsample-backward-checks.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..compiler.specs import UpsampleSpec
from ..core.errors import ACLNN_ERR_PARAM_INVALID as INVALID
from ..core.errors import ACLNN_ERR_PARAM_NULLPTR as NULLPTR
from ..core.errors import brief
from ..core.tensors import aclIntArray, tensor_over
from ..core.validation import (bool_attr, dtype_name, fail, no_alias, rank, same_device, same_dtype, scale_arg,
                               supported_dtype, tensor_arg)
from . import Binding, Operator, reference

__all__ = ["ACLNN_NAME", "check", "bind", "upsample_scale", "checked_scales", "op_math", "scales_tensor", "call_kind",
           "OPERATOR"]

ACLNN_NAME = "aclnnUpsampleBilinear2dBackwardV2"


def upsample_scale(in_size: int, out_size: int, align_corners: bool, scale: float, dtype) -> float:
    """PyTorch 2.13's source-index scale for one axis, rounded to the op-math type `dtype`.

    An axis that is not resized maps identically (scale 1); align_corners uses
    (in-1)/(out-1), or 0 for out == 1; otherwise 1/scale for a given scale > 0,
    else in/out (area_pixel_compute_scale, aten/src/ATen/native/UpSample.h).
    """
    if in_size == out_size:
        return 1.0
    if align_corners:
        return float(dtype(in_size - 1) / dtype(out_size - 1)) if out_size > 1 else 0.0
    if scale is not None and scale > 0:
        return float(dtype(1.0 / scale))  # 1/scale in double, then rounded (compute_scales_value)
    return float(dtype(in_size) / dtype(out_size))


def check(gradOut, outputSize, inputSize, alignCorners, scalesH, scalesW, out) -> tuple:
    """Checks aclnnUpsampleBilinear2dBackwardV2's arguments in aclnn's order
    (docs/status-codes.md#upsample-backward-checks); returns (layout, (rh, rw)): "NCHW" or
    "NHWC" and the per-axis source scales in the op-math
    type.  Raises AclnnError: 161001 for a None or destroyed argument, 161002 for an invalid one."""
    tensor_arg("gradOut", gradOut)
    for name, arr in (("outputSize", outputSize), ("inputSize", inputSize)):
        if arr is None:
            fail(NULLPTR, f"{name} is None")
    tensor_arg("out", out)
    for name, arr in (("outputSize", outputSize), ("inputSize", inputSize)):
        if not isinstance(arr, aclIntArray):
            fail(INVALID, f"{name} must be an aclIntArray, got {brief(arr)}")
        if arr.destroyed:
            fail(NULLPTR, f"{name} was destroyed")
    same_device([("gradOut", gradOut), ("out", out)])
    rank("gradOut", gradOut, 4)
    if inputSize.size != 4:
        fail(INVALID, f"inputSize must have 4 entries, got {inputSize.size}")
    if outputSize.size != 2:
        fail(INVALID, f"outputSize must have 2 entries, got {outputSize.size}")
    if out.format not in ("NCHW", "NHWC"):
        fail(INVALID, f"out has format {out.format}; expected NCHW or NHWC")
    if gradOut.format not in ("NCHW", "NHWC"):
        fail(INVALID, f"gradOut has format {gradOut.format}; expected NCHW or NHWC")
    if out.format != gradOut.format:
        fail(INVALID, f"out has format {out.format} but gradOut has {gradOut.format}")
    nhwc = gradOut.format == "NHWC"
    if nhwc:
        N, H, W, C = inputSize.values
    else:
        N, C, H, W = inputSize.values
    Ho, Wo = outputSize.values
    if H <= 0 or W <= 0:
        fail(INVALID, f"inputSize H and W must be > 0, got {inputSize.values}")
    if Ho <= 0 or Wo <= 0:
        fail(INVALID, f"outputSize must be > 0, got {outputSize.values}")
    if N < 0 or C < 0:
        fail(INVALID, f"inputSize N and C must be >= 0, got {inputSize.values}")
    expected = (N, Ho, Wo, C) if nhwc else (N, C, Ho, Wo)
    if gradOut.shape != expected:
        fail(INVALID, f"gradOut has shape {gradOut.shape}; expected {expected} from inputSize {inputSize.values} "
                       f"and outputSize {outputSize.values} ({gradOut.format})")
    same_dtype("gradOut", gradOut, [("out", out)])
    supported_dtype("gradOut", gradOut)
    expected_out = (N, H, W, C) if nhwc else (N, C, H, W)
    if out.shape != expected_out:
        fail(INVALID, f"out has shape {out.shape}; expected the grad-input shape {expected_out} ({out.format})")
    bool_attr("alignCorners", alignCorners)
    no_alias((("out", out),), (("gradOut", gradOut),))
    return ("NHWC" if nhwc else "NCHW"), checked_scales(scalesH, scalesW, (H, Ho), (W, Wo), bool(alignCorners),
                                                        op_math(gradOut.dtype))


def checked_scales(scalesH, scalesW, h_sizes, w_sizes, align_corners: bool, dtype) -> tuple:
    """(rh, rw), each axis's source-index scale (upsample_scale) for (in, out) sizes `h_sizes`
    and `w_sizes`, in the op-math type `dtype`.  Raises AclnnError 161002 for a scale that is
    not a number, or a given one (> 0) that disagrees with the sizes (never silently ignored:
    docs/semantics.md#scale-consistency-check)."""
    scales = (scale_arg("scalesH", scalesH), scale_arg("scalesW", scalesW))
    for name, s, (i, o) in zip(("scalesH", "scalesW"), scales, (h_sizes, w_sizes)):
        if s > 0 and (not math.isfinite(i * s) or o != math.floor(i * s)):
            got = math.floor(i * s) if math.isfinite(i * s) else i * s
            fail(INVALID, f"{name}={s} is inconsistent with the sizes: output {o} != floor({i} * {s}) = {got}")
    return tuple(upsample_scale(i, o, align_corners, s, dtype) for s, (i, o) in zip(scales, (h_sizes, w_sizes)))


def op_math(dtype):
    """The type the scales are computed and passed in: float64 for float64, else float32."""
    return np.float64 if dtype == np.float64 else np.float32


def bind(gradOut, alignCorners, out, layout: str, scales) -> Binding:
    """The call for checked arguments (check() gives `layout` and `scales`, the per-axis
    (rh, rw)): the function takes gradOut, the scales as a device tensor in the op-math type,
    then out."""
    if gradOut.size == 0 or out.size == 0:
        return Binding(zero_fill=(out,))
    spec = UpsampleSpec(bool(alignCorners), dtype_name(gradOut.dtype), layout)
    scales = scales_tensor(gradOut.device, tuple(scales), op_math(gradOut.dtype))
    return Binding(spec, spec.function_name(same_size=gradOut.shape == out.shape), (gradOut, scales, out))


@functools.lru_cache(maxsize=256)
def scales_tensor(device, scales: tuple, dtype):
    """The (rh, rw) scales as a device tensor, shared by the calls with the same scales: the
    kernels only read it (a ReadOnly binding), and nothing destroys it, so a call in flight
    keeps it as it keeps any tensor it reads (aclOpExecutor.resources).  Making one costs
    ~25 us, a tenth of a small call."""
    return tensor_over(device, np.array(scales, dtype), "ND")


def call_kind(grad_output_shape, grad_input_shape) -> str:
    """The kind of a call, for Operator.call_device: "same_size" where the two tensors (the
    backward's grad_output and grad_input, the forward's input and output) have one shape
    (both axes keep their size: an elementwise pass), else ""."""
    return "same_size" if tuple(grad_output_shape) == tuple(grad_input_shape) else ""


# inline_work: the measured crossover is about 5e5 elements on 2 threads (docs/performance.md#host-overhead); a same-size call is a copy (2 x 32 x 64^2, 2 threads, end to end 99-172 us on
# local-task, 54 us inline; even at 8 x 64 x 64^2).
OPERATOR = Operator(ACLNN_NAME, UpsampleSpec, check, bind, reference.upsample_bilinear2d_backward,
                    {"": 262144, "same_size": 1 << 22}, torch="aclnn_iree.torch.upsample",
                    bench="aclnn_iree.tools.bench_upsample")
