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

from .bench import BENCHES
from .cases import synchronised

__all__ = ["PEERS", "available_peers", "peer_function"]

PEERS = ("torch_compile", "jax")


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
    # The timed backward runs many times over one kept graph, which buffers donated to the
    # compiled backward would forbid (a process-wide setting: this is the benchmark's process).
    import torch._functorch.config
    torch._functorch.config.donated_buffer = False
    dev = "cuda" if cuda else "cpu"
    return synchronised(torch, BENCHES[case.op].torch_compile(case, [torch.from_numpy(a).to(dev) for a in arrays],
                                                              torch), cuda)


def _jax(case, arrays):
    return BENCHES[case.op].jax_op(case, arrays)
