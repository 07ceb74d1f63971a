"""Drop-in replacements for torch.nn.functional.grid_sample and interpolate (bilinear).

Same signatures, defaults, argument checks and semantics as PyTorch 2.13's; the forward
and the backward run our kernels (through the custom ops in aclnn_iree.torch.ops), so the
gradients match autograd's (docs/pytorch.md).  Each lives in its operator's torch module
(grid_sampler.py, upsample.py).
"""
from __future__ import annotations

from .grid_sampler import grid_sample
from .upsample import interpolate

__all__ = ["grid_sample", "interpolate"]
