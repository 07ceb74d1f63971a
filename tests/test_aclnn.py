"""The aclnn two-phase layer (aclnn_iree.aclnn): C-style calling, every status path, masks, views,
stream ordering, repeatable executors, threads, empty tensors and device errors.

docs/status-codes.md (status codes, check orders, phase 2) and docs/semantics.md (#output-mask,
#empty-tensors, #scale-consistency-check, #invalid-and-extreme-inputs).
Kernels compile on first use, so the tests share a small set of specialisations:
grid sampler bilinear/zeros/ac0 in every dtype plus nearest/border/ac1 and bicubic/reflection/ac0
in float32; upsample NCHW/NHWC x align_corners in float32 plus NCHW/ac0 in float16.
"""
from __future__ import annotations

import os
import threading

import ml_dtypes
import numpy as np
import pytest

from aclnn_iree import aclnn as A
from aclnn_iree.core import api
from aclnn_iree.ops import reference as R


SUCCESS = A.ACLNN_SUCCESS
NULLPTR = A.ACLNN_ERR_PARAM_NULLPTR          # 161001
INVALID = A.ACLNN_ERR_PARAM_INVALID          # 161002
NOT_TRANS = A.ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR  # 561102
INNER_NULLPTR = A.ACLNN_ERR_INNER_NULLPTR    # 561103
RUNTIME = A.ACLNN_ERR_RUNTIME_ERROR          # 361001

BF16 = np.dtype(ml_dtypes.bfloat16)
DEVICE = "local-task"
OTHER_DEVICE = "local-sync"  # a second IREE device on the same machine

# ----------------------------------------------------------------------------- helpers
@pytest.fixture
def stream():
    status, s = A.aclrtCreateStream(DEVICE)
    assert status == SUCCESS, A.aclGetRecentErrMsg()
    yield s
    if not s.destroyed:
        A.aclrtDestroyStream(s)  # checked by the tests themselves; a poisoned stream fails here


@pytest.fixture
def other_stream():
    status, s = A.aclrtCreateStream(OTHER_DEVICE)
    assert status == SUCCESS, A.aclGetRecentErrMsg()
    yield s
    if not s.destroyed:
        A.aclrtDestroyStream(s)


def tol(dtype):
    """(rtol, atol factor) against the float64 reference for a storage dtype."""
    return {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 2e-5, np.dtype(np.float16): 4e-3,
            BF16: 3e-2}[np.dtype(dtype)]


def assert_close(actual, expected, dtype):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape
    t = tol(dtype)
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    np.testing.assert_allclose(actual, expected, rtol=t, atol=t * scale)


