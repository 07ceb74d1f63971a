"""Argument checks that every operator uses (aclnn_iree.ops.<op>.check calls them in its
operator's aclnn order: docs/status-codes.md#phase-1, and #where-aclnn-skips-its-checks).

Each check raises AclnnError(status, message); the message names the argument,
what it was and what was expected.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..compiler.specs import DTYPES
from .errors import ACLNN_ERR_PARAM_INVALID as INVALID
from .errors import ACLNN_ERR_PARAM_NULLPTR as NULLPTR
from .errors import AclnnError, brief
from .tensors import aclTensor

__all__ = ["SUPPORTED_DTYPES", "bool_attr", "dtype_name", "fail", "int_attr", "no_alias", "overlaps", "rank",
           "same_device", "same_dtype", "scale_arg", "supported_dtype", "tensor_arg"]

SUPPORTED_DTYPES = tuple(DTYPES)  # the dtypes every kernel family is specialised on


@functools.lru_cache(maxsize=64)
def dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, remembered: NumPy computes the name on every access (~10 us, a
    noticeable share of a small call's phase 1)."""
    return dtype.name


def fail(status, message):
    raise AclnnError(status, message)


def tensor_arg(name, t):
    """None -> 161001; a destroyed tensor -> 161001; not an aclTensor -> 161002."""
    if t is None:
        fail(NULLPTR, f"{name} is None")
    if not isinstance(t, aclTensor):
        fail(INVALID, f"{name} must be an aclTensor, got {type(t).__name__}")
    if t.destroyed:
        fail(NULLPTR, f"{name} was destroyed")
    return t


def same_dtype(ref_name, ref, others):
    for name, t in others:
        if t.dtype != ref.dtype:
            fail(INVALID, f"{name} has dtype {t.dtype.name} but {ref_name} has dtype {ref.dtype.name}; "
                           "all tensors of one call share one dtype")


def supported_dtype(name, t):
    if dtype_name(t.dtype) not in SUPPORTED_DTYPES:
        fail(INVALID, f"{name} has dtype {t.dtype.name}; supported: {', '.join(SUPPORTED_DTYPES)}")


def same_device(tensors):
    devs = {t.device.name for _, t in tensors}
    if len(devs) > 1:
        fail(INVALID, "tensors are on different devices: " + ", ".join(f"{n} on {t.device.name}" for n, t in tensors))


def overlaps(a, b) -> bool:
    """Whether two tensors share memory: one tensor, one device buffer, or (on CPU devices,
    after aclSetInputTensorAddr / aclSetOutputTensorAddr pointed them at host arrays)
    overlapping host memory.  A tensor without memory (a masked-out output) overlaps nothing."""
    if a is b:
        return True
    if a.buffer is None or b.buffer is None:
        return False
    if a.buffer is b.buffer:
        return True
    return a.host is not None and b.host is not None and bool(np.may_share_memory(a.host, b.host))


def no_alias(outputs, inputs):
    """The kernels read their inputs while they write their outputs: an output sharing memory
    with an input or another output would give silently wrong numbers.  161002."""
    for i, (oname, o) in enumerate(outputs):
        for name, t in list(inputs) + list(outputs[:i]):
            if overlaps(o, t):
                fail(INVALID, f"{oname} shares memory with {name}; an output must not alias an input "
                               "or another output")


def int_attr(name, v, allowed):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        fail(INVALID, f"{name} must be an int, got {type(v).__name__} {brief(v)}")
    if int(v) not in allowed:
        fail(INVALID, f"{name} is {v}; expected one of {sorted(allowed)} "
                       f"({', '.join(f'{k}={n}' for k, n in allowed.items())})")


def rank(name, t, ndim):
    if len(t.shape) != ndim:
        fail(INVALID, f"{name} must be {ndim}-D, got shape {t.shape}")


def bool_attr(name, v):
    if not isinstance(v, (bool, np.bool_)):
        fail(INVALID, f"{name} must be a bool, got {type(v).__name__} {brief(v)}")


def scale_arg(name, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        fail(INVALID, f"{name} must be a float, got {type(v).__name__} {brief(v)}")
    try:
        v = float(v)
    except OverflowError:  # an int beyond the double range
        fail(INVALID, f"{name} must be finite, got an integer of {int(v).bit_length()} bits")
    if not math.isfinite(v):
        fail(INVALID, f"{name} must be finite, got {v}")
    return v
