"""Device objects of the aclnn layer: tensors, int/bool arrays, streams and device memory.

Names follow CANN (aclTensor, aclrtStream, aclrtMalloc, ...).  Everything here
sits on one IREE device (an IREE driver name: local-task, local-sync, vulkan,
cuda); work on a stream is ordered by one IREE semaphore timeline.
"""
from __future__ import annotations

import ctypes
import math
from typing import NamedTuple

import iree.runtime as rt
import numpy as np

from ..runtime.device import Device, element_type, get_device
from ..runtime.timeline import Timeline

__all__ = ["aclTensor", "aclIntArray", "aclBoolArray", "aclrtStream", "aclrtBuffer", "FORMATS",
           "hal_element_type", "Storage", "host_storage", "storage_of", "no_storage", "view_over", "tensor_over",
           "import_or_upload", "aligned", "empty_aligned", "data_address", "read_back"]

FORMATS = ("ND", "NCHW", "NHWC")
# The kernels declare their buffer bindings 16-byte aligned: what NumPy (and malloc)
# guarantees, so host arrays are imported without a copy.
HOST_ALIGNMENT = 16


class Storage(NamedTuple):
    """The memory one tensor argument of a call refers to: the device buffer, a buffer view
    of the tensor's shape over it, the host array imported into it (CPU devices; IREE's
    import does not keep the array alive) or None, and the tensor's shape, dtype, format."""

    buffer: object
    view: object
    host: object
    shape: tuple
    dtype: np.dtype
    fmt: str


def hal_element_type(dtype) -> int:
    """HAL element type of a NumPy dtype; raises KeyError for dtypes a tensor cannot hold."""
    return element_type(dtype)


def data_address(array: np.ndarray) -> int:
    """The address of `array`'s first byte.  Through ctypes' buffer protocol where the array
    is a writable buffer of at least one byte (0.8 us), else `array.ctypes.data` (1.8 us, more
    in slow spells: each call's host and output arrays ask for theirs)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data


def aligned(array: np.ndarray, alignment: int = HOST_ALIGNMENT) -> np.ndarray:
    """`array` as a C-contiguous array whose data starts on an `alignment`-byte boundary.

    Returns `array` itself when it already is one, else a copy that starts on a cache
    line (the kernels declare aligned bindings, so imported host memory must honour
    that; whole cache lines let the kernels write large outputs non-temporally).
    """
    if array.flags.c_contiguous and data_address(array) % alignment == 0:
        return array
    out = empty_aligned(array.shape, array.dtype, max(alignment, 64))
    out[...] = array
    return out


# Beyond any real allocation: a larger size is a MemoryError before NumPy sees it.
MAX_HOST_BYTES = 1 << 62


def empty_aligned(shape, dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an `alignment`-byte boundary
    (64 by default: outputs start on a cache line of their own).

    Raises MemoryError when it cannot be allocated, or when NumPy cannot represent the
    shape at all (its non-zero extents alone span more than any memory, even for an empty
    array).  Sizes are multiplied as Python ints, so a huge shape never wraps around.
    """
    dtype = np.dtype(dtype)
    shape = tuple(map(int, shape))
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_HOST_BYTES:
        raise MemoryError(f"needs {nbytes} bytes, which cannot be allocated")
    if nbytes == 0 and math.prod(max(d, 1) for d in shape) * dtype.itemsize > MAX_HOST_BYTES:
        raise MemoryError("has extents too large for an array (even an empty one)")
    if alignment <= HOST_ALIGNMENT:  # malloc's own alignment, as a rule: no over-allocation and slicing (2 us)
        plain = np.empty(shape, dtype)
        if data_address(plain) % alignment == 0:
            return plain
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-data_address(raw)) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


# Imported host memory's type and usage, made once (combining the flags costs ~0.7 us a call).
HOST_MEMORY_TYPE = rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE
HOST_BUFFER_USAGE = rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING


