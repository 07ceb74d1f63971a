"""PyTorch tensors in and out of our kernels without copies.

CPU tensors reach a CPU IREE device as NumPy views of their own memory, which the aclnn
layer imports (no copy); results are written into tensors PyTorch allocated, so a
returned gradient *is* the buffer the kernel wrote.  bfloat16 goes through an int16 view
(`torch.bfloat16` <-> `ml_dtypes.bfloat16`).  CUDA tensors reach IREE's `cuda` device
through DLPack (IREE shares the primary context with PyTorch) with host synchronisation
before and after the launch, since IREE's CUDA HAL can neither wait on nor signal
PyTorch's streams.  Where IREE has no device for a tensor, PyTorch's own kernel runs
instead, with a one-time warning.
"""
from __future__ import annotations

import threading
import warnings

import ml_dtypes
import numpy as np
import torch

from ..core import api
from ..core.errors import AclnnError
from ..runtime.device import DeviceUnavailable, get_device
from ..core.tensors import HOST_ALIGNMENT, Storage, host_storage, no_storage, read_back, storage_of

__all__ = ["set_cpu_device", "get_cpu_device", "SUPPORTED_DTYPES", "grid_sampler_backward", "upsample_backward",
           "iree_device_for", "is_channels_last"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}

_cpu_device = "local-task"
_warned: set = set()
_warn_lock = threading.Lock()


def set_cpu_device(device: str):
    """The IREE device that computes for CPU tensors: "local-task" (default, threads),
    "local-sync", or a GPU device such as "vulkan" (then the tensors are copied to it and
    the results back).  Raises AclnnError (361001) when the device is unavailable."""
    global _cpu_device
    try:
        get_device(device)
    except DeviceUnavailable as e:
        raise AclnnError(361001, str(e)) from None
    _cpu_device = device


def get_cpu_device() -> str:
    """The IREE device that computes for CPU tensors (see set_cpu_device)."""
    return _cpu_device


def _warn_once(key: str, message: str):
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def iree_device_for(*tensors):
    """The IREE device name that computes for these tensors, or None where IREE has none for
    them (then the caller runs PyTorch's kernel; the reason is warned once)."""
    dev = tensors[0].device
    if any(t.device != dev for t in tensors):
        raise ValueError(f"tensors are on different devices: {sorted({str(t.device) for t in tensors})}")
    if dev.type == "cpu":
        return _cpu_device
    if dev.type == "cuda":
        name = "cuda" if (dev.index or 0) == 0 else None
        try:
            if name is None:
                raise DeviceUnavailable(f"only the first CUDA device is used, not {dev}")
            get_device(name)
            return name
        except DeviceUnavailable as e:
            _warn_once(str(dev), f"aclnn_iree: no IREE device for {dev} tensors ({e}); PyTorch's own kernels "
                                 "run for them instead")
            return None
    _warn_once(dev.type, f"aclnn_iree: IREE has no device for {dev.type} tensors; PyTorch's own kernels run "
                         "for them instead")
    return None


