"""The aclnn two-phase API in Python, on IREE (names, parameter order and status codes as in CANN).

Porting a C snippet from the aclnn docs is line by line::

    status, stream = aclrtCreateStream("local-task")
    go = aclCreateTensor(grad_output)             # NumPy array -> device tensor
    ...
    status, ws_size, executor = aclnnGridSampler2DBackwardGetWorkspaceSize(
        go, inp, grid, 0, 0, False, aclCreateBoolArray([True, True]), dx, dgrid)
    workspace = None
    if ws_size > 0:
        status, workspace = aclrtMalloc(ws_size, stream)
    status = aclnnGridSampler2DBackward(workspace, ws_size, executor, stream)
    aclrtSynchronizeStream(stream)
    dx.numpy(), dgrid.numpy()

Phase 1 (`...GetWorkspaceSize`) checks the arguments in aclnn's order
(docs/status-codes.md#phase-1) and returns the first failing status, picks
the specialisation, loads its compiled module and binds the call into an
executor.  The workspace size is what the module's `<function>_transients_size`
reports for these very arguments.  Phase 2 enqueues the call on the stream
(IREE coarse-fences ABI) and returns without waiting; out tensors are written in
place.  No function here raises: failures return a status code and
`aclGetRecentErrMsg()` gives the calling thread's last message.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading

import iree.runtime as rt
import numpy as np

from . import errors as E
from ..compiler.compile import CompileError, CompilerMissing
from ..compiler.specs import FORMS
from ..compiler.targets import CpuArchError, target_for_driver
from .errors import AclnnError, brief
from ..ops import grid_sampler, grid_sampler_forward, upsample, upsample_forward
from ..runtime.device import DeviceUnavailable
from ..runtime.kernels import ModuleLoadError, load_module
from ..runtime.store import ArtifactMissing, UnsupportedCpu
from .validation import no_alias
from .tensors import (FORMATS, HOST_ALIGNMENT, Storage, aclBoolArray, aclIntArray, aclrtBuffer, aclrtStream,
                      aclTensor, data_address, empty_aligned, device_of, hal_element_type, host_storage, tensor_over,
                      view_over)

__all__ = [
    "aclGetRecentErrMsg", "aclCreateTensor", "aclDestroyTensor", "aclCreateIntArray", "aclDestroyIntArray",
    "aclCreateBoolArray", "aclDestroyBoolArray", "aclSetInputTensorAddr", "aclSetOutputTensorAddr",
    "aclrtCreateStream", "aclrtSynchronizeStream",
    "aclrtDestroyStream", "aclrtMalloc", "aclrtFree", "aclOpExecutor", "aclSetAclOpExecutorRepeatable",
    "aclDestroyAclOpExecutor", "aclnnGridSampler2DBackwardGetWorkspaceSize", "aclnnGridSampler2DBackward",
    "aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize", "aclnnUpsampleBilinear2dBackwardV2",
    "aclnnGridSampler2DGetWorkspaceSize", "aclnnGridSampler2D", "aclnnUpsampleBilinear2dGetWorkspaceSize",
    "aclnnUpsampleBilinear2d",
    "aclTensor", "aclIntArray", "aclBoolArray", "aclrtStream", "aclrtBuffer",
    "ACL_OPT_DETERMINISTIC", "ACLNN_IREE_OPT_FORM", "FORM_ENV", "KERNEL_FORMS", "current_form", "call_options",
    "scoped_form",
    "aclrtContext", "aclrtCreateContext", "aclrtSetCurrentContext",
    "aclrtGetCurrentContext", "aclrtDestroyContext", "aclrtCtxSetSysParamOpt", "aclrtCtxGetSysParamOpt",
]
# The status codes are part of this module's namespace too (aclnn.ACLNN_SUCCESS, ...).
globals().update({name: code for code, name in E.STATUS_NAMES.items()})
__all__ += list(E.STATUS_NAMES.values())

_tls = threading.local()


def aclGetRecentErrMsg() -> str:
    """The message of the calling thread's most recent failed call ("" if none)."""
    return getattr(_tls, "message", "")


def _set_error(message: str):
    _tls.message = message


def _captured(fn, args, kwargs, unexpected):
    """(True, fn's result), or (False, the status) with the message kept for
    aclGetRecentErrMsg: an AclnnError's own, or `unexpected(e)` (an AclnnError) for any other
    exception, which never escapes the aclnn layer."""
    try:
        return True, fn(*args, **kwargs)
    except AclnnError as e:
        err = e
    except Exception as e:
        err = unexpected(e)
    _set_error(str(err))
    return False, err.status


