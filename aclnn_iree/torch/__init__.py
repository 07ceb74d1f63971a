"""aclnn_iree for PyTorch users: our kernels inside autograd, torch.compile and DDP.

Three ways in (docs/pytorch.md):

* drop-in functions ``aclnn_iree.torch.grid_sample`` and ``aclnn_iree.torch.interpolate``
  (F.grid_sample's and F.interpolate(mode="bilinear")'s signatures and semantics, our
  forward and backward);
* custom ops ``torch.ops.aclnn_iree.{grid_sampler_2d_backward, upsample_bilinear2d_backward,
  grid_sampler_2d, upsample_bilinear2d}`` with aten's schemas and fake implementations;
* ``enable()`` / ``disable()`` / ``with enabled():``: our kernels become PyTorch's CPU kernels
  of aten::grid_sampler_2d, aten::upsample_bilinear2d and their backward operators, for
  unmodified models.

CPU tensors run on the IREE CPU device (``set_cpu_device`` picks another, e.g. "vulkan"),
CUDA tensors on IREE's ``cuda`` device through DLPack, with no copies of contiguous
tensors.  Importing ``aclnn_iree`` itself never needs torch; this module does.
"""
from ._bridge import get_cpu_device, set_cpu_device
from .functional import grid_sample, interpolate
from .override import disable, enable, enabled, is_enabled
from . import ops  # noqa: F401  (registers torch.ops.aclnn_iree.*)

__all__ = ["grid_sample", "interpolate", "enable", "disable", "enabled", "is_enabled", "set_cpu_device",
           "get_cpu_device", "ops"]
