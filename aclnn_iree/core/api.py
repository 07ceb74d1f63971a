"""The Pythonic layer: NumPy in, NumPy out, PyTorch's argument names and order.

Both functions are thin wrappers over the aclnn layer (aclnn_iree.aclnn): create
tensors, phase 1, allocate the workspace, phase 2, synchronize, read back; a
failing status becomes AclnnError.  So there is one code path for both layers.
"""
from __future__ import annotations

import collections
import collections.abc
import functools
import math
import re
import threading

import numpy as np

from . import aclnn as A
from ..runtime import kernels
from ..runtime.device import on_fork_in_child
from .errors import ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_PARAM_NULLPTR, ACLNN_SUCCESS, AclnnError
from .tensors import (HOST_ALIGNMENT, Storage, aclTensor, empty_aligned, host_storage, no_storage, read_back, storage_of,
                      view_over)
from ..ops import grid_sampler, grid_sampler_forward, upsample, upsample_forward
from ..ops.grid_sampler import INTERPOLATION_NAMES, PADDING_NAMES

__all__ = ["grid_sampler_2d_backward", "upsample_bilinear2d_backward", "grid_sampler_2d", "upsample_bilinear2d",
           "thread_stream", "current_determinism", "run_grid_sampler", "run_upsample", "run_grid_sampler_forward",
           "run_upsample_forward"]

_tls = threading.local()


@on_fork_in_child
def _forget_streams():
    """The parent's per-thread streams belong to its devices: a forked child makes new ones."""
    global _tls
    _tls = threading.local()


# Small calls run inline on the calling thread, on IREE's local-sync device, when
# local-task is asked for (Operator.call_device, with each operator's inline_work): the same
# compiled kernels and the same bits (tests/test_devices.py), without waking the task
# workers, which costs more than such a call computes (100-250 us each on a 2-core VM; more
# while PyTorch's OpenMP threads still spin).  PyTorch's parallel_for runs work under its
# grain size inline for the same reason.


def thread_stream(device: str):
    """This thread's stream on the IREE device `device` (created once per thread and device);
    raises AclnnError (361001) when the device is unavailable."""
    streams = getattr(_tls, "streams", None)
    if streams is None:
        streams = _tls.streams = {}
    s = streams.get(device)
    if s is None:
        status, s = A.aclrtCreateStream(device)
        _check(status)
        streams[device] = s
    return s


# The aclnn layer's messages name aclnn parameters; this layer speaks PyTorch's names.
_PYTORCH_NAMES = {
    "gradOutput": "grad_output", "gradOut": "grad_output", "inputGrad": "grad_input", "gridGrad": "grad_grid",
    "interpolationMode": "interpolation_mode", "paddingMode": "padding_mode", "alignCorners": "align_corners",
    "outputMask": "output_mask", "outputSize": "output_size", "inputSize": "input_size",
    "scalesH": "scales_h", "scalesW": "scales_w", "self": "input",
}
_NAME_RE = re.compile(r"\b(" + "|".join(_PYTORCH_NAMES) + r")\b")


def _check(status):
    if status != ACLNN_SUCCESS:
        msg = A.aclGetRecentErrMsg()
        # The message already carries the status name and code.
        msg = msg.split(": ", 1)[1] if ": " in msg else msg
        raise AclnnError(status, _NAME_RE.sub(lambda m: _PYTORCH_NAMES[m.group(1)], msg))


def _as_array(name, x) -> np.ndarray:
    if x is None:
        raise AclnnError(ACLNN_ERR_PARAM_NULLPTR, f"{name} is None")
    if isinstance(x, aclTensor):
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"{name}: pass a NumPy array here (aclTensor is for aclnn_iree.aclnn)")
    try:
        a = np.asarray(x)
    except Exception as e:
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"{name} is not an array: {e}") from None
    if a.dtype == object:
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"{name} is not a numeric array")
    if not a.dtype.isnative:  # e.g. big-endian '>f4': the same values in this machine's byte order
        a = a.astype(a.dtype.newbyteorder("="))
    return a


_SUPPORTED = "supported: float16, bfloat16, float32, float64"