def _status_call(failure_extra=()):
    """Decorator: an AclnnError inside becomes (status, *failure_extra); any other exception
    becomes ACLNN_ERR_INNER.  The message is kept for aclGetRecentErrMsg."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            ok, value = _captured(fn, args, kwargs,
                                  lambda e: AclnnError(E.ACLNN_ERR_INNER, f"{type(e).__name__}: {e}"))
            if ok:
                return value
            return (value, *failure_extra) if failure_extra else value
        return inner
    return wrap


def _object_call(fn):
    """Decorator for the aclCreate* functions: None (C's nullptr) on failure, the message kept
    with its status (an unexpected exception is 161002: the arguments were not usable)."""
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        ok, value = _captured(fn, args, kwargs, lambda e: AclnnError(
            E.ACLNN_ERR_PARAM_INVALID, f"{fn.__name__}: {type(e).__name__}: {e}"))
        return value if ok else None
    return inner


# ----------------------------------------------------------------------------- objects
@_object_call
def aclCreateTensor(array=None, format: str = "ND", *, shape=None, dtype=None, device="local-task", stream=None):
    """Creates a device tensor (aclTensor) holding a copy of `array`.

    array: a NumPy array (any strides: a transposed or sliced view gives the
    same tensor as its contiguous copy) of float16, bfloat16
    (ml_dtypes.bfloat16), float32, float64 or an integer/bool dtype.  Or pass
    `shape=` and `dtype=` instead of `array` for a zero-filled tensor (an output).
    format: "ND", "NCHW" or "NHWC": how aclnn reads a 4-D tensor's dimensions
    (the array's own axis order is the view order).
    device: an IREE driver name, or `stream=` to use the stream's device.
    Returns the aclTensor, or None on failure (see aclGetRecentErrMsg).
    """
    if format not in FORMATS:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"format {brief(format)} is not one of {FORMATS}")
    dev = _device_arg("aclCreateTensor", stream if stream is not None else device)
    if array is None:
        if shape is None or dtype is None:
            raise AclnnError(E.ACLNN_ERR_PARAM_NULLPTR, "aclCreateTensor needs an array, or shape= and dtype=")
        shape, dtype = _shape_arg(shape), _dtype_arg(dtype)
    else:
        array = np.asarray(array)
        shape, dtype = array.shape, array.dtype
    try:
        hal_element_type(dtype)
    except KeyError:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateTensor: dtype {dtype} cannot be held") from None
    try:
        # The tensor owns its data, on a cache line of its own (see tensors.aligned).
        data = empty_aligned(shape, dtype)
    except MemoryError as e:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateTensor: shape {shape} {e}") from None
    data[...] = 0 if array is None else array
    return tensor_over(dev, data, format)


def _device_arg(caller: str, device):
    """The Device of a driver name, Device or live stream, as an aclnn status otherwise."""
    try:
        return device_of(device)
    except DeviceUnavailable as e:
        raise AclnnError(E.ACLNN_ERR_RUNTIME_ERROR, f"{caller}: {e}") from None
    except (TypeError, ValueError) as e:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"{caller}: {e}") from None


def _shape_arg(shape) -> tuple:
    """`shape` as a tuple of non-negative ints (bools, floats and strings are not sizes)."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateTensor: shape must be a sequence of ints, "
                                                    f"got {brief(shape)}") from None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) for d in dims):
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateTensor: shape {brief(shape)} is not all ints")
    dims = tuple(int(d) for d in dims)
    if any(d < 0 for d in dims):
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateTensor: shape {dims} has a negative dimension")
    return dims


def _dtype_arg(dtype) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateTensor: dtype {brief(dtype)}: {e}") from None


def aclDestroyTensor(tensor) -> int:
    """Releases a tensor; later use of it is an error status.  Returns ACLNN_SUCCESS or 161001."""
    return _destroy(tensor, aclTensor)


def _values_arg(caller: str, values) -> list:
    if values is None:
        raise AclnnError(E.ACLNN_ERR_PARAM_NULLPTR, f"{caller}: values is None")
    try:
        return list(values)
    except TypeError:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"{caller}: values must be a sequence, got {brief(values)}") from None


@_object_call
def aclCreateIntArray(values) -> aclIntArray:
    """An aclIntArray of int64 values (a list/tuple/1-D array of integers); None on failure
    (161001 for None, 161002 otherwise, with the message in aclGetRecentErrMsg)."""
    vals = _values_arg("aclCreateIntArray", values)
    for v in vals:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateIntArray: {brief(v)} is not an integer")
        if not -2**63 <= int(v) < 2**63:
            raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateIntArray: {v} does not fit in int64")
    return aclIntArray(vals)


def aclDestroyIntArray(array) -> int:
    """Releases an aclIntArray."""
    return _destroy(array, aclIntArray)


@_object_call
def aclCreateBoolArray(values) -> aclBoolArray:
    """An aclBoolArray (a list/tuple of bools); None on failure (161001 for None, 161002
    otherwise, with the message in aclGetRecentErrMsg)."""
    vals = _values_arg("aclCreateBoolArray", values)
    for v in vals:
        if not isinstance(v, (bool, np.bool_)):
            raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclCreateBoolArray: {brief(v)} is not a bool")
    return aclBoolArray(vals)


def aclDestroyBoolArray(array) -> int:
    """Releases an aclBoolArray."""
    return _destroy(array, aclBoolArray)


def _destroy(obj, cls) -> int:
    if not isinstance(obj, cls) or obj.destroyed:
        _set_error(f"ACLNN_ERR_PARAM_NULLPTR ({E.ACLNN_ERR_PARAM_NULLPTR}): not a live {cls.__name__}: {brief(obj)}")
        return E.ACLNN_ERR_PARAM_NULLPTR
    obj.destroyed = True
    if isinstance(obj, aclTensor):
        obj.buffer = obj.view = obj.host = None
    return E.ACLNN_SUCCESS


# ----------------------------------------------------------------------------- streams, memory
@_status_call(failure_extra=(None,))
def aclrtCreateStream(device="local-task"):
    """(status, aclrtStream) on the IREE device `device` ("local-task", "local-sync", "vulkan", "cuda").

    A missing driver or device is ACLNN_ERR_RUNTIME_ERROR with a message.
    """
    return E.ACLNN_SUCCESS, aclrtStream(_device_arg("aclrtCreateStream", device))


@_status_call()
def aclrtSynchronizeStream(stream) -> int:
    """Waits until all work enqueued on `stream` has finished."""
    _check_stream(stream)
    stream.synchronize()
    return E.ACLNN_SUCCESS


@_status_call()
def aclrtDestroyStream(stream) -> int:
    """Waits for the stream's work, then releases it."""
    _check_stream(stream)
    stream.synchronize()
    stream.destroyed = True
    return E.ACLNN_SUCCESS