def assert_bitwise(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes(), f"max abs diff {np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))}"


def gs_arrays(N=2, C=3, H=4, W=5, Ho=3, Wo=4, dtype=np.float32, seed=0):
    """(gradOutput, input, grid) NumPy arrays for the grid sampler."""
    rng = np.random.default_rng(seed)
    go = rng.standard_normal((N, C, Ho, Wo)).astype(dtype)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    grid = rng.uniform(-1.2, 1.2, (N, Ho, Wo, 2)).astype(dtype)
    return go, x, grid


def gs_tensors(go, x, grid, dx_fill=None, dg_fill=None):
    """aclTensors (gradOutput, input, grid, inputGrad, gridGrad); outputs zero or filled with a sentinel."""
    t = [A.aclCreateTensor(a) for a in (go, x, grid)]
    dx = A.aclCreateTensor(np.full(x.shape, dx_fill, x.dtype)) if dx_fill is not None else \
        A.aclCreateTensor(shape=x.shape, dtype=x.dtype)
    dg = A.aclCreateTensor(np.full(grid.shape, dg_fill, grid.dtype)) if dg_fill is not None else \
        A.aclCreateTensor(shape=grid.shape, dtype=grid.dtype)
    assert all(v is not None for v in (*t, dx, dg)), A.aclGetRecentErrMsg()
    return (*t, dx, dg)


def gs_phase1(go, x, grid, dx, dg, mode=0, pad=0, ac=False, mask=(True, True)):
    m = A.aclCreateBoolArray(list(mask)) if isinstance(mask, (list, tuple)) else mask
    return A.aclnnGridSampler2DBackwardGetWorkspaceSize(go, x, grid, mode, pad, ac, m, dx, dg)


def execute(phase1_result, stream, run, sync=True):
    """Phase 2 the way the aclnn samples do it: aclrtMalloc only when the size is > 0."""
    status, ws_size, executor = phase1_result
    assert status == SUCCESS, A.aclGetRecentErrMsg()
    workspace = None
    if ws_size > 0:
        st, workspace = A.aclrtMalloc(ws_size, stream)
        assert st == SUCCESS, A.aclGetRecentErrMsg()
    assert run(workspace, ws_size, executor, stream) == SUCCESS, A.aclGetRecentErrMsg()
    if sync:
        assert A.aclrtSynchronizeStream(stream) == SUCCESS, A.aclGetRecentErrMsg()
    return workspace


def run_gs(stream, go, x, grid, mode=0, pad=0, ac=False, mask=(True, True)):
    """One full two-phase grid sampler call; returns (dx, dgrid) NumPy arrays."""
    ts = gs_tensors(go, x, grid)
    execute(gs_phase1(*ts, mode, pad, ac, mask), stream, A.aclnnGridSampler2DBackward)
    return ts[3].numpy(), ts[4].numpy()


def up_arrays(N=2, C=3, Hi=3, Wi=4, Ho=5, Wo=7, dtype=np.float32, fmt="NCHW", seed=0):
    """(gradOut array in `fmt`, NCHW gradOut, outputSize, inputSize in `fmt` order)."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((N, C, Ho, Wo)).astype(dtype)
    if fmt == "NHWC":
        return np.ascontiguousarray(g.transpose(0, 2, 3, 1)), g, [Ho, Wo], [N, Hi, Wi, C]
    return g, g, [Ho, Wo], [N, C, Hi, Wi]


def up_phase1(go_t, osz, isz, ac, sh, sw, out_t):
    osz = A.aclCreateIntArray(osz) if isinstance(osz, list) else osz
    isz = A.aclCreateIntArray(isz) if isinstance(isz, list) else isz
    return A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(go_t, osz, isz, ac, sh, sw, out_t)


def up_valid(dtype=np.float32, fmt="NCHW"):
    """Valid upsample arguments as aclnn objects: [gradOut, outputSize, inputSize, ac, sH, sW, out]."""
    garr, _, osz, isz = up_arrays(dtype=dtype, fmt=fmt)
    return [A.aclCreateTensor(garr, fmt), A.aclCreateIntArray(osz), A.aclCreateIntArray(isz), False, -1.0, -1.0,
            A.aclCreateTensor(shape=isz, dtype=dtype, format=fmt)]


def expect_status(result, status, *words):
    """`result` is a status or a (status, size, executor) tuple failing with `status`;
    the recent message contains every word of `words` (the offending argument)."""
    if isinstance(result, tuple):
        assert len(result) == 3
        st, ws, ex = result
        assert (st, ws, ex) == (status, 0, None), (result, A.aclGetRecentErrMsg())
    else:
        st = result
        assert st == status, (result, A.aclGetRecentErrMsg())
    msg = A.aclGetRecentErrMsg()
    assert msg, "a failed call must leave a message"
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ----------------------------------------------------------------------------- two-phase runs
@pytest.mark.parametrize("dtype,mode,pad,ac", [
    (np.float32, 0, 0, False),
    (np.float32, 1, 1, True),
    (np.float32, 2, 2, False),
    (np.float16, 0, 0, False),
    (BF16, 0, 0, False),
    (np.float64, 0, 0, False),
])
def test_grid_sampler_c_snippet_matches_pythonic_bit_for_bit(dtype, mode, pad, ac):
    go_np, x_np, grid_np = gs_arrays(dtype=dtype, seed=1)
    # --- the aclnn sample program, line by line
    status, stream = A.aclrtCreateStream(DEVICE)
    assert status == SUCCESS
    gradOutput = A.aclCreateTensor(go_np)
    input_ = A.aclCreateTensor(x_np)
    grid = A.aclCreateTensor(grid_np)
    inputGrad = A.aclCreateTensor(shape=x_np.shape, dtype=dtype)
    gridGrad = A.aclCreateTensor(shape=grid_np.shape, dtype=dtype)
    outputMask = A.aclCreateBoolArray([True, True])
    status, workspaceSize, executor = A.aclnnGridSampler2DBackwardGetWorkspaceSize(
        gradOutput, input_, grid, mode, pad, ac, outputMask, inputGrad, gridGrad)
    assert status == SUCCESS, A.aclGetRecentErrMsg()
    assert isinstance(workspaceSize, int) and workspaceSize >= 0
    assert isinstance(executor, A.aclOpExecutor)
    assert workspaceSize == executor.workspace_size
    workspace = None
    if workspaceSize > 0:
        status, workspace = A.aclrtMalloc(workspaceSize, stream)
        assert status == SUCCESS
        assert workspace.size == workspaceSize
    status = A.aclnnGridSampler2DBackward(workspace, workspaceSize, executor, stream)
    assert status == SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    dx, dgrid = inputGrad.numpy(), gridGrad.numpy()
    for t in (gradOutput, input_, grid, inputGrad, gridGrad):
        assert A.aclDestroyTensor(t) == SUCCESS
    assert A.aclDestroyBoolArray(outputMask) == SUCCESS
    if workspace is not None:
        assert A.aclrtFree(workspace) == SUCCESS
    assert A.aclrtDestroyStream(stream) == SUCCESS
    # --- same bits as the Pythonic layer, and right against the float64 reference
    p_dx, p_dgrid = api.grid_sampler_2d_backward(go_np, x_np, grid_np, mode, pad, ac, (True, True))
    assert_bitwise(dx, p_dx)
    assert_bitwise(dgrid, p_dgrid)
    r_dx, r_dgrid = R.grid_sampler_2d_backward(go_np, x_np, grid_np, mode, pad, ac)
    assert_close(dx, r_dx, dtype)
    assert_close(dgrid, r_dgrid, dtype)


def test_float16_grid_sampler_reports_a_workspace(stream):
    """float16 accumulates dx in float32 (docs/semantics.md#half-precision-accumulates-in-float32), in
    the workspace: phase 1 asks for it, which
    makes the too-small-workspace paths below testable."""
    go, x, grid = gs_arrays(dtype=np.float16)
    status, ws, ex = gs_phase1(*gs_tensors(go, x, grid))
    assert status == SUCCESS
    assert ws > 0
    assert ex.workspace_size == ws
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


@pytest.mark.parametrize("dtype,fmt,ac,scales", [
    (np.float32, "NCHW", False, (-1.0, -1.0)),
    (np.float32, "NCHW", True, (-1.0, -1.0)),
    (np.float32, "NHWC", False, (5 / 3, 7 / 4)),
    (np.float32, "NHWC", True, (0.0, 0.0)),
    (np.float16, "NCHW", False, (-1.0, -1.0)),
])
def test_upsample_c_snippet_matches_pythonic_bit_for_bit(dtype, fmt, ac, scales):
    garr, g_nchw, osz, isz = up_arrays(dtype=dtype, fmt=fmt, seed=2)
    status, stream = A.aclrtCreateStream(DEVICE)
    assert status == SUCCESS
    gradOut = A.aclCreateTensor(garr, fmt)
    out = A.aclCreateTensor(shape=isz, dtype=dtype, format=fmt)
    outputSize = A.aclCreateIntArray(osz)
    inputSize = A.aclCreateIntArray(isz)
    status, workspaceSize, executor = A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        gradOut, outputSize, inputSize, ac, scales[0], scales[1], out)
    assert status == SUCCESS, A.aclGetRecentErrMsg()
    assert workspaceSize == executor.workspace_size
    workspace = None
    if workspaceSize > 0:
        status, workspace = A.aclrtMalloc(workspaceSize, stream)
        assert status == SUCCESS
    status = A.aclnnUpsampleBilinear2dBackwardV2(workspace, workspaceSize, executor, stream)
    assert status == SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    result = out.numpy()
    assert A.aclDestroyTensor(gradOut) == SUCCESS and A.aclDestroyTensor(out) == SUCCESS
    assert A.aclDestroyIntArray(outputSize) == SUCCESS and A.aclDestroyIntArray(inputSize) == SUCCESS
    if workspace is not None:
        assert A.aclrtFree(workspace) == SUCCESS
    assert A.aclrtDestroyStream(stream) == SUCCESS

    sh, sw = (None if s <= 0 else s for s in scales)
    p = api.upsample_bilinear2d_backward(garr, osz, isz, ac, sh, sw, memory_format=fmt)
    assert_bitwise(result, p)
    nchw = result.transpose(0, 3, 1, 2) if fmt == "NHWC" else result
    N, C, Hi, Wi = (isz[0], isz[3], isz[1], isz[2]) if fmt == "NHWC" else isz
    assert_close(nchw, R.upsample_bilinear2d_backward(g_nchw, osz, [N, C, Hi, Wi], ac, sh, sw), dtype)


# ----------------------------------------------------------------------------- grid sampler phase-1 statuses
def _gs_args(dtype=np.float32, **shape):
    """Valid phase-1 arguments as a dict (names as in aclnn)."""
    go, x, grid = gs_arrays(dtype=dtype, **shape)
    t = gs_tensors(go, x, grid)
    return dict(gradOutput=t[0], input=t[1], grid=t[2], interpolationMode=0, paddingMode=0, alignCorners=False,
                outputMask=A.aclCreateBoolArray([True, True]), inputGrad=t[3], gridGrad=t[4])


def _gs_call(args):
    return A.aclnnGridSampler2DBackwardGetWorkspaceSize(**args)


def test_grid_sampler_valid_arguments_succeed():
    status, ws, ex = _gs_call(_gs_args())
    # Both gradients: one pass writes dx and per-channel-block partial grid gradients (the
    # workspace, 2 values per output point and block), then the blocks are summed.
    assert status == SUCCESS and ws > 0 and isinstance(ex, A.aclOpExecutor)
    args = _gs_args()
    args["outputMask"] = A.aclCreateBoolArray([True, False])
    status, ws_dx, _ = _gs_call(args)
    # dx alone: the CPU accumulation slots, H*W pixels x min(C, 8) interleaved channels
    # each (at a stride of the power of two at or above it: 4 for 3 channels), one per
    # worker thread at most, no more than the blocks of 8 channels, and as many as fit in
    # the largest input's bytes counted in IREE's 64-byte units (it rounds a transient
    # allocation up to 64 bytes): here x is 2*3*4*5 floats (480 B: 448 B in whole units),
    # a slot 4*5*4 floats (320 B), and there are 2 blocks (N = 2).  The pass's
    # grid-gradient output, not computed here, is an empty placeholder that takes no
    # memory.
    slots = min(2, _local_task_workers(), 448 // 320) * 4 * 5 * 4 * 4
    assert status == SUCCESS and ws_dx == -(-slots // 64) * 64


def _local_task_workers():
    """The worker threads of this process's local-task device, as the grid sampler's phase 1
    counts its slots (test_grid_sampler.py::test_one_slot_per_worker checks that count
    against explicit worker counts): dx alone of 64 one-channel 8 x 8 images has room
    for 64 slots of 256 B."""
    args = _gs_args(N=64, C=1, H=8, W=8, Ho=8, Wo=8)
    args["outputMask"] = A.aclCreateBoolArray([True, False])
    status, ws, _ = _gs_call(args)
    assert status == SUCCESS and ws % 256 == 0
    return ws // 256


def test_workspace_size_remembered_per_shape():
    """Phase 1 remembers the module's workspace answer per argument shapes (a query of the
    module costs tens of microseconds a call): with shapes alternating, each call still gets
    its own shape's size, the one the module's _transients_size function computes for it."""
    sizes = {}
    for H in (4, 16, 4, 16, 4):
        args = _gs_args(H=H)
        args["outputMask"] = A.aclCreateBoolArray([True, False])
        status, ws, ex = _gs_call(args)
        assert status == SUCCESS
        assert ws == ex.kernel._query_workspace_size(ex.views)
        sizes.setdefault(H, set()).add(ws)
    # A slot per block holds H*W*3 floats: the two heights need different workspaces.
    assert len(sizes[4]) == len(sizes[16]) == 1 and sizes[4] != sizes[16]


def test_call_duration_estimate_and_presleep():
    """A CPU stream sleeps through most of a call it has timed before: phase 2 records
    each call's observed duration on its kernel, and the estimate is the fastest run,
    moving only a quarter of the way towards a slower one (a slow first run must not make
    later waits oversleep).  The results stay those of a plain wait."""
    go, x, grid = gs_arrays(N=4, C=16, H=48, W=48, Ho=48, Wo=48)
    status, stream = A.aclrtCreateStream(DEVICE)
    t = gs_tensors(go, x, grid)
    status, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(
        *t[:3], 0, 0, False, A.aclCreateBoolArray([True, True]), t[3], t[4])
    assert status == SUCCESS and A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    _, workspace = A.aclrtMalloc(ws, stream)
    kernel = ex.kernel
    outs = []
    for _ in range(3):
        assert A.aclnnGridSampler2DBackward(workspace, ws, ex, stream) == SUCCESS
        assert A.aclrtSynchronizeStream(stream) == SUCCESS
        outs.append((t[3].numpy(), t[4].numpy()))
        assert kernel.estimate(ex.views).seconds > 0
    for a, b in outs[1:]:
        assert_bitwise(a, outs[0][0])
        assert_bitwise(b, outs[0][1])
    r_dx, r_dg = R.grid_sampler_2d_backward(go, x, grid, 0, 0, False)
    assert_close(outs[0][0], r_dx, np.float32)
    assert_close(outs[0][1], r_dg, np.float32)
    # the estimator alone
    est = kernel.estimate(ex.views)
    kernel._seconds.clear()
    assert est.seconds is None
    est.record(0.050)  # a slow first run
    est.record(0.003)
    assert kernel.estimate(ex.views).seconds == 0.003
    est.record(0.007)
    assert est.seconds == pytest.approx(0.004)
    est.record(3.0)  # one stalled call (the process stopped for 3 s): at most twice the estimate
    assert est.seconds == pytest.approx(0.008)
    est.record(0.004)
    # A call found finished at the first look after its presleep took at most what was observed
    # (the presleep and its overshoot): the estimate shrinks by the factor below that, where
    # recording the observation would settle at the presleep's own length (a 1.1 ms kernel
    # was timed at 1.5 ms and slept through for that long on every call).
    kernel._seconds.clear()
    est.record(0.050)  # far longer than the call (a few ms at most)
    assert A.aclnnGridSampler2DBackward(workspace, ws, ex, stream) == SUCCESS
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    assert est.seconds <= 0.85 * 0.050  # observed: 0.9 * 0.050 + the sleep's overshoot
    assert_bitwise(t[3].numpy(), outs[0][0])
    # A call expected to take under 2 ms gets a blocking fence wait (no polls), and its
    # duration is recorded as observed; a longer one polls.
    from aclnn_iree.runtime import timeline
    polls = []
    real = timeline.Timeline._sleep_until
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timeline.Timeline, "_sleep_until", lambda self, value: polls.append(value) or real(self, value))
        for expected, polled in ((0.0015, False), (0.0025, True)):
            polls.clear()
            kernel._seconds.clear()
            est.record(expected)
            assert A.aclnnGridSampler2DBackward(workspace, ws, ex, stream) == SUCCESS
            assert A.aclrtSynchronizeStream(stream) == SUCCESS
            assert bool(polls) == polled, expected
            assert_bitwise(t[3].numpy(), outs[0][0])
            assert_bitwise(t[4].numpy(), outs[0][1])
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


@pytest.mark.parametrize("mask", [(True, False), (True, True)])
def test_grid_sampler_workspace_within_largest_input(mask):
    """Where the largest input has room for two slots, the workspace stays within it (the
    performance issue's rule): 4 x 16 channels of 8 x 8 pixels = 8 blocks, x is 16 KiB."""
    args = _gs_args(N=4, C=16, H=8, W=8, Ho=8, Wo=8)
    args["outputMask"] = A.aclCreateBoolArray(list(mask))
    status, ws, _ = _gs_call(args)
    largest = 4 * 16 * 8 * 8 * 4
    assert status == SUCCESS and 8 * 8 * 8 * 4 <= ws <= largest


def test_grid_sampler_one_slot_when_only_one_fits():
    """dx alone of one 9-channel image: two blocks (8 + 1 channels), but the input
    (9 x 20 x 20 floats, 14400 B) holds only one slot of 20 x 20 pixels x 8 channels
    (12800 B): one slot does both blocks in turn, within the largest input, and the
    result is still right."""
    go, x, grid = gs_arrays(N=1, C=9, H=20, W=20, Ho=20, Wo=20)
    args = _gs_args(N=1, C=9, H=20, W=20, Ho=20, Wo=20)
    args["outputMask"] = A.aclCreateBoolArray([True, False])
    status, ws, _ = _gs_call(args)
    assert status == SUCCESS and ws == 20 * 20 * 8 * 4
    dx, _ = api.grid_sampler_2d_backward(go, x, grid, 0, 0, False, (True, False))
    assert_close(dx, R.grid_sampler_2d_backward(go, x, grid, 0, 0, False)[0], np.float32)


def test_grid_sampler_dx_workspace_of_one_image_is_its_input():
    """dx alone of one 3-channel image: one slot of H*W pixels x 3 channels (float32), the
    input's own size; the pass's grad_grid output, not computed, takes no memory."""
    args = _gs_args(N=1, C=3, H=32, W=48, Ho=32, Wo=48)
    args["outputMask"] = A.aclCreateBoolArray([True, False])
    status, ws, _ = _gs_call(args)
    assert status == SUCCESS and ws == 32 * 48 * 3 * 4


@pytest.mark.parametrize("name", ["gradOutput", "input", "grid", "inputGrad", "gridGrad", "outputMask"])
def test_grid_sampler_none_argument_is_nullptr(name):
    args = _gs_args()
    args[name] = None
    expect_status(_gs_call(args), NULLPTR, name)


@pytest.mark.parametrize("name", ["gradOutput", "input", "grid", "inputGrad", "gridGrad"])
def test_grid_sampler_destroyed_tensor_is_nullptr(name):
    args = _gs_args()
    assert A.aclDestroyTensor(args[name]) == SUCCESS
    expect_status(_gs_call(args), NULLPTR, name, "destroyed")


@pytest.mark.parametrize("name", ["gradOutput", "input", "grid", "inputGrad", "gridGrad"])
@pytest.mark.parametrize("bad", [np.zeros((1, 1, 1, 1), np.float32), "tensor", 1.5, [1, 2], {}])
def test_grid_sampler_non_tensor_argument_is_invalid(name, bad):
    args = _gs_args()
    args[name] = bad
    expect_status(_gs_call(args), INVALID, name)


@pytest.mark.parametrize("bad", [[True, True], (True, True), "TT", 3])
def test_grid_sampler_output_mask_not_a_bool_array(bad):
    args = _gs_args()
    args["outputMask"] = bad
    expect_status(_gs_call(args), INVALID, "outputMask")


def test_grid_sampler_destroyed_output_mask():
    args = _gs_args()
    assert A.aclDestroyBoolArray(args["outputMask"]) == SUCCESS
    expect_status(_gs_call(args), NULLPTR, "outputMask", "destroyed")  # as for a destroyed tensor


@pytest.mark.parametrize("name", ["gradOutput", "grid", "inputGrad", "gridGrad"])
def test_grid_sampler_tensors_on_different_devices(name):
    args = _gs_args()
    t = args[name]
    args[name] = A.aclCreateTensor(t.numpy(), device=OTHER_DEVICE)
    expect_status(_gs_call(args), INVALID, "different devices", name)


@pytest.mark.parametrize("name", ["gradOutput", "grid", "inputGrad", "gridGrad"])
def test_grid_sampler_dtype_differs_from_input(name):
    args = _gs_args()
    args[name] = A.aclCreateTensor(args[name].numpy().astype(np.float64))
    expect_status(_gs_call(args), INVALID, name, "dtype")


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_grid_sampler_unsupported_dtype(dtype):
    go, x, grid = gs_arrays()
    ts = gs_tensors(*(a.astype(dtype) for a in (go, x, grid)))
    expect_status(gs_phase1(*ts), INVALID, "input", "dtype")


@pytest.mark.parametrize("name", ["interpolationMode", "paddingMode"])
@pytest.mark.parametrize("bad", [-1, 3, 100, 2**63, -2**70, 1.0, "bilinear", None, True, np.float32(0)])
def test_grid_sampler_bad_mode(name, bad):
    args = _gs_args()
    args[name] = bad
    expect_status(_gs_call(args), INVALID, name)


@pytest.mark.parametrize("name", ["interpolationMode", "paddingMode"])
def test_grid_sampler_numpy_int_modes_accepted(name):
    args = _gs_args()
    args[name] = np.int64(0)
    assert _gs_call(args)[0] == SUCCESS


@pytest.mark.parametrize("bad", [1, 0, None, "True", 0.0])
def test_grid_sampler_align_corners_not_bool(bad):
    args = _gs_args()
    args["alignCorners"] = bad
    expect_status(_gs_call(args), INVALID, "alignCorners")


def test_grid_sampler_numpy_bool_align_corners_accepted():
    args = _gs_args()
    args["alignCorners"] = np.bool_(False)
    assert _gs_call(args)[0] == SUCCESS


@pytest.mark.parametrize("name,shape", [
    ("input", (2, 3, 4)), ("input", (1, 2, 3, 4, 5)),
    ("grid", (2, 3, 4)), ("grid", (1, 2, 3, 4, 2)),
    ("gradOutput", (2, 3, 3)), ("gradOutput", (2, 3, 3, 4, 1)),
])
def test_grid_sampler_wrong_rank(name, shape):
    args = _gs_args()
    args[name] = A.aclCreateTensor(np.zeros(shape, np.float32))
    expect_status(_gs_call(args), INVALID, name, "4-D")


def test_grid_sampler_grid_batch_differs():
    args = _gs_args()
    args["grid"] = A.aclCreateTensor(np.zeros((3, 3, 4, 2), np.float32))
    expect_status(_gs_call(args), INVALID, "grid", "N=")


@pytest.mark.parametrize("last", [1, 3])
def test_grid_sampler_grid_last_dim_not_2(last):
    args = _gs_args()
    args["grid"] = A.aclCreateTensor(np.zeros((2, 3, 4, last), np.float32))
    expect_status(_gs_call(args), INVALID, "grid", "last dimension")


@pytest.mark.parametrize("H,W", [(0, 5), (4, 0)])
def test_grid_sampler_empty_input_spatial_is_invalid(H, W):
    args = _gs_args(H=H, W=W)
    expect_status(_gs_call(args), INVALID, "input", "H and W")


@pytest.mark.parametrize("shape", [(1, 3, 3, 4), (2, 2, 3, 4), (2, 3, 2, 4), (2, 3, 3, 5)])
def test_grid_sampler_grad_output_shape_mismatch(shape):
    args = _gs_args()
    args["gradOutput"] = A.aclCreateTensor(np.zeros(shape, np.float32))
    expect_status(_gs_call(args), INVALID, "gradOutput", "shape")


@pytest.mark.parametrize("shape", [(2, 3, 4, 6), (2, 2, 4, 5), (1, 3, 4, 5), (2, 3, 5, 5)])
def test_grid_sampler_input_grad_shape_mismatch(shape):
    args = _gs_args()
    args["inputGrad"] = A.aclCreateTensor(np.zeros(shape, np.float32))
    expect_status(_gs_call(args), INVALID, "inputGrad", "shape")


@pytest.mark.parametrize("shape", [(2, 3, 5, 2), (2, 4, 4, 2), (1, 3, 4, 2), (2, 3, 4, 3), (2, 3, 4)])
def test_grid_sampler_grid_grad_shape_mismatch(shape):
    args = _gs_args()
    args["gridGrad"] = A.aclCreateTensor(np.zeros(shape, np.float32))
    expect_status(_gs_call(args), INVALID, "gridGrad", "shape")


def test_grid_sampler_out_tensor_dtype_mismatch_names_it():
    args = _gs_args()
    args["inputGrad"] = A.aclCreateTensor(np.zeros((2, 3, 4, 5), np.float16))
    expect_status(_gs_call(args), INVALID, "inputGrad", "float16")


@pytest.mark.parametrize("mask", [[], [True], [True, True, True], [False, False, False]])
def test_grid_sampler_output_mask_wrong_length(mask):
    args = _gs_args()
    args["outputMask"] = A.aclCreateBoolArray(mask)
    expect_status(_gs_call(args), INVALID, "outputMask", "2 entries")


def test_grid_sampler_check_order_nullptr_before_invalid():
    """docs/status-codes.md#grid-sampler-backward-checks: null tensors (161001) are reported before
    dtype/attribute/shape checks (161002)."""
    args = _gs_args()
    args["interpolationMode"] = 7
    args["gridGrad"] = A.aclCreateTensor(np.zeros((1, 1, 1, 2), np.float64))
    args["grid"] = None
    expect_status(_gs_call(args), NULLPTR, "grid")
    # dtype before attributes before shapes
    args = _gs_args()
    args["gridGrad"] = A.aclCreateTensor(np.zeros((1, 1, 1, 2), np.float64))
    args["interpolationMode"] = 7
    expect_status(_gs_call(args), INVALID, "gridGrad", "dtype")
    args = _gs_args()
    args["gridGrad"] = A.aclCreateTensor(np.zeros((1, 1, 1, 2), np.float32))
    args["paddingMode"] = -1
    expect_status(_gs_call(args), INVALID, "paddingMode")


# ----------------------------------------------------------------------------- upsample phase-1 statuses
def _up_args(dtype=np.float32, fmt="NCHW"):
    v = up_valid(dtype, fmt)
    return dict(zip(["gradOut", "outputSize", "inputSize", "alignCorners", "scalesH", "scalesW", "out"], v))


def _up_call(args):
    return A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(**args)


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_upsample_valid_arguments_succeed(fmt):
    status, ws, ex = _up_call(_up_args(fmt=fmt))
    assert status == SUCCESS and isinstance(ex, A.aclOpExecutor) and ws == ex.workspace_size


@pytest.mark.parametrize("name", ["gradOut", "outputSize", "inputSize", "out"])
def test_upsample_none_argument_is_nullptr(name):
    args = _up_args()
    args[name] = None
    expect_status(_up_call(args), NULLPTR, name)


@pytest.mark.parametrize("name", ["gradOut", "out"])
def test_upsample_destroyed_tensor_is_nullptr(name):
    args = _up_args()
    assert A.aclDestroyTensor(args[name]) == SUCCESS
    expect_status(_up_call(args), NULLPTR, name)


@pytest.mark.parametrize("name", ["gradOut", "out"])
@pytest.mark.parametrize("bad", [np.zeros((2, 3, 5, 7), np.float32), "x", 2.0, [1]])
def test_upsample_non_tensor_is_invalid(name, bad):
    args = _up_args()
    args[name] = bad
    expect_status(_up_call(args), INVALID, name)


@pytest.mark.parametrize("name", ["outputSize", "inputSize"])
@pytest.mark.parametrize("bad", ["list", "bool_array", "destroyed", "str"])
def test_upsample_size_not_an_int_array(name, bad):
    args = _up_args()
    if bad == "list":
        args[name] = list(args[name].values)
    elif bad == "bool_array":
        args[name] = A.aclCreateBoolArray([True] * args[name].size)
    elif bad == "destroyed":
        assert A.aclDestroyIntArray(args[name]) == SUCCESS
        expect_status(_up_call(args), NULLPTR, name, "destroyed")  # as for a destroyed tensor
        return
    else:
        args[name] = "5,7"
    expect_status(_up_call(args), INVALID, name)


def test_upsample_tensors_on_different_devices():
    args = _up_args()
    args["out"] = A.aclCreateTensor(args["out"].numpy(), "NCHW", device=OTHER_DEVICE)
    expect_status(_up_call(args), INVALID, "different devices", "out")


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 3, 5, 7)])
def test_upsample_grad_out_not_4d(shape):
    args = _up_args()
    args["gradOut"] = A.aclCreateTensor(np.zeros(shape, np.float32), "NCHW")
    expect_status(_up_call(args), INVALID, "gradOut", "4-D")


