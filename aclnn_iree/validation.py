"""Argument checks of both ops, in aclnn's order (shared/SPEC.md part B 2.2 and 3.2, part A 5-6).

Each check raises AclnnError(status, message); the message names the argument,
what it was and what was expected.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ACLNN_ERR_PARAM_INVALID as INVALID
from .errors import ACLNN_ERR_PARAM_NULLPTR as NULLPTR
from .errors import AclnnError, brief
from .tensors import aclBoolArray, aclIntArray, aclTensor

__all__ = ["check_grid_sampler", "check_upsample", "SUPPORTED_DTYPES", "INTERPOLATION_NAMES", "PADDING_NAMES",
           "upsample_scale"]

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "float64")
INTERPOLATION_NAMES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
PADDING_NAMES = {0: "zeros", 1: "border", 2: "reflection"}


def _fail(status, message):
    raise AclnnError(status, message)


def _tensor(name, t):
    """None -> 161001; a destroyed tensor -> 161001; not an aclTensor -> 161002."""
    if t is None:
        _fail(NULLPTR, f"{name} is None")
    if not isinstance(t, aclTensor):
        _fail(INVALID, f"{name} must be an aclTensor, got {type(t).__name__}")
    if t.destroyed:
        _fail(NULLPTR, f"{name} was destroyed")
    return t


def _same_dtype(ref_name, ref, others):
    for name, t in others:
        if t.dtype != ref.dtype:
            _fail(INVALID, f"{name} has dtype {t.dtype.name} but {ref_name} has dtype {ref.dtype.name}; "
                           "all tensors of one call share one dtype")


def _supported_dtype(name, t):
    if t.dtype.name not in SUPPORTED_DTYPES:
        _fail(INVALID, f"{name} has dtype {t.dtype.name}; supported: {', '.join(SUPPORTED_DTYPES)}")


def _same_device(tensors):
    devs = {t.device.name for _, t in tensors}
    if len(devs) > 1:
        _fail(INVALID, "tensors are on different devices: " + ", ".join(f"{n} on {t.device.name}" for n, t in tensors))


def _overlaps(a, b) -> bool:
    """Whether two tensors share memory.  aclCreateTensor copies its array and the Pythonic
    layer allocates its outputs, so two tensors share memory only when they are one tensor
    (or wrap one device buffer)."""
    return a is b or a.buffer is b.buffer


def _no_alias(outputs, inputs):
    """The kernels read their inputs while they write their outputs: an output sharing memory
    with an input or another output would give silently wrong numbers.  161002."""
    for i, (oname, o) in enumerate(outputs):
        for name, t in list(inputs) + list(outputs[:i]):
            if _overlaps(o, t):
                _fail(INVALID, f"{oname} shares memory with {name}; an output must not alias an input "
                               "or another output")


def _int_attr(name, v, allowed):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        _fail(INVALID, f"{name} must be an int, got {type(v).__name__} {brief(v)}")
    if int(v) not in allowed:
        _fail(INVALID, f"{name} is {v}; expected one of {sorted(allowed)} "
                       f"({', '.join(f'{k}={n}' for k, n in allowed.items())})")


def _rank(name, t, rank):
    if len(t.shape) != rank:
        _fail(INVALID, f"{name} must be {rank}-D, got shape {t.shape}")


def check_grid_sampler(gradOutput, input, grid, interpolationMode, paddingMode, alignCorners, outputMask,
                       inputGrad, gridGrad) -> tuple:
    """Checks aclnnGridSampler2DBackward's arguments; returns the output mask as (bool, bool)."""
    # A None outputMask is an error here (aclnn skips every check instead: SPEC part A 6).
    if outputMask is None:
        _fail(NULLPTR, "outputMask is None")
    tensors = [("gradOutput", gradOutput), ("input", input), ("grid", grid), ("inputGrad", inputGrad),
               ("gridGrad", gridGrad)]
    for name, t in tensors:
        _tensor(name, t)
    if not isinstance(outputMask, aclBoolArray) or outputMask.destroyed:
        _fail(INVALID, f"outputMask must be a live aclBoolArray, got {brief(outputMask)}")
    _same_device(tensors)
    _same_dtype("input", input, [(n, t) for n, t in tensors if n != "input"])
    _supported_dtype("input", input)
    _int_attr("interpolationMode", interpolationMode, INTERPOLATION_NAMES)
    _int_attr("paddingMode", paddingMode, PADDING_NAMES)
    if not isinstance(alignCorners, (bool, np.bool_)):
        _fail(INVALID, f"alignCorners must be a bool, got {type(alignCorners).__name__} {brief(alignCorners)}")
    for name, t in (("input", input), ("grid", grid), ("gradOutput", gradOutput)):
        _rank(name, t, 4)
    # aclnn's grid sampler takes ND tensors, read as (N, C, H, W) and (N, H_out, W_out, 2);
    # an NHWC tensor would be misread, so it is refused rather than reinterpreted.
    for name, t in (("gradOutput", gradOutput), ("input", input), ("grid", grid), ("inputGrad", inputGrad),
                    ("gridGrad", gridGrad)):
        if t.format == "NHWC":
            _fail(INVALID, f"{name} has format NHWC; aclnnGridSampler2DBackward reads its tensors as ND "
                           "((N, C, H, W) and (N, H_out, W_out, 2)): pass them as ND or NCHW")
    N, C, H, W = input.shape
    if grid.shape[0] != N:
        _fail(INVALID, f"grid has N={grid.shape[0]} but input has N={N}")
    if grid.shape[3] != 2:
        _fail(INVALID, f"grid's last dimension must be 2 (x, y), got shape {grid.shape}")
    if H == 0 or W == 0:
        _fail(INVALID, f"input's H and W must be non-zero, got shape {input.shape}")
    expected = (N, C, grid.shape[1], grid.shape[2])
    if gradOutput.shape != expected:
        _fail(INVALID, f"gradOutput has shape {gradOutput.shape}; expected {expected} "
                       "= (input N, input C, grid H_out, grid W_out)")
    if inputGrad.shape != input.shape:
        _fail(INVALID, f"inputGrad has shape {inputGrad.shape}; expected input's shape {input.shape}")
    if gridGrad.shape != grid.shape:
        _fail(INVALID, f"gridGrad has shape {gridGrad.shape}; expected grid's shape {grid.shape}")
    if outputMask.size != 2:
        _fail(INVALID, f"outputMask must have 2 entries, got {outputMask.size}")
    mask = tuple(outputMask.values)
    written = [(n, t) for (n, t), m in zip((("inputGrad", inputGrad), ("gridGrad", gridGrad)), mask) if m]
    _no_alias(written, (("gradOutput", gradOutput), ("input", input), ("grid", grid)))
    return mask


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