@_status_call(failure_extra=(None,))
def aclrtMalloc(size, device="local-task"):
    """(status, aclrtBuffer) of `size` bytes on `device` (a driver name or a stream)."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"aclrtMalloc: size must be a non-negative int, got {brief(size)}")
    dev = _device_arg("aclrtMalloc", device)
    try:
        return E.ACLNN_SUCCESS, aclrtBuffer(dev, int(size))
    except Exception as e:  # the allocator's out-of-memory and size errors
        raise AclnnError(E.ACLNN_ERR_RUNTIME_ERROR,
                         f"aclrtMalloc: could not allocate {int(size)} bytes on {dev.name}: {e}") from None


@_status_call()
def aclrtFree(buffer) -> int:
    """Releases memory from aclrtMalloc."""
    if not isinstance(buffer, aclrtBuffer) or buffer.freed:
        raise AclnnError(E.ACLNN_ERR_PARAM_NULLPTR, f"aclrtFree: not a live aclrtBuffer: {brief(buffer)}")
    buffer.freed = True
    buffer.buffer = None
    return E.ACLNN_SUCCESS


def _check_stream(stream, device=None):
    if not isinstance(stream, aclrtStream):
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"stream must be an aclrtStream, got {type(stream).__name__}")
    if stream.destroyed:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, "stream was destroyed")
    _check_usable(stream.device)
    if device is not None and stream.device is not device:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID,
                         f"stream is on device {stream.device.name} but the executor's tensors are on {device.name}")


# ----------------------------------------------------------------------------- executors
class aclOpExecutor:
    """A bound call made by phase 1 (aclOpExecutor).

    Single use by default: phase 2 runs it once and releases it.  After
    aclSetAclOpExecutorRepeatable it runs any number of times until
    aclDestroyAclOpExecutor.  `workspace_size` is in bytes.  Thread-safe: phase 2
    checks and releases a single-use executor atomically, so of two threads racing
    to run it one succeeds and the other gets 561102.
    """

    def __init__(self, op: str, device, kernel=None, bound=(), workspace_size: int = 0, zero_fill=(), inputs=(),
                 outputs=()):
        self.op = op
        self.device = device
        self.kernel = kernel  # None: nothing to compute (empty tensors, all-False mask)
        self.bound = tuple(bound)  # the kernel's tensor arguments, in its order
        self.workspace_size = int(workspace_size)
        self.zero_fill = tuple(zero_fill)  # requested outputs to write as zeros (nothing contributes)
        # The tensors phase 1 took, in aclnn's order: what aclSet{Input,Output}TensorAddr index.
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        self.repeatable = False
        self.destroyed = False
        self.lock = threading.Lock()
        self.estimate = None  # the kernel's CallEstimate for these shapes, made on first launch
        self.launcher = None  # a Launcher of the kept executor (api._launcher)
        self.refresh()

    def refresh(self):
        """Takes what a launch touches from the bound tensors, now: a tensor destroyed (or
        refreshed to other memory) while the launch is queued then frees nothing the kernel
        reads or writes (CANN's aclTensor is a descriptor).  Under `lock` once shared."""
        self.tensors = self.bound + self.zero_fill  # every tensor bound, checked live in phase 2
        self.views = [t.view for t in self.bound]
        self.resources = (tuple(t.storage for t in self.tensors), tuple(self.views))
        self.fills = [(t.buffer, t.nbytes) for t in self.zero_fill]

    def _refuse_copy(self, *args):
        raise TypeError("an aclOpExecutor is the handle of one bound call (as in CANN) and cannot be copied "
                        "or pickled: a copy of a single-use executor would run it twice; call phase 1 again "
                        "for another")

    __copy__ = __deepcopy__ = __reduce_ex__ = __reduce__ = __getstate__ = _refuse_copy

    def __repr__(self):
        state = "destroyed" if self.destroyed else ("repeatable" if self.repeatable else "single-use")
        return f"aclOpExecutor({self.op}, {state}, workspace={self.workspace_size} bytes)"


@_status_call()
def aclSetAclOpExecutorRepeatable(executor) -> int:
    """Lets `executor` run many times; the caller then releases it with aclDestroyAclOpExecutor."""
    _check_type(executor)
    with executor.lock:
        _check_live(executor)
        executor.repeatable = True
    return E.ACLNN_SUCCESS


@_status_call()
def aclDestroyAclOpExecutor(executor) -> int:
    """Releases an executor; any later use of it is an error status.  Work it already
    enqueued still runs (the stream keeps what that work touches)."""
    _check_type(executor)
    with executor.lock:
        _check_live(executor)
        _release(executor)
    return E.ACLNN_SUCCESS


@_status_call()
def aclSetInputTensorAddr(executor, index, tensor, addr) -> int:
    """Points input `index` (aclnn's order of the op's input tensors, from 0) of `executor`
    at other memory, for a repeated phase 2 on new data without phase 1 (CANN's
    aclSetInputTensorAddr).  `tensor`: that very input aclTensor; `addr`: the new memory,
    an aclrtBuffer on the executor's device of at least the tensor's bytes, or on CPU
    devices a C-contiguous, writable, 16-byte aligned NumPy array of exactly its bytes
    (read as the tensor's dtype and shape, without a copy).  Launches already enqueued keep
    the memory they were given.  Returns ACLNN_SUCCESS; 561103 for a None executor or
    tensor; 161002 for an index out of range, a tensor that is not that input, or memory
    that does not fit; 561102 for a used-up or destroyed executor."""
    return _set_tensor_addr(executor, "input", index, tensor, addr)


@_status_call()
def aclSetOutputTensorAddr(executor, index, tensor, addr) -> int:
    """Points output `index` of `executor` at other memory (CANN's aclSetOutputTensorAddr;
    otherwise as aclSetInputTensorAddr)."""
    return _set_tensor_addr(executor, "output", index, tensor, addr)


def _set_tensor_addr(executor, kind, index, tensor, addr) -> int:
    _check_type(executor)
    if tensor is None:
        raise AclnnError(E.ACLNN_ERR_INNER_NULLPTR, "tensor is None")
    with executor.lock:
        _check_live(executor)
        tensors = executor.inputs if kind == "input" else executor.outputs
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(tensors):
            raise AclnnError(E.ACLNN_ERR_PARAM_INVALID,
                             f"index {brief(index)} is out of range: {executor.op} has {len(tensors)} {kind} tensors")
        if tensor is not tensors[int(index)]:
            raise AclnnError(E.ACLNN_ERR_PARAM_INVALID,
                             f"tensor is not {kind} {int(index)} of the executor (the aclTensor phase 1 took there)")
        if tensor.destroyed:
            raise AclnnError(E.ACLNN_ERR_PARAM_NULLPTR, f"{kind} {int(index)} was destroyed")
        before = Storage(tensor.buffer, tensor.view, tensor.host, tensor.shape, tensor.dtype, tensor.format)
        tensor.rebind(_addr_storage(executor.device, tensor, addr))
        try:  # what phase 1 refused (an output over an input or another output) stays refused
            no_alias([(f"output {i}", t) for i, t in enumerate(executor.outputs)],
                     [(f"input {i}", t) for i, t in enumerate(executor.inputs)])
        except AclnnError:
            tensor.rebind(before)
            raise
        executor.refresh()
    return E.ACLNN_SUCCESS


def _addr_storage(dev, tensor, addr) -> Storage:
    """The memory `addr` as storage for `tensor` (see aclSetInputTensorAddr)."""
    if isinstance(addr, aclrtBuffer):
        if addr.freed or addr.device is not dev or addr.size < tensor.nbytes:
            raise AclnnError(E.ACLNN_ERR_PARAM_INVALID,
                             f"addr must be a live aclrtBuffer on {dev.name} of at least {tensor.nbytes} bytes, "
                             f"got {brief(addr)}")
        return Storage(addr.buffer, view_over(addr.buffer, tensor.shape, tensor.dtype), None, tensor.shape,
                       tensor.dtype, tensor.format)
    if not isinstance(addr, np.ndarray):
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"addr must be an aclrtBuffer or (on CPU devices) a NumPy "
                                                    f"array, got {brief(addr)}")
    if not dev.is_host:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"addr must be device memory (an aclrtBuffer) on {dev.name}")
    if (not addr.flags.c_contiguous or not addr.flags.writeable or data_address(addr) % HOST_ALIGNMENT
            or addr.nbytes != tensor.nbytes):
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID,
                         f"addr must be a C-contiguous, writable, {HOST_ALIGNMENT}-byte aligned array of "
                         f"{tensor.nbytes} bytes, got {addr.nbytes} bytes, dtype {addr.dtype}, "
                         f"contiguous={addr.flags.c_contiguous}, writable={addr.flags.writeable}")
    data = addr.reshape(-1).view(np.uint8).view(tensor.dtype).reshape(tensor.shape)
    return host_storage(dev, data, tensor.format)


