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
import threading
import warnings

import torch

from . import _bridge as B

__all__ = ["enable", "disable", "enabled", "is_enabled"]

_lock = threading.RLock()
_library = None  # registered once, on the first enable(), and kept
_active = False  # the switch our registered kernels read
_open_blocks = 0  # enabled() blocks open now, in any thread
_before_blocks = False  # whether enable() was in effect before the first of them
_originals: dict = {}


def device_for(*tensors):
    """The IREE device on which an overriding kernel runs these tensors itself, or None where
    PyTorch's kernel runs them: enable() is off, their dtypes differ or are not ours, or IREE
    has no device for them (_bridge.iree_device_for)."""
    if not (_active and all(t.dtype in B.SUPPORTED_DTYPES and t.dtype == tensors[0].dtype for t in tensors)):
        return None
    return B.iree_device_for(*tensors)


def original(aten: str):
    """PyTorch's own CPU kernel of `aten` ("aten::<op>"), kept when ours was registered: the
    operators' kernels call it where they do not handle a call, or while disabled."""
    return _originals[aten]


def _register():
    """Registers every operator's kernels (its torch module's ATEN_OVERRIDES) over PyTorch's
    CPU kernels, once (under _lock)."""
    global _library
    if _library is not None:
        return
    if not hasattr(torch.library, "get_kernel"):
        raise RuntimeError(f"aclnn_iree.torch.enable() needs torch.library.get_kernel, which PyTorch "
                           f"{torch.__version__} lacks; use aclnn_iree.torch.grid_sample / interpolate instead")
    from ..ops.registry import OPERATORS
    overrides = {aten: kernel for op in OPERATORS for aten, kernel in op.load("torch").ATEN_OVERRIDES.items()}
    for aten in overrides:
        _originals[aten] = torch.library.get_kernel(aten, "CPU")
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore", UserWarning)
        for aten, kernel in overrides.items():
            lib.impl(aten.split("::", 1)[1], kernel, "CPU", with_keyset=True)
    _library = lib


def enable():
    """Makes our kernels PyTorch's CPU kernels of every operator's aten ops (each operator's
    torch module's ATEN_OVERRIDES: aten::grid_sampler_2d_backward and
    aten::upsample_bilinear2d_backward) (idempotent; process-wide).  The first call registers
    them with PyTorch's dispatcher, later ones only turn the switch (module docstring).
    Raises RuntimeError on a PyTorch without torch.library.get_kernel."""
    global _active
    with _lock:
        _register()
        _active = True


def disable():
    """Makes PyTorch's own CPU kernels of those ops answer again, bit for bit (no-op when not
    enabled).  Our registration stays (only the switch turns): safe while other threads run."""
    global _active
    with _lock:
        _active = False


def is_enabled() -> bool:
    """Whether enable() is in effect."""
    return _active


@contextlib.contextmanager
def enabled():
    """Within the block our kernels are PyTorch's CPU kernels of those ops; on exit (an
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
