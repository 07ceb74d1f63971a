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

import contextlib
import ctypes
import threading
import warnings

import ml_dtypes
import numpy as np
import torch
from iree.runtime import HalBufferView
from torch._C._profiler import _RecordFunctionFast
from torch.autograd import _profiler_enabled
from torch.utils.dlpack import to_dlpack

from ..core import api
from ..core.errors import AclnnError
from ..runtime import cuda, kernels
from ..runtime.device import DeviceUnavailable, element_type, get_device, on_fork_in_child
from ..core.tensors import (HOST_ALIGNMENT, HOST_BUFFER_USAGE, HOST_MEMORY_TYPE, Storage, host_storage, read_back,
                            storage_of)
from . import _cuda

__all__ = ["set_cpu_device", "get_cpu_device", "SUPPORTED_DTYPES", "iree_device_for", "is_channels_last", "Launch", "reader",
           "numpy_dtype", "Plan", "plan", "planner", "event_name"]

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
    for t in tensors:  # CPU tensors first: Tensor.is_cpu costs a sixth of Tensor.device.type
        if not t.is_cpu:
            break
    else:
        return _cpu_device
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
    """Whether a 4-D tensor is laid out NHWC in memory, as PyTorch's suggest_memory_format
    decides it: where it is contiguous both ways (size-1 dimensions: (N, C, 1, 1), say), by
    its strides, so that the result takes the input's layout as F.interpolate's does."""
    if t.dim() != 4 or not t.is_contiguous(memory_format=torch.channels_last):
        return False
    return not t.is_contiguous() or _strides_like_channels_last(t.shape, t.stride())


def _strides_like_channels_last(sizes, strides) -> bool:
    """c10's is_channels_last_strides_2d: the strides grow in the order C, W, H, N."""
    low = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < low or (d == 0 and low == strides[1]):
            return False
        low = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


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
    if t.is_neg():  # a lazily negated view (torch._neg_view): its memory holds -t; DLPack exports it as is
        t = t.resolve_neg()
    cuda = t.device.type == "cuda"
    if t.numel() and (cuda or device.is_host):
        if cuda and t.data_ptr() % 64:
            t = t.clone()
        if t.data_ptr() % 64 == 0 and (cuda or not output):
            view = device.hal.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(t.detach()))
            return Storage(view.get_buffer(), view, None, tuple(t.shape), numpy_dtype(t.dtype), fmt)
        if output and t.data_ptr() % HOST_ALIGNMENT == 0:  # torch.empty's: aligned, contiguous
            return storage_of(device, _numpy_view(t), fmt)
    return host_storage(device, _numpy_view(t), fmt)


def reader(targets):
    """read() for api.run_*: copies a device result into its CPU tensor where the kernel did
    not write that tensor itself (a CPU tensor computed on a GPU device)."""
    targets = iter(targets)

    def read(storage, device):
        t = next(targets)
        if t.device.type == "cpu" and storage.host is None and t.numel():
            _numpy_view(t)[...] = read_back(storage, device)
        return t
    return read


def event_name(op: str, device: str) -> str:
    """The torch.profiler event of one call of our kernel of `op` on IREE device `device`, e.g.
    "aclnn_iree::grid_sampler_2d_backward (IREE local-sync)": besides the op's own event, which
    a call that falls back to PyTorch's kernel records too, and the aten op's under enable()."""
    return f"aclnn_iree::{op} (IREE {device})"


# torch.profiler events (Launch.recorded, Plan) are made only while a profiler records this
# thread (_profiler_enabled: ~0.03 us a call, thread-local as the profiler is): an event costs
# ~0.2 us even with none recording (_RecordFunctionFast; ~5 us through record_function).
class Launch:
    """One call's IREE side: the device and the thread's stream."""

    def __init__(self, name: str, tensors):
        self.name = name
        self.device = get_device(name)
        self.stream = api.thread_stream(name)
        self.cuda_index = None
        if tensors[0].device.type == "cuda":  # IREE cannot wait on PyTorch's stream: the inputs must be ready
            self.cuda_index = tensors[0].device.index or 0
            torch.cuda.current_stream(tensors[0].device).synchronize()

    def storage(self, t, fmt="ND", output=False):
        return _storage(self.device, t, fmt, output)

    def recorded(self, op):
        """A context around the call of our kernel of Operator `op`: its event_name while a
        profiler records, else nothing."""
        if _profiler_enabled():
            return _RecordFunctionFast(event_name(op.name, self.name))
        return contextlib.nullcontext()


def numpy_dtype(dtype):
    return _NUMPY.get(dtype, ml_dtypes.bfloat16)


# ----------------------------------------------------------------------------- repeated calls
# A training step repeats its calls: the same op, shapes, dtypes, layouts and modes every step.
# The first call of a signature in a thread takes the general path above (devices, storages,
# phase 1's checks, the kept executor); it leaves a Plan under the torch layer's own key of
# the call, and the next calls go straight from their tensors to the kernel launch: one
# DLPack import per input, one host import per output, the launch and the wait (~12 us of
# host time on 1x1x4x4 against ~40 us the general way; docs/performance.md#host-overhead).
_PLANS_PER_THREAD = 64