class Launcher:
    """A kept executor's kernel made ready to run again on `stream`, on new memory of the same
    shapes, dtypes and formats: what the Pythonic and torch layers' repeated calls run (they
    made the executor repeatable and keep it to one thread).  What aclSetInputTensorAddr and
    phase 2 check holds by construction there (the layer's own tensors, stream and
    workspace; a stale module is retired by kernels.generation), so `run` skips them and
    passes the call's buffer views straight to the kernel, never binding them to the
    executor's tensors (docs/performance.md#host-overhead)."""

    __slots__ = ("stream", "_timeline", "_sources", "_own", "_kernel", "_estimate", "_arity", "_placeholder")

    def __init__(self, executor, stream):
        order = executor.inputs + executor.outputs
        # Where each kernel argument comes from: the call's view at an index of `order`, or
        # (None) the executor's own tensor (the upsample's scales), whose view it keeps.
        slots = [next((i for i, t in enumerate(order) if t is b), None) for b in executor.bound]
        self._sources = tuple((i, b.view if i is None else None) for b, i in zip(executor.bound, slots))
        self._own = tuple(b.storage for b, (i, _) in zip(executor.bound, self._sources) if i is None)
        self._kernel = executor.kernel
        # The kernel's CallEstimate for these shapes (None until the first run), or False on a
        # synchronous device, whose launch returns when the work is done (nothing to sleep through).
        self._estimate = False if executor.device.synchronous else None
        self._arity = len(self._sources) + 3
        self._placeholder = executor.device.placeholder
        self.stream, self._timeline = stream, stream.timeline

    def run(self, views, workspace, keep):
        """Enqueues the kernel on `views` (the buffer views of the executor's inputs, then its
        outputs, in aclnn's order) and waits for it.  `workspace`: an aclrtBuffer of at
        least the executor's workspace size, or None when it needs none.  The stream keeps
        `keep` (what owns the views' memory), the workspace and the executor's own tensors
        until the launch has run.  Raises AclnnError: ACLNN_ERR_RUNTIME_ERROR when the
        launch cannot be queued, ACLNN_ERR_INNER when it failed on the device (as
        aclrtSynchronizeStream reports it)."""
        args = rt.VmVariantList(self._arity)
        push = args.push_ref
        for i, own in self._sources:
            push(own if i is None else views[i])
        push(self._placeholder if workspace is None else workspace.buffer)
        kernel, estimate = self._kernel, self._estimate
        if estimate is None:  # the first run: its shapes are this signature's
            estimate = self._estimate = kernel.estimate([own if i is None else views[i] for i, own in self._sources])

        def enqueue(wait, signal):
            return kernel.fenced_call(args, wait, signal)
        timeline = self._timeline
        try:
            if estimate is False:  # a synchronous device: the launch runs the work, nothing is kept
                done = timeline.run_synchronous(enqueue).wait
            else:
                timeline.submit(enqueue, keep=(keep, self._own, workspace), estimate=estimate)
                done = timeline.synchronize
        except AclnnError:  # a signal handler's call, failed in the middle of this one: its own status
            raise
        except Exception as e:
            raise AclnnError(E.ACLNN_ERR_RUNTIME_ERROR, f"launch failed: {e}") from None
        try:
            done()
        except Exception as e:
            raise AclnnError(E.ACLNN_ERR_INNER, f"{type(e).__name__}: {e}") from None