def import_or_upload(device: Device, array: np.ndarray) -> rt.HalBuffer:
    """A device buffer with `array`'s bytes.

    On the CPU drivers the C-contiguous host array is imported without a copy (IREE does
    not keep the array alive: whoever holds the buffer must hold the array too, as
    aclTensor.storage does); other devices get a copy.
    """
    if array.nbytes == 0:
        return device.allocate(1)
    if device.is_host:
        return device.allocator.import_host_allocation(array, HOST_MEMORY_TYPE, HOST_BUFFER_USAGE)
    return device.upload(array)


def host_storage(device: Device, array: np.ndarray, fmt: str = "ND") -> "Storage":
    """Device memory holding `array` for a tensor of its shape and dtype: on CPU devices the
    array's own memory (imported, no copy; an array that is not C-contiguous or not 16-byte
    aligned is copied once); on other devices a device copy of it.

    Raises KeyError for a dtype a tensor cannot hold, MemoryError when a needed copy cannot
    be allocated.
    """
    return storage_of(device, aligned(array), fmt)


def storage_of(device: Device, array: np.ndarray, fmt: str = "ND") -> "Storage":
    """host_storage of an array known to be C-contiguous and 16-byte aligned (empty_aligned's)."""
    buf = import_or_upload(device, array)
    return Storage(buf, view_over(buf, array.shape, array.dtype), array if device.is_host else None, array.shape,
                   array.dtype, fmt)


def view_over(buffer: rt.HalBuffer, shape, dtype) -> rt.HalBufferView:
    """A buffer view of `shape` (a tuple or list of ints) and `dtype` over the start of `buffer`."""
    return rt.HalBufferView(buffer, shape, element_type(dtype))


def read_back(storage: Storage, device: Device) -> np.ndarray:
    """A host copy of the memory of `storage` (shape `storage.shape`, dtype `storage.dtype`)
    on `device`: its host array's on CPU devices, else Device.download's copy of the device
    buffer.  Synchronize the stream that wrote it first."""
    if storage.host is not None:
        return storage.host.reshape(storage.shape).copy()
    dtype = np.dtype(storage.dtype)
    nbytes = math.prod(storage.shape) * dtype.itemsize
    if nbytes == 0:
        return np.zeros(storage.shape, dtype)
    return device.download(storage.buffer, nbytes).view(dtype).reshape(storage.shape)


def tensor_over(device: Device, array: np.ndarray, fmt: str = "ND") -> "aclTensor":
    """An aclTensor over the host array `array` (host_storage: no copy on CPU devices when
    it is C-contiguous and 16-byte aligned).  Raises KeyError, MemoryError as host_storage."""
    return aclTensor.over(device, host_storage(device, array, fmt))


def no_storage(shape, dtype, fmt: str = "ND") -> Storage:
    """A masked-out output's storage: no memory, only a shape, dtype and format, which aclnn
    checks but no kernel touches (so nothing is allocated); an aclTensor over it is a
    descriptor that cannot be read back."""
    return Storage(None, None, None, tuple(shape), np.dtype(dtype), fmt)


