"""IREE devices, one per driver name, created on first use and shared by all threads."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading

import iree.runtime as rt
import numpy as np
import ml_dtypes

__all__ = ["Device", "get_device", "DeviceUnavailable", "element_type"]

_ELEMENT_TYPES = {
    np.dtype(np.float32): rt.HalElementType.FLOAT_32,
    np.dtype(np.float16): rt.HalElementType.FLOAT_16,
    np.dtype(np.float64): rt.HalElementType.FLOAT_64,
    np.dtype(ml_dtypes.bfloat16): rt.HalElementType.BFLOAT_16,
    np.dtype(np.int8): rt.HalElementType.SINT_8,
    np.dtype(np.int16): rt.HalElementType.SINT_16,
    np.dtype(np.int32): rt.HalElementType.SINT_32,
    np.dtype(np.int64): rt.HalElementType.SINT_64,
    np.dtype(np.uint8): rt.HalElementType.UINT_8,
    np.dtype(np.bool_): rt.HalElementType.BOOL_8,
}


def element_type(dtype) -> int:
    """The HAL element type of a NumPy dtype (floats incl. ml_dtypes.bfloat16, ints, bool).

    Raises KeyError for a dtype a device buffer cannot hold.
    """
    return _ELEMENT_TYPES[np.dtype(dtype)]


class DeviceUnavailable(RuntimeError):
    """The IREE driver or a device for it is missing on this machine."""


class Device:
    """One IREE HAL device (`name` is an IREE driver: local-task, local-sync, vulkan, cuda, hip,
    metal; or "vmvx": local-task running the vmvx target's modules).

    Owns the VM instance and the HAL module that loaded programs link against,
    and a 1-byte buffer passed as the workspace of kernels that need none.
    """

    def __init__(self, name: str, threads: int | None = None, staged: bool | None = None):
        """`threads`: worker count of a local-task device.  IREE caches its drivers per
        process, so only the first local-task device of a process gets to set it.
        `staged`: whether kernel memory is device-only, reached through staging copies
        (None: where the device's own memory is not cached host memory, see `allocate`)."""
        self.name = name
        self.threads = threads
        if threads is not None:
            # The task executor reads its worker count when the device is created.
            rt.flags.parse_flags(f"--task_topology_group_count={int(threads)}")
        # CPU drivers run kernels on host memory: host arrays are imported, not copied.
        base = name.split(":", 1)[0]
        # "vmvx": IREE's local-task driver running modules of the vmvx target (its VM-based
        # CPU loader), the same driver as llvm-cpu's modules; only the modules differ.
        driver = "local-task" if base == "vmvx" else name
        self.is_host = base in ("local-task", "local-sync", "vmvx")
        # The IREE bindings cache drivers per process, and the local-task driver's worker
        # threads do not survive fork(): a forked child runs local-task work on the
        # synchronous CPU driver instead (same kernels, one thread).
        self.driver = "local-sync" if (_in_forked_child and driver == "local-task") else driver
        # local-sync runs a launch's work inside the launch: it has finished when the call returns.
        self.synchronous = self.driver.split(":", 1)[0] == "local-sync"
        if base in _drivers_of_parent and not self.is_host:
            # A GPU driver the parent created is cached in this forked copy of it, with its
            # threads gone: a device from it hangs on its first wait (seen with Vulkan).
            raise DeviceUnavailable(
                f"IREE device {name!r} cannot be used in a process forked after its parent used it "
                "(the driver does not survive fork()); start the process with the 'spawn' or "
                "'forkserver' method of multiprocessing, or use the CPU device here")
        self.pid = os.getpid()  # a device belongs to the process that made it (see check_usable)
        _drivers_used.add(base)
        try:
            self.config = rt.Config(self.driver)
        except Exception as e:  # IREE raises ValueError/RuntimeError depending on the driver
            cause = f" ({e.__cause__})" if e.__cause__ is not None else ""
            raise DeviceUnavailable(f"IREE device {name!r} is not available: {e}{cause}") from e
        self.hal = self.config.device
        self.instance = self.config.vm_instance
        self.hal_module = rt.create_hal_module(self.instance, self.hal)
        self.allocator = self.hal.allocator
        self._cuda_context = _current_cuda_context() if base == "cuda" else None
        if staged is None:
            staged = not self.is_host and not _device_memory_is_cached_host_memory(self.allocator)
        self.staged = bool(staged)
        # Loop iterations one invocation may run before the driver stops it, where it is
        # known to stop them: Mesa's lavapipe (software Vulkan) after 65535 in all, which
        # serial dispatches (the linalg forms' scatter) can reach; a margin below.  None: no limit.
        self.loop_budget = 60000 if base == "vulkan" and _vulkan_is_lavapipe() else None
        # Pinned host memory for staged uploads and downloads, kept for reuse: pinning is a
        # system call per allocation (PyTorch's CUDA host allocator caches it for the same reason).
        self._staging = (StagingPool(self.allocator, _STAGING_UPLOAD), StagingPool(self.allocator, _STAGING_DOWNLOAD))
        self.placeholder = self.allocate(1)

    def _enter_thread(self):
        """Makes this device's CUDA context current on the calling thread.  IREE 3.13's cuda
        allocator uses the thread's current context, which only the thread that created the
        device has: on any other thread allocations failed with CUDA_ERROR_INVALID_CONTEXT
        (seen on an H200, first GPU run).  A no-op for the other drivers."""
        if self._cuda_context is not None:
            _set_cuda_context(self._cuda_context)

    def check_usable(self):
        """Raises DeviceUnavailable when this device was made by another process: a forked
        child inherits the parent's devices (and the streams, tensors and executors on
        them), whose driver threads did not survive fork(); using one would hang."""
        if self.pid != os.getpid():
            raise DeviceUnavailable(
                f"this object is on the parent process's IREE device {self.name!r}, which a forked "
                "child cannot use; create streams and tensors again in the child")

    def allocate(self, nbytes: int) -> rt.HalBuffer:
        """Memory for kernels, `nbytes` bytes (at least 1).  Mappable where the device's memory
        is cached host memory (the CPU drivers, lavapipe, integrated GPUs); device-only on the
        others (`staged`: cuMemAlloc on CUDA, VRAM on a discrete Vulkan GPU), which the host
        reaches by `upload` and `download`, not by mapping.  A mappable device-local buffer
        is managed memory on CUDA, which the host read and wrote at about 1 GB/s (first GPU
        run, H200), and uncached BAR memory on a discrete Vulkan GPU."""
        return self._allocate(nbytes, _KERNEL_USAGE_GPU if self.staged else _KERNEL_USAGE_HOST)

    def allocate_mappable(self, nbytes: int) -> rt.HalBuffer:
        """Device-local memory the host can also map (`buffer.map()`): what aclrtMalloc gives,
        so that a caller can fill it in place.  Managed memory on CUDA."""
        return self._allocate(nbytes, _KERNEL_USAGE_HOST)

    def _allocate(self, nbytes: int, usage) -> rt.HalBuffer:
        self._enter_thread()
        return self.allocator.allocate_buffer(memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=usage,
                                              allocation_size=max(int(nbytes), 1))

    def upload(self, array: np.ndarray) -> rt.HalBuffer:
        """A buffer from `allocate` holding a copy of `array`.  On a `staged` device the bytes
        go through pinned host staging memory and a queued copy, which this waits for."""
        if array.nbytes == 0:
            return self.allocate(1)
        array = np.ascontiguousarray(array)
        self._enter_thread()
        if not self.staged:
            return self.allocator.allocate_buffer_copy(
                memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=_KERNEL_USAGE_HOST,
                device=self.hal, buffer=array, element_type=element_type(array.dtype)).get_buffer()
        # (allocate_buffer_copy would make the target host-visible, i.e. managed memory on CUDA.)
        buffer = self.allocate(array.nbytes)
        with self._staging[0].lend(array.nbytes) as staging:
            staging.map().asarray([array.nbytes], np.dtype(np.uint8))[...] = array.reshape(-1).view(np.uint8)
            self._copy_and_wait(staging, buffer)
        return buffer

    def download(self, buffer: rt.HalBuffer, nbytes: int) -> np.ndarray:
        """A host copy (uint8, `nbytes` long) of the first `nbytes` bytes of `buffer`.  Mapped
        where the host can map it, else copied by the queue into pinned host memory first.
        The caller makes sure no queued work still writes `buffer` (synchronize first)."""
        nbytes = int(nbytes)
        if nbytes == 0:
            return np.zeros(0, np.uint8)
        self._enter_thread()
        if int(buffer.allowed_usage()) & int(rt.BufferUsage.MAPPING_SCOPED):
            return buffer.map().asarray([nbytes], np.dtype(np.uint8)).copy()
        with self._staging[1].lend(buffer.byte_length()) as staging:
            self._copy_and_wait(buffer, staging)
            return staging.map().asarray([nbytes], np.dtype(np.uint8)).copy()

    def _copy_and_wait(self, source: rt.HalBuffer, target: rt.HalBuffer):
        """Copies all of `source` to the start of `target` on the device queue and waits for
        it (so the staging buffer on one side can be lent again).  queue_copy, not a command
        buffer's copy: on lavapipe that took 8.8 ms for 8 MiB against queue_copy's 0.9 ms."""
        semaphore = self.hal.create_semaphore(0)
        done = rt.HalFence.create_at(semaphore, 1)
        self.hal.queue_copy(source, target, rt.HalFence(0), done)
        done.wait()

    def fill_call(self, buffers, wait: rt.HalFence, signal: rt.HalFence):
        """The call that enqueues zero fills of (buffer, nbytes) pairs, ordered by the fences
        (none: a barrier), as (function, *arguments) for Timeline.submit."""
        cb = rt.HalCommandBuffer(self.hal, binding_capacity=0, begin=True)
        for buffer, nbytes in buffers:
            if nbytes:
                cb.fill(buffer, np.zeros(1, np.uint8), 0, nbytes)
        cb.end()
        return self.hal.queue_execute, cb, wait, signal  # iree-base-runtime 3.13 takes one command buffer

    def __repr__(self):
        return f"Device({self.name!r})" if self.threads is None else f"Device({self.name!r}, threads={self.threads})"


# Usage of kernel memory: the CPU drivers' is host memory, mappable; a GPU's is device-only.
_KERNEL_USAGE_HOST = rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING
_KERNEL_USAGE_GPU = rt.BufferUsage.DEFAULT
# Pinned host memory that staged transfers go through (cuMemHostAlloc on CUDA): write-combined
# for uploads (the host only writes it), cached for downloads (the host reads it).
_STAGING_UPLOAD = int(rt.MemoryType.HOST_LOCAL) | int(rt.MemoryType.DEVICE_VISIBLE)
_STAGING_DOWNLOAD = _STAGING_UPLOAD | int(rt.MemoryType.HOST_CACHED)
_STAGING_USAGE = int(rt.BufferUsage.TRANSFER) | int(rt.BufferUsage.MAPPING)


class StagingPool:
    """Host staging buffers of one memory type, lent for one transfer at a time and kept for
    the next of the same size (queue_copy copies whole buffers, so sizes are exact; repeated
    calls repeat their shapes), at most `keep_bytes` of them idle (beyond that a returned
    buffer is released).  Thread-safe."""

    def __init__(self, allocator, memory_type: int, keep_bytes: int = 64 << 20):
        self.allocator = allocator
        self.memory_type = memory_type
        self.keep_bytes = keep_bytes
        self.idle: dict = {}  # size -> [HalBuffer]
        self.idle_bytes = 0
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def lend(self, nbytes: int):
        """A buffer of `nbytes` bytes (at least 1) for the `with` block (mappable, a transfer
        source and target); returned to the pool when the block ends without an exception."""
        size = max(int(nbytes), 1)
        with self.lock:
            free = self.idle.get(size)
            buffer = free.pop() if free else None
            if buffer is not None:
                self.idle_bytes -= size
        if buffer is None:
            buffer = self.allocator.allocate_buffer(memory_type=self.memory_type, allowed_usage=_STAGING_USAGE,
                                                    allocation_size=size)
        yield buffer  # a transfer that raised may still use it: then it is not kept
        with self.lock:
            if self.idle_bytes + size <= self.keep_bytes:
                self.idle.setdefault(size, []).append(buffer)
                self.idle_bytes += size


def _vulkan_is_lavapipe() -> bool:
    """Whether IREE's default Vulkan device is Mesa's lavapipe (its first device: "llvmpipe ...")."""
    try:
        devices = rt.get_driver("vulkan").query_available_devices()
    except Exception:  # noqa: BLE001 - no driver: not lavapipe
        return False
    return bool(devices) and str(devices[0].get("name", "")).startswith("llvmpipe")


def _device_memory_is_cached_host_memory(allocator) -> bool:
    """Whether the device-only memory of `allocator` is host-visible and cached (one memory,
    as on lavapipe): there the host maps kernel memory, since a queued copy through staging
    memory costs more than it saves (lavapipe: 17 ms against 1.2 ms for 8 MiB up and down)."""
    probe = allocator.allocate_buffer(memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=_KERNEL_USAGE_GPU,
                                      allocation_size=1)
    wanted = int(rt.MemoryType.HOST_VISIBLE) | int(rt.MemoryType.HOST_CACHED)
    return int(probe.memory_type()) & wanted == wanted


_cuda_thread = threading.local()  # .context: the CUDA context this thread last made current


@functools.cache
def _libcuda():
    """NVIDIA's driver library (loaded once); OSError where there is none."""
    return ctypes.CDLL("libcuda.so.1")


def _current_cuda_context():
    """The calling thread's current CUDA context (a handle), or the primary context of device 0
    (which IREE's cuda driver and PyTorch share) when none is current; None without libcuda."""
    try:
        lib = _libcuda()
    except OSError:
        return None
    ctx = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value:
        return ctx.value
    dev = ctypes.c_int()
    if lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), 0) or lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev):
        return None
    return ctx.value