def unbind(executor):
    """Lets go of the memory of every tensor of `executor` (after its call has run), so that a
    kept executor holds no caller's array; phase 2 refuses it until it is bound again."""
    with executor.lock:
        for t in executor.inputs + executor.outputs:
            t.rebind(None)
        executor.views, executor.resources, executor.fills = [], (), []


def _release(executor):
    executor.destroyed = True
    executor.kernel = None
    executor.views = []
    executor.bound = executor.tensors = executor.zero_fill = executor.inputs = executor.outputs = ()
    executor.resources = ()
    executor.fills = []


def _check_type(executor, op=None):
    if executor is None:
        raise AclnnError(E.ACLNN_ERR_INNER_NULLPTR, "executor is None")
    if not isinstance(executor, aclOpExecutor):
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"executor must be an aclOpExecutor, got {type(executor).__name__}")
    if op is not None and executor.op != op:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"executor was made for {executor.op}, not {op}")


def _check_live(executor):
    """Under executor.lock: a used-up or destroyed executor is 561102."""
    if executor.destroyed:
        raise AclnnError(E.ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR,
                         "executor was already run (single use) or destroyed; call phase 1 again, or make it "
                         "repeatable with aclSetAclOpExecutorRepeatable")


def _workspace_buffer(workspace, workspaceSize, executor):
    """The device buffer to pass as the call's workspace, after aclnn's checks of it."""
    if isinstance(workspaceSize, bool) or not isinstance(workspaceSize, (int, np.integer)) or workspaceSize < 0:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"workspaceSize must be a non-negative int, got {brief(workspaceSize)}")
    need = executor.workspace_size
    if workspaceSize < need:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID,
                         f"workspaceSize {workspaceSize} is smaller than the {need} bytes phase 1 reported")
    if need == 0:
        return executor.device.placeholder
    if workspace is None:
        raise AclnnError(E.ACLNN_ERR_PARAM_NULLPTR, f"workspace is None but {need} bytes are needed")
    if not isinstance(workspace, aclrtBuffer) or workspace.freed:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"workspace must be a live aclrtBuffer, got {brief(workspace)}")
    if workspace.device is not executor.device:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID,
                         f"workspace is on {workspace.device.name}, the executor on {executor.device.name}")
    if workspace.size < need:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID,
                         f"workspace holds {workspace.size} bytes, fewer than the {need} bytes needed")
    return workspace.buffer


def _run(op, workspace, workspaceSize, executor, stream) -> int:
    """Phase 2 of either op: checks the executor, stream and workspace, then enqueues the call.

    Under the executor's lock, so a single-use executor is checked, launched and released
    by one thread only.  The stream keeps everything the call touches (the tensors'
    buffers and host arrays, the workspace, internal tables) until the call has run."""
    _check_type(executor, op)
    with executor.lock:
        _check_live(executor)
        _check_stream(stream, executor.device)
        for t in executor.tensors:
            if t.destroyed or t.buffer is None:
                raise AclnnError(E.ACLNN_ERR_PARAM_NULLPTR, f"a tensor bound by phase 1 was destroyed before "
                                                            f"phase 2, or has no memory: {brief(t)}")
        ws_buffer = _workspace_buffer(workspace, workspaceSize, executor)
        kernel, views, fills, dev = executor.kernel, executor.views, executor.fills, executor.device
        if kernel is not None:
            def enqueue(wait, signal):
                return kernel.launch_call(views, ws_buffer, wait, signal)
            estimate = _estimate(executor, kernel, views)
        else:
            def enqueue(wait, signal):
                return dev.fill_call(fills, wait, signal)
            estimate = None
        try:
            stream.submit(enqueue, keep=(executor.resources, ws_buffer, workspace), estimate=estimate)
        except Exception as e:
            raise AclnnError(E.ACLNN_ERR_RUNTIME_ERROR, f"launch failed: {e}") from None
        if not executor.repeatable:
            _release(executor)
    return E.ACLNN_SUCCESS


def _estimate(executor, kernel, views):
    """The kernel's CallEstimate for the executor's shapes, made once (rebinding keeps every
    tensor's shape, and asking the views for theirs cost ~4 us a launch); None on a
    synchronous device, whose launch returns when the work is done (nothing to sleep through)."""
    if executor.device.synchronous:
        return None
    if executor.estimate is None:
        executor.estimate = kernel.estimate(views)
    return executor.estimate


def _check_usable(device):
    """A device of this process (not inherited through fork()), else 361001."""
    try:
        device.check_usable()
    except DeviceUnavailable as e:
        raise AclnnError(E.ACLNN_ERR_RUNTIME_ERROR, str(e)) from None


def _phase1(build):
    """Shared phase-1 wrapper: returns (status, workspaceSize, executor)."""
    @functools.wraps(build)
    @_status_call(failure_extra=(0, None))
    def inner(*args, **kwargs):
        executor = build(*args, **kwargs)
        return E.ACLNN_SUCCESS, executor.workspace_size, executor
    return inner


def _load_kernel(device, spec, function_name):
    """The kernel of a specialisation on a device, with load failures as status codes."""
    try:
        return load_module(device, spec).kernel(function_name)
    except (ArtifactMissing, CompilerMissing, ModuleLoadError, UnsupportedCpu, CpuArchError) as e:
        raise AclnnError(E.ACLNN_ERR_INNER_FIND_KERNEL_ERROR, str(e)) from None
    except CompileError as e:
        raise AclnnError(E.ACLNN_ERR_INNER, f"compiling {spec.kernel_name} failed: {e.stderr.strip()[:2000]}") from None
    except DeviceUnavailable as e:
        raise AclnnError(E.ACLNN_ERR_RUNTIME_ERROR, str(e)) from None


