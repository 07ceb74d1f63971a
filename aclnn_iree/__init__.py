"""aclnn-iree: aclnnGridSampler2D, aclnnUpsampleBilinear2d and their backward operators on any hardware.

Jinja2 templates emit MLIR per specialisation, IREE compiles them to vmfb
modules, and this package runs them behind aclnn's two-phase API
(`aclnn_iree.aclnn`) and a Pythonic layer (the functions below).
"""
from .core.errors import AclnnError  # noqa: F401
from . import aclnn  # noqa: F401  (the public aclnn_iree.aclnn, an attribute after `import aclnn_iree`)
from .core.api import (grid_sampler_2d, grid_sampler_2d_backward, upsample_bilinear2d,  # noqa: F401
                       upsample_bilinear2d_backward)

__version__ = "0.1.0"
__all__ = ["AclnnError", "grid_sampler_2d", "upsample_bilinear2d", "grid_sampler_2d_backward",
           "upsample_bilinear2d_backward"]