class _Plans(threading.local):
    def __init__(self):
        self.plans = {}


_tls = _Plans()


@on_fork_in_child
def _forget_plans():
    """The parent's plans launch on its devices' streams: a forked child makes its own."""
    global _tls
    _tls = _Plans()


def plan(key):
    """This thread's Plan for the call signature `key` (the torch layer's: op, device name,
    shapes, dtypes, layout, modes), or None."""
    return _tls.plans.get(key)


def _remember(key, p):
    plans = _tls.plans
    if len(plans) >= _PLANS_PER_THREAD:  # signatures rarely vary that much: start over
        plans.clear()
    plans[key] = p


def planner(key, launch: Launch, dtype):
    """The `kept` callback for api.run_*: remembers the call's kept executor as the Plan of
    `key` (its first entry: the op's name, for its event_name), where the call ran on a CPU
    device, or as a _cuda.CudaPlan where it ran on CUDA tensors and ACLNN_IREE_CUDA_LAUNCH
    asks for the stream launch (None elsewhere: GPU devices copy CPU tensors, and IREE's runtime
    needs PyTorch's stream synchronised around each call; those take the general path)."""
    if launch.cuda_index is not None:
        if not _cuda.stream_launch():
            return None

        def kept_cuda(run, ex):
            try:
                p = _cuda.plan_for(ex, launch.cuda_index, event_name(key[0], "cuda stream"))
            except (cuda.CudaError, ValueError) as e:  # the call itself ran: later ones stay on IREE's runtime
                _warn_once(f"cuda-launch:{key[0]}", f"aclnn_iree: {key[0]}'s kernels cannot be launched on "
                                                   f"PyTorch's stream ({e}); IREE's runtime runs them")
                return
            if p is not None:
                _remember(key, p)
        return kept_cuda
    if not launch.device.is_host:
        return None

    def kept(run, ex):
        _remember(key, Plan(key, run, launch.device, dtype, event_name(key[0], launch.name)))
    return kept


class Plan:
    """A call signature's kept launch on a CPU device, called with the next call's tensors:
    `plan(inputs, outputs)` runs the kernel on them and returns True, or returns False
    without running anything where they need the general path (memory off the import
    alignment, an empty tensor, modules unloaded since).  inputs: contiguous CPU tensors in
    aclnn's order, in the kernel's layout (an NHWC tensor as its (N, H, W, C) permutation);
    outputs: fresh tensors from torch.empty (None for a masked-out output).  Raises
    AclnnError when the launch fails; the thread's plans are then forgotten (the stream they
    launch on may have failed for good: the next calls take the general path, which makes a
    new one where it did).  The launch is a torch.profiler event named `event` while a
    profiler records."""

    __slots__ = ("_key", "_run", "_generation", "_from_dlpack", "_import", "_element_type", "_outputs", "_event")

    def __init__(self, key, run, device, dtype, event: str):
        self._key, self._run, self._generation, self._event = key, run, kernels.generation, event
        self._from_dlpack = device.hal.from_dlpack_capsule
        self._import = device.allocator.import_host_allocation
        self._element_type = element_type(numpy_dtype(dtype))
        self._outputs = None  # per output: (its bytes as a ctypes array type, its shape); the key fixes them

    @staticmethod
    def _output_specs(outputs):
        """(ctypes.c_char * its bytes, its shape) per output (None for a masked-out one), or
        False where one is empty (those take the general path)."""
        specs = []
        for t in outputs:
            if t is not None and not t.numel():
                return False
            specs.append(None if t is None else (ctypes.c_char * (t.numel() * t.element_size()), tuple(t.shape)))
        return specs

    def __call__(self, inputs, outputs) -> bool:
        if self._generation != kernels.generation:
            return False
        views = []
        from_dlpack = self._from_dlpack
        for t in inputs:  # imported in place (_storage); to_dlpack takes a tensor that requires grad
            if t.data_ptr() % 64 or not t.numel() or t.is_neg():  # a negated view: _storage resolves it
                return False
            views.append(from_dlpack(to_dlpack(t)))
        specs = self._outputs
        if specs is None:
            specs = self._outputs = self._output_specs(outputs)
        if specs is False:
            return False
        element, host_import = self._element_type, self._import
        # host imports: the kernels' whole overwrites need DISCARD_WRITE (_storage); of a ctypes
        # array over the tensor's bytes (0.2 us) rather than its .numpy() (0.5 us)
        for t, spec in zip(outputs, specs):
            if spec is None:
                views.append(None)
                continue
            address = t.data_ptr()
            if address % HOST_ALIGNMENT or not t.is_cpu:  # (a CPU tensor's bytes, never another device's)
                return False
            views.append(HalBufferView(host_import(spec[0].from_address(address), HOST_MEMORY_TYPE, HOST_BUFFER_USAGE),
                                       spec[1], element))
        try:
            if _profiler_enabled():
                with _RecordFunctionFast(self._event):
                    self._run(views, (inputs, outputs))
            else:
                self._run(views, (inputs, outputs))
        except AclnnError:  # its stream may have failed for good, and the thread's other plans launch on it too
            _tls.plans.clear()
            raise
        return True