def _executor(op: str, device, binding, inputs, outputs) -> aclOpExecutor:
    """The executor of an operator's Binding (aclnn_iree.ops): its kernel loaded and its
    workspace sized for these very tensors; no kernel for an all-zero or empty result.
    `inputs`, `outputs`: the aclTensors of the call in aclnn's order."""
    if binding.spec is None:
        return aclOpExecutor(op, device, zero_fill=binding.zero_fill, inputs=inputs, outputs=outputs)
    target = _target(device)
    if binding.spec.dtype not in target.dtypes:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"dtype {binding.spec.dtype} is not supported on {device.name} "
                                                     f"(the {target.name} target computes {', '.join(target.dtypes)})")
    form = _form(target)
    try:
        spec, function = binding.spec.in_form(form, binding.function)
    except ValueError as e:  # a form the operator does not have (yet)
        raise AclnnError(E.ACLNN_ERR_INNER_FIND_KERNEL_ERROR, f"{e}; ask for the tuned form") from None
    binding = dataclasses.replace(binding, spec=spec, function=function)
    budget = device.loop_budget
    serial = spec.serial_iterations(function, [t.shape for t in binding.tensors]) if budget is not None else 0
    if budget is not None and serial > budget:
        raise AclnnError(E.ACLNN_ERR_INNER_TILING_ERROR,
                         f"{function} runs its work serially in one invocation, and {device.name}'s driver (Mesa's "
                         f"lavapipe) stops an invocation after 65535 loop iterations: this call needs about {serial}; "
                         f"use the tuned form or a smaller call")
    kernel = _load_kernel(device, binding.spec, binding.function)
    ws = _workspace_size(kernel, [t.view for t in binding.tensors])
    return aclOpExecutor(op, device, kernel, binding.tensors, ws, inputs=inputs, outputs=outputs)


def _workspace_size(kernel, views) -> int:
    try:
        return kernel.workspace_size(views)
    except Exception as e:
        raise AclnnError(E.ACLNN_ERR_INNER_CREATE_EXECUTOR, f"workspace size query failed: {e}") from None


# ----------------------------------------------------------------------------- contexts
ACL_OPT_DETERMINISTIC = 0  # aclSysParamOpt: 1 = deterministic computation (aclnn's name and value)
# This package's own option, beside aclnn's (a value aclnn's aclSysParamOpt does not use): the
# kernel form phase 1 picks, an index into KERNEL_FORMS: 0 "tuned" (the hand-written kernels
# where they exist for the device's target, else linalg), 1 "linalg" (the linalg form, IREE's
# own code generation).  Unset in a context, it follows the environment variable FORM_ENV
# (read at each phase 1: "tuned", "linalg", or unset/empty for tuned).
ACLNN_IREE_OPT_FORM = 1000
KERNEL_FORMS = FORMS
FORM_ENV = "ACLNN_IREE_FORM"


class aclrtContext:
    """An aclrt context: the system options (aclSysParamOpt -> int64) that phase 1 reads.

    As in aclnn, a context is current per thread (aclrtSetCurrentContext); threads
    that never set one share the process's default context.
    """

    def __init__(self):
        self.options = {ACL_OPT_DETERMINISTIC: 0, ACLNN_IREE_OPT_FORM: None}  # None: from FORM_ENV
        self.destroyed = False

    def __repr__(self):
        form = self.options[ACLNN_IREE_OPT_FORM]
        return (f"aclrtContext(deterministic={self.options[ACL_OPT_DETERMINISTIC]}, "
                f"form={KERNEL_FORMS[form] if form is not None else 'from ' + FORM_ENV})")


_default_context = aclrtContext()
_ctx_tls = threading.local()


def current_context() -> aclrtContext:
    """The calling thread's current context: the default context unless one was set, or where
    the one set was destroyed since (by any thread: aclrtDestroyContext)."""
    ctx = getattr(_ctx_tls, "context", None)
    return _default_context if ctx is None or ctx.destroyed else ctx


@contextlib.contextmanager
def _scoped_option(opt, value):
    """Within the block, the calling thread's current context is a copy of it with option
    `opt` = `value` (None: the context as it is)."""
    if value is None:
        yield
        return
    ctx = aclrtContext()
    ctx.options.update(current_context().options)
    ctx.options[opt] = value
    prev = getattr(_ctx_tls, "context", None)
    _ctx_tls.context = ctx
    try:
        yield
    finally:
        _ctx_tls.context = prev


def scoped_determinism(deterministic):
    """Within the block, the calling thread's phase-1 calls see ACL_OPT_DETERMINISTIC =
    `deterministic` (None: leave the current context as it is).  For the Pythonic layer."""
    return _scoped_option(ACL_OPT_DETERMINISTIC, None if deterministic is None else int(bool(deterministic)))


# os.environ.get costs 0.6 us (it encodes the key and decodes the value), a tenth of a
# repeated tiny call's host time over IREE's; the POSIX mapping's own dict, which os.environ's
# setters and deleters keep up to date, answers the same in 0.05 us.  Another object put in
# os.environ's place is asked as a mapping.
_ENVIRON_TYPE = type(os.environ)
_FORM_ENV_KEY = (os.environ.encodekey(FORM_ENV)
                 if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict) else None)


def _form_env() -> str:
    env = os.environ
    if type(env) is _ENVIRON_TYPE and _FORM_ENV_KEY is not None:
        raw = env._data.get(_FORM_ENV_KEY)
        return "" if raw is None else env.decodevalue(raw)
    return env.get(FORM_ENV, "")


def current_form(context=None) -> str:
    """The kernel form phase 1 asks for ("tuned" or "linalg"): `context`'s (default: the
    calling thread's current context) ACLNN_IREE_OPT_FORM, else the environment variable
    ACLNN_IREE_FORM, else "tuned".  Raises AclnnError 161002 for another value of the variable."""
    value = (context or current_context()).options[ACLNN_IREE_OPT_FORM]
    if value is not None:
        return KERNEL_FORMS[value]
    env = _form_env()
    if not env:
        return "tuned"
    env = env.strip()
    if env in ("", *KERNEL_FORMS):
        return env or "tuned"
    raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"{FORM_ENV}={env[:100]!r} is not a kernel form; "
                                                 f"use one of {', '.join(KERNEL_FORMS)} or unset it")