def _host_storage(dev, name, array, fmt="ND") -> Storage:
    """Device memory holding `array` (no copy on CPU devices when it is aligned, contiguous and
    writable: IREE imports only writable memory, so a read-only array is copied)."""
    try:
        flags = array.flags  # made anew on each access
        if not flags.writeable:
            array = np.array(array, order="C")
        elif not flags.c_contiguous:
            # np.ascontiguousarray would turn a 0-d array into shape (1,): a 0-d array is contiguous.
            array = np.ascontiguousarray(array)
        return host_storage(dev, array, fmt)
    except KeyError:
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"{name} has dtype {array.dtype}; {_SUPPORTED}") from None
    except MemoryError:
        raise AclnnError(ACLNN_ERR_PARAM_INVALID,
                         f"{name} of shape {array.shape} needs a contiguous copy of {array.nbytes} bytes, "
                         "which cannot be allocated") from None


# Host outputs of at least this many bytes start on a 64-byte cache line (_output_storage).
_LINE_ALIGNED_BYTES = 1 << 16


def _output_storage(dev, name, shape, dtype, fmt="ND") -> Storage:
    """Uninitialised memory for an output: imported host memory on CPU devices, device memory
    on others (read back after the call)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(map(int, shape)) * dtype.itemsize
    try:
        if dev.is_host:
            # Large outputs start on a cache line (the kernels store them non-temporally where
            # aligned); small ones need only the bindings' alignment, which NumPy's own
            # allocation usually has (saving 2 us of over-allocation and slicing).
            align = 64 if nbytes >= _LINE_ALIGNED_BYTES else HOST_ALIGNMENT
            return storage_of(dev, empty_aligned(shape, dtype, align), fmt)
        buf = dev.allocate(nbytes)
        return Storage(buf, view_over(buf, shape, dtype), None, tuple(shape), dtype, fmt)
    except KeyError:
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"dtype {dtype} is not supported; {_SUPPORTED}") from None
    except MemoryError as e:
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"{name} of shape {tuple(shape)} {e}") from None
    except RuntimeError as e:  # a device allocator's out-of-memory
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"{name} of shape {tuple(shape)} cannot be allocated on "
                                                  f"{dev.name}: {e}") from None


def _output_mask(output_mask) -> list:
    """output_mask as two bools; anything else is an AclnnError (PyTorch's bool[2])."""
    if output_mask is None:
        raise AclnnError(ACLNN_ERR_PARAM_NULLPTR, "output_mask is None")
    if isinstance(output_mask, (str, bytes)) or not hasattr(output_mask, "__len__"):
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"output_mask must be two bools, got {output_mask!r}")
    values = list(output_mask)
    if len(values) != 2 or not all(isinstance(v, (bool, np.bool_)) for v in values):
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"output_mask must be two bools, got {output_mask!r}")
    return [bool(v) for v in values]


def _mode(name, value, names: dict) -> int:
    if isinstance(value, str):
        codes = {v: k for k, v in names.items()}
        if value not in codes:
            raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"{name} {value!r} is not one of {list(codes)}")
        return codes[value]
    return value


def _workspace(stream, ws_size):
    """This thread's workspace on the stream's device, grown to `ws_size` bytes when needed.

    Kept between calls: a fresh multi-megabyte allocation would cost its page faults on
    every call.  Safe because every call synchronizes its stream before returning."""
    cache = getattr(_tls, "workspaces", None)
    if cache is None:
        cache = _tls.workspaces = {}
    ws = cache.get(stream.device)
    if ws is None or ws.size < ws_size:
        st, ws = A.aclrtMalloc(ws_size, stream)
        _check(st)
        cache[stream.device] = ws
    return ws


# Executors kept per thread (the aclnn way to skip phase 1: a repeatable executor whose
# tensors are pointed at each call's memory, as aclSetInputTensorAddr does).
_EXECUTORS_PER_THREAD = 64


def _cached_executor(key):
    """This thread's repeatable executor for the call signature `key`, or None (also when
    the modules were unloaded since it was made: runtime.kernels.unload_modules)."""
    cache = getattr(_tls, "executors", None)
    if cache is None:
        cache = _tls.executors = collections.OrderedDict()
    entry = cache.get(key)
    if entry is None:
        return None
    if entry[0] != kernels.generation:
        del cache[key]
        A.aclDestroyAclOpExecutor(entry[1])
        return None
    cache.move_to_end(key)
    return entry[1]


