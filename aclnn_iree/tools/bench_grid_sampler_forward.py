"""The grid sampler forward's benchmark (its Operator's `bench` module): grid_sample at the
backward suite's shapes, ours beside PyTorch's aten op, torch.compile and JAX (the interface:
aclnn_iree/tools/bench.py).  Its training step is the backward's (bench_grid_sampler)."""
from __future__ import annotations

from ..core import aclnn as A
from ..core.api import grid_sampler_2d
from ..ops.grid_sampler_forward import OPERATOR
from . import bench_grid_sampler as backward
from .cases import Case, forward_cases

CASES, QUICK = forward_cases(backward, OPERATOR.name)
torch_step = None  # the backward's training step runs this forward


def inputs(case: Case, rng) -> tuple:
    """(input, grid), float32: the backward case's own input and grid."""
    return backward.inputs(case, rng)[1:]


def compulsory_bytes(case: Case) -> int:
    """Bytes every implementation must move (float32): input and grid read, output written."""
    N, C, H, W, Ho, Wo = case.shape
    return 4 * (N * C * H * W + 2 * N * Ho * Wo + N * C * Ho * Wo)


def pythonic(case: Case, arrays, device):
    return lambda: grid_sampler_2d(*arrays, case.mode, case.padding, case.align_corners, device=device)


def phase2(case: Case, arrays, stream) -> tuple:
    """Phase 1 on device-resident tensors: (status, workspace bytes, executor, phase-2 function,
    output tensors)."""
    N, C, H, W, Ho, Wo = case.shape
    x, g = (A.aclCreateTensor(a, stream=stream) for a in arrays)
    out = A.aclCreateTensor(shape=(N, C, Ho, Wo), dtype=arrays[0].dtype, stream=stream)
    st, ws, ex = A.aclnnGridSampler2DGetWorkspaceSize(x, g, case.mode, case.padding, case.align_corners, out)
    return st, ws, ex, A.aclnnGridSampler2D, [out]


def torch_op(case: Case, tensors, torch):
    """PyTorch's own forward (aten::grid_sampler_2d) on `tensors` (input, grid)."""
    x, g = tensors
    return lambda: torch.ops.aten.grid_sampler_2d(x, g, case.mode, case.padding, case.align_corners)


def torch_compile(case: Case, tensors, torch):
    """inductor's compiled grid_sample (compiled here, outside the timer)."""
    import torch.nn.functional as F
    x, g = tensors
    kw = backward.forward_kwargs(case)
    fn = torch.compile(lambda x, g: F.grid_sample(x, g, **kw), dynamic=False)
    fn(x, g)
    return lambda: fn(x, g)


def jax_op(case: Case, arrays):
    """JAX's map_coordinates grid_sample (bench_grid_sampler's), or None for bicubic."""
    forward = backward.jax_forward(case)
    if forward is None:
        return None
    import jax
    import jax.numpy as jnp
    import numpy as np
    x, g = (jnp.asarray(a) for a in arrays)
    fn = jax.jit(forward)
    return lambda: np.asarray(fn(x, g))