def _scale_arg(name, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        _fail(INVALID, f"{name} must be a float, got {type(v).__name__} {brief(v)}")
    try:
        v = float(v)
    except OverflowError:  # an int beyond the double range
        _fail(INVALID, f"{name} must be finite, got an integer of {int(v).bit_length()} bits")
    if not math.isfinite(v):
        _fail(INVALID, f"{name} must be finite, got {v}")
    return v


def check_upsample(gradOut, outputSize, inputSize, alignCorners, scalesH, scalesW, out) -> tuple:
    """Checks aclnnUpsampleBilinear2dBackwardV2's arguments; returns (layout, (rh, rw))."""
    _tensor("gradOut", gradOut)
    for name, arr in (("outputSize", outputSize), ("inputSize", inputSize)):
        if arr is None:
            _fail(NULLPTR, f"{name} is None")
    _tensor("out", out)
    for name, arr in (("outputSize", outputSize), ("inputSize", inputSize)):
        if not isinstance(arr, aclIntArray) or arr.destroyed:
            _fail(INVALID, f"{name} must be a live aclIntArray, got {brief(arr)}")
    _same_device([("gradOut", gradOut), ("out", out)])
    _rank("gradOut", gradOut, 4)
    if inputSize.size != 4:
        _fail(INVALID, f"inputSize must have 4 entries, got {inputSize.size}")
    if outputSize.size != 2:
        _fail(INVALID, f"outputSize must have 2 entries, got {outputSize.size}")
    if out.format not in ("NCHW", "NHWC"):
        _fail(INVALID, f"out has format {out.format}; expected NCHW or NHWC")
    if gradOut.format not in ("NCHW", "NHWC"):
        _fail(INVALID, f"gradOut has format {gradOut.format}; expected NCHW or NHWC")
    if out.format != gradOut.format:
        _fail(INVALID, f"out has format {out.format} but gradOut has {gradOut.format}")
    nhwc = gradOut.format == "NHWC"
    if nhwc:
        N, H, W, C = inputSize.values
    else:
        N, C, H, W = inputSize.values
    Ho, Wo = outputSize.values
    if H <= 0 or W <= 0:
        _fail(INVALID, f"inputSize H and W must be > 0, got {inputSize.values}")
    if Ho <= 0 or Wo <= 0:
        _fail(INVALID, f"outputSize must be > 0, got {outputSize.values}")
    if N < 0 or C < 0:
        _fail(INVALID, f"inputSize N and C must be >= 0, got {inputSize.values}")
    expected = (N, Ho, Wo, C) if nhwc else (N, C, Ho, Wo)
    if gradOut.shape != expected:
        _fail(INVALID, f"gradOut has shape {gradOut.shape}; expected {expected} from inputSize {inputSize.values} "
                       f"and outputSize {outputSize.values} ({gradOut.format})")
    if out.dtype != gradOut.dtype:
        _fail(INVALID, f"out has dtype {out.dtype.name} but gradOut has dtype {gradOut.dtype.name}; "
                       "all tensors of one call share one dtype")
    _supported_dtype("gradOut", gradOut)
    expected_out = (N, H, W, C) if nhwc else (N, C, H, W)
    if out.shape != expected_out:
        _fail(INVALID, f"out has shape {out.shape}; expected the grad-input shape {expected_out} ({out.format})")
    if not isinstance(alignCorners, (bool, np.bool_)):
        _fail(INVALID, f"alignCorners must be a bool, got {type(alignCorners).__name__} {brief(alignCorners)}")
    _no_alias((("out", out),), (("gradOut", gradOut),))
    sh = _scale_arg("scalesH", scalesH)
    sw = _scale_arg("scalesW", scalesW)
    # A given scale must agree with the sizes (SPEC part A 5), never be silently ignored.
    for name, s, i, o in (("scalesH", sh, H, Ho), ("scalesW", sw, W, Wo)):
        if s > 0 and o != math.floor(i * s):
            _fail(INVALID, f"{name}={s} is inconsistent with the sizes: output {o} != floor({i} * {s}) = "
                           f"{math.floor(i * s)}")
    dtype = np.float64 if gradOut.dtype == np.float64 else np.float32
    return ("NHWC" if nhwc else "NCHW"), (upsample_scale(H, Ho, bool(alignCorners), sh, dtype),
                                          upsample_scale(W, Wo, bool(alignCorners), sw, dtype))