def _remember_executor(key, ex):
    cache = _tls.executors
    cache[key] = (kernels.generation, ex)
    while len(cache) > _EXECUTORS_PER_THREAD:
        _, (_, old) = cache.popitem(last=False)
        A.aclDestroyAclOpExecutor(old)


def _signature(*parts):
    """The call signature that keys the kept executors, or None where a part cannot be hashed
    (an argument phase 1 refuses: the call goes through phase 1, which says what is wrong;
    also where its __hash__ raises something else than TypeError)."""
    try:
        hash(parts)
    except Exception:
        return None
    return parts


def _typed(values) -> tuple:
    """Call-signature entries that tell True from 1 and 2.0 from 2 (phase 1 checks types):
    the values and their types, as two tuples (built in C: a third of the time of pairs)."""
    values = tuple(values)
    return values, tuple(map(type, values))


def _run(stream, key, storages, phase1, phase2, read, kept=None):
    """Runs one call: phase 1 and phase 2, or this thread's executor from an earlier call
    with the same signature `key` (phase 1 is a function of it alone) launched on this
    call's memory (aclnn.Launcher); then waits for it.

    storages: the call's tensors in aclnn's order (inputs, then outputs), as
    tensors.Storage (a masked-out output without memory: no_storage).  phase1(tensors)
    returns (status, workspaceSize, executor); read(output Storage, device) takes a result once
    the call has run.  key None: not cached.  kept(run, ex): called, when the call's executor `ex` is
    kept, with `run(views, keep)`, which launches it again on other memory of the same
    signature (views in aclnn's order; `keep` owns their memory) and waits (the torch
    layer's per-signature plans).  Raises AclnnError.
    """
    ex = _cached_executor(key) if key is not None else None
    if ex is None:
        ex = _phase1(stream.device, storages, phase1)
        if key is not None and ex.kernel is not None:  # an empty call is not worth keeping
            _check(A.aclSetAclOpExecutorRepeatable(ex))
            _remember_executor(key, ex)
        else:  # a single-use executor: phase 2 runs it
            outputs = storages[len(ex.inputs):]  # before its run releases it
            try:
                workspace = _workspace(stream, ex.workspace_size) if ex.workspace_size > 0 else None
                _check(phase2(workspace, ex.workspace_size, ex, stream))
                _check(A.aclrtSynchronizeStream(stream))
                return [read(s, stream.device) if s.buffer is not None else None for s in outputs]
            except AclnnError:
                _forget_failed_stream(stream)
                raise
        A.unbind(ex)  # a kept executor holds none of the caller's memory: the Launcher passes it
    run = _launcher(ex, stream)
    run([s.view for s in storages], storages)
    if kept is not None:
        kept(run, ex)
    return [read(s, stream.device) if s.buffer is not None else None for s in storages[len(ex.inputs):]]


def _launcher(ex, stream):
    """run(views, keep) for the kept executor `ex` on `stream`: its aclnn.Launcher with this
    thread's workspace; a launch failure also forgets the stream (_forget_failed_stream)."""
    launcher = ex.launcher
    if launcher is None or launcher.stream is not stream:
        launcher = ex.launcher = A.Launcher(ex, stream)
    size, launch = ex.workspace_size, launcher.run

    def run(views, keep):
        try:
            launch(views, _workspace(stream, size) if size > 0 else None, keep)
        except AclnnError:
            _forget_failed_stream(stream)
            raise
    return run


def _forget_failed_stream(stream):
    """A launch that failed on the device fails the stream's timeline for good (as a CANN
    stream's error is sticky); the layers own their per-thread streams, so the next call
    gets a fresh one instead of the same error forever."""
    try:
        stream.timeline.completed()
        return  # the stream is fine: the failure was the call's own (e.g. an argument)
    except Exception:
        pass
    streams = getattr(_tls, "streams", {})
    for name, s in list(streams.items()):
        if s is stream:
            del streams[name]


def _phase1(dev, storages, phase1):
    try:
        tensors = [aclTensor.over(dev, s) for s in storages]
    except KeyError:
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"dtype {storages[0].dtype} is not supported; {_SUPPORTED}") from None
    status, _, ex = phase1(tensors)
    _check(status)
    return ex