@pytest.mark.parametrize("vals", [[2, 3, 3], [2, 3, 3, 4, 1], []])
def test_upsample_input_size_wrong_length(vals):
    args = _up_args()
    args["inputSize"] = A.aclCreateIntArray(vals)
    expect_status(_up_call(args), INVALID, "inputSize", "4 entries")


@pytest.mark.parametrize("vals", [[5], [5, 7, 1], []])
def test_upsample_output_size_wrong_length(vals):
    args = _up_args()
    args["outputSize"] = A.aclCreateIntArray(vals)
    expect_status(_up_call(args), INVALID, "outputSize", "2 entries")


def test_upsample_out_format_nd():
    args = _up_args()
    args["out"] = A.aclCreateTensor(np.zeros((2, 3, 3, 4), np.float32), "ND")
    expect_status(_up_call(args), INVALID, "out", "format")


def test_upsample_grad_out_format_nd():
    args = _up_args()
    args["gradOut"] = A.aclCreateTensor(args["gradOut"].numpy(), "ND")
    expect_status(_up_call(args), INVALID, "gradOut", "format")


def test_upsample_formats_differ():
    args = _up_args()
    args["out"] = A.aclCreateTensor(np.zeros((2, 3, 3, 4), np.float32), "NHWC")
    expect_status(_up_call(args), INVALID, "out", "NHWC")