def call_options() -> tuple:
    """(deterministic, form) of the calling thread's current context, as phase 1 reads them
    (ACL_OPT_DETERMINISTIC as a bool, current_form): what keys a layer's repeated call."""
    context = current_context()
    return bool(context.options[ACL_OPT_DETERMINISTIC]), current_form(context)


def _form(target) -> str:
    """The form of the kernels phase 1 loads for `target`: the linalg form where it is asked for
    (current_form) or where the target has no tuned forms."""
    form = current_form()
    return form if target.tuned else "linalg"


def scoped_form(form):
    """Within the block, the calling thread's phase-1 calls ask for the kernel form `form`
    ("tuned", "linalg"; None: leave the current context as it is).  For the Pythonic layer."""
    return _scoped_option(ACLNN_IREE_OPT_FORM, None if form is None else KERNEL_FORMS.index(form))


@_status_call(failure_extra=(None,))
def aclrtCreateContext(deviceId: int = 0):
    """(status, aclrtContext): a new context, made current for the calling thread (as in aclnn).

    deviceId is accepted for aclnn compatibility; devices are chosen per tensor/stream here.
    """
    ctx = aclrtContext()
    _ctx_tls.context = ctx
    return E.ACLNN_SUCCESS, ctx


@_status_call()
def aclrtSetCurrentContext(context) -> int:
    """Makes `context` the calling thread's current context; 161002 for a destroyed or non-context."""
    if not isinstance(context, aclrtContext) or context.destroyed:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"context must be a live aclrtContext, got {brief(context)}")
    _ctx_tls.context = context
    return E.ACLNN_SUCCESS


@_status_call(failure_extra=(None,))
def aclrtGetCurrentContext():
    """(status, the calling thread's current aclrtContext)."""
    return E.ACLNN_SUCCESS, current_context()


@_status_call()
def aclrtDestroyContext(context) -> int:
    """Destroys `context`; threads it was current on fall back to the default context."""
    if not isinstance(context, aclrtContext) or context is _default_context or context.destroyed:
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"cannot destroy {brief(context)}")
    context.destroyed = True
    if getattr(_ctx_tls, "context", None) is context:
        _ctx_tls.context = None
    return E.ACLNN_SUCCESS


def _check_opt(opt):
    if isinstance(opt, bool) or not isinstance(opt, (int, np.integer)) or opt not in (ACL_OPT_DETERMINISTIC,
                                                                                       ACLNN_IREE_OPT_FORM):
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"unknown aclSysParamOpt {brief(opt)}; known: ACL_OPT_DETERMINISTIC "
                                                     f"(0), ACLNN_IREE_OPT_FORM ({ACLNN_IREE_OPT_FORM})")


@_status_call()
def aclrtCtxSetSysParamOpt(opt, value) -> int:
    """Sets a system option of the current context, as aclnn's aclrtCtxSetSysParamOpt.

    ACL_OPT_DETERMINISTIC = 1: operators whose GPU kernels would add with float
    atomics (grid sampler dx) use an order-fixed form instead, so results are
    bitwise reproducible; 0 (default): the faster atomic form.  CPU kernels are
    always deterministic.
    ACLNN_IREE_OPT_FORM (this package's option): 0 the tuned kernels (the hand-written forms
    where the device's target has them, else linalg), 1 the linalg forms (IREE's own code
    generation); unset, the environment variable ACLNN_IREE_FORM decides (current_form).
    Applies to phase-1 calls made afterwards.  Returns ACLNN_SUCCESS, or 161002 for an
    unknown option or a value other than 0/1.
    """
    _check_opt(opt)
    name = "ACL_OPT_DETERMINISTIC" if opt == ACL_OPT_DETERMINISTIC else "ACLNN_IREE_OPT_FORM"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) not in (0, 1):
        raise AclnnError(E.ACLNN_ERR_PARAM_INVALID, f"{name} takes 0 or 1, got {brief(value)}")
    current_context().options[opt] = int(value)
    return E.ACLNN_SUCCESS


@_status_call(failure_extra=(None,))
def aclrtCtxGetSysParamOpt(opt):
    """(status, value) of a system option of the current context (ACLNN_IREE_OPT_FORM: the
    form's index in KERNEL_FORMS, from ACLNN_IREE_FORM where the context leaves it unset)."""
    _check_opt(opt)
    if opt == ACLNN_IREE_OPT_FORM:
        return E.ACLNN_SUCCESS, KERNEL_FORMS.index(current_form())
    return E.ACLNN_SUCCESS, current_context().options[opt]


# ----------------------------------------------------------------------------- grid sampler
@_phase1
def aclnnGridSampler2DBackwardGetWorkspaceSize(gradOutput, input, grid, interpolationMode, paddingMode,
                                                alignCorners, outputMask, inputGrad, gridGrad):
    """Phase 1 of aclnnGridSampler2DBackward: check, pick the kernel, report the workspace.

    gradOutput: (N, C, H_out, W_out); input: (N, C, H_in, W_in); grid:
    (N, H_out, W_out, 2), last dim (x, y) normalised to [-1, 1]; inputGrad and
    gridGrad: out tensors shaped like input and grid.  All one dtype: float16,
    bfloat16, float32 or float64.  interpolationMode 0 bilinear / 1 nearest /
    2 bicubic; paddingMode 0 zeros / 1 border / 2 reflection; alignCorners a
    bool; outputMask an aclBoolArray of 2: [write inputGrad, write gridGrad].
    Semantics: PyTorch 2.13 grid_sampler_2d_backward (docs/semantics.md#grid-sampler).
    Returns (status, workspaceSize in bytes, executor): 161001 for a None
    argument, 161002 for an invalid one (checked in aclnn's order), 561xxx when
    no kernel can be loaded.
    """
    mask = grid_sampler.check(gradOutput, input, grid, interpolationMode, paddingMode, alignCorners, outputMask,
                              inputGrad, gridGrad)
    dev = input.device
    _check_usable(dev)
    deterministic = bool(current_context().options[ACL_OPT_DETERMINISTIC])
    return _executor(grid_sampler.ACLNN_NAME, dev, grid_sampler.bind(
        gradOutput, input, grid, interpolationMode, paddingMode, alignCorners, mask, inputGrad, gridGrad,
        _target(dev), deterministic), (gradOutput, input, grid), (inputGrad, gridGrad))