class aclTensor:
    """A dense tensor on a device (aclTensor).

    shape: tuple of ints (the view shape, in the order of `format`: NCHW or
    NHWC for 4-D image tensors, ND otherwise); dtype: a NumPy dtype;
    format: "ND", "NCHW" or "NHWC"; nbytes: size in bytes.  `numpy()` reads
    it back to the host (synchronize the stream that wrote it first).
    Create with aclCreateTensor; release with aclDestroyTensor.
    """

    def __init__(self, device: Device, buffer: rt.HalBuffer, shape, dtype, fmt: str, host=None, view=None):
        self.device = device
        self.buffer = buffer
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.format = fmt
        self.host = host  # the imported host array (CPU drivers), else None
        self.destroyed = False
        etype = hal_element_type(self.dtype)
        if view is None and buffer is not None:
            view = rt.HalBufferView(buffer, list(self.shape), etype)
        self.view = view  # over `buffer`, of `shape` (None: a descriptor)

    @classmethod
    def over(cls, device: Device, storage: "Storage") -> "aclTensor":
        """A tensor referring to `storage` (host_storage, or a DLPack import)."""
        return cls(device, storage.buffer, storage.shape, storage.dtype, storage.fmt, storage.host, storage.view)

    def rebind(self, storage):
        """Refers to other memory from now on (aclSetInputTensorAddr's refresh): `storage` of
        this tensor's shape and dtype, or None for none (then the tensor is a descriptor
        until it is bound again).  Work already queued keeps the memory it was given."""
        if storage is None:
            self.buffer = self.view = self.host = None
        else:
            self.buffer, self.view, self.host = storage.buffer, storage.view, storage.host

    @property
    def storage(self) -> tuple:
        """What work over this tensor touches: its device buffer and, on CPU devices, the host
        array imported into it (IREE's import does not keep the array alive).  A launch keeps
        this, not the tensor, until it has run: destroying the tensor does not free it."""
        return (self.buffer, self.host)

    @property
    def size(self) -> int:
        """Number of elements (an exact Python int)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """A host copy of the contents, shape `self.shape`, dtype `self.dtype`."""
        if self.destroyed:
            raise ValueError("aclTensor was destroyed")
        if self.buffer is None:
            raise ValueError("this aclTensor is a descriptor without storage (a masked-out output)")
        return read_back(Storage(self.buffer, self.view, self.host, self.shape, self.dtype, self.format), self.device)

    def __repr__(self):
        state = " destroyed" if self.destroyed else ""
        return f"aclTensor(shape={self.shape}, dtype={self.dtype.name}, format={self.format}, device={self.device.name}{state})"


class _HostArray:
    """A small host-side array argument (aclIntArray / aclBoolArray): `.values`, `.size`."""

    convert = staticmethod(lambda v: v)

    def __init__(self, values):
        self.values = tuple(self.convert(v) for v in values)
        self.destroyed = False

    @property
    def size(self) -> int:
        return len(self.values)

    def __repr__(self):
        return f"{type(self).__name__}({list(self.values)})"


class aclIntArray(_HostArray):
    """A host array of int64 values (aclIntArray): `.values` tuple, `.size` length."""

    convert = staticmethod(int)


class aclBoolArray(_HostArray):
    """A host array of bools (aclBoolArray): `.values` tuple, `.size` length."""

    convert = staticmethod(bool)


class aclrtStream:
    """An ordered queue of work on one device (aclrtStream): a runtime Timeline.

    Each launch waits for the timeline's current value and signals the next, so work
    on one stream runs in order; `synchronize` waits for the last.  The timeline keeps
    everything a launch touches alive until the launch has run, whatever the caller
    destroys meanwhile.  Thread-safe: several threads may enqueue on one stream.
    """

    def __init__(self, device: Device):
        self.device = device
        self.timeline = Timeline(device)
        self.destroyed = False

    def submit(self, enqueue, keep=(), estimate=None) -> int:
        """Enqueues work on the stream (see runtime.timeline.Timeline.submit)."""
        return self.timeline.submit(enqueue, keep, estimate)

    def synchronize(self):
        """Blocks until all work enqueued so far has finished (raises if it failed)."""
        self.timeline.synchronize()

    def __repr__(self):
        return f"aclrtStream(device={self.device.name}, value={self.timeline.value})"


class aclrtBuffer:
    """Device memory from aclrtMalloc: `.size` bytes on `.device` (used as an aclnn workspace)."""

    def __init__(self, device: Device, size: int):
        self.device = device
        self.size = int(size)
        self.buffer = device.allocate_mappable(self.size)  # the host may fill it in place
        self.freed = False

    def __repr__(self):
        return f"aclrtBuffer({self.size} bytes on {self.device.name}{' freed' if self.freed else ''})"


def device_of(device) -> Device:
    """A Device from a driver name, a Device, or a stream; raises for anything else."""
    if isinstance(device, Device):
        device.check_usable()
        return device
    if isinstance(device, aclrtStream):
        if device.destroyed:
            raise ValueError("the stream was destroyed")
        device.device.check_usable()
        return device.device
    if isinstance(device, str):
        return get_device(device)
    raise TypeError(f"device must be an IREE driver name (e.g. 'local-task') or a stream, got {type(device).__name__}")