@pytest.mark.parametrize("isz", [[2, 3, 0, 4], [2, 3, 3, 0], [2, 3, -1, 4], [2, 3, 3, -5]])
def test_upsample_input_hw_not_positive(isz):
    args = _up_args()
    args["inputSize"] = A.aclCreateIntArray(isz)
    expect_status(_up_call(args), INVALID, "inputSize", "H and W")


@pytest.mark.parametrize("osz", [[0, 7], [5, 0], [-5, 7], [5, -2**62]])
def test_upsample_output_size_not_positive(osz):
    args = _up_args()
    args["outputSize"] = A.aclCreateIntArray(osz)
    expect_status(_up_call(args), INVALID, "outputSize")


@pytest.mark.parametrize("isz", [[-2, 3, 3, 4], [2, -3, 3, 4]])
def test_upsample_negative_n_or_c(isz):
    args = _up_args()
    args["inputSize"] = A.aclCreateIntArray(isz)
    expect_status(_up_call(args), INVALID, "inputSize", "N and C")


@pytest.mark.parametrize("osz,isz", [([5, 8], [2, 3, 3, 4]), ([6, 7], [2, 3, 3, 4]), ([5, 7], [1, 3, 3, 4]),
                                     ([5, 7], [2, 4, 3, 4]), ([2**40, 7], [2, 3, 3, 4])])
def test_upsample_grad_out_shape_mismatch(osz, isz):
    args = _up_args()
    args["outputSize"] = A.aclCreateIntArray(osz)
    args["inputSize"] = A.aclCreateIntArray(isz)
    if isz != [2, 3, 3, 4]:
        args["out"] = A.aclCreateTensor(np.zeros(isz, np.float32), "NCHW")
    expect_status(_up_call(args), INVALID, "gradOut", "shape")


def test_upsample_out_dtype_mismatch():
    args = _up_args()
    args["out"] = A.aclCreateTensor(np.zeros((2, 3, 3, 4), np.float64), "NCHW")
    expect_status(_up_call(args), INVALID, "out", "dtype")


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.bool_])
def test_upsample_unsupported_dtype(dtype):
    args = _up_args()
    args["gradOut"] = A.aclCreateTensor(args["gradOut"].numpy().astype(dtype), "NCHW")
    args["out"] = A.aclCreateTensor(np.zeros((2, 3, 3, 4), dtype), "NCHW")
    expect_status(_up_call(args), INVALID, "gradOut", "dtype")


@pytest.mark.parametrize("shape", [(2, 3, 3, 5), (2, 3, 4, 4), (2, 3, 4, 3)])
def test_upsample_out_shape_mismatch(shape):
    args = _up_args()
    args["out"] = A.aclCreateTensor(np.zeros(shape, np.float32), "NCHW")
    expect_status(_up_call(args), INVALID, "out", "shape")


