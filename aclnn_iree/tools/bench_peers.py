"""The benchmark's other peers (`aclnn-iree bench --peers`): PyTorch with `torch.compile` and JAX.

Each peer computes the same gradients of the same forward on the same data, so that its
time sits beside ours and PyTorch eager's in one run:
- "torch_compile": the forward compiled by `torch.compile` (inductor); what is timed is
  `torch.autograd.grad` through that compiled graph, i.e. inductor's compiled backward (the
  forward runs once, outside the timer);
- "jax": JAX/XLA.  Upsampling is linear in its input, so its backward is exactly
  `jax.linear_transpose` of `jax.image.resize(..., "linear", antialias=False)` (jitted,
  no forward inside); the grid sampler's `jax.vjp` of a `jax.scipy.ndimage.map_coordinates`
  grid_sample (coordinates reflected and clipped as PyTorch does) re-runs the forward
  inside the jitted function: its time is an upper bound.
  JAX has no align_corners resize and no bicubic `map_coordinates`: those cases have no JAX
  peer.  XLA uses its own thread pool (every core).
A peer that is not installed, or that has no form of a case, is left out of that row; the
caller checks each peer's numbers against ours before timing it.
"""
from __future__ import annotations

import numpy as np

__all__ = ["PEERS", "available_peers", "peer_function"]

PEERS = ("torch_compile", "jax")
_MODES = ("bilinear", "nearest", "bicubic")
_PADDINGS = ("zeros", "border", "reflection")


def available_peers() -> dict:
    """{peer: None if usable here, else why not} for every peer in PEERS."""
    why = {}
    try:
        import torch  # noqa: F401
        why["torch_compile"] = None
    except ImportError:
        why["torch_compile"] = "torch is not installed"
    try:
        import jax  # noqa: F401
        why["jax"] = None
    except ImportError:
        why["jax"] = "jax is not installed"
    return why


def peer_function(peer: str, case, arrays, cuda: bool = False):
    """A no-argument function computing `case`'s gradients (a tuple, in our output order;
    NHWC upsample results as PyTorch's NCHW-shaped channels_last view or as NHWC arrays)
    with `peer`, or None when the peer has no form of this case.  `cuda`: torch.compile
    runs on CUDA tensors (synchronised, so the time is the kernels'); JAX runs on its
    default backend."""
    if peer == "torch_compile":
        return _torch_compile(case, arrays, cuda)
    if peer == "jax":
        return _jax(case, arrays)
    raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")


def _torch_compile(case, arrays, cuda: bool = False):
    import torch
    import torch.nn.functional as F
    # The timed backward runs many times over one kept graph, which buffers donated to the
    # compiled backward would forbid (a process-wide setting: this is the benchmark's process).
    import torch._functorch.config
    torch._functorch.config.donated_buffer = False
    N, C, H, W, Ho, Wo = case.shape
    dev = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if case.op == "grid":
        go, x, g = (torch.from_numpy(a).to(dev) for a in arrays)
        inputs = (x.clone().requires_grad_(), g.clone().requires_grad_())
        forward = torch.compile(lambda x, g: F.grid_sample(x, g, mode=_MODES[case.mode],
                                                           padding_mode=_PADDINGS[case.padding],
                                                           align_corners=case.align_corners), dynamic=False)
    else:
        go = torch.from_numpy(arrays[0]).to(dev)
        fmt = torch.contiguous_format
        if case.layout == "NHWC":  # channels_last, as for PyTorch eager
            go, fmt = go.permute(0, 3, 1, 2), torch.channels_last
        inputs = (torch.zeros(N, C, H, W, device=dev).contiguous(memory_format=fmt).requires_grad_(),)
        forward = torch.compile(lambda x: F.interpolate(x, size=(Ho, Wo), mode="bilinear",
                                                        align_corners=case.align_corners), dynamic=False)

    def backward():
        grads = torch.autograd.grad(out, inputs, go, retain_graph=True)
        sync()
        return grads
    out = forward(*inputs)  # compiles forward and backward; outside the timer
    backward()  # the first call runs the compiled backward's setup
    return backward


def _jax(case, arrays):
    import jax
    import jax.numpy as jnp
    N, C, H, W, Ho, Wo = case.shape
    if case.op == "upsample":
        if case.align_corners:
            return None  # jax.image.resize has half-pixel centres only
        nhwc = case.layout == "NHWC"
        in_shape = (N, H, W, C) if nhwc else (N, C, H, W)
        out_shape = (N, Ho, Wo, C) if nhwc else (N, C, Ho, Wo)

        def forward(x):
            return jax.image.resize(x, out_shape, "linear", antialias=False)
        transpose = jax.jit(jax.linear_transpose(forward, jax.ShapeDtypeStruct(in_shape, jnp.float32)))
        go = jnp.asarray(arrays[0])
        return lambda: tuple(t.block_until_ready() for t in transpose(go))
    if case.mode == 2:
        return None  # map_coordinates has orders 0 and 1 only
    go, x, g = (jnp.asarray(a) for a in arrays)
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

    def forward(x, g):
        return jax.vmap(sample_image)(x, g)

    @jax.jit
    def backward(go, x, g):
        return jax.vjp(forward, x, g)[1](go)
    return lambda: tuple(np.asarray(t) for t in backward(go, x, g))