def _set_cuda_context(context):
    """Makes `context` current on this thread unless it already is (one ctypes call a thread)."""
    if getattr(_cuda_thread, "context", None) == context:
        return
    if _libcuda().cuCtxSetCurrent(ctypes.c_void_p(context)) == 0:  # else: IREE's own error follows
        _cuda_thread.context = context


_devices: dict = {}
_lock = threading.Lock()
_orphans: list = []  # devices inherited through fork(): never used nor destroyed in the child
_in_forked_child = False
_drivers_used: set = set()  # drivers this process asked IREE for (IREE caches them per process)
_drivers_of_parent: frozenset = frozenset()  # in a forked child: the parent's drivers


def _after_fork_in_child():
    """A forked child gets fresh devices: the task executor's worker threads do not survive
    fork(), so the parent's devices would hang on first use.  The inherited ones are kept
    (not destroyed) because tearing them down would wait for those threads too.  GPU
    drivers the parent used cannot be used at all (Device refuses them)."""
    global _devices, _lock, _in_forked_child, _drivers_of_parent
    _in_forked_child = True
    _drivers_of_parent = frozenset(_drivers_of_parent | _drivers_used)
    _orphans.append(_devices)
    _devices = {}
    _lock = threading.Lock()
    for hook in _fork_hooks:
        hook()


_fork_hooks: list = []


def on_fork_in_child(hook):
    """Registers `hook()` to run in a forked child after the device cache was reset."""
    _fork_hooks.append(hook)
    return hook


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def release_devices():
    """Forgets this process's own devices (runtime.kernels, at exit); a later get_device makes
    new ones.  Inherited devices (a forked child's orphans) are kept."""
    global _devices
    with _lock:
        _devices = {}


def get_device(name: str = "local-task") -> Device:
    """The shared Device for driver `name`; raises DeviceUnavailable when it cannot be created."""
    with _lock:
        dev = _devices.get(name)
        if dev is None:
            dev = _devices[name] = Device(name)
        return dev