@pytest.mark.parametrize("bad", [1, None, "False", 0.0])
def test_upsample_align_corners_not_bool(bad):
    args = _up_args()
    args["alignCorners"] = bad
    expect_status(_up_call(args), INVALID, "alignCorners")


@pytest.mark.parametrize("name", ["scalesH", "scalesW"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "2.0", None, True, [2.0], 1j])
def test_upsample_bad_scale(name, bad):
    args = _up_args()
    args[name] = bad
    expect_status(_up_call(args), INVALID, name)


def test_upsample_scale_whose_product_overflows_is_inconsistent_not_an_inner_error():
    """H_in * scalesH beyond the double range cannot be floor()ed: 161002, not 561000."""
    args = _up_args()
    args["scalesH"] = 1e308
    expect_status(_up_call(args), INVALID, "scalesH", "inconsistent")


def test_array_constructors_say_the_status_of_a_failure():
    for create in (A.aclCreateIntArray, A.aclCreateBoolArray):
        assert create(None) is None
        assert A.aclGetRecentErrMsg().startswith(f"ACLNN_ERR_PARAM_NULLPTR ({NULLPTR}): {create.__name__}")
        assert create(5) is None
        assert A.aclGetRecentErrMsg().startswith(f"ACLNN_ERR_PARAM_INVALID ({INVALID}): {create.__name__}")


@pytest.mark.parametrize("name,value", [("scalesH", 2.0), ("scalesW", 1.5), ("scalesH", 1e-3), ("scalesW", 1e300)])
def test_upsample_inconsistent_scale(name, value):
    """docs/semantics.md#scale-consistency-check: a scale > 0 must satisfy out == floor(in * scale)
    (here H 3 -> 5, W 4 -> 7)."""
    args = _up_args()
    args[name] = value
    expect_status(_up_call(args), INVALID, name, "inconsistent")


@pytest.mark.parametrize("name", ["scalesH", "scalesW"])
def test_upsample_huge_int_scale_is_invalid(name):
    args = _up_args()
    args[name] = 10**400
    expect_status(_up_call(args), INVALID, name)


# ----------------------------------------------------------------------------- phase-2 statuses
def _f16_executor(stream, repeatable=False):
    """A float16 grid sampler executor: it reports a non-zero workspace."""
    go, x, grid = gs_arrays(dtype=np.float16, seed=3)
    ts = gs_tensors(go, x, grid)
    status, ws, ex = gs_phase1(*ts)
    assert status == SUCCESS and ws > 0
    if repeatable:
        assert A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    return ts, ws, ex


def test_phase2_workspace_size_smaller_than_reported(stream):
    ts, ws, ex = _f16_executor(stream)
    _, buf = A.aclrtMalloc(ws, stream)
    expect_status(A.aclnnGridSampler2DBackward(buf, ws - 1, ex, stream), INVALID, "workspaceSize", str(ws))
    expect_status(A.aclnnGridSampler2DBackward(buf, 0, ex, stream), INVALID, "workspaceSize")
    # the rejected calls did not consume the executor
    assert A.aclnnGridSampler2DBackward(buf, ws, ex, stream) == SUCCESS
    assert A.aclrtSynchronizeStream(stream) == SUCCESS


@pytest.mark.parametrize("bad", [-1, -2**70, 1.5, "128", None, True, [128]])
def test_phase2_workspace_size_not_a_size(stream, bad):
    ts, ws, ex = _f16_executor(stream)
    _, buf = A.aclrtMalloc(ws, stream)
    expect_status(A.aclnnGridSampler2DBackward(buf, bad, ex, stream), INVALID, "workspaceSize")


def test_phase2_zero_workspace_executor_rejects_negative_size(stream):
    go, x, grid = gs_arrays()
    status, ws, ex = gs_phase1(*gs_tensors(go, x, grid), mode=1, mask=(False, True))
    assert ws == 0  # nearest grad_grid alone is zeros: no workspace
    expect_status(A.aclnnGridSampler2DBackward(None, -1, ex, stream), INVALID, "workspaceSize")
    expect_status(A.aclnnGridSampler2DBackward(None, "0", ex, stream), INVALID, "workspaceSize")
    # a larger size than needed is fine (and the workspace pointer is ignored when 0 bytes are needed)
    assert A.aclnnGridSampler2DBackward(None, 10, ex, stream) == SUCCESS
    assert A.aclrtSynchronizeStream(stream) == SUCCESS


def test_phase2_workspace_buffer_too_small(stream):
    ts, ws, ex = _f16_executor(stream)
    _, small = A.aclrtMalloc(ws - 1, stream)
    expect_status(A.aclnnGridSampler2DBackward(small, ws, ex, stream), INVALID, "workspace", str(ws - 1))
    _, larger = A.aclrtMalloc(ws * 2, stream)
    assert A.aclnnGridSampler2DBackward(larger, ws * 2, ex, stream) == SUCCESS
    assert A.aclrtSynchronizeStream(stream) == SUCCESS


def test_phase2_workspace_none_when_needed(stream):
    ts, ws, ex = _f16_executor(stream)
    expect_status(A.aclnnGridSampler2DBackward(None, ws, ex, stream), NULLPTR, "workspace")


@pytest.mark.parametrize("bad", ["freed", "str", "array", "other_device"])
def test_phase2_workspace_wrong_object(stream, other_stream, bad):
    ts, ws, ex = _f16_executor(stream)
    if bad == "freed":
        _, buf = A.aclrtMalloc(ws, stream)
        assert A.aclrtFree(buf) == SUCCESS
    elif bad == "str":
        buf = "workspace"
    elif bad == "array":
        buf = np.zeros(ws, np.uint8)
    else:
        _, buf = A.aclrtMalloc(ws, other_stream)
    expect_status(A.aclnnGridSampler2DBackward(buf, ws, ex, stream), INVALID, "workspace")


def test_phase2_single_use_executor_cannot_run_twice(stream):
    go, x, grid = gs_arrays()
    ts = gs_tensors(go, x, grid)
    status, ws, ex = gs_phase1(*ts)
    buf = A.aclrtMalloc(ws, stream)[1] if ws > 0 else None
    assert A.aclnnGridSampler2DBackward(buf, ws, ex, stream) == SUCCESS
    expect_status(A.aclnnGridSampler2DBackward(buf, ws, ex, stream), NOT_TRANS, "executor")
    # nor be made repeatable or destroyed afterwards (the framework released it)
    expect_status(A.aclSetAclOpExecutorRepeatable(ex), NOT_TRANS)
    expect_status(A.aclDestroyAclOpExecutor(ex), NOT_TRANS)
    assert A.aclrtSynchronizeStream(stream) == SUCCESS


def test_phase2_after_destroy(stream):
    ts, ws, ex = _f16_executor(stream, repeatable=True)
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS
    _, buf = A.aclrtMalloc(ws, stream)
    expect_status(A.aclnnGridSampler2DBackward(buf, ws, ex, stream), NOT_TRANS, "destroyed")
    expect_status(A.aclDestroyAclOpExecutor(ex), NOT_TRANS)
    # an unrun single-use executor can be destroyed too, then not run
    go, x, grid = gs_arrays()
    _, ws2, ex2 = gs_phase1(*gs_tensors(go, x, grid))
    assert A.aclDestroyAclOpExecutor(ex2) == SUCCESS
    expect_status(A.aclnnGridSampler2DBackward(None, ws2, ex2, stream), NOT_TRANS)


def test_executor_none_is_inner_nullptr(stream):
    expect_status(A.aclnnGridSampler2DBackward(None, 0, None, stream), INNER_NULLPTR, "executor")
    expect_status(A.aclnnUpsampleBilinear2dBackwardV2(None, 0, None, stream), INNER_NULLPTR, "executor")
    expect_status(A.aclSetAclOpExecutorRepeatable(None), INNER_NULLPTR, "executor")
    expect_status(A.aclDestroyAclOpExecutor(None), INNER_NULLPTR, "executor")


@pytest.mark.parametrize("bad", ["executor", 0, object()])
def test_executor_wrong_object(stream, bad):
    status = A.aclnnGridSampler2DBackward(None, 0, bad, stream)
    assert status != SUCCESS and A.aclGetRecentErrMsg()
    assert A.aclSetAclOpExecutorRepeatable(bad) != SUCCESS
    assert A.aclDestroyAclOpExecutor(bad) != SUCCESS


def test_executor_of_the_other_op(stream):
    go, x, grid = gs_arrays()
    _, ws, ex = gs_phase1(*gs_tensors(go, x, grid))
    buf = A.aclrtMalloc(ws, stream)[1] if ws > 0 else None
    expect_status(A.aclnnUpsampleBilinear2dBackwardV2(buf, ws, ex, stream), INVALID, "aclnnGridSampler2DBackward")
    assert A.aclnnGridSampler2DBackward(buf, ws, ex, stream) == SUCCESS  # still usable
    assert A.aclrtSynchronizeStream(stream) == SUCCESS


