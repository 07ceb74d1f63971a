"""Loaded kernels: a compiled module on a device, and calls of its exported functions.

Every exported function uses IREE's coarse-fences ABI (asynchronous: wait and
signal fences after the arguments), takes its outputs as caller storage
(`iree.abi.output`) and its workspace as a caller-owned `!hal.buffer`
(`iree.abi.transients`); `<function>_transients_size` returns the workspace
size in bytes for the same arguments.
"""
from __future__ import annotations

import atexit
import gc
import hashlib
import threading

import iree.runtime as rt

from . import device as _device
from .device import Device, on_fork_in_child
from ..compiler.reflect import ptx_images
from .store import load_module_bytes

__all__ = ["Kernel", "LoadedModule", "CallEstimate", "ModuleLoadError", "load_module"]

_SHAPE_CACHE_ENTRIES = 4096  # values remembered per kernel by argument shapes (a bound, not an LRU)


def _remember(cache: dict, key, value):
    """cache[key] = value, clearing the cache first when it is full: shapes rarely vary that much."""
    if len(cache) >= _SHAPE_CACHE_ENTRIES:
        cache.clear()
    cache[key] = value


class CallEstimate:
    """The duration of recent calls of one kernel with one set of argument shapes.

    `seconds`: the fastest recent run (None before the first), which lets a CPU
    timeline sleep through most of a call instead of polling (runtime.timeline);
    `record(seconds)` notes an observed duration: a faster run replaces the estimate, a
    slower one moves it a quarter of the way, at most to twice the estimate (so a slow first
    run, a slower machine or one stalled call (the process stopped, swapped out, the GIL held
    elsewhere) never makes a timeline sleep past the end of a call for long: a 3 s stall of a
    0.5 ms call had later calls sleep 0.7 s, 0.5 s, ... for 3 s in all).
    """

    __slots__ = ("_table", "_key")

    def __init__(self, table: dict, key):
        self._table, self._key = table, key

    @property
    def seconds(self):
        return self._table.get(self._key)

    def record(self, seconds: float):
        old = self._table.get(self._key)
        _remember(self._table, self._key,
                  seconds if old is None or seconds < old else min(0.75 * old + 0.25 * seconds, 2 * old))


class ModuleLoadError(RuntimeError):
    """A module file passed the store's checks but IREE cannot load it: names the file."""


class LoadedModule:
    """One vmfb loaded into a VM context on one device (`path`: where it came from)."""

    def __init__(self, device: Device, spec, vmfb: bytes, target, path: str = "<bytes>"):
        self.device, self.spec, self.target, self.path = device, spec, target, path
        try:
            self.vm_module = rt.VmModule.copy_buffer(device.instance, vmfb)
            self.context = rt.VmContext(device.instance, modules=[device.hal_module, self.vm_module])
        except Exception as e:
            raise ModuleLoadError(f"cannot load module {path} ({spec.kernel_name}): {e}; delete it or run "
                                  "`aclnn-iree build` to rebuild it") from None
        self._kernels = {}
        # a CUDA module's bytes, for the torch layer's stream launch (cuda_image, on first use)
        self._vmfb = vmfb if target is not None and target.name == "cuda" else None
        self._cuda_image = None

    def cuda_image(self) -> tuple:
        """(identity, PTX texts) of a CUDA module for runtime.cuda.executable, read once: the
        identity is its path and sha256.  Raises ValueError for another target's module or PTX
        that does not frame as IREE writes it (compiler.reflect.ptx_images)."""
        if self._cuda_image is None:
            if self._vmfb is None:
                raise ValueError(f"module {self.path} is not a CUDA module")
            self._cuda_image = (self.path, hashlib.sha256(self._vmfb).hexdigest()), tuple(ptx_images(self._vmfb))
        return self._cuda_image

    def kernel(self, function_name: str) -> "Kernel":
        k = self._kernels.get(function_name)
        if k is None:
            try:
                k = self._kernels[function_name] = Kernel(self, function_name)
            except LookupError as e:  # another module in this one's place (its manifest entry forged)
                raise ModuleLoadError(f"module {self.path} ({self.spec.kernel_name}): {e}; delete it or run "
                                      "`aclnn-iree build` to rebuild it") from None
        return k


