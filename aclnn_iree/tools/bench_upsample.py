"""The upsample backward's benchmark (its Operator's `bench` module): the suite's cases, their
inputs, our calls, PyTorch's and the peers' (the interface: aclnn_iree/tools/bench.py)."""
from __future__ import annotations

import numpy as np

from ..core import aclnn as A
from ..core.api import upsample_bilinear2d_backward
from ..ops.upsample import OPERATOR
from .cases import Case, compiled_backward

CASES = [
    Case("up_x2_8x64_64from128", OPERATOR.name, (8, 64, 64, 64, 128, 128), large=True),
    Case("up_seghead_1x19_128x256from512x1024", OPERATOR.name, (1, 19, 128, 256, 512, 1024), large=True),
    Case("up_channels_ac_4x256_32from64", OPERATOR.name, (4, 256, 32, 32, 64, 64), align_corners=True),
    Case("up_down_2x16_300x400from150x200", OPERATOR.name, (2, 16, 300, 400, 150, 200)),
    Case("up_x2_nhwc_8x64_64from128", OPERATOR.name, (8, 64, 64, 64, 128, 128), layout="NHWC"),
    # H down-sampled while W is up-sampled: the W pass goes first (pass_order); H first
    # would cost H_in * W_out per plane (1374 ms on the 2000x case).
    Case("up_mixed_4x32_512x64from128x256", OPERATOR.name, (4, 32, 512, 64, 128, 256)),
    Case("up_mixed_2x32_2000x1from1x2000", OPERATOR.name, (2, 32, 2000, 1, 1, 2000)),
    Case("up_mixed_nhwc_2x32_2000x1from1x2000", OPERATOR.name, (2, 32, 2000, 1, 1, 2000), layout="NHWC"),
    # interpolate to the size a tensor already has (as segmentation heads do unconditionally):
    # PyTorch maps both axes onto themselves, and the backward is a copy (`_same_size`)
    Case("up_same_2x32_64from64", OPERATOR.name, (2, 32, 64, 64, 64, 64)),
]
QUICK = {"up_x2_8x64_64from128", "up_down_2x16_300x400from150x200", "up_x2_nhwc_8x64_64from128"}


def input_size(case: Case) -> tuple:
    """The input's shape in the case's layout."""
    N, C, H, W, Ho, Wo = case.shape
    return (N, H, W, C) if case.layout == "NHWC" else (N, C, H, W)


def inputs(case: Case, rng) -> tuple:
    """(grad_output,), float32, in the case's layout."""
    N, C, H, W, Ho, Wo = case.shape
    go = rng.standard_normal((N, C, Ho, Wo), dtype=np.float32)
    return (np.ascontiguousarray(go.transpose(0, 2, 3, 1)),) if case.layout == "NHWC" else (go,)


def compulsory_bytes(case: Case) -> int:
    """Bytes every implementation must move (float32): grad_output read, grad_input written."""
    N, C, H, W, Ho, Wo = case.shape
    return 4 * (N * C * Ho * Wo + N * C * H * W)


def pythonic(case: Case, arrays, device):
    Ho, Wo = case.shape[4:]
    return lambda: upsample_bilinear2d_backward(arrays[0], (Ho, Wo), input_size(case), case.align_corners,
                                                memory_format=case.layout, device=device)


def phase2(case: Case, arrays, stream) -> tuple:
    """Phase 1 on device-resident tensors: (status, workspace bytes, executor, phase-2 function,
    output tensors)."""
    Ho, Wo = case.shape[4:]
    size = input_size(case)
    go = A.aclCreateTensor(arrays[0], case.layout, stream=stream)
    outs = [A.aclCreateTensor(shape=size, dtype=np.float32, format=case.layout, stream=stream)]
    st, ws, ex = A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        go, A.aclCreateIntArray([Ho, Wo]), A.aclCreateIntArray(size), case.align_corners, 0.0, 0.0, outs[0])
    return st, ws, ex, A.aclnnUpsampleBilinear2dBackwardV2, outs


def torch_layout(case: Case, go, torch):
    """A tensor in the case's layout as PyTorch takes it: NHWC cases as a channels_last view of
    the (N, H, W, C) array (what a speed-minded user runs)."""
    if case.layout == "NHWC":
        go = go.permute(0, 3, 1, 2)
        assert go.is_contiguous(memory_format=torch.channels_last)
    return go


def torch_op(case: Case, tensors, torch):
    """PyTorch's own backward (aten) on `tensors` (grad_output,)."""
    N, C, H, W, Ho, Wo = case.shape
    go = torch_layout(case, tensors[0], torch)
    return lambda: torch.ops.aten.upsample_bilinear2d_backward(go, [Ho, Wo], [N, C, H, W], case.align_corners,
                                                               None, None)


def torch_compile(case: Case, tensors, torch):
    """A function timing inductor's compiled backward of interpolate (cases.compiled_backward)."""
    import torch.nn.functional as F
    N, C, H, W, Ho, Wo = case.shape
    go = torch_layout(case, tensors[0], torch)
    fmt = torch.channels_last if case.layout == "NHWC" else torch.contiguous_format
    x = torch.zeros(N, C, H, W, device=go.device).contiguous(memory_format=fmt).requires_grad_()
    return compiled_backward(torch, (x,), torch.compile(lambda x: F.interpolate(
        x, size=(Ho, Wo), mode="bilinear", align_corners=case.align_corners), dynamic=False), go)


def jax_resize(case: Case):
    """(the input shape, the resize function) of `jax.image.resize(..., "linear",
    antialias=False)` in the case's layout, or None for align_corners, which it lacks
    (half-pixel centres only)."""
    import jax
    N, C, H, W, Ho, Wo = case.shape
    if case.align_corners:
        return None
    nhwc = case.layout == "NHWC"
    out_shape = (N, Ho, Wo, C) if nhwc else (N, C, Ho, Wo)
    return ((N, H, W, C) if nhwc else (N, C, H, W)), (lambda x: jax.image.resize(x, out_shape, "linear",
                                                                                  antialias=False))


def jax_op(case: Case, arrays):
    """JAX's exact backward, `jax.linear_transpose` of jax_resize (upsampling is linear in its
    input), or None for align_corners."""
    import jax
    import jax.numpy as jnp
    resize = jax_resize(case)
    if resize is None:
        return None
    in_shape, forward = resize
    transpose = jax.jit(jax.linear_transpose(forward, jax.ShapeDtypeStruct(in_shape, jnp.float32)))
    go = jnp.asarray(arrays[0])
    return lambda: tuple(t.block_until_ready() for t in transpose(go))


def torch_step(case: Case, torch, functional) -> tuple:
    """(forward, leaves, grad_output) of a training step through `functional`'s interpolate
    (torch.nn.functional's or aclnn_iree.torch's), bilinear, with the gradient w.r.t. input."""
    N, C, H, W, Ho, Wo = case.shape
    g = torch.Generator().manual_seed(0)
    fmt = torch.channels_last if case.layout == "NHWC" else torch.contiguous_format
    x = torch.randn(N, C, H, W, generator=g).contiguous(memory_format=fmt).requires_grad_(True)
    go = torch.randn(N, C, Ho, Wo, generator=g).contiguous(memory_format=fmt)
    return (lambda a: functional.interpolate(a, size=(Ho, Wo), mode="bilinear", align_corners=case.align_corners),
            (x,), go)