@pytest.mark.parametrize("bad", [None, "stream", "destroyed", "other_device"])
def test_phase2_bad_stream(stream, other_stream, bad):
    go, x, grid = gs_arrays()
    _, ws, ex = gs_phase1(*gs_tensors(go, x, grid))
    buf = A.aclrtMalloc(ws, stream)[1] if ws > 0 else None
    if bad == "destroyed":
        _, s = A.aclrtCreateStream(DEVICE)
        assert A.aclrtDestroyStream(s) == SUCCESS
    elif bad == "other_device":
        s = other_stream
    else:
        s = bad
    expect_status(A.aclnnGridSampler2DBackward(buf, ws, ex, s), INVALID, "stream")
    assert A.aclnnGridSampler2DBackward(buf, ws, ex, stream) == SUCCESS  # not consumed
    assert A.aclrtSynchronizeStream(stream) == SUCCESS


@pytest.mark.parametrize("bad", [None, "stream", "destroyed"])
def test_stream_functions_reject_bad_streams(bad):
    if bad == "destroyed":
        _, s = A.aclrtCreateStream(DEVICE)
        assert A.aclrtDestroyStream(s) == SUCCESS
    else:
        s = bad
    expect_status(A.aclrtSynchronizeStream(s), INVALID, "stream")
    expect_status(A.aclrtDestroyStream(s), INVALID, "stream")


# ----------------------------------------------------------------------------- object creation / release
def test_create_and_destroy_objects_statuses():
    assert A.aclCreateTensor(None) is None and A.aclGetRecentErrMsg()
    assert A.aclCreateTensor(np.zeros(3, np.float32), "NCDHW") is None and "format" in A.aclGetRecentErrMsg()
    assert A.aclCreateTensor(np.array(["a"])) is None and "dtype" in A.aclGetRecentErrMsg()
    assert A.aclCreateTensor(np.zeros(3, np.complex64)) is None and A.aclGetRecentErrMsg()
    assert A.aclCreateTensor(shape=(2, -1), dtype=np.float32) is None and "negative" in A.aclGetRecentErrMsg()
    assert A.aclCreateTensor(np.zeros(3, np.float32), device="no-such-driver") is None and A.aclGetRecentErrMsg()
    assert A.aclCreateIntArray([1, 2.5]) is None and "2.5" in A.aclGetRecentErrMsg()
    assert A.aclCreateIntArray([True]) is None and A.aclGetRecentErrMsg()
    assert A.aclCreateIntArray([2**64]) is None and "int64" in A.aclGetRecentErrMsg()
    assert A.aclCreateIntArray(5) is None and A.aclGetRecentErrMsg()
    assert A.aclCreateBoolArray([1, 0]) is None and "bool" in A.aclGetRecentErrMsg()
    assert A.aclCreateBoolArray(None) is None and A.aclGetRecentErrMsg()
    assert A.aclCreateIntArray(np.array([1, 2], np.int32)).values == (1, 2)
    assert A.aclCreateBoolArray(np.array([True, False])).values == (True, False)

    t = A.aclCreateTensor(np.ones((2, 2), np.float32))
    assert A.aclDestroyTensor(t) == SUCCESS
    expect_status(A.aclDestroyTensor(t), NULLPTR)
    expect_status(A.aclDestroyTensor(None), NULLPTR)
    ia, ba = A.aclCreateIntArray([1]), A.aclCreateBoolArray([True])
    assert A.aclDestroyIntArray(ia) == SUCCESS and A.aclDestroyBoolArray(ba) == SUCCESS
    expect_status(A.aclDestroyIntArray(ia), NULLPTR)
    expect_status(A.aclDestroyBoolArray(ba), NULLPTR)
    expect_status(A.aclDestroyIntArray(ba), NULLPTR)  # wrong kind of object


def test_malloc_and_free_statuses(stream):
    for bad in (-1, 1.5, "8", None, True):
        st, buf = A.aclrtMalloc(bad, stream)
        assert (st, buf) == (INVALID, None) and "size" in A.aclGetRecentErrMsg()
    st, buf = A.aclrtMalloc(64, "no-such-driver")
    assert st != SUCCESS and buf is None and A.aclGetRecentErrMsg()
    st, buf = A.aclrtMalloc(64, 12)
    assert st == INVALID and buf is None
    st, buf = A.aclrtMalloc(0, stream)
    assert st == SUCCESS and buf.size == 0
    st, buf = A.aclrtMalloc(64, DEVICE)
    assert st == SUCCESS and buf.size == 64
    assert A.aclrtFree(buf) == SUCCESS
    expect_status(A.aclrtFree(buf), NULLPTR)
    expect_status(A.aclrtFree(None), NULLPTR)


# ----------------------------------------------------------------------------- output masks
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("mask", [(True, False), (False, True)])
def test_masked_out_output_keeps_sentinel(stream, dtype, mask):
    go, x, grid = gs_arrays(dtype=dtype, seed=4)
    ts = gs_tensors(go, x, grid, dx_fill=7.0, dg_fill=7.0)
    status, ws, ex = gs_phase1(*ts, mask=mask)
    assert status == SUCCESS
    execute((status, ws, ex), stream, A.aclnnGridSampler2DBackward)
    dx, dg = ts[3].numpy(), ts[4].numpy()
    full_dx, full_dg = run_gs(stream, go, x, grid)
    if mask[0]:
        assert_bitwise(dx, full_dx)
        assert np.all(dg == 7.0), "gridGrad was written although outputMask[1] is False"
    else:
        assert np.all(dx == 7.0), "inputGrad was written although outputMask[0] is False"
        assert_bitwise(dg, full_dg)