class Kernel:
    """An exported function of a loaded module and its `_transients_size` companion."""

    def __init__(self, module: LoadedModule, name: str):
        self.module, self.name = module, name
        self.function = module.vm_module.lookup_function(name)
        if self.function is None:
            raise LookupError(f"module {module.spec.kernel_name} exports no function {name}")
        self.size_function = module.vm_module.lookup_function(name + "_transients_size")
        refl = self.function.reflection
        const = refl.get("iree.abi.transients.size.constant")
        self.constant_workspace = int(const) if const is not None else None
        self._invoke = module.context.invoke
        self._sizes = {}  # argument shapes -> workspace bytes (a call of the companion each is ~40 us)
        self._seconds = {}  # argument shapes -> a recent duration of the call (see CallEstimate)

    def _args(self, views, workspace, wait, signal):
        args = rt.VmVariantList(len(views) + 3)
        for v in views:
            args.push_ref(v)
        args.push_ref(workspace)
        args.push_ref(wait)
        args.push_ref(signal)
        return args

    @staticmethod
    def _shape_key(views) -> tuple:
        return tuple(tuple(v.shape) for v in views)

    def estimate(self, views) -> "CallEstimate":
        """How long a call with these argument shapes took before (see CallEstimate)."""
        return CallEstimate(self._seconds, self._shape_key(views))

    def workspace_size(self, views) -> int:
        """Bytes of workspace the call with these buffer views needs, from the module itself
        (its `_transients_size` companion); remembered per argument shapes.  Besides the
        shapes it depends only on this kernel's device (the grid sampler counts its worker
        threads, which IREE fixes per process)."""
        if self.constant_workspace is not None:
            return self.constant_workspace
        key = self._shape_key(views)
        size = self._sizes.get(key)
        if size is None:
            size = self._query_workspace_size(views)
            _remember(self._sizes, key, size)
        return size

    def _query_workspace_size(self, views) -> int:
        dev = self.module.device
        sem = dev.hal.create_semaphore(0)
        signal = rt.HalFence.create_at(sem, 1)
        out = rt.VmVariantList(1)
        # The size depends on shapes only: invoke returns it synchronously (the companion
        # does not necessarily signal its fence, so it is not waited on).
        self.module.context.invoke(self.size_function,
                                   self._args(views, dev.placeholder, rt.HalFence.create_at(sem, 0), signal), out)
        return int(out.get_variant(0))

    def launch_call(self, views, workspace: rt.HalBuffer, wait: rt.HalFence, signal: rt.HalFence):
        """The call that enqueues this kernel on `views` (to start when `wait` is reached and
        signal `signal` when done; it returns at once), as (function, *arguments) for
        Timeline.submit, which makes it."""
        args = rt.VmVariantList(len(views) + 3)
        for v in views:
            args.push_ref(v)
        args.push_ref(workspace)
        return self.fenced_call(args, wait, signal)

    def fenced_call(self, args: rt.VmVariantList, wait: rt.HalFence, signal: rt.HalFence):
        """launch_call for `args` already holding the call's buffer views and workspace (a
        caller that keeps their order: aclnn.Launcher): appends the fences."""
        args.push_ref(wait)
        args.push_ref(signal)
        return self._invoke, self.function, args, rt.VmVariantList(4)

    def launch(self, views, workspace: rt.HalBuffer, wait: rt.HalFence, signal: rt.HalFence):
        """Enqueues the call now (launch_call, made here); returns at once.  Outside a
        Timeline nothing signals `signal` if this is interrupted: streams use submit()."""
        fn, *args = self.launch_call(views, workspace, wait, signal)
        fn(*args)


_modules: dict = {}
_lock = threading.Lock()
# Bumped whenever the loaded modules are forgotten: whoever keeps a Kernel between calls
# (the Pythonic layer's executors) compares it to know its kernel is still the loaded one.
generation = 0


@on_fork_in_child
def _forget_modules():
    """Modules loaded in the parent belong to its devices; a forked child loads its own."""
    global _modules, _lock, generation
    _modules = {}
    _lock = threading.Lock()
    generation += 1


def unload_modules():
    """Forgets every loaded module: the next call of each kernel loads it from the artifact
    store again (e.g. after the store changed).  Work already queued keeps its module."""
    global _modules, generation
    with _lock:
        _modules = {}
        generation += 1


@atexit.register
def _release_at_exit():
    """At interpreter exit (after the other threads were joined), drops the loaded modules and
    the devices while IREE's bindings can still free them.  Left to the interpreter's
    teardown, whatever keeps one of our modules alive past it (PyTorch's dispatcher holds our
    kernels' functions, and with them their modules) made nanobind print a report of leaked
    IREE objects at every exit of a process that used the torch layer.  A forked child's
    inherited devices stay as they are (destroying them would wait for threads it does not
    have)."""
    global _modules
    _modules = {}
    _device.release_devices()
    gc.collect()


def load_module(device: Device, spec) -> LoadedModule:
    """The module of `spec` loaded on `device` (resolved through the artifact store once, then cached)."""
    key = (device, spec)  # per Device object: two devices of one driver have separate VM instances
    with _lock:
        mod = _modules.get(key)
    if mod is not None:
        return mod
    vmfb, target, path = load_module_bytes(spec, device.name)
    mod = LoadedModule(device, spec, vmfb, target, path)
    with _lock:
        return _modules.setdefault(key, mod)
