"""aclnnUpsampleBilinear2d: bilinear 2-D up- (or down-)sampling, the forward.

Semantics: PyTorch 2.13 upsample_bilinear2d (aten/src/ATen/native/UpSample.h, the CPU kernel
in cpu/UpSampleKernel.cpp), with the same scale rules and consistency check as the backward
(aclnnUpsampleBilinear2dBackwardV2: docs/semantics.md#bilinear-upsampling).  The checks follow
the backward's order for the arguments the two share.
"""
from __future__ import annotations

from ..compiler.specs import UpsampleBilinear2dSpec
from ..core.errors import ACLNN_ERR_PARAM_INVALID as INVALID
from ..core.errors import ACLNN_ERR_PARAM_NULLPTR as NULLPTR
from ..core.errors import brief
from ..core.tensors import aclIntArray
from ..core.validation import (bool_attr, dtype_name, fail, no_alias, rank, same_device, same_dtype, supported_dtype,
                               tensor_arg)
from . import Binding, Operator, reference
from .upsample import checked_scales, op_math, scales_tensor

__all__ = ["ACLNN_NAME", "check", "bind", "OPERATOR"]

ACLNN_NAME = "aclnnUpsampleBilinear2d"


def check(self, outputSize, alignCorners, scalesH, scalesW, out) -> tuple:
    """Checks aclnnUpsampleBilinear2d's arguments in aclnn's order; returns (layout, (rh, rw)):
    "NCHW" or "NHWC" and the per-axis source scales in the op-math type.  Raises AclnnError:
    161001 for a None or destroyed argument, 161002 for an invalid one."""
    tensor_arg("self", self)
    if outputSize is None:
        fail(NULLPTR, "outputSize is None")
    tensor_arg("out", out)
    if not isinstance(outputSize, aclIntArray):
        fail(INVALID, f"outputSize must be an aclIntArray, got {brief(outputSize)}")
    if outputSize.destroyed:
        fail(NULLPTR, "outputSize was destroyed")
    same_device([("self", self), ("out", out)])
    rank("self", self, 4)
    if outputSize.size != 2:
        fail(INVALID, f"outputSize must have 2 entries, got {outputSize.size}")
    for name, t in (("self", self), ("out", out)):
        if t.format not in ("NCHW", "NHWC"):
            fail(INVALID, f"{name} has format {t.format}; expected NCHW or NHWC")
    if out.format != self.format:
        fail(INVALID, f"out has format {out.format} but self has {self.format}")
    nhwc = self.format == "NHWC"
    N, H, W, C = self.shape if nhwc else (self.shape[0], self.shape[2], self.shape[3], self.shape[1])
    Ho, Wo = outputSize.values
    if H <= 0 or W <= 0:
        fail(INVALID, f"self's H and W must be > 0, got shape {self.shape} ({self.format})")
    if Ho <= 0 or Wo <= 0:
        fail(INVALID, f"outputSize must be > 0, got {outputSize.values}")
    same_dtype("self", self, [("out", out)])
    supported_dtype("self", self)
    expected = (N, Ho, Wo, C) if nhwc else (N, C, Ho, Wo)
    if out.shape != expected:
        fail(INVALID, f"out has shape {out.shape}; expected {expected} from self's shape {self.shape} and "
                      f"outputSize {outputSize.values} ({out.format})")
    bool_attr("alignCorners", alignCorners)
    no_alias((("out", out),), (("self", self),))
    return ("NHWC" if nhwc else "NCHW"), checked_scales(scalesH, scalesW, (H, Ho), (W, Wo), bool(alignCorners),
                                                        op_math(self.dtype))


def bind(self, alignCorners, out, layout: str, scales, target=None) -> Binding:
    """The call for checked arguments (check() gives `layout` and `scales`) on `target`
    (compiler.targets.Target; None: a CPU's): the function takes self, the scales as a device
    tensor in the op-math type, then out; a same-size call on a CPU takes the elementwise
    pass (UpsampleBilinear2dSpec.function_name)."""
    if out.size == 0:  # N or C is 0: nothing to compute
        return Binding()
    spec = UpsampleBilinear2dSpec(bool(alignCorners), dtype_name(self.dtype), layout)
    scales = scales_tensor(self.device, tuple(scales), op_math(self.dtype))
    return Binding(spec, spec.function_name(same_size=self.shape == out.shape, target=target), (self, scales, out))


# inline_work (input plus output elements): measured through the Pythonic call, x2, 2 threads,
# local-sync vs local-task: 2x16x64^2 (6.6e5) 323 vs 337 us, 2x30x31x46 (4.3e5) 391 vs 326 us:
# the crossover lies near the backward's, 2.6e5, which is kept.  A same-size call (upsample.call_kind)
# is the backward's elementwise pass, with its threshold.
OPERATOR = Operator(ACLNN_NAME, UpsampleBilinear2dSpec, check, bind, reference.upsample_bilinear2d,
                    {"": 262144, "same_size": 1 << 22},
                    torch="aclnn_iree.torch.upsample", bench="aclnn_iree.tools.bench_upsample_forward")
