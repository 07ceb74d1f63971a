"""Our CUDA kernels launched on a CUDA stream of the caller's (PyTorch's), without IREE's runtime.

IREE's CUDA HAL launches a dispatch of a compiled module as one `cuLaunchKernel` of the
export's PTX function: block = the export's workgroup size, no dynamic shared memory, and one
kernel parameter per binding (its device address, in binding order) followed by one per push
constant (a 32-bit value, in ordinal order); IREE passes each through an 8-byte slot
(runtime/src/iree/hal/drivers/cuda/, its stream and graph command buffers).  The PTX a module
embeds (compiler.reflect.ptx_images) says the same for each entry: `.param .u64 .ptr` per
binding, `.param .b32` per constant, `.maxntid` the workgroup size.  This module reads that
(ptx_entries), packs arguments for an entry and checks them against it (pack), and launches
through the CUDA driver API, ctypes over libcuda (Driver), in the primary context that PyTorch
and IREE's CUDA HAL use too.  What to launch for a call (the dispatches of an exported
function, in its host function's order) is the caller's: aclnn_iree.torch._cuda.

Every dispatch of our GPU forms is a grid-stride loop over its work items whose bounds come
from the push constants (templates/_common.mlir.j2 gpu_loop), so the grid only has to be at
least one workgroup: `workgroups` sizes it as the export's count region does (gpu_count).

Loaded modules stay loaded for the process's life: a kernel queued on a stream may still run
from one.  Nothing here synchronises a stream.
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
import threading

__all__ = ["Entry", "ptx_entries", "pack", "Packed", "workgroups", "MAX_WORKGROUPS", "CudaError", "Driver", "driver",
           "Executable", "executable"]

# The most workgroups one dispatch of our GPU forms launches along x (templates/_common.mlir.j2
# max_workgroups: Vulkan's minimum limit; the grid-stride loops cover the rest).
MAX_WORKGROUPS = 65535

_ENTRY = re.compile(r"\.visible\s+\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)([^{]*)\{")
_PARAM = re.compile(r"\.param\s+\.(u64|b64|u32|b32|s32)\s+(?:\.ptr\s+(?:\.global\s+)?(?:\.align\s+(\d+)\s+)?)?"
                    r"([A-Za-z_$][\w$]*)")
_NTID = re.compile(r"\.(?:maxntid|reqntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One kernel of a module's PTX, as IREE's CUDA HAL launches it.

    name: the PTX function (the export's name); params: per kernel parameter, its alignment in
    bytes for a binding's address (a `.u64 .ptr` parameter) or 0 for a push constant (`.b32`),
    bindings first; block: the workgroup size (x, y, z) in threads, from `.maxntid`/`.reqntid`.
    """

    name: str
    params: tuple
    block: tuple

    @property
    def bindings(self) -> int:
        return sum(1 for p in self.params if p)

    @property
    def constants(self) -> int:
        return sum(1 for p in self.params if not p)


def ptx_entries(ptx: str) -> dict:
    """{name: Entry} of every kernel (`.visible .entry`) in a PTX text.  Raises ValueError for
    a kernel IREE's CUDA HAL could not launch the way `pack` packs: a parameter neither a
    pointer nor 32 bits, a pointer after a constant, or no workgroup size."""
    entries = {}
    for m in _ENTRY.finditer(ptx):
        name, plist, directives = m.groups()
        params = []
        for p in filter(None, (s.strip() for s in plist.split(","))):
            pm = _PARAM.fullmatch(p)
            if pm is None:
                raise ValueError(f"PTX kernel {name}: parameter {p!r} is neither a binding address nor a 32-bit constant")
            kind, align, _ = pm.groups()
            if kind in ("u64", "b64"):
                if params and not params[-1]:
                    raise ValueError(f"PTX kernel {name}: a binding address after a push constant ({p!r})")
                params.append(int(align or 8))
            else:
                params.append(0)
        nt = _NTID.search(directives)
        if nt is None:
            raise ValueError(f"PTX kernel {name} declares no workgroup size (.maxntid or .reqntid)")
        entries[name] = Entry(name, tuple(params), tuple(int(v or 1) for v in nt.groups()))
    return entries


