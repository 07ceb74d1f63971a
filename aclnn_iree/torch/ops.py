"""Our kernels as PyTorch custom ops (torch.library, namespace `aclnn_iree`), with aten's schemas:
every operator's torch module (its Operator's `torch`: grid_sampler.py, upsample.py) defines
its ops there when imported, and this module imports them all from the registry.

* ``torch.ops.aclnn_iree.grid_sampler_2d_backward(grad_output, input, grid,
  interpolation_mode, padding_mode, align_corners, output_mask) -> (Tensor, Tensor)``
* ``torch.ops.aclnn_iree.upsample_bilinear2d_backward(grad_output, output_size,
  input_size, align_corners, scales_h=None, scales_w=None) -> Tensor``
* ``torch.ops.aclnn_iree.grid_sampler_2d(input, grid, interpolation_mode, padding_mode,
  align_corners) -> Tensor`` and ``torch.ops.aclnn_iree.upsample_bilinear2d(input,
  output_size, align_corners, scales_h=None, scales_w=None) -> Tensor``: PyTorch's own
  forward, whose autograd formula is our backward (a gradient autograd does not need is
  not computed: ``ctx.needs_input_grad`` becomes the output mask).

Each op has a fake (meta) implementation, so torch.compile, torch.export and FakeTensor
tracing see through them, and an autograd formula: the backward ops too, so that a double
backward (create_graph=True) is right (docs/pytorch.md).  The backward ops return a
0-element tensor for an output whose output_mask entry is False (a custom op cannot return
an undefined tensor; aten's grid_sampler_2d_backward returns an undefined grad_input there
and always computes grad_grid).  Devices: see aclnn_iree.torch._bridge.  Semantics:
docs/semantics.md.
"""
from __future__ import annotations

from ..ops.registry import OPERATORS
from .grid_sampler import grid_sampler_2d, grid_sampler_2d_backward
from .upsample import upsample_bilinear2d, upsample_bilinear2d_backward

__all__ = ["grid_sampler_2d_backward", "upsample_bilinear2d_backward", "grid_sampler_2d", "upsample_bilinear2d"]

# every operator's ops, the ones named above and any other the registry lists
MODULES = tuple(op.load("torch") for op in OPERATORS)
