"""The benchmark's case type, shared by every operator's benchmark module (bench_<op>.py)."""
from __future__ import annotations

import dataclasses

__all__ = ["Case", "compiled_backward", "synchronised", "forward_cases"]


@dataclasses.dataclass(frozen=True)
class Case:
    """A benchmark case of the operator `op` (its registry name): `shape` is (N, C, H_in, W_in,
    H_out, W_out) (the grid sampler's grid is N x H_out x W_out x 2; the upsample's forward maps
    H_in x W_in to H_out x W_out); mode, padding: the operator's integer codes; `large`: one of
    the cases the thread-scaling measurement runs."""

    name: str
    op: str
    shape: tuple
    mode: int = 0
    padding: int = 0
    align_corners: bool = False
    layout: str = "NCHW"
    large: bool = False


def compiled_backward(torch, leaves, forward, grad_output):
    """A function timing inductor's compiled backward: `forward` (a torch.compile'd function of
    `leaves`) runs once here, compiling forward and backward outside the timer, and each call
    of the result is `torch.autograd.grad` through that graph (its first call, the compiled
    backward's setup, runs here too)."""
    out = forward(*leaves)

    def backward():
        return torch.autograd.grad(out, leaves, grad_output, retain_graph=True)
    backward()
    return backward


def synchronised(torch, fn, cuda: bool):
    """`fn`, followed by torch.cuda.synchronize() where it runs on CUDA tensors (`cuda`), so that
    its time is its kernels' as ours is."""
    if not cuda:
        return fn

    def call():
        r = fn()
        torch.cuda.synchronize()
        return r
    return call


def forward_cases(backward, op: str) -> tuple:
    """(CASES, QUICK) of a forward operator's benchmark: its backward's (the module `backward`)
    at the same shapes and modes, each named "fwd_<name>" and of the operator `op`."""
    cases = [dataclasses.replace(c, name="fwd_" + c.name, op=op) for c in backward.CASES]
    return cases, {"fwd_" + name for name in backward.QUICK}