def _target(dev):
    """The compile target of the device's modules; a bad ACLNN_IREE_CPU_ARCH is 561003."""
    try:
        return target_for_driver(dev.name)
    except CpuArchError as e:
        raise AclnnError(E.ACLNN_ERR_INNER_FIND_KERNEL_ERROR, str(e)) from None


@_status_call()
def aclnnGridSampler2DBackward(workspace, workspaceSize, executor, stream) -> int:
    """Phase 2: enqueues the executor's call on `stream` and returns without waiting.

    workspace: an aclrtBuffer of at least the phase-1 size on the executor's
    device (None when that size is 0).  Returns ACLNN_SUCCESS, or a status for
    a missing/too-small workspace (161001/161002), a used-up or destroyed
    executor (561102), a wrong stream (161002).
    """
    return _run(grid_sampler.ACLNN_NAME, workspace, workspaceSize, executor, stream)


# ----------------------------------------------------------------------------- upsample
@_phase1
def aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(gradOut, outputSize, inputSize, alignCorners,
                                                       scalesH, scalesW, out):
    """Phase 1 of aclnnUpsampleBilinear2dBackwardV2.

    gradOut: 4-D, format NCHW (N, C, H_out, W_out) or NHWC (N, H_out, W_out, C);
    outputSize: aclIntArray (H_out, W_out); inputSize: aclIntArray of 4, the
    grad-input sizes in gradOut's format order; alignCorners: bool; scalesH,
    scalesW: the forward's scale factors, <= 0 meaning not given (a given scale
    must satisfy H_out == floor(H_in * scalesH)); out: the grad-input tensor,
    same dtype and format as gradOut.  Dtypes float16, bfloat16, float32, float64.
    Semantics: PyTorch 2.13 upsample_bilinear2d_backward.  Returns (status,
    workspaceSize in bytes, executor).
    """
    layout, scales = upsample.check(gradOut, outputSize, inputSize, alignCorners, scalesH, scalesW, out)
    dev = gradOut.device
    _check_usable(dev)
    return _executor(upsample.ACLNN_NAME, dev, upsample.bind(gradOut, alignCorners, out, layout, scales), (gradOut,),
                     (out,))


@_status_call()
def aclnnUpsampleBilinear2dBackwardV2(workspace, workspaceSize, executor, stream) -> int:
    """Phase 2 of aclnnUpsampleBilinear2dBackwardV2 (same contract as aclnnGridSampler2DBackward)."""
    return _run(upsample.ACLNN_NAME, workspace, workspaceSize, executor, stream)


# ----------------------------------------------------------------------------- forward operators
@_phase1
def aclnnGridSampler2DGetWorkspaceSize(input, grid, interpolationMode, paddingMode, alignCorners, out):
    """Phase 1 of aclnnGridSampler2D (grid_sample's forward): check, pick the kernel, report the
    workspace.

    input: (N, C, H_in, W_in); grid: (N, H_out, W_out, 2), last dim (x, y) normalised to
    [-1, 1]; out: (N, C, H_out, W_out).  All one dtype: float16, bfloat16, float32 or float64
    (half types compute in float32).  interpolationMode 0 bilinear / 1 nearest / 2 bicubic;
    paddingMode 0 zeros / 1 border / 2 reflection; alignCorners a bool.  Semantics: PyTorch
    2.13 grid_sampler_2d.  Returns (status, workspaceSize in bytes, executor): 161001 for a
    None argument, 161002 for an invalid one (in aclnn's order), 561xxx when no kernel can be
    loaded.
    """
    grid_sampler_forward.check(input, grid, interpolationMode, paddingMode, alignCorners, out)
    dev = input.device
    _check_usable(dev)
    return _executor(grid_sampler_forward.ACLNN_NAME, dev, grid_sampler_forward.bind(
        input, grid, interpolationMode, paddingMode, alignCorners, out), (input, grid), (out,))


@_status_call()
def aclnnGridSampler2D(workspace, workspaceSize, executor, stream) -> int:
    """Phase 2 of aclnnGridSampler2D (same contract as aclnnGridSampler2DBackward)."""
    return _run(grid_sampler_forward.ACLNN_NAME, workspace, workspaceSize, executor, stream)


@_phase1
def aclnnUpsampleBilinear2dGetWorkspaceSize(self, outputSize, alignCorners, scalesH, scalesW, out):
    """Phase 1 of aclnnUpsampleBilinear2d (bilinear interpolate's forward).

    self: 4-D, format NCHW (N, C, H_in, W_in) or NHWC (N, H_in, W_in, C); outputSize:
    aclIntArray (H_out, W_out); alignCorners: bool; scalesH, scalesW: the scale factors, <= 0
    meaning not given (a given scale must satisfy H_out == floor(H_in * scalesH)); out: (N, C,
    H_out, W_out) in self's format and dtype.  Dtypes float16, bfloat16, float32, float64.
    Semantics: PyTorch 2.13 upsample_bilinear2d.  Returns (status, workspaceSize in bytes,
    executor).
    """
    layout, scales = upsample_forward.check(self, outputSize, alignCorners, scalesH, scalesW, out)
    dev = self.device
    _check_usable(dev)
    binding = upsample_forward.bind(self, alignCorners, out, layout, scales, _target(dev))
    return _executor(upsample_forward.ACLNN_NAME, dev, binding, (self,), (out,))


@_status_call()
def aclnnUpsampleBilinear2d(workspace, workspaceSize, executor, stream) -> int:
    """Phase 2 of aclnnUpsampleBilinear2d (same contract as aclnnGridSampler2DBackward)."""
    return _run(upsample_forward.ACLNN_NAME, workspace, workspaceSize, executor, stream)
