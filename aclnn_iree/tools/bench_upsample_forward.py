"""The upsample forward's benchmark (its Operator's `bench` module): interpolate(bilinear) at the
backward suite's shapes, ours beside PyTorch's aten op, torch.compile and JAX (the interface:
aclnn_iree/tools/bench.py).  Its training step is the backward's (bench_upsample)."""
from __future__ import annotations

import numpy as np

from ..core import aclnn as A
from ..core.api import upsample_bilinear2d
from ..ops.upsample_forward import OPERATOR
from . import bench_upsample as backward
from .cases import Case, forward_cases

CASES, QUICK = forward_cases(backward, OPERATOR.name)
torch_step = None  # the backward's training step runs this forward


def inputs(case: Case, rng) -> tuple:
    """(input,), float32, in the case's layout."""
    N, C, H, W, Ho, Wo = case.shape
    x = rng.standard_normal((N, C, H, W), dtype=np.float32)
    return (np.ascontiguousarray(x.transpose(0, 2, 3, 1)),) if case.layout == "NHWC" else (x,)


def compulsory_bytes(case: Case) -> int:
    """Bytes every implementation must move (float32): input read, output written."""
    return backward.compulsory_bytes(case)


def _output_size(case: Case) -> tuple:
    N, C, H, W, Ho, Wo = case.shape
    return (N, Ho, Wo, C) if case.layout == "NHWC" else (N, C, Ho, Wo)


def pythonic(case: Case, arrays, device):
    return lambda: upsample_bilinear2d(arrays[0], case.shape[4:], case.align_corners, memory_format=case.layout,
                                       device=device)


def phase2(case: Case, arrays, stream) -> tuple:
    """Phase 1 on device-resident tensors: (status, workspace bytes, executor, phase-2 function,
    output tensors)."""
    x = A.aclCreateTensor(arrays[0], case.layout, stream=stream)
    out = A.aclCreateTensor(shape=_output_size(case), dtype=np.float32, format=case.layout, stream=stream)
    st, ws, ex = A.aclnnUpsampleBilinear2dGetWorkspaceSize(x, A.aclCreateIntArray(list(case.shape[4:])),
                                                          case.align_corners, 0.0, 0.0, out)
    return st, ws, ex, A.aclnnUpsampleBilinear2d, [out]


def torch_op(case: Case, tensors, torch):
    """PyTorch's own forward (aten::upsample_bilinear2d) on `tensors` (input,)."""
    x = backward.torch_layout(case, tensors[0], torch)
    return lambda: torch.ops.aten.upsample_bilinear2d(x, list(case.shape[4:]), case.align_corners, None, None)


def torch_compile(case: Case, tensors, torch):
    """inductor's compiled interpolate (compiled here, outside the timer)."""
    import torch.nn.functional as F
    x = backward.torch_layout(case, tensors[0], torch)
    fn = torch.compile(lambda x: F.interpolate(x, size=tuple(case.shape[4:]), mode="bilinear",
                                               align_corners=case.align_corners), dynamic=False)
    fn(x)
    return lambda: fn(x)


def jax_op(case: Case, arrays):
    """jax.image.resize (bench_upsample.jax_resize), or None for align_corners."""
    import jax
    import jax.numpy as jnp
    resize = backward.jax_resize(case)
    if resize is None:
        return None
    fn = jax.jit(resize[1])
    x = jnp.asarray(arrays[0])
    return lambda: fn(x).block_until_ready()