def test_all_false_mask_still_validates_every_argument():
    args = _gs_args(dtype=np.float16)
    args["outputMask"] = A.aclCreateBoolArray([False, False])
    for name, bad, status in [
            ("interpolationMode", 5, INVALID),
            ("paddingMode", -1, INVALID),
            ("gridGrad", A.aclCreateTensor(np.zeros((2, 3, 5, 2), np.float16)), INVALID),
            ("inputGrad", A.aclCreateTensor(np.zeros((2, 3, 4, 5), np.float32)), INVALID),
            ("input", None, NULLPTR),
            ("gradOutput", A.aclCreateTensor(np.zeros((2, 3, 3, 4), np.float32)), INVALID),
            ("grid", A.aclCreateTensor(np.zeros((2, 3, 4, 3), np.float16)), INVALID),
            ("alignCorners", "yes", INVALID)]:
        expect_status(_gs_call(dict(args, **{name: bad})), status, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_all_false_mask_phase1_succeeds_with_zero_workspace(dtype):
    """float16 needs a workspace when something is computed; with nothing to compute it needs none."""
    go, x, grid = gs_arrays(dtype=dtype)
    status, ws, ex = gs_phase1(*gs_tensors(go, x, grid), mask=(False, False))
    assert (status, ws) == (SUCCESS, 0) and isinstance(ex, A.aclOpExecutor)
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


def test_all_false_mask_phase2_runs_and_leaves_outputs_untouched(stream):
    go, x, grid = gs_arrays(dtype=np.float16)
    ts = gs_tensors(go, x, grid, dx_fill=7.0, dg_fill=7.0)
    status, ws, ex = gs_phase1(*ts, mask=(False, False))
    assert (status, ws) == (SUCCESS, 0)
    assert A.aclnnGridSampler2DBackward(None, 0, ex, stream) == SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    assert np.all(ts[3].numpy() == 7.0) and np.all(ts[4].numpy() == 7.0)


def test_output_mask_none_and_length_3():
    go, x, grid = gs_arrays()
    ts = gs_tensors(go, x, grid)
    expect_status(A.aclnnGridSampler2DBackwardGetWorkspaceSize(*ts[:3], 0, 0, False, None, *ts[3:]),
                  NULLPTR, "outputMask")
    expect_status(gs_phase1(*ts, mask=[True, True, False]), INVALID, "outputMask")


# ----------------------------------------------------------------------------- non-contiguous views
def test_grid_sampler_non_contiguous_views_equal_contiguous_copies(stream):
    rng = np.random.default_rng(5)
    N, C, H, W, Ho, Wo = 2, 3, 4, 5, 3, 4
    go_big = rng.standard_normal((N, C, 2 * Ho, 2 * Wo + 1)).astype(np.float32)
    go = go_big[:, :, ::2, 1::2]                                        # strided slice
    x = rng.standard_normal((W, H, C, N)).astype(np.float32).transpose(3, 2, 1, 0)  # fully transposed
    grid = rng.uniform(-1.1, 1.1, (N, Wo, Ho, 2)).astype(np.float32).transpose(0, 2, 1, 3)
    grid = grid[..., ::-1]                                               # negative stride
    for a in (go, x, grid):
        assert not a.flags.c_contiguous
    views = run_gs(stream, go, x, grid, 0, 1, True)
    copies = run_gs(stream, *(np.ascontiguousarray(a) for a in (go, x, grid)), 0, 1, True)
    assert_bitwise(views[0], copies[0])
    assert_bitwise(views[1], copies[1])
    r = R.grid_sampler_2d_backward(go, x, grid, 0, 1, True)
    assert_close(views[0], r[0], np.float32)
    assert_close(views[1], r[1], np.float32)
    # the tensor is a copy: changing the array afterwards changes nothing
    arr = np.ascontiguousarray(x)
    t = A.aclCreateTensor(arr)
    arr[...] = 0
    assert_bitwise(t.numpy(), np.ascontiguousarray(x))


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_upsample_non_contiguous_view_equals_contiguous_copy(stream, fmt):
    garr, g_nchw, osz, isz = up_arrays(fmt=fmt, seed=6)
    view = np.asfortranarray(garr)[..., :]           # same values, Fortran order
    sliced = np.repeat(garr, 2, axis=0)[::2]          # stride-2 slice along N
    results = []
    for a in (garr, view, sliced):
        assert np.array_equal(a, garr)
        go_t = A.aclCreateTensor(a, fmt)
        out = A.aclCreateTensor(shape=isz, dtype=np.float32, format=fmt)
        execute(up_phase1(go_t, osz, isz, False, -1.0, -1.0, out), stream, A.aclnnUpsampleBilinear2dBackwardV2)
        results.append(out.numpy())
    assert not view.flags.c_contiguous and not sliced.flags.c_contiguous
    assert_bitwise(results[1], results[0])
    assert_bitwise(results[2], results[0])


# ----------------------------------------------------------------------------- stream ordering
def test_two_calls_on_one_stream_chain_without_synchronize(stream):
    """Call 2 reads call 1's inputGrad as its gradOutput; only one synchronize at the end."""
    rng = np.random.default_rng(7)
    N, C, H, W = 2, 8, 48, 40
    go1 = rng.standard_normal((N, C, 64, 64)).astype(np.float32)
    x1 = rng.standard_normal((N, C, H, W)).astype(np.float32)
    g1 = rng.uniform(-1.1, 1.1, (N, 64, 64, 2)).astype(np.float32)
    x2 = rng.standard_normal((N, C, 5, 6)).astype(np.float32)
    g2 = rng.uniform(-1.1, 1.1, (N, H, W, 2)).astype(np.float32)

    t1 = gs_tensors(go1, x1, g1)
    execute(gs_phase1(*t1), stream, A.aclnnGridSampler2DBackward, sync=False)
    x2_t, g2_t = A.aclCreateTensor(x2), A.aclCreateTensor(g2)
    dx2 = A.aclCreateTensor(shape=x2.shape, dtype=np.float32)
    dg2 = A.aclCreateTensor(shape=g2.shape, dtype=np.float32)
    execute(gs_phase1(t1[3], x2_t, g2_t, dx2, dg2), stream, A.aclnnGridSampler2DBackward, sync=False)
    assert A.aclrtSynchronizeStream(stream) == SUCCESS

    dx1 = t1[3].numpy()
    ref_dx1, _ = R.grid_sampler_2d_backward(go1, x1, g1, 0, 0, False)
    assert_close(dx1, ref_dx1, np.float32)
    # the second call saw the finished first result: the same bits as a separately synchronized run
    exp_dx2, exp_dg2 = run_gs(stream, dx1, x2, g2)
    assert_bitwise(dx2.numpy(), exp_dx2)
    assert_bitwise(dg2.numpy(), exp_dg2)
    ref_dx2, ref_dg2 = R.grid_sampler_2d_backward(dx1, x2, g2, 0, 0, False)
    assert_close(dx2.numpy(), ref_dx2, np.float32)
    assert_close(dg2.numpy(), ref_dg2, np.float32)


def test_grid_sampler_then_upsample_on_one_stream(stream):
    """The upsample reads the grid sampler's inputGrad (created with format NCHW, which the grid
    sampler ignores) as its gradOut; one synchronize at the end."""
    rng = np.random.default_rng(8)
    N, C, H, W = 2, 4, 40, 48
    go = rng.standard_normal((N, C, 64, 64)).astype(np.float32)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    g = rng.uniform(-1.1, 1.1, (N, 64, 64, 2)).astype(np.float32)
    go_t, x_t, g_t = (A.aclCreateTensor(a) for a in (go, x, g))
    dx_t = A.aclCreateTensor(shape=x.shape, dtype=np.float32, format="NCHW")
    dg_t = A.aclCreateTensor(shape=g.shape, dtype=np.float32)
    execute(gs_phase1(go_t, x_t, g_t, dx_t, dg_t), stream, A.aclnnGridSampler2DBackward, sync=False)
    out = A.aclCreateTensor(shape=(N, C, 20, 24), dtype=np.float32, format="NCHW")
    execute(up_phase1(dx_t, [H, W], [N, C, 20, 24], False, -1.0, -1.0, out), stream,
            A.aclnnUpsampleBilinear2dBackwardV2, sync=False)
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    dx = dx_t.numpy()
    assert_close(dx, R.grid_sampler_2d_backward(go, x, g, 0, 0, False)[0], np.float32)
    assert_close(out.numpy(), R.upsample_bilinear2d_backward(dx, [H, W], [N, C, 20, 24], False), np.float32)


# ----------------------------------------------------------------------------- repeatable executors
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_repeatable_executor_100_runs_identical_without_memory_growth(stream, dtype):
    go, x, grid = gs_arrays(N=2, C=4, H=8, W=9, Ho=7, Wo=6, dtype=dtype, seed=9)
    ts = gs_tensors(go, x, grid)
    status, ws, ex = gs_phase1(*ts)
    assert status == SUCCESS
    assert A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    workspace = None
    if ws > 0:
        _, workspace = A.aclrtMalloc(ws, stream)
    first = None
    base = None
    for i in range(110):
        if i == 10:
            base = rss_bytes()
        assert A.aclnnGridSampler2DBackward(workspace, ws, ex, stream) == SUCCESS, A.aclGetRecentErrMsg()
        assert A.aclrtSynchronizeStream(stream) == SUCCESS
        res = (ts[3].numpy(), ts[4].numpy())
        if first is None:
            first = res
        else:
            assert_bitwise(res[0], first[0])  # no accumulation across runs
            assert_bitwise(res[1], first[1])
    growth = rss_bytes() - base
    assert growth < 20 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 100 runs"
    r = R.grid_sampler_2d_backward(go, x, grid, 0, 0, False)
    assert_close(first[0], r[0], dtype)
    assert_close(first[1], r[1], dtype)
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS
    expect_status(A.aclnnGridSampler2DBackward(workspace, ws, ex, stream), NOT_TRANS)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_repeatable_upsample_executor(stream, dtype):
    garr, g, osz, isz = up_arrays(dtype=dtype, seed=10)
    go_t = A.aclCreateTensor(garr, "NCHW")
    out = A.aclCreateTensor(shape=isz, dtype=dtype, format="NCHW")
    status, ws, ex = up_phase1(go_t, osz, isz, False, -1.0, -1.0, out)
    assert status == SUCCESS
    assert A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    workspace = A.aclrtMalloc(ws, stream)[1] if ws > 0 else None
    first = None
    for _ in range(20):
        assert A.aclnnUpsampleBilinear2dBackwardV2(workspace, ws, ex, stream) == SUCCESS
        assert A.aclrtSynchronizeStream(stream) == SUCCESS
        if first is None:
            first = out.numpy()
        assert_bitwise(out.numpy(), first)
    assert_close(first, R.upsample_bilinear2d_backward(g, osz, isz, False), dtype)
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS
    expect_status(A.aclnnUpsampleBilinear2dBackwardV2(workspace, ws, ex, stream), NOT_TRANS)


# ----------------------------------------------------------------------------- threads
def test_four_threads_25_calls_each_on_their_own_streams():
    errors = []
    ops = ["gs", "up"]

    def worker(k):
        try:
            status, s = A.aclrtCreateStream(DEVICE)
            assert status == SUCCESS
            for i in range(25):
                seed = 1000 * k + i
                op = ops[(k + i) % len(ops)]
                dtype = np.float16 if i % 5 == 0 else np.float32
                if op == "gs":
                    go, x, grid = gs_arrays(N=1 + i % 2, C=2, H=3 + k, W=4, Ho=2 + i % 3, Wo=3, dtype=dtype, seed=seed)
                    ts = gs_tensors(go, x, grid)
                    res = gs_phase1(*ts)
                    if res[0] != SUCCESS:
                        raise AssertionError(A.aclGetRecentErrMsg())
                    execute(res, s, A.aclnnGridSampler2DBackward)
                    r = R.grid_sampler_2d_backward(go, x, grid, 0, 0, False)
                    assert_close(ts[3].numpy(), r[0], dtype)
                    assert_close(ts[4].numpy(), r[1], dtype)
                else:
                    dtype = np.float16 if i % 5 == 0 and k % 2 == 1 else np.float32
                    garr, g, osz, isz = up_arrays(N=1 + i % 2, C=2, Hi=3 + k, Wi=4, Ho=5, Wo=6 + i % 3,
                                                   dtype=dtype, seed=seed)
                    go_t = A.aclCreateTensor(garr, "NCHW")
                    out = A.aclCreateTensor(shape=isz, dtype=dtype, format="NCHW")
                    res = up_phase1(go_t, osz, isz, False, -1.0, -1.0, out)
                    if res[0] != SUCCESS:
                        raise AssertionError(A.aclGetRecentErrMsg())
                    # Single use: the stream keeps the executor's internal scales alive until it ran.
                    execute(res, s, A.aclnnUpsampleBilinear2dBackwardV2)
                    assert_close(out.numpy(), R.upsample_bilinear2d_backward(g, osz, isz, False), dtype)
                # the error message is per thread: a failure here is seen only by this thread
                bad = A.aclnnGridSampler2DBackwardGetWorkspaceSize(None, None, None, 0, 0, False,
                                                                   A.aclCreateBoolArray([True, True]), None, None)
                assert bad[0] == NULLPTR and "gradOutput" in A.aclGetRecentErrMsg()
            assert A.aclrtDestroyStream(s) == SUCCESS
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    assert not errors, errors


def test_single_use_upsample_keeps_its_scales_alive_until_the_kernel_ran():
    """Deterministic form of the threaded failure: the stream is held at an unsignalled step, so the
    enqueued kernel cannot start; the host memory freed by _release is reused; then the stream goes on."""
    status, s = A.aclrtCreateStream(DEVICE)
    g = np.ones((1, 1, 4, 4), np.float32)
    go_t = A.aclCreateTensor(g, "NCHW")
    out = A.aclCreateTensor(shape=(1, 1, 2, 2), dtype=np.float32, format="NCHW")
    status, ws, ex = up_phase1(go_t, [4, 4], [1, 1, 2, 2], False, -1.0, -1.0, out)
    assert status == SUCCESS
    workspace = A.aclrtMalloc(ws, s)[1] if ws > 0 else None
    s.timeline.next_fences()  # an unsignalled step 0 -> 1 ahead of the call
    assert A.aclnnUpsampleBilinear2dBackwardV2(workspace, ws, ex, s) == SUCCESS
    del workspace  # the stream keeps it alive until the call ran
    junk = [np.full(18, 1e6, np.float32) for _ in range(10000)]  # reuses freed small blocks
    s.timeline.semaphore.signal(1)
    assert A.aclrtSynchronizeStream(s) == SUCCESS
    del junk
    np.testing.assert_array_equal(out.numpy(), R.upsample_bilinear2d_backward(g, [4, 4], [1, 1, 2, 2], False))


def test_repeatable_upsample_survives_reuse_of_freed_memory():
    """Same sequence with a repeatable executor (it keeps its objects until destroyed): right answer."""
    status, s = A.aclrtCreateStream(DEVICE)
    g = np.ones((1, 1, 4, 4), np.float32)
    go_t = A.aclCreateTensor(g, "NCHW")
    out = A.aclCreateTensor(shape=(1, 1, 2, 2), dtype=np.float32, format="NCHW")
    status, ws, ex = up_phase1(go_t, [4, 4], [1, 1, 2, 2], False, -1.0, -1.0, out)
    assert A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    workspace = A.aclrtMalloc(ws, s)[1] if ws > 0 else None
    s.timeline.next_fences()
    assert A.aclnnUpsampleBilinear2dBackwardV2(workspace, ws, ex, s) == SUCCESS
    junk = [np.full(18, 1e6, np.float32) for _ in range(10000)]
    s.timeline.semaphore.signal(1)
    assert A.aclrtSynchronizeStream(s) == SUCCESS
    del junk
    np.testing.assert_array_equal(out.numpy(), R.upsample_bilinear2d_backward(g, [4, 4], [1, 1, 2, 2], False))
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


def test_error_message_is_per_thread():
    expect_status(A.aclDestroyTensor(None), NULLPTR)
    main_msg = A.aclGetRecentErrMsg()
    seen = []

    def worker():
        seen.append(A.aclGetRecentErrMsg())
        A.aclrtFree("nope")
        seen.append(A.aclGetRecentErrMsg())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen[0] == "" and "aclrtFree" in seen[1]
    assert A.aclGetRecentErrMsg() == main_msg


# ----------------------------------------------------------------------------- empty tensors
EMPTY_GS = [dict(N=0), dict(Ho=0), dict(Wo=0), dict(Ho=0, Wo=0), dict(C=0)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", EMPTY_GS)
@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
def test_grid_sampler_empty_tensors_phase1(dtype, shape, mask):
    go, x, grid = gs_arrays(dtype=dtype, **shape)
    status, ws, ex = gs_phase1(*gs_tensors(go, x, grid), mask=mask)
    assert (status, ws) == (SUCCESS, 0), A.aclGetRecentErrMsg()
    assert isinstance(ex, A.aclOpExecutor)
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [dict(Ho=0), dict(Wo=0), dict(Ho=0, Wo=0)])
def test_grid_sampler_empty_grid_writes_requested_input_grad_as_zeros(stream, dtype, shape):
    """H_out = 0: nothing contributes, so a requested (non-empty) inputGrad is all zeros
    (docs/semantics.md#empty-tensors)."""
    go, x, grid = gs_arrays(dtype=dtype, **shape)
    ts = gs_tensors(go, x, grid, dx_fill=7.0, dg_fill=7.0)
    assert ts[3].numpy().size > 0 and np.all(ts[3].numpy() == 7.0)
    status, ws, ex = gs_phase1(*ts)
    assert (status, ws) == (SUCCESS, 0)
    assert A.aclnnGridSampler2DBackward(None, ws, ex, stream) == SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    assert np.all(ts[3].numpy() == 0)
    assert ts[4].numpy().shape == grid.shape


def test_grid_sampler_empty_batch_runs(stream):
    go, x, grid = gs_arrays(N=0)
    ts = gs_tensors(go, x, grid)
    status, ws, ex = gs_phase1(*ts)
    assert (status, ws) == (SUCCESS, 0)
    assert A.aclnnGridSampler2DBackward(None, ws, ex, stream) == SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    assert ts[3].numpy().shape == x.shape and ts[4].numpy().shape == grid.shape


def test_grid_sampler_empty_grid_masked_input_grad_untouched(stream):
    go, x, grid = gs_arrays(Ho=0)
    ts = gs_tensors(go, x, grid, dx_fill=7.0, dg_fill=7.0)
    status, ws, ex = gs_phase1(*ts, mask=(False, True))
    assert (status, ws) == (SUCCESS, 0)
    assert A.aclnnGridSampler2DBackward(None, 0, ex, stream) == SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    assert np.all(ts[3].numpy() == 7.0)


def test_grid_sampler_empty_repeatable_zero_fill(stream):
    """The zero fill of an empty call runs on every run of a repeatable executor."""
    go, x, grid = gs_arrays(Ho=0)
    ts = gs_tensors(go, x, grid, dx_fill=7.0)
    status, ws, ex = gs_phase1(*ts, mask=(True, False))
    assert A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    for _ in range(3):
        assert A.aclnnGridSampler2DBackward(None, 0, ex, stream) == SUCCESS, A.aclGetRecentErrMsg()
        assert A.aclrtSynchronizeStream(stream) == SUCCESS
        assert np.all(ts[3].numpy() == 0)
        ts[3].host[...] = 7.0  # CPU tensors alias their host array: refill between runs
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


def _up_empty(isz, fmt):
    N, C, Hi, Wi = isz
    go_shape = (N, 5, 7, C) if fmt == "NHWC" else (N, C, 5, 7)
    in_sz = [N, Hi, Wi, C] if fmt == "NHWC" else list(isz)
    go_t = A.aclCreateTensor(np.zeros(go_shape, np.float32), fmt)
    out = A.aclCreateTensor(shape=in_sz, dtype=np.float32, format=fmt)
    return go_t, in_sz, out


@pytest.mark.parametrize("isz", [[0, 3, 3, 4], [2, 0, 3, 4]])
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_upsample_empty_tensors_phase1(isz, fmt):
    """N = 0 or C = 0 succeeds with workspace 0 (docs/status-codes.md#upsample-backward-checks;
    needs no kernel)."""
    go_t, in_sz, out = _up_empty(isz, fmt)
    status, ws, ex = up_phase1(go_t, [5, 7], in_sz, False, -1.0, -1.0, out)
    assert (status, ws) == (SUCCESS, 0), A.aclGetRecentErrMsg()
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_upsample_empty_tensors_phase2(stream, fmt):
    go_t, in_sz, out = _up_empty([0, 3, 3, 4], fmt)
    status, ws, ex = up_phase1(go_t, [5, 7], in_sz, False, -1.0, -1.0, out)
    assert (status, ws) == (SUCCESS, 0)
    assert A.aclnnUpsampleBilinear2dBackwardV2(None, 0, ex, stream) == SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    assert out.numpy().shape == tuple(in_sz)


# ----------------------------------------------------------------------------- devices
def test_create_stream_unknown_driver_returns_status():
    status, s = A.aclrtCreateStream("no-such-driver")
    assert status != SUCCESS and s is None
    assert status == RUNTIME
    assert "no-such-driver" in A.aclGetRecentErrMsg()


@pytest.mark.parametrize("bad", [None, 0, "", ["local-task"], "local-task:99999"])
def test_create_stream_bad_device_never_raises(bad):
    status, s = A.aclrtCreateStream(bad)
    assert status != SUCCESS and s is None
    assert A.aclGetRecentErrMsg()


def test_create_stream_missing_cuda_device():
    status, s = A.aclrtCreateStream("cuda")
    if status == SUCCESS:
        A.aclrtDestroyStream(s)
        pytest.skip("a CUDA device exists on this machine")
    assert s is None
    assert status == RUNTIME
    msg = A.aclGetRecentErrMsg()
    assert "cuda" in msg and len(msg) > len("cuda")
    # and a tensor for it is None with a message, never an exception
    assert A.aclCreateTensor(np.zeros(2, np.float32), device="cuda") is None
    assert A.aclGetRecentErrMsg()