def _result(storage, device):
    """An output as an array: the host memory the kernel wrote on CPU devices, else a copy."""
    return storage.host if storage.host is not None else read_back(storage, device)


def current_determinism() -> bool:
    """The current context's ACL_OPT_DETERMINISTIC (aclnn.aclrtCtxSetSysParamOpt), as a bool."""
    return bool(A.current_context().options[A.ACL_OPT_DETERMINISTIC])


def run_grid_sampler(stream, storages, interpolation_mode, padding_mode, align_corners, output_mask,
                     deterministic=None, read=_result, kept=None, form=None):
    """aclnnGridSampler2DBackward on `storages` (grad_output, input, grid, grad_input,
    grad_grid; a masked-out output as no_storage), waiting for the result; returns
    [read(grad_input Storage, device) or None, read(grad_grid Storage, device) or None].

    The Pythonic and torch layers share it.  kept: see _run.  Raises AclnnError.
    """
    if deterministic is None:
        deterministic = current_determinism()
    form = form or A.current_form()
    key = _signature(grid_sampler.OPERATOR.name, stream.device, *((s.shape, s.dtype, s.fmt) for s in storages), *_typed(
        (interpolation_mode, padding_mode, align_corners, deterministic)), tuple(output_mask), form)

    def phase1(t):
        with A.scoped_determinism(deterministic), A.scoped_form(form):
            return A.aclnnGridSampler2DBackwardGetWorkspaceSize(
                t[0], t[1], t[2], interpolation_mode, padding_mode, align_corners,
                A.aclCreateBoolArray(list(output_mask)), t[3], t[4])
    return _run(stream, key, storages, phase1, A.aclnnGridSampler2DBackward, read, kept)


def run_upsample(stream, storages, output_size, input_size, align_corners, scales_h, scales_w, read=_result,
                 kept=None, form=None):
    """aclnnUpsampleBilinear2dBackwardV2 on `storages` (grad_output, grad_input; scales None:
    not given), waiting for the result; returns [read(grad_input Storage, device)].  Raises AclnnError."""
    try:
        sizes = (_typed(output_size), _typed(input_size))
    except TypeError:  # not sequences: phase 1 says what is wrong
        sizes = ([],)
    form = form or A.current_form()
    key = _signature(upsample.OPERATOR.name, stream.device, *((s.shape, s.dtype, s.fmt) for s in storages), *sizes,
                     *_typed((align_corners, scales_h, scales_w)), form)

    def phase1(t):
        osz, isz = _int_array("output_size", output_size), _int_array("input_size", input_size)
        with A.scoped_form(form):
            return A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
                t[0], osz, isz, align_corners, -1.0 if scales_h is None else scales_h,
                -1.0 if scales_w is None else scales_w, t[1])
    return _run(stream, key, storages, phase1, A.aclnnUpsampleBilinear2dBackwardV2, read, kept)


def run_grid_sampler_forward(stream, storages, interpolation_mode, padding_mode, align_corners, read=_result,
                             kept=None, form=None):
    """aclnnGridSampler2D on `storages` (input, grid, output), waiting for the result; returns
    [read(output Storage, device)].  Raises AclnnError."""
    form = form or A.current_form()
    key = _signature(grid_sampler_forward.OPERATOR.name, stream.device, *((s.shape, s.dtype, s.fmt) for s in storages),
                     *_typed((interpolation_mode, padding_mode, align_corners)), form)

    def phase1(t):
        with A.scoped_form(form):
            return A.aclnnGridSampler2DGetWorkspaceSize(t[0], t[1], interpolation_mode, padding_mode, align_corners,
                                                        t[2])
    return _run(stream, key, storages, phase1, A.aclnnGridSampler2D, read, kept)


def run_upsample_forward(stream, storages, output_size, align_corners, scales_h, scales_w, read=_result, kept=None,
                         form=None):
    """aclnnUpsampleBilinear2d on `storages` (input, output; scales None: not given), waiting for
    the result; returns [read(output Storage, device)].  Raises AclnnError."""
    try:
        size = (_typed(output_size),)
    except TypeError:  # not a sequence: phase 1 says what is wrong
        size = ([],)
    form = form or A.current_form()
    key = _signature(upsample_forward.OPERATOR.name, stream.device, *((s.shape, s.dtype, s.fmt) for s in storages),
                     *size, *_typed((align_corners, scales_h, scales_w)), form)

    def phase1(t):
        with A.scoped_form(form):
            return A.aclnnUpsampleBilinear2dGetWorkspaceSize(
                t[0], _int_array("output_size", output_size), align_corners, -1.0 if scales_h is None else scales_h,
                -1.0 if scales_w is None else scales_w, t[1])
    return _run(stream, key, storages, phase1, A.aclnnUpsampleBilinear2d, read, kept)