def is_channels_last(t: torch.Tensor) -> bool:
    """Whether a 4-D tensor is laid out NHWC in memory (and not also plainly contiguous)."""
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    """A NumPy array over the CPU tensor's own memory (no copy)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _storage(device, t: torch.Tensor, fmt: str = "ND", output: bool = False) -> Storage:
    """Device memory for `t` (C-contiguous in the order the kernel reads).

    A CPU tensor on a CPU device, or a CUDA tensor on IREE's cuda device, is imported
    through DLPack: the kernel reads and writes the tensor's own memory, and IREE's buffer
    holds the DLPack capsule, so the memory stays alive while a launch uses it.  IREE
    imports only memory on a 64-byte boundary that way (PyTorch's allocations are); other
    CPU memory (a view at an offset, a tensor over a NumPy array) goes in as a NumPy view,
    also without a copy where it is 16-byte aligned (tensors.host_storage).  A CPU tensor on
    a GPU device (Vulkan) is copied to it; a misaligned CUDA tensor is cloned first.
    CPU outputs (`output`) always go in as NumPy views: IREE imports DLPack memory for
    reading and writing but not for discarding writes, which the kernels' fills and whole
    overwrites ask for ("buffer allows READ|WRITE, operation requires DISCARD_WRITE").
    """
    cuda = t.device.type == "cuda"
    if t.numel() and (cuda or device.is_host):
        if cuda and t.data_ptr() % 64:
            t = t.clone()
        if t.data_ptr() % 64 == 0 and (cuda or not output):
            view = device.hal.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(t.detach()))
            return Storage(view.get_buffer(), view, None, tuple(t.shape), _numpy_dtype(t.dtype), fmt)
        if output and t.data_ptr() % HOST_ALIGNMENT == 0:  # torch.empty's: aligned, contiguous
            return storage_of(device, _numpy_view(t), fmt)
    return host_storage(device, _numpy_view(t), fmt)


def _reader(targets):
    """read() for api.run_*: copies a device result into its CPU tensor where the kernel did
    not write that tensor itself (a CPU tensor computed on a GPU device)."""
    targets = iter(targets)

    def read(storage, device):
        t = next(targets)
        if t.device.type == "cpu" and storage.host is None and t.numel():
            _numpy_view(t)[...] = read_back(storage, device)
        return t
    return read


class _Launch:
    """One call's IREE side: the device and the thread's stream."""

    def __init__(self, name: str, tensors):
        self.device = get_device(name)
        self.stream = api.thread_stream(name)
        if tensors[0].device.type == "cuda":  # IREE cannot wait on PyTorch's stream: the inputs must be ready
            torch.cuda.current_stream(tensors[0].device).synchronize()

    def storage(self, t, fmt="ND", output=False):
        return _storage(self.device, t, fmt, output)


def grid_sampler_backward(name, grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                          output_mask):
    """(grad_input, grad_grid) on IREE device `name`: torch tensors over the memory the kernel
    wrote; a masked-out gradient is None.  Inputs are made contiguous (the kernels read NCHW:
    a channels_last or strided input is copied once).  Raises AclnnError."""
    go, x, g = (t.contiguous() for t in (grad_output, input, grid))
    run = _Launch(api.call_device(name, "grid", go.numel() + x.numel()), (go, x, g))
    mask = [bool(m) for m in output_mask]
    # empty_like: a third of torch.empty's host time with shape, dtype and device spelled out
    outs = [torch.empty_like(like, memory_format=torch.contiguous_format) if m else None
            for like, m in ((x, mask[0]), (g, mask[1]))]
    storages = [run.storage(go), run.storage(x), run.storage(g)]
    storages += [run.storage(t, output=True) if t is not None
                 else no_storage(like.shape, _numpy_dtype(like.dtype)) for t, like in ((outs[0], x), (outs[1], g))]
    return tuple(api.run_grid_sampler(run.stream, storages, int(interpolation_mode), int(padding_mode),
                                      bool(align_corners), mask, read=_reader(t for t in outs if t is not None)))


def upsample_backward(name, grad_output, output_size, input_size, align_corners, scales_h, scales_w):
    """grad_input of upsample_bilinear2d on IREE device `name`, in grad_output's memory format:
    a channels_last grad_output takes the NHWC kernel and gives a channels_last gradient,
    any other the NCHW one (a strided grad_output is copied once).  Raises AclnnError."""
    nhwc = is_channels_last(grad_output)
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    go = grad_output.contiguous(memory_format=fmt)
    N, C, H, W = (int(v) for v in input_size)
    out = torch.empty((N, C, H, W), dtype=go.dtype, device=go.device, memory_format=fmt)
    run = _Launch(api.call_device(name, api.upsample_kind(go.shape, out.shape), go.numel() + out.numel()), (go,))
    if nhwc:  # the kernels take NHWC as (N, H, W, C) arrays, C fastest
        storages = [run.storage(go.permute(0, 2, 3, 1), "NHWC"), run.storage(out.permute(0, 2, 3, 1), "NHWC", True)]
        isz = (N, H, W, C)
    else:
        storages, isz = [run.storage(go, "NCHW"), run.storage(out, "NCHW", True)], (N, C, H, W)
    # A result read back from device memory (a GPU device for CPU tensors) is in the kernel's
    # layout: NHWC goes into the channels_last tensor through its (N, H, W, C) view.
    api.run_upsample(run.stream, storages, [int(v) for v in output_size], isz, bool(align_corners), scales_h,
                     scales_w, read=_reader([out.permute(0, 2, 3, 1) if nhwc else out]))
    return out


def _numpy_dtype(dtype):
    return _NUMPY.get(dtype, ml_dtypes.bfloat16)
