"""aclnn status codes (CANN's numbers, docs/status-codes.md#the-codes) and the Pythonic layer's exception."""
from __future__ import annotations

__all__ = ["AclnnError", "STATUS_NAMES"] + [
    "ACLNN_SUCCESS", "ACLNN_ERR_PARAM_NULLPTR", "ACLNN_ERR_PARAM_INVALID", "ACLNN_ERR_RUNTIME_ERROR",
    "ACLNN_ERR_INNER", "ACLNN_ERR_INNER_INFERSHAPE_ERROR", "ACLNN_ERR_INNER_TILING_ERROR",
    "ACLNN_ERR_INNER_FIND_KERNEL_ERROR", "ACLNN_ERR_INNER_CREATE_EXECUTOR", "ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR",
    "ACLNN_ERR_INNER_NULLPTR", "ACLNN_ERR_INNER_WRONG_ATTR_INFO_SIZE", "ACLNN_ERR_INNER_KEY_CONFLICT",
    "ACLNN_ERR_INNER_INVALID_IMPL_MODE", "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
    "ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND", "ACLNN_ERR_INNER_STATIC_WORKSPACE_INVALID",
]

ACLNN_SUCCESS = 0
ACLNN_ERR_PARAM_NULLPTR = 161001  # a required argument is None (a null pointer in C)
ACLNN_ERR_PARAM_INVALID = 161002  # an argument has a wrong dtype, shape, value or format
ACLNN_ERR_RUNTIME_ERROR = 361001  # the runtime failed: device missing, launch failed
ACLNN_ERR_INNER = 561000
ACLNN_ERR_INNER_INFERSHAPE_ERROR = 561001
ACLNN_ERR_INNER_TILING_ERROR = 561002
ACLNN_ERR_INNER_FIND_KERNEL_ERROR = 561003  # no compiled kernel for the specialisation (e.g. offline, not built)
ACLNN_ERR_INNER_CREATE_EXECUTOR = 561101
ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR = 561102  # an executor that cannot run (used up, destroyed, not ours)
ACLNN_ERR_INNER_NULLPTR = 561103
ACLNN_ERR_INNER_WRONG_ATTR_INFO_SIZE = 561104
ACLNN_ERR_INNER_KEY_CONFLICT = 561105
ACLNN_ERR_INNER_INVALID_IMPL_MODE = 561106
ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND = 561107
ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND = 561112
ACLNN_ERR_INNER_STATIC_WORKSPACE_INVALID = 561118  # CANN's; not returned: a bad workspace is 161001 or 161002 (docs/status-codes.md#phase-2)

STATUS_NAMES = {v: k for k, v in globals().items() if k.startswith("ACLNN_") and isinstance(v, int)}


class AclnnError(ValueError):
    """An aclnn call failed: `.status` is the aclnn status code, the message says which argument and why.

    A subclass of ValueError, raised by the Pythonic layer (grid_sampler_2d_backward,
    upsample_bilinear2d_backward) where the aclnn layer returns the status code.
    """

    def __init__(self, status: int, message: str):
        self.status = int(status)
        super().__init__(f"{STATUS_NAMES.get(self.status, 'ACLNN_ERR')} ({self.status}): {message}")


def brief(obj, limit: int = 120) -> str:
    """repr(obj) for an error message, short: arrays as their shape and dtype, anything
    else cut to about `limit` characters (a message never embeds a whole array)."""
    import numpy as np
    if isinstance(obj, np.ndarray):
        return f"ndarray(shape={obj.shape}, dtype={obj.dtype})"
    r = repr(obj)
    return r if len(r) <= limit else r[:limit - 3] + "..."