def _form_arg(form):
    """The Pythonic functions' `form`: None or "tuned" (the hand-written kernels where the
    device's target has them, else the linalg form), "linalg" (the linalg form: IREE's own code
    generation; docs/kernel-design.md#forms); None follows the current context
    (aclnn.current_form: ACLNN_IREE_OPT_FORM, else ACLNN_IREE_FORM).  Raises AclnnError 161002."""
    if form is None or (isinstance(form, str) and form in A.KERNEL_FORMS):
        return form
    raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"form must be None, {' or '.join(map(repr, A.KERNEL_FORMS))}, got "
                                              f"{type(form).__name__} {form!r}"[:200])


def _int_values(name, values) -> tuple:
    """The values of _int_array(name, values), remembered per typed value tuple (making an
    aclIntArray costs ~10 us; sizes repeat from call to call)."""
    try:
        return _checked_int_values(name, _typed(values))
    except TypeError:  # not a sequence of hashables: _int_array says what is wrong
        return _int_array(name, values).values


@functools.lru_cache(maxsize=1024)
def _checked_int_values(name, typed: tuple) -> tuple:
    return _int_array(name, list(typed[0])).values


def _int_array(name, values):
    if values is None:
        raise AclnnError(ACLNN_ERR_PARAM_NULLPTR, f"{name} is None")
    arr = A.aclCreateIntArray(values)
    if arr is None:  # the message already carries the status: keep only its text
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"{name}: {A.aclGetRecentErrMsg().split(': ', 1)[-1]}")
    return arr


def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode=0, padding_mode=0, align_corners=False,
                             output_mask=(True, True), *, device: str = "local-task", deterministic=None, form=None):
    """Gradients of grid_sample w.r.t. input and grid (torch.ops.aten.grid_sampler_2d_backward).

    grad_output: (N, C, H_out, W_out); input: (N, C, H_in, W_in); grid:
    (N, H_out, W_out, 2), last dim (x, y) in [-1, 1] (values outside are
    padded); all NumPy arrays of one dtype: float16, ml_dtypes.bfloat16,
    float32 or float64 (half types compute in float32).  interpolation_mode:
    0/"bilinear", 1/"nearest", 2/"bicubic"; padding_mode: 0/"zeros",
    1/"border", 2/"reflection"; align_corners as in PyTorch.  output_mask:
    (compute grad_input, compute grad_grid).
    Returns (grad_input or None, grad_grid or None), shaped like input and grid.
    Raises AclnnError (a ValueError) with .status 161001 for a None argument,
    161002 for an invalid one.  Runs on the IREE device `device` ("local-task",
    "local-sync", "vulkan", "cuda").  deterministic: True for bitwise
    reproducible results on GPUs (an order-fixed grad_input instead of float
    atomics), False for the atomic form, None (default) for the current
    context's ACL_OPT_DETERMINISTIC (see aclnn.aclrtCtxSetSysParamOpt); CPU
    devices are always deterministic.
    Semantics: PyTorch 2.13 CPU (docs/semantics.md).

    Formulation (templates/grid_sampler_2d_backward/): grad_input is a
    scatter-add, computed by workgroups that each own a block of 8 (c, n)
    planes and add the contributions in a fixed order (parallel and
    deterministic; IREE's scatter op would run serially); grad_grid is a gather
    over C, fused into the same pass when both outputs are asked for.
    """
    if deterministic is not None and not isinstance(deterministic, (bool, np.bool_)):
        raise AclnnError(ACLNN_ERR_PARAM_INVALID,
                         f"deterministic must be True, False or None, got {type(deterministic).__name__} "
                         f"{deterministic!r}"[:200])
    form = _form_arg(form)
    go, x, g = _as_array("grad_output", grad_output), _as_array("input", input), _as_array("grid", grid)
    mask = _output_mask(output_mask)
    interpolation_mode = _mode("interpolation_mode", interpolation_mode, INTERPOLATION_NAMES)
    padding_mode = _mode("padding_mode", padding_mode, PADDING_NAMES)
    N, C = x.shape[:2] if x.ndim == 4 else (0, 0)
    work = N * C * (math.prod(g.shape[1:3]) if g.ndim == 4 else 0) + x.size
    stream = thread_stream(grid_sampler.OPERATOR.call_device(device, work, grid_sampler.call_kind(interpolation_mode)))
    dev = stream.device
    # The kernels write every element of a requested output (and the empty-input path
    # zero-fills it), so outputs start uninitialised.  A masked-out output still needs a
    # tensor of the right shape (aclnn requires both); on CPU devices it is never touched.
    storages = [_host_storage(dev, n, a) for n, a in (("grad_output", go), ("input", x), ("grid", g))]
    storages += [(_output_storage(dev, name, a.shape, a.dtype) if m else no_storage(a.shape, a.dtype))
                 for name, a, m in (("grad_input", x, mask[0]), ("grad_grid", g, mask[1]))]
    return tuple(run_grid_sampler(stream, storages, interpolation_mode, padding_mode, align_corners, mask,
                                  deterministic, form=form))


