"""Our kernels as PyTorch's own CPU kernels of the two aten backward ops, for unmodified models.

While enabled, ``aten::grid_sampler_2d_backward`` and ``aten::upsample_bilinear2d_backward``
on CPU tensors run our kernels (torch.library.Library("aten", "IMPL")), so
``F.grid_sample(...).backward()`` and ``F.interpolate(..., mode="bilinear").backward()``
use them without a change to the model.  What we do not handle (a dtype outside float16,
bfloat16, float32, float64; an upsample scale that disagrees with the sizes, which PyTorch
defines and aclnn refuses; no IREE device) goes to PyTorch's kernel, kept with
torch.library.get_kernel.

Thread safety: PyTorch's dispatcher cannot take a kernel registered or removed while other
threads dispatch the same op (measured: internal asserts in SafePyObject, segfaults, wrong
arguments).  So the first enable() registers our kernels once, for the life of the
process, and from then on enable() and disable() only flip a process-wide switch that the
kernels read: while it is off they call PyTorch's kernel, whose results are PyTorch's to
the bit; entering and leaving never touch the dispatcher again.  The one registration is
best made before other threads run these ops (an enable(); disable() at start-up does it).
With the switch off, a call of either op pays one Python call more (a few microseconds).
Under torch.compile, inductor keeps grid_sampler_2d_backward as a call
of the aten op (the override runs) but decomposes upsample_bilinear2d_backward into its
own code (the override does not run): use the functions of aclnn_iree.torch there.
"""
from __future__ import annotations

import contextlib
import math
import threading
import warnings

import torch

from . import _bridge as B

__all__ = ["enable", "disable", "enabled", "is_enabled"]

_GRID = "aten::grid_sampler_2d_backward"
_UPSAMPLE = "aten::upsample_bilinear2d_backward"
_lock = threading.RLock()
_library = None  # registered once, on the first enable(), and kept
_active = False  # the switch our registered kernels read
_open_blocks = 0  # enabled() blocks open now, in any thread
_before_blocks = False  # whether enable() was in effect before the first of them
_originals: dict = {}


def _consistent(scale, in_size, out_size) -> bool:
    return scale is None or scale <= 0 or out_size == math.floor(in_size * scale)


def _grid_kernel(keyset, grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    tensors = (grad_output, input, grid)
    name = B.iree_device_for(*tensors) if _active and all(t.dtype in B.SUPPORTED_DTYPES and t.dtype == input.dtype
                                                         for t in tensors) else None
    if name is None:
        return _originals[_GRID].call_boxed(keyset, grad_output, input, grid, interpolation_mode, padding_mode,
                                            align_corners, output_mask)
    # A masked-out gradient is returned undefined (None), as aten returns grad_input.
    return B.grid_sampler_backward(name, grad_output, input, grid, interpolation_mode, padding_mode,
                                   align_corners, output_mask)


def _upsample_kernel(keyset, grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    name = None
    if (_active and grad_output.dtype in B.SUPPORTED_DTYPES and len(output_size) == 2 and len(input_size) == 4
            and _consistent(scales_h, input_size[2], output_size[0])
            and _consistent(scales_w, input_size[3], output_size[1])):
        name = B.iree_device_for(grad_output)
    if name is None:
        return _originals[_UPSAMPLE].call_boxed(keyset, grad_output, output_size, input_size, align_corners,
                                                scales_h, scales_w)
    return B.upsample_backward(name, grad_output, output_size, input_size, align_corners, scales_h, scales_w)


def _register():
    """Registers our kernels over PyTorch's CPU kernels of both ops, once (under _lock)."""
    global _library
    if _library is not None:
        return
    if not hasattr(torch.library, "get_kernel"):
        raise RuntimeError(f"aclnn_iree.torch.enable() needs torch.library.get_kernel, which PyTorch "
                           f"{torch.__version__} lacks; use aclnn_iree.torch.grid_sample / interpolate instead")
    for op in (_GRID, _UPSAMPLE):
        _originals[op] = torch.library.get_kernel(op, "CPU")
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore", UserWarning)
        lib.impl("grid_sampler_2d_backward", _grid_kernel, "CPU", with_keyset=True)
        lib.impl("upsample_bilinear2d_backward", _upsample_kernel, "CPU", with_keyset=True)
    _library = lib


def enable():
    """Makes our kernels PyTorch's CPU kernels of aten::grid_sampler_2d_backward and
    aten::upsample_bilinear2d_backward (idempotent; process-wide).  The first call registers
    them with PyTorch's dispatcher, later ones only turn the switch (module docstring).
    Raises RuntimeError on a PyTorch without torch.library.get_kernel."""
    global _active
    with _lock:
        _register()
        _active = True


def disable():
    """Makes PyTorch's own CPU kernels of both ops answer again, bit for bit (no-op when not
    enabled).  Our registration stays (only the switch turns): safe while other threads run."""
    global _active
    with _lock:
        _active = False


def is_enabled() -> bool:
    """Whether enable() is in effect."""
    return _active


@contextlib.contextmanager
def enabled():
    """Within the block our kernels are PyTorch's CPU kernels of both ops; on exit (an
    exception included) the state before the block comes back, so blocks nest.

    Process-wide, as PyTorch's kernel registry is: while any thread is inside a block,
    every thread's calls run our kernels, and blocks open in several threads at once count
    as one, whose end (the last to close) restores the state before the first."""
    global _open_blocks, _before_blocks
    entered = False
    try:  # an interrupt (Ctrl-C) anywhere after the count went up still brings it down
        with _lock:
            before = is_enabled()
            enable()
            if _open_blocks == 0:
                _before_blocks = before
            _open_blocks += 1
            entered = True  # no call between this and the line before: no signal handler runs there
        yield
    finally:
        if entered:
            with _lock:
                _open_blocks -= 1
                if _open_blocks == 0 and not _before_blocks:
                    disable()
