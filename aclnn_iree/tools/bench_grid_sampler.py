"""The grid sampler's benchmark (its Operator's `bench` module): the suite's cases, their
inputs, our calls, PyTorch's and the peers' (the interface: aclnn_iree/tools/bench.py)."""
from __future__ import annotations

import numpy as np

from ..core import aclnn as A
from ..core.api import grid_sampler_2d_backward
from ..ops.grid_sampler import INTERPOLATION_NAMES, OPERATOR, PADDING_NAMES
from .cases import Case, compiled_backward

CASES = [
    Case("gs_bilinear_zeros_8x64x64", OPERATOR.name, (8, 64, 64, 64, 64, 64), large=True),
    Case("gs_bilinear_border_ac_4x32x128", OPERATOR.name, (4, 32, 128, 128, 128, 128), 0, 1, True, large=True),
    Case("gs_bilinear_reflection_16x3x224", OPERATOR.name, (16, 3, 224, 224, 224, 224), 0, 2, False, large=True),
    Case("gs_bilinear_zeros_ac_1x256_32to64", OPERATOR.name, (1, 256, 32, 32, 64, 64), 0, 0, True),
    Case("gs_nearest_border_8x64x64", OPERATOR.name, (8, 64, 64, 64, 64, 64), 1, 1, False),
    Case("gs_bicubic_zeros_4x16x64", OPERATOR.name, (4, 16, 64, 64, 64, 64), 2, 0, False),
]
QUICK = {"gs_bilinear_zeros_8x64x64", "gs_bicubic_zeros_4x16x64"}


def inputs(case: Case, rng) -> tuple:
    """(grad_output, input, grid), float32; grid values in [-1.1, 1.1] (some taps padded)."""
    N, C, H, W, Ho, Wo = case.shape
    x = rng.standard_normal((N, C, H, W), dtype=np.float32)
    g = rng.uniform(-1.1, 1.1, (N, Ho, Wo, 2)).astype(np.float32)
    go = rng.standard_normal((N, C, Ho, Wo), dtype=np.float32)
    return go, x, g


def compulsory_bytes(case: Case) -> int:
    """Bytes every implementation must move (float32): grad_output, input and grid read once,
    grad_input and grad_grid written once."""
    N, C, H, W, Ho, Wo = case.shape
    return 4 * (N * C * Ho * Wo + 2 * N * C * H * W + 2 * 2 * N * Ho * Wo)


def pythonic(case: Case, arrays, device):
    return lambda: grid_sampler_2d_backward(*arrays, case.mode, case.padding, case.align_corners, device=device)


def phase2(case: Case, arrays, stream) -> tuple:
    """Phase 1 on device-resident tensors: (status, workspace bytes, executor, phase-2 function,
    output tensors)."""
    go, x, g = (A.aclCreateTensor(a, stream=stream) for a in arrays)
    outs = [A.aclCreateTensor(shape=x.shape, dtype=np.float32, stream=stream),
            A.aclCreateTensor(shape=g.shape, dtype=np.float32, stream=stream)]
    st, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(
        go, x, g, case.mode, case.padding, case.align_corners, A.aclCreateBoolArray([True, True]), *outs)
    return st, ws, ex, A.aclnnGridSampler2DBackward, outs


def torch_op(case: Case, tensors, torch):
    """PyTorch's own backward (aten) on `tensors` (grad_output, input, grid)."""
    go, x, g = tensors
    return lambda: torch.ops.aten.grid_sampler_2d_backward(go, x, g, case.mode, case.padding, case.align_corners,
                                                           [True, True])


def forward_kwargs(case: Case) -> dict:
    """F.grid_sample's keyword arguments for the case."""
    return dict(mode=INTERPOLATION_NAMES[case.mode], padding_mode=PADDING_NAMES[case.padding],
                align_corners=case.align_corners)


def torch_compile(case: Case, tensors, torch):
    """A function timing inductor's compiled backward of grid_sample (cases.compiled_backward)."""
    import torch.nn.functional as F
    go, x, g = tensors
    kw = forward_kwargs(case)
    return compiled_backward(torch, (x.clone().requires_grad_(), g.clone().requires_grad_()),
                             torch.compile(lambda x, g: F.grid_sample(x, g, **kw), dynamic=False), go)


def jax_forward(case: Case):
    """grid_sample in JAX (`(x, g) -> output`): `jax.scipy.ndimage.map_coordinates` with the
    coordinates reflected and clipped as PyTorch does, or None for bicubic, which
    map_coordinates lacks (orders 0 and 1 only)."""
    import jax
    import jax.numpy as jnp
    N, C, H, W, Ho, Wo = case.shape
    if case.mode == 2:
        return None
    order = 0 if case.mode == 1 else 1
    # map_coordinates pads its taps; PyTorch reflects the coordinate and then clips it
    # (reflect_coordinates, GridSampler.h): done here in jnp, then every tap is in range.
    mode = "constant" if case.padding == 0 else "nearest"

    def reflect(c, twice_low, twice_high):
        low, span = twice_low / 2, (twice_high - twice_low) / 2
        c = jnp.abs(c - low)
        extra, flips = jnp.fmod(c, span), jnp.floor(c / span)
        return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)

    def unnormalize(c, size):
        c = (c + 1) / 2 * (size - 1) if case.align_corners else ((c + 1) * size - 1) / 2
        if case.padding == 2 and size > 1:
            c = reflect(c, 0, 2 * (size - 1)) if case.align_corners else reflect(c, -1, 2 * size - 1)
        return jnp.clip(c, 0, size - 1) if case.padding else c

    def sample_image(img, grid):  # img (C, H, W), grid (Ho, Wo, 2) -> (C, Ho, Wo)
        coords = jnp.stack([unnormalize(grid[..., 1], H), unnormalize(grid[..., 0], W)])
        return jax.vmap(lambda plane: jax.scipy.ndimage.map_coordinates(plane, coords, order, mode=mode,
                                                                         cval=0.0))(img)

    return jax.vmap(sample_image)


def jax_op(case: Case, arrays):
    """JAX's `vjp` of jax_forward (its time includes the forward), or None for bicubic."""
    import jax
    import jax.numpy as jnp
    forward = jax_forward(case)
    if forward is None:
        return None
    go, x, g = (jnp.asarray(a) for a in arrays)

    @jax.jit
    def backward(go, x, g):
        return jax.vjp(forward, x, g)[1](go)
    return lambda: tuple(np.asarray(t) for t in backward(go, x, g))


def torch_step(case: Case, torch, functional) -> tuple:
    """(forward, leaves, grad_output) of a training step through `functional`'s grid_sample
    (torch.nn.functional's or aclnn_iree.torch's), with gradients w.r.t. input and grid."""
    N, C, H, W, Ho, Wo = case.shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, C, H, W, generator=g).requires_grad_(True)
    grid = (torch.rand(N, Ho, Wo, 2, generator=g) * 2.2 - 1.1).requires_grad_(True)
    go = torch.randn(N, C, Ho, Wo, generator=g)
    kw = forward_kwargs(case)
    return (lambda a, b: functional.grid_sample(a, b, **kw)), (x, grid), go