def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners=False, scales_h=None,
                                 scales_w=None, *, memory_format: str = "NCHW", device: str = "local-task", form=None):
    """Gradient of bilinear 2-D upsampling (torch.ops.aten.upsample_bilinear2d_backward; aclnn V2).

    grad_output: NCHW (N, C, H_out, W_out), or with memory_format="NHWC"
    (N, H_out, W_out, C); output_size: (H_out, W_out); input_size: (N, C,
    H_in, W_in), or (N, H_in, W_in, C) for NHWC; align_corners as in PyTorch;
    scales_h/scales_w: the forward's scale factors or None (a given scale must
    satisfy H_out == floor(H_in * scales_h)).  dtypes float16,
    ml_dtypes.bfloat16, float32, float64.  Returns grad_input shaped
    input_size, in the same layout.  Raises AclnnError (.status 161001 / 161002).

    Formulation (templates/upsample_bilinear2d_backward/): a gather, not a
    scatter-add.  The forward's weights are separable, so a small dispatch per
    axis tabulates for each input index the window of output positions whose
    taps land on it (with PyTorch's own float expressions), and each grad_input
    pixel sums its 2-D window separably, H pass or W pass first, whichever costs
    fewer taps for these sizes: O(N*C*(H_out*W_out + H_in*W_in)) work for every
    pair of ratios, no intermediate tensor on CPUs, deterministic, vectorised
    over C (NHWC) or W (NCHW).
    A dense interpolation-matrix product would cost O(H_out*H_in) per column and
    a scatter-add runs serially in IREE.
    """
    form = _form_arg(form)
    go = _as_array("grad_output", grad_output)
    for name, v in (("output_size", output_size), ("input_size", input_size)):
        if v is None:
            raise AclnnError(ACLNN_ERR_PARAM_NULLPTR, f"{name} is None")
    # An iterator's values, read once: every later check reads the sizes again.
    output_size, input_size = (tuple(v) if isinstance(v, collections.abc.Iterator) else v
                               for v in (output_size, input_size))
    if memory_format not in ("NCHW", "NHWC"):
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"memory_format must be 'NCHW' or 'NHWC', got {memory_format!r}")
    isz = _int_values("input_size", input_size)
    _int_values("output_size", output_size)
    if len(isz) == 4 and any(v < 0 for v in isz):
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"input_size has a negative entry: {isz}")
    out_shape = isz if len(isz) == 4 else (0, 0, 0, 0)
    stream = thread_stream(upsample.OPERATOR.call_device(device, go.size + math.prod(out_shape),
                                                         upsample.call_kind(go.shape, out_shape)))
    dev = stream.device
    storages = [_host_storage(dev, "grad_output", go, memory_format),
                _output_storage(dev, "grad_input", out_shape, go.dtype, memory_format)]
    return run_upsample(stream, storages, output_size, input_size, align_corners, scales_h, scales_w, form=form)[0]


