"""aclnnGridSampler2D: grid_sample's forward, input sampled at the grid's points.

Semantics: PyTorch 2.13 grid_sampler_2d (aten/src/ATen/native/GridSampler.cpp, the CPU
kernel), the same coordinate rules as the backward (docs/semantics.md#grid-sampler).  The checks
follow the backward's order (docs/status-codes.md#grid-sampler-forward-checks) for the arguments
the two share: pointers, then
devices, dtypes, modes, ranks, shapes, aliasing.
"""
from __future__ import annotations

from ..compiler.specs import GridSampler2dSpec
from ..core.errors import ACLNN_ERR_PARAM_INVALID as INVALID
from ..core.validation import (bool_attr, dtype_name, fail, int_attr, no_alias, rank, same_device, same_dtype,
                               supported_dtype, tensor_arg)
from . import Binding, Operator, reference
from .grid_sampler import INTERPOLATION_NAMES, PADDING_NAMES, VOCABULARY, sampled_shape

__all__ = ["ACLNN_NAME", "check", "bind", "OPERATOR"]

ACLNN_NAME = "aclnnGridSampler2D"


def check(input, grid, interpolationMode, paddingMode, alignCorners, out) -> None:
    """Checks aclnnGridSampler2D's arguments in aclnn's order.  Raises AclnnError: 161001 for a
    None or destroyed tensor, 161002 for an invalid argument."""
    tensors = [("input", input), ("grid", grid), ("out", out)]
    for name, t in tensors:
        tensor_arg(name, t)
    same_device(tensors)
    same_dtype("input", input, [("grid", grid), ("out", out)])
    supported_dtype("input", input)
    int_attr("interpolationMode", interpolationMode, INTERPOLATION_NAMES)
    int_attr("paddingMode", paddingMode, PADDING_NAMES)
    bool_attr("alignCorners", alignCorners)
    for name, t in tensors:
        rank(name, t, 4)
    expected = sampled_shape(ACLNN_NAME, tensors, input, grid)
    if out.shape != expected:
        fail(INVALID, f"out has shape {out.shape}; expected {expected} = (input N, input C, grid H_out, grid W_out)")
    no_alias((("out", out),), (("input", input), ("grid", grid)))


def bind(input, grid, interpolationMode, paddingMode, alignCorners, out) -> Binding:
    """The call for checked arguments (check()): the function takes input, grid, then out."""
    if out.size == 0:  # N, C, H_out or W_out is 0 (input's H and W are not): nothing to compute
        return Binding()
    spec = GridSampler2dSpec(INTERPOLATION_NAMES[interpolationMode], PADDING_NAMES[paddingMode], bool(alignCorners),
                             dtype_name(input.dtype))
    return Binding(spec, spec.function_name(), (input, grid, out))


# inline_work (output elements): measured through the Pythonic call, bilinear border, 2 threads,
# local-sync vs local-task: 2x30x31x46 126 vs 205 us, 2x16x64^2 233 vs 323 us, 2x30x62x92
# 594 vs 530 us: the crossover lies near 2.5e5, four times the backward's.  The other modes'
# by their kernel time per point on one thread (4 x 16 x 64^2, Xeon: nearest 0.5x bilinear's,
# bicubic 3.2x: run inline there, 4x16x64^2 took 1.3 ms a call where 2 workers take 0.7).
OPERATOR = Operator(ACLNN_NAME, GridSampler2dSpec, check, bind, reference.grid_sampler_2d,
                    {"": 262144, "bilinear": 262144, "nearest": 524288, "bicubic": 65536},
                    torch="aclnn_iree.torch.grid_sampler", bench="aclnn_iree.tools.bench_grid_sampler_forward",
                    vocabulary=VOCABULARY)