def workgroups(work: int, block_x: int) -> int:
    """Workgroups along x for `work` items of `block_x` threads each: ceil(work / block_x),
    at least 1 and at most MAX_WORKGROUPS (templates/_common.mlir.j2 gpu_count)."""
    return max(1, min(-(-int(work) // block_x), MAX_WORKGROUPS))


class Packed:
    """Kernel parameters for cuLaunchKernel: `params` (void*[n], its kernelParams) points at
    one 8-byte slot per parameter (`slots`), a binding's address or a constant's 32
    bits, as IREE's CUDA HAL passes them.  Keep it alive until the launch call returns (the
    driver copies the values at launch)."""

    __slots__ = ("slots", "params")

    def __init__(self, values):
        n = len(values)
        self.slots = (ctypes.c_uint64 * n)(*values)
        base = ctypes.addressof(self.slots)
        self.params = (ctypes.c_void_p * n)(*(base + 8 * i for i in range(n)))


def pack(entry: Entry, addresses, constants) -> Packed:
    """The parameters of a launch of `entry`: `addresses` (device addresses, one per binding,
    in binding order; each a multiple of the binding's alignment) then `constants` (ints, one
    per push constant, in ordinal order; each in [-2**31, 2**32): a 32-bit value).  Raises
    ValueError where they do not match the entry."""
    addresses, constants = list(addresses), list(constants)
    if len(addresses) != entry.bindings or len(constants) != entry.constants:
        raise ValueError(f"kernel {entry.name} takes {entry.bindings} bindings and {entry.constants} push constants, "
                         f"not {len(addresses)} and {len(constants)}")
    values = []
    for i, (a, align) in enumerate(zip(addresses, entry.params)):
        a = int(a)
        if not 0 < a < 1 << 64 or a % align:
            raise ValueError(f"kernel {entry.name}: binding {i}'s address {a:#x} is not a device address aligned "
                             f"to {align} bytes")
        values.append(a)
    for i, c in enumerate(constants):
        c = int(c)
        if not -(1 << 31) <= c < 1 << 32:
            raise ValueError(f"kernel {entry.name}: push constant {i} ({c}) does not fit in 32 bits")
        values.append(c & 0xFFFFFFFF)
    return Packed(values)


class CudaError(RuntimeError):
    """A CUDA driver call failed (or libcuda is missing): names the call and CUDA's error."""


class Driver:
    """The few CUDA driver API calls the launch path makes, through ctypes over libcuda
    (`library`: its file name; default libcuda.so.1, which PyTorch's CUDA build loads).
    Raises CudaError when the library cannot be loaded or initialised."""

    def __init__(self, library: str = "libcuda.so.1"):
        try:
            lib = ctypes.CDLL(library)
        except OSError as e:
            raise CudaError(f"the CUDA driver library {library} cannot be loaded ({e}): no NVIDIA driver here") from None
        self._lib = lib
        P, U, I = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        for name, args in (("cuInit", [U]), ("cuDeviceGet", [ctypes.POINTER(I), I]),
                           ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(P), I]), ("cuCtxGetCurrent", [ctypes.POINTER(P)]),
                           ("cuCtxSetCurrent", [P]), ("cuModuleLoadData", [ctypes.POINTER(P), ctypes.c_char_p]),
                           ("cuModuleGetFunction", [ctypes.POINTER(P), P, ctypes.c_char_p]),
                           ("cuLaunchKernel", [P, U, U, U, U, U, U, U, P, P, P]),
                           ("cuGetErrorName", [I, ctypes.POINTER(ctypes.c_char_p)])):
            f = getattr(lib, name)
            f.argtypes, f.restype = args, I
        self._launch = lib.cuLaunchKernel
        self._contexts = {}
        self.check(lib.cuInit(0), "cuInit")

    def check(self, rc: int, call: str):
        if rc:
            name = ctypes.c_char_p()
            self._lib.cuGetErrorName(rc, ctypes.byref(name))
            raise CudaError(f"{call} failed: {(name.value or b'CUDA error').decode()} ({rc})")

    def enter(self, ordinal: int):
        """Makes device `ordinal`'s primary context (PyTorch's and IREE's) current on this thread;
        returns the context that was current before, for `leave` (the thread's current device,
        as the CUDA runtime and PyTorch see it, must not change under the caller)."""
        ctx = self._contexts.get(ordinal)
        if ctx is None:
            dev, c = ctypes.c_int(), ctypes.c_void_p()
            self.check(self._lib.cuDeviceGet(ctypes.byref(dev), ordinal), f"cuDeviceGet({ordinal})")
            self.check(self._lib.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev), "cuDevicePrimaryCtxRetain")
            ctx = self._contexts[ordinal] = c.value  # retained for the process's life
        current = ctypes.c_void_p()
        self.check(self._lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value != ctx:
            self.check(self._lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return current.value

    def leave(self, previous, ordinal: int):
        """Makes `previous` (what `enter(ordinal)` returned) current again where enter replaced it."""
        if previous != self._contexts[ordinal]:
            self.check(self._lib.cuCtxSetCurrent(previous), "cuCtxSetCurrent")

    def load(self, ptx: str, names) -> dict:
        """{name: CUfunction} of the kernels `names` of a PTX image, loaded (JIT-compiled by the
        driver for this GPU) into the current context, never unloaded."""
        module = ctypes.c_void_p()
        self.check(self._lib.cuModuleLoadData(ctypes.byref(module), ptx.encode() + b"\0"), "cuModuleLoadData")
        functions = {}
        for name in names:
            f = ctypes.c_void_p()
            self.check(self._lib.cuModuleGetFunction(ctypes.byref(f), module, name.encode()),
                       f"cuModuleGetFunction({name})")
            functions[name] = f.value
        return functions

    def launch(self, function: int, grid: tuple, block: tuple, stream: int, packed: Packed, name: str = "kernel"):
        """cuLaunchKernel on `stream` (a CUstream handle; 0 is the legacy default stream)."""
        rc = self._launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, stream,
                          packed.params, None)
        if rc:
            self.check(rc, f"cuLaunchKernel({name})")


_driver = None
_lock = threading.Lock()


def driver() -> Driver:
    """The process's Driver (made on first use).  Raises CudaError where there is no CUDA driver."""
    global _driver
    if _driver is None:
        with _lock:
            if _driver is None:
                _driver = Driver()
    return _driver


class Executable:
    """A CUDA module's kernels loaded on one device: `launch(name, work, addresses, constants,
    stream)` launches kernel `name` over `work` items.  Made by `executable`."""

    def __init__(self, drv: Driver, ordinal: int, images):
        self._driver, self.ordinal = drv, ordinal
        self.entries, self._functions = {}, {}
        previous = drv.enter(ordinal)
        try:
            for ptx in images:
                entries = ptx_entries(ptx)
                self.entries.update(entries)
                self._functions.update(drv.load(ptx, entries))
        finally:
            drv.leave(previous, ordinal)

    def launch(self, name: str, work: int, addresses, constants, stream: int):
        """cuLaunchKernel of kernel `name` over `work` items on `stream`, in the device's primary
        context (the thread's current context is put back after).  Raises KeyError for a kernel
        the module lacks, ValueError for arguments it does not take, CudaError."""
        entry = self.entries[name]
        packed = pack(entry, addresses, constants)
        previous = self._driver.enter(self.ordinal)
        try:
            self._driver.launch(self._functions[name], (workgroups(work, entry.block[0]), 1, 1), entry.block, stream,
                                packed, name)
        finally:
            self._driver.leave(previous, self.ordinal)


_executables = {}


def executable(key, ordinal: int, images) -> Executable:
    """The Executable of the PTX `images` (compiler.reflect.ptx_images of a module) on device
    `ordinal`, loaded once per process under `key` (the module's identity, e.g. its path and
    digest).  Raises CudaError, or ValueError for PTX the launch path cannot launch."""
    k = (key, ordinal)
    ex = _executables.get(k)
    if ex is None:
        drv = driver()
        with _lock:
            ex = _executables.get(k)
            if ex is None:
                ex = _executables[k] = Executable(drv, ordinal, images)
    return ex