def grid_sampler_2d(input, grid, interpolation_mode=0, padding_mode=0, align_corners=False, *,
                    device: str = "local-task", form=None):
    """grid_sample's forward (torch.ops.aten.grid_sampler_2d; aclnnGridSampler2D): input sampled
    at the grid's points.

    input: (N, C, H_in, W_in); grid: (N, H_out, W_out, 2), last dim (x, y) in [-1, 1] (values
    outside are padded); NumPy arrays of one dtype: float16, ml_dtypes.bfloat16, float32 or
    float64 (half types compute in float32).  interpolation_mode: 0/"bilinear", 1/"nearest",
    2/"bicubic"; padding_mode: 0/"zeros", 1/"border", 2/"reflection"; align_corners as in
    PyTorch.  Returns the output, (N, C, H_out, W_out).  Raises AclnnError (a ValueError) with
    .status 161001 for a None argument, 161002 for an invalid one.  Runs on the IREE device
    `device` ("local-task", "local-sync", "vulkan", "cuda").  Semantics: PyTorch 2.13 CPU
    (docs/semantics.md).
    """
    form = _form_arg(form)
    x, g = _as_array("input", input), _as_array("grid", grid)
    interpolation_mode = _mode("interpolation_mode", interpolation_mode, INTERPOLATION_NAMES)
    padding_mode = _mode("padding_mode", padding_mode, PADDING_NAMES)
    N, C = x.shape[:2] if x.ndim == 4 else (0, 0)
    out_shape = (N, C, *g.shape[1:3]) if g.ndim == 4 else (N, C, 0, 0)
    stream = thread_stream(grid_sampler_forward.OPERATOR.call_device(device, math.prod(out_shape),
                                                                     grid_sampler.call_kind(interpolation_mode)))
    dev = stream.device
    storages = [_host_storage(dev, "input", x), _host_storage(dev, "grid", g),
                _output_storage(dev, "output", out_shape, x.dtype)]
    return run_grid_sampler_forward(stream, storages, interpolation_mode, padding_mode, align_corners, form=form)[0]


def upsample_bilinear2d(input, output_size, align_corners=False, scales_h=None, scales_w=None, *,
                        memory_format: str = "NCHW", device: str = "local-task", form=None):
    """Bilinear 2-D up- or down-sampling (torch.ops.aten.upsample_bilinear2d; aclnnUpsampleBilinear2d).

    input: NCHW (N, C, H_in, W_in), or with memory_format="NHWC" (N, H_in, W_in, C);
    output_size: (H_out, W_out); align_corners as in PyTorch; scales_h/scales_w: the scale
    factors or None (a given scale must satisfy H_out == floor(H_in * scales_h)).  dtypes
    float16, ml_dtypes.bfloat16, float32, float64.  Returns the output, (N, C, H_out, W_out)
    or (N, H_out, W_out, C) for NHWC.  Raises AclnnError (.status 161001 / 161002).
    Semantics: PyTorch 2.13 CPU (docs/semantics.md).
    """
    form = _form_arg(form)
    x = _as_array("input", input)
    if output_size is None:
        raise AclnnError(ACLNN_ERR_PARAM_NULLPTR, "output_size is None")
    if isinstance(output_size, collections.abc.Iterator):  # read once: later checks read the sizes again
        output_size = tuple(output_size)
    if memory_format not in ("NCHW", "NHWC"):
        raise AclnnError(ACLNN_ERR_PARAM_INVALID, f"memory_format must be 'NCHW' or 'NHWC', got {memory_format!r}")
    osz = _int_values("output_size", output_size)
    if len(osz) == 2 and x.ndim == 4 and min(osz) >= 0:
        N, C = (x.shape[0], x.shape[3]) if memory_format == "NHWC" else x.shape[:2]
        out_shape = (N, *osz, C) if memory_format == "NHWC" else (N, C, *osz)
    else:  # phase 1 says what is wrong
        out_shape = (0, 0, 0, 0)
    stream = thread_stream(upsample_forward.OPERATOR.call_device(device, x.size + math.prod(out_shape),
                                                                 upsample.call_kind(x.shape, out_shape)))
    dev = stream.device
    storages = [_host_storage(dev, "input", x, memory_format),
                _output_storage(dev, "output", out_shape, x.dtype, memory_format)]
    return run_upsample_forward(stream, storages, output_size, align_corners, scales_h, scales_w, form=form)[0]
