"""Phase 1 once, phase 2 on new data: aclSetInputTensorAddr / aclSetOutputTensorAddr, the
executors the Pythonic and torch layers keep per call signature, and small calls run inline.

CANN lets a repeatable executor run on other memory after its tensors' addresses are
refreshed (aclSetInputTensorAddr); the Pythonic layer keeps such executors per thread, so
a repeated call skips phase 1.  These tests check that a reused executor computes what a
fresh phase 1 would (the float64 reference within the dtype's bound, and the same bits as
a fresh call), that the statuses of bad refreshes are aclnn's, that no kept executor
holds a caller's array, and that the inline (local-sync) path gives local-task's bits.
"""
from __future__ import annotations

import collections
import gc
import threading
import weakref

import numpy as np
import pytest

from aclnn_iree import aclnn as A
from aclnn_iree.core import api
from aclnn_iree.ops import Operator, grid_sampler, grid_sampler_forward, upsample
from aclnn_iree.ops import reference as R
from aclnn_iree.core.errors import ACLNN_ERR_INNER_NULLPTR, ACLNN_ERR_PARAM_INVALID, ACLNN_SUCCESS as SUCCESS
from aclnn_iree.core.tensors import empty_aligned
from test_aclnn import (BF16, assert_bitwise, assert_close, execute, expect_status, gs_arrays, gs_phase1,
                        gs_tensors, up_arrays, up_phase1)


@pytest.fixture
def stream():
    status, s = A.aclrtCreateStream("local-task")
    assert status == SUCCESS, A.aclGetRecentErrMsg()
    yield s
    A.aclrtDestroyStream(s)


def _aligned_copy(a):
    out = empty_aligned(a.shape, a.dtype)
    out[...] = a
    return out


# ----------------------------------------------------------------------------- aclnn layer
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16], ids=lambda d: np.dtype(d).name)
def test_repeatable_grid_executor_on_new_data(stream, dtype):
    """One phase 1, then phase 2 on three sets of data through refreshed addresses: each
    result is the float64 reference's within the dtype's bound and a fresh call's bits."""
    go, x, grid = gs_arrays(dtype=dtype, seed=0)
    ts = gs_tensors(go, x, grid)
    status, ws, ex = gs_phase1(*ts, mode=0, pad=1, ac=True)
    assert status == SUCCESS and A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    st, workspace = A.aclrtMalloc(max(ws, 1), stream)
    assert st == SUCCESS
    for seed in (1, 2, 3):
        arrays = [_aligned_copy(a) for a in gs_arrays(dtype=dtype, seed=seed)]
        outs = [empty_aligned(a.shape, a.dtype) for a in (arrays[1], arrays[2])]
        for i, (t, a) in enumerate(zip(ts[:3], arrays)):
            assert A.aclSetInputTensorAddr(ex, i, t, a) == SUCCESS, A.aclGetRecentErrMsg()
        for i, (t, a) in enumerate(zip(ts[3:], outs)):
            assert A.aclSetOutputTensorAddr(ex, i, t, a) == SUCCESS, A.aclGetRecentErrMsg()
        assert A.aclnnGridSampler2DBackward(workspace, ws, ex, stream) == SUCCESS, A.aclGetRecentErrMsg()
        assert A.aclrtSynchronizeStream(stream) == SUCCESS
        ref_dx, ref_dg = R.grid_sampler_2d_backward(*(a.astype(np.float64) for a in arrays), 0, 1, True)
        assert_close(outs[0], ref_dx, dtype)
        assert_close(outs[1], ref_dg, dtype)
        fresh = api.grid_sampler_2d_backward(*arrays, 0, 1, True)
        assert_bitwise(outs[0], fresh[0])
        assert_bitwise(outs[1], fresh[1])
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_repeatable_upsample_executor_on_device_buffers(stream, fmt):
    """aclrtMalloc'd memory as the new addresses: the upsample's result on the second data
    is the reference's, and the old output is left as the first call wrote it."""
    garr, _, osz, isz = up_arrays(fmt=fmt, seed=0)
    go_t = A.aclCreateTensor(garr, fmt)
    out_t = A.aclCreateTensor(shape=isz, dtype=np.float32, format=fmt)
    status, ws, ex = up_phase1(go_t, osz, isz, False, -1.0, -1.0, out_t)
    assert status == SUCCESS and A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    execute((status, ws, ex), stream, A.aclnnUpsampleBilinear2dBackwardV2)
    first = out_t.numpy()
    g2, g2_nchw, _, _ = up_arrays(fmt=fmt, seed=5)
    st, gbuf = A.aclrtMalloc(g2.nbytes, stream)
    st2, obuf = A.aclrtMalloc(first.nbytes, stream)
    assert st == st2 == SUCCESS
    gbuf.buffer.map().asarray([g2.nbytes], np.dtype(np.uint8))[...] = g2.reshape(-1).view(np.uint8)
    assert A.aclSetInputTensorAddr(ex, 0, go_t, gbuf) == SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclSetOutputTensorAddr(ex, 0, out_t, obuf) == SUCCESS, A.aclGetRecentErrMsg()
    execute((SUCCESS, ws, ex), stream, A.aclnnUpsampleBilinear2dBackwardV2)
    got = out_t.numpy()
    N, C, Hi, Wi = (isz[0], isz[3], isz[1], isz[2]) if fmt == "NHWC" else isz
    ref = R.upsample_bilinear2d_backward(g2_nchw.astype(np.float64), osz, (N, C, Hi, Wi), False, None, None)
    assert_close(got.transpose(0, 3, 1, 2) if fmt == "NHWC" else got, ref, np.float32)
    assert not np.array_equal(got, first)
    A.aclDestroyAclOpExecutor(ex)


def test_set_tensor_addr_statuses(stream):
    go, x, grid = gs_arrays()
    ts = gs_tensors(go, x, grid)
    status, ws, ex = gs_phase1(*ts)
    assert status == SUCCESS
    good = _aligned_copy(x)
    expect_status(A.aclSetInputTensorAddr(None, 0, ts[0], good), ACLNN_ERR_INNER_NULLPTR, "executor")
    expect_status(A.aclSetInputTensorAddr(ex, 1, None, good), ACLNN_ERR_INNER_NULLPTR, "tensor")
    expect_status(A.aclSetInputTensorAddr(ex, 3, ts[1], good), ACLNN_ERR_PARAM_INVALID, "out of range")
    expect_status(A.aclSetInputTensorAddr(ex, True, ts[1], good), ACLNN_ERR_PARAM_INVALID, "out of range")
    expect_status(A.aclSetOutputTensorAddr(ex, 2, ts[3], good), ACLNN_ERR_PARAM_INVALID, "out of range")
    expect_status(A.aclSetInputTensorAddr(ex, 0, ts[1], good), ACLNN_ERR_PARAM_INVALID, "not input 0")
    expect_status(A.aclSetInputTensorAddr(ex, 1, ts[1], good[:, :, :2]), ACLNN_ERR_PARAM_INVALID, "bytes")
    expect_status(A.aclSetInputTensorAddr(ex, 1, ts[1], np.asfortranarray(good)), ACLNN_ERR_PARAM_INVALID,
                  "contiguous")
    ro = _aligned_copy(x)
    ro.flags.writeable = False
    expect_status(A.aclSetInputTensorAddr(ex, 1, ts[1], ro), ACLNN_ERR_PARAM_INVALID, "writable")
    raw = empty_aligned((x.size + 1,), np.float32)
    expect_status(A.aclSetInputTensorAddr(ex, 1, ts[1], raw[1:].reshape(x.shape)), ACLNN_ERR_PARAM_INVALID,
                  "aligned")
    expect_status(A.aclSetInputTensorAddr(ex, 1, ts[1], [1.0] * x.size), ACLNN_ERR_PARAM_INVALID, "aclrtBuffer")
    st, small = A.aclrtMalloc(8, stream)
    expect_status(A.aclSetInputTensorAddr(ex, 1, ts[1], small), ACLNN_ERR_PARAM_INVALID, "at least")
    st, other = A.aclrtMalloc(x.nbytes, "local-sync")
    expect_status(A.aclSetInputTensorAddr(ex, 1, ts[1], other), ACLNN_ERR_PARAM_INVALID, "local-task")
    # a failed refresh changed nothing: the call still runs on the tensors' own data
    execute((status, ws, ex), stream, A.aclnnGridSampler2DBackward)
    assert_bitwise(ts[3].numpy(), api.grid_sampler_2d_backward(go, x, grid)[0])
    # the single-use executor was released by its run
    expect_status(A.aclSetInputTensorAddr(ex, 1, ts[1], good), A.ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR)


def test_refresh_while_a_launch_is_queued_keeps_its_memory(stream):
    """A launch keeps the memory it was given: refreshing and dropping the old arrays while it
    is queued neither frees what it reads nor redirects where it writes."""
    go, x, grid = (_aligned_copy(a) for a in gs_arrays(N=4, C=16, H=64, W=64, Ho=64, Wo=64))
    ts = gs_tensors(go, x, grid)
    status, ws, ex = gs_phase1(*ts)
    assert status == SUCCESS and A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    st, workspace = A.aclrtMalloc(ws, stream)
    out_dx = empty_aligned(x.shape, x.dtype)
    assert A.aclSetOutputTensorAddr(ex, 0, ts[3], out_dx) == SUCCESS
    x_copy = _aligned_copy(x)
    assert A.aclSetInputTensorAddr(ex, 1, ts[1], x_copy) == SUCCESS
    alive = weakref.ref(x_copy)
    assert A.aclnnGridSampler2DBackward(workspace, ws, ex, stream) == SUCCESS
    assert A.aclSetInputTensorAddr(ex, 1, ts[1], _aligned_copy(x * 0)) == SUCCESS
    assert A.aclSetOutputTensorAddr(ex, 0, ts[3], empty_aligned(x.shape, x.dtype)) == SUCCESS
    del x_copy
    gc.collect()
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    assert_bitwise(out_dx, api.grid_sampler_2d_backward(go, x, grid)[0])
    gc.collect()
    assert alive() is None  # released once the launch had run
    A.aclDestroyAclOpExecutor(ex)


# ----------------------------------------------------------------------------- Pythonic layer
def _kept():
    return {k: ex for k, (_, ex) in getattr(api._tls, "executors", {}).items()}


def test_pythonic_call_reuses_its_executor_and_keeps_no_array():
    """The second call with one signature reuses the first call's executor; after a call the
    kept executor refers to none of the caller's arrays or the results."""
    go, x, grid = gs_arrays(C=5, seed=11)
    api.grid_sampler_2d_backward(go, x, grid, 0, 0, False, device="local-sync")
    before = _kept()
    x2 = _aligned_copy(gs_arrays(C=5, seed=12)[1])
    probe = weakref.ref(x2)
    dx, dg = api.grid_sampler_2d_backward(go, x2, grid, 0, 0, False, device="local-sync")
    assert _kept().keys() == before.keys()  # no new executor: the first one ran again
    ref_dx, ref_dg = R.grid_sampler_2d_backward(go.astype(np.float64), x2.astype(np.float64),
                                                grid.astype(np.float64), 0, 0, False)
    assert_close(dx, ref_dx, np.float32)
    assert_close(dg, ref_dg, np.float32)
    del x2
    gc.collect()
    assert probe() is None
    for ex in _kept().values():
        assert all(t.buffer is None and t.host is None for t in ex.inputs + ex.outputs)
        assert ex.views == [] and ex.resources == ()


@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
def test_kept_calls_replay_on_their_own_memory(device, mask, monkeypatch):
    """A repeated call skips phase 1, and every call of a kept executor phase 2's checks: it is
    launched on the call's memory (aclnn.Launcher), never bound to it, and on every device
    (results read back from device memory on GPUs) each call gives the float64 reference's
    result for its own data; the executor's own tensors (the upsample's scales) keep theirs."""
    from conftest import on_device
    grid_fn, up_fn = on_device(device)
    monkeypatch.setattr(api._tls, "executors", collections.OrderedDict(), raising=False)  # none kept yet
    phase1, phase2 = [], []
    for name in ("aclnnGridSampler2DBackward", "aclnnUpsampleBilinear2dBackwardV2"):
        for calls, fn in ((phase1, name + "GetWorkspaceSize"), (phase2, name)):
            real = getattr(A, fn)
            monkeypatch.setattr(A, fn, (lambda real, calls: lambda *a: calls.append(1) or real(*a))(real, calls))
    rng = np.random.default_rng(5)
    go, x, grid = gs_arrays(C=3, seed=31)
    g, _, osz, isz = up_arrays(seed=32)
    for k in range(3):
        x = rng.standard_normal(x.shape).astype(np.float32)
        g = rng.standard_normal(g.shape).astype(np.float32)
        dx, dgrid = grid_fn(go, x, grid, 0, 2, True, mask)
        ref = R.grid_sampler_2d_backward(go.astype(np.float64), x.astype(np.float64), grid.astype(np.float64), 0, 2,
                                         True)
        for got, want, m in zip((dx, dgrid), ref, mask):
            assert (got is None) == (not m)
            if m:
                assert_close(got, want, np.float32)
        assert_close(up_fn(g, osz, isz, False, 1.7, None),
                     R.upsample_bilinear2d_backward(g.astype(np.float64), osz, isz, False, 1.7, None), np.float32)
    assert len(phase1) == 2 and not phase2  # phase 1 for the first call of each signature; no phase 2
    for ex in _kept().values():
        assert all(t.buffer is None for t in ex.inputs + ex.outputs)


def test_sizes_given_as_iterators_are_read_once():
    """output_size and input_size given as iterators (a generator, map) are read once: the
    call, fresh or kept, gives the list form's bits (the signature and phase 1 each read the
    sizes, and a generator once reached phase 1 empty: "got 0 entries")."""
    g, _, osz, isz = up_arrays(seed=41)
    want = api.upsample_bilinear2d_backward(g, osz, isz, False, device="local-sync")
    for _ in range(2):  # the second: a kept executor
        got = api.upsample_bilinear2d_backward(g, (v for v in osz), map(int, isz), False, device="local-sync")
        assert_bitwise(got, want)


def test_pythonic_signature_tells_types_apart():
    """True and 1 are one dict key but not one call: a kept executor of align_corners=True must
    not let align_corners=1 skip phase 1's check."""
    go, x, grid = gs_arrays()
    api.grid_sampler_2d_backward(go, x, grid, 0, 0, True, device="local-sync")
    with pytest.raises(api.AclnnError) as e:
        api.grid_sampler_2d_backward(go, x, grid, 0, 0, 1, device="local-sync")
    assert e.value.status == ACLNN_ERR_PARAM_INVALID and "align_corners" in str(e.value)
    g, _, osz, isz = up_arrays()
    api.upsample_bilinear2d_backward(g, osz, isz, False, device="local-sync")
    with pytest.raises(api.AclnnError):
        api.upsample_bilinear2d_backward(g, osz, isz, 0, device="local-sync")
    with pytest.raises(api.AclnnError):
        api.upsample_bilinear2d_backward(g, [float(v) for v in osz], isz, False, device="local-sync")


@pytest.mark.parametrize("kw", [dict(interpolation_mode=[0]), dict(padding_mode={0: 1}), dict(align_corners=[1]),
                                dict(output_mask=[True, [True]])], ids=["mode", "padding", "ac", "mask"])
def test_unhashable_arguments_get_phase_1s_status(kw):
    """An argument that cannot key a kept executor goes through phase 1, which refuses it
    with a status (it once escaped as a bare TypeError from the executor cache)."""
    go, x, grid = gs_arrays()
    with pytest.raises(api.AclnnError) as e:
        api.grid_sampler_2d_backward(go, x, grid, **kw)
    assert e.value.status == ACLNN_ERR_PARAM_INVALID


def test_threads_keep_their_own_executors():
    """Each thread reuses its own executors: concurrent calls of one signature on new data
    give each thread the reference's result."""
    rng = np.random.default_rng(3)
    go, _, grid = gs_arrays(C=4)
    xs = [rng.standard_normal((2, 4, 4, 5)).astype(np.float32) for _ in range(4)]
    results, errors = {}, []

    def work(k):
        try:
            for _ in range(20):
                results[k] = api.grid_sampler_2d_backward(go, xs[k], grid, 0, 2, False, (True, False))[0]
        except Exception as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in range(4):
        ref, _ = R.grid_sampler_2d_backward(go.astype(np.float64), xs[k].astype(np.float64),
                                            grid.astype(np.float64), 0, 2, False)
        assert_close(results[k], ref, np.float32)


def test_unloading_the_modules_retires_kept_executors():
    """After runtime.kernels.unload_modules (the store changed), a kept executor is not reused:
    the call loads its module again through phase 1."""
    from aclnn_iree.runtime import kernels
    go, x, grid = gs_arrays(C=6)
    api.grid_sampler_2d_backward(go, x, grid, device="local-sync")
    (old,) = [ex for k, ex in _kept().items() if k[1].name == "local-sync" and k[3][0] == x.shape]
    old_module = old.kernel.module
    kernels.unload_modules()
    again = api.grid_sampler_2d_backward(go, x, grid, device="local-sync")
    (new,) = [ex for k, ex in _kept().items() if k[1].name == "local-sync" and k[3][0] == x.shape]
    assert new is not old and old.destroyed and new.kernel.module is not old_module
    assert_close(again[0], R.grid_sampler_2d_backward(go.astype(np.float64), x.astype(np.float64),
                                                      grid.astype(np.float64), 0, 0, False)[0], np.float32)


def test_kept_executors_are_bounded():
    g, _, osz, _ = up_arrays()
    for h in range(1, api._EXECUTORS_PER_THREAD + 10):
        api.upsample_bilinear2d_backward(g, osz, [2, 3, h, 4], False, device="local-sync")
    assert len(_kept()) <= api._EXECUTORS_PER_THREAD


# ----------------------------------------------------------------------------- inline small calls
def test_small_calls_run_inline_on_local_sync():
    GS, UP = grid_sampler.OPERATOR, upsample.OPERATOR
    assert GS.call_device("local-task", GS.inline_work[""]) == "local-sync"
    assert GS.call_device("local-task", GS.inline_work[""] + 1) == "local-task"
    assert UP.call_device("local-task", 10) == "local-sync"
    assert UP.call_device("vulkan", 10) == "vulkan"
    assert GS.call_device("local-sync", 10**9) == "local-sync"
    # a same-size upsample is a copy: inline up to a larger bound
    assert UP.inline_work["same_size"] > UP.inline_work[""]
    assert UP.call_device("local-task", UP.inline_work[""] + 1, "same_size") == "local-sync"
    assert upsample.call_kind((2, 3, 5, 6), (2, 3, 5, 6)) == "same_size"
    assert upsample.call_kind((2, 3, 5, 6), (2, 3, 5, 7)) == ""
    # the grid sampler's modes read 1, 4 and 16 taps per point: bicubic leaves the caller's
    # thread sooner, nearest later (a 4 x 16 x 64^2 bicubic forward took 1.3 ms a call inline,
    # 0.7 on two workers, under bilinear's bound); an unknown code takes ""'s bound
    for op in (GS, grid_sampler_forward.OPERATOR):
        work = op.inline_work["bilinear"]
        assert op.inline_work["bicubic"] < work < op.inline_work["nearest"]
        assert [op.call_device("local-task", work, grid_sampler.call_kind(m)) for m in (0, 1, 2, 7, [0])] == \
            ["local-sync", "local-sync", "local-task", "local-sync", "local-sync"]
    class Unhashable:  # a __hash__ that raises something else than TypeError: still phase 1's to reject
        def __hash__(self):
            raise ValueError("no hash")
    assert grid_sampler.call_kind(Unhashable()) == ""
    with pytest.raises(api.AclnnError, match="161002"):
        api.grid_sampler_2d(*gs_arrays(N=1, C=1, H=3, W=3, Ho=2, Wo=2)[1:], Unhashable())
        assert op.call_device("local-task", work + 1, grid_sampler.call_kind(1)) == "local-sync"


def test_grid_sampler_calls_name_their_mode_for_the_inline_bound(monkeypatch):
    """The Pythonic calls and the torch layer pass the interpolation mode's kind to
    call_device (forward and backward), so its bound is the one applied."""
    torch = pytest.importorskip("torch")
    from aclnn_iree.torch import grid_sampler as TG
    seen = []
    real = Operator.call_device
    monkeypatch.setattr(Operator, "call_device", lambda self, device, work, kind="": seen.append((self.name, kind))
                        or real(self, device, work, kind))
    go, x, grid = gs_arrays(N=1, C=2, H=5, W=6, Ho=4, Wo=3)
    api.grid_sampler_2d_backward(go, x, grid, "bicubic", 0, False)
    api.grid_sampler_2d(x, grid, "nearest", 0, False)
    t = [torch.from_numpy(a) for a in (go, x, grid)]
    TG.grid_sampler_backward("local-task", *t, 2, 0, False, (True, True))
    TG.grid_sampler_forward("local-task", t[1], t[2], 1, 0, False)
    assert seen == [("grid_sampler_2d_backward", "bicubic"), ("grid_sampler_2d", "nearest")] * 2


@pytest.mark.parametrize("mode,pad,ac", [(0, 0, False), (1, 1, True), (2, 2, False), (0, 2, True)])
def test_inline_and_threaded_runs_agree_bitwise(mode, pad, ac, monkeypatch):
    """Calls under the inline bound run on local-sync instead of local-task: both devices run
    the same kernels with the same summation order, so the same bits (compared here with the
    bound lowered so that local-task really runs on its workers)."""
    for op in (grid_sampler.OPERATOR, upsample.OPERATOR):
        for kind in op.inline_work:
            monkeypatch.setitem(op.inline_work, kind, -1)
    rng = np.random.default_rng(mode * 7 + pad)
    for C in (3, 17):
        go, x, grid = gs_arrays(N=2, C=C, H=20, W=23, Ho=19, Wo=21, seed=C)
        grid = rng.uniform(-1.3, 1.3, grid.shape).astype(np.float32)
        sync = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, device="local-sync")
        task = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, device="local-task")
        for a, b in zip(sync, task):
            assert_bitwise(a, b)
    g = rng.standard_normal((2, 8, 61, 47)).astype(np.float32)
    assert_bitwise(api.upsample_bilinear2d_backward(g, (61, 47), (2, 8, 30, 20), ac, device="local-sync"),
                   api.upsample_bilinear2d_backward(g, (61, 47), (2, 8, 30, 20), ac, device="local-task"))
    assert_bitwise(api.upsample_bilinear2d_backward(g, (61, 47), (2, 8, 61, 47), ac, device="local-sync"),
                   api.upsample_bilinear2d_backward(g, (61, 47), (2, 8, 61, 47), ac, device="local-task"))


# ----------------------------------------------------------------------------- grid_runs
@pytest.mark.parametrize("smooth", [True, False], ids=["warp", "scattered"])
def test_grid_gradient_alone_takes_the_point_pass_for_a_smooth_grid(stream, smooth, monkeypatch):
    """grad_grid alone with more than 8 channels, of more elements than the point pass takes
    whole (here: any): @grid_runs sends a smooth grid (a warp) to the point-parallel pass,
    which leaves the slots and partial sums in the workspace untouched (only the 64-byte
    unit of its verdict is written), and a scattered one to the slot pass, which writes
    them; both give the reference's gradient."""
    from aclnn_iree.compiler import specs
    monkeypatch.setattr(specs, "DGRID_POINTS_MAX_ELEMENTS", {})
    rng = np.random.default_rng(8)
    N, C, H, W = 2, 12, 20, 40
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    go = rng.standard_normal((N, C, H, W)).astype(np.float32)
    if smooth:
        ys, xs = np.meshgrid(np.arange(H) + 0.25, np.arange(W) - 1.6, indexing="ij")
        grid = np.stack([(2 * xs + 1) / W - 1, (2 * ys + 1) / H - 1], -1)
        grid = np.broadcast_to(grid, (N, H, W, 2)).astype(np.float32)
    else:
        grid = rng.uniform(-1, 1, (N, H, W, 2)).astype(np.float32)
    ts = gs_tensors(go, x, grid)
    status, ws, ex = gs_phase1(*ts, pad=1, mask=(False, True))
    assert status == SUCCESS and ex.kernel.name.endswith("_dgrid"), (status, ex and ex.kernel.name)
    st, workspace = A.aclrtMalloc(ws, stream)
    raw = workspace.buffer.map().asarray([ws], np.dtype(np.uint8))
    raw[...] = 0xA5
    assert A.aclnnGridSampler2DBackward(workspace, ws, ex, stream) == SUCCESS
    assert A.aclrtSynchronizeStream(stream) == SUCCESS
    changed = int(np.count_nonzero(workspace.buffer.map().asarray([ws], np.dtype(np.uint8)) != 0xA5))
    if smooth:
        assert changed <= 64, changed
    else:
        assert changed > ws // 4, (changed, ws)
    ref = R.grid_sampler_2d_backward(go.astype(np.float64), x.astype(np.float64), grid.astype(np.float64), 0, 1,
                                     False)[1]
    assert_close(ts[4].numpy(), ref, np.float32)


def test_a_failed_launch_does_not_fail_every_later_call():
    """A launch that fails on the device fails its stream's timeline for good; the layers'
    per-thread stream is then replaced, so the next call computes again (it once kept
    failing with the same error: the custom op's nearest grid gradient alone did so)."""
    go, x, grid = gs_arrays(C=2, seed=21)
    want = api.grid_sampler_2d_backward(go, x, grid, device="local-sync")
    api.thread_stream("local-sync").timeline.semaphore.fail("a device failure")
    with pytest.raises(api.AclnnError) as e:
        api.grid_sampler_2d_backward(go, x, grid, device="local-sync")
    assert e.value.status == A.ACLNN_ERR_RUNTIME_ERROR
    again = api.grid_sampler_2d_backward(go, x, grid, device="local-sync")
    assert_bitwise(again[0], want[0])
    assert_bitwise(again[1], want[1])


@pytest.mark.parametrize("device", ["local-task", "local-sync"])
def test_a_repeatable_executor_asks_for_its_estimate_once(device, monkeypatch):
    """A launch's duration estimate (what a CPU stream sleeps through) is made on the executor's
    first launch and kept, since rebinding keeps every shape; a synchronous device, whose launch
    returns with the work done, has none.  Each run still computes the reference's result."""
    from aclnn_iree.runtime import kernels
    asked = []
    real = kernels.Kernel.estimate
    monkeypatch.setattr(kernels.Kernel, "estimate", lambda self, views: asked.append(1) or real(self, views))
    status, s = A.aclrtCreateStream(device)
    assert status == SUCCESS
    garr, _, osz, isz = up_arrays(fmt="NCHW", seed=0)
    go_t = A.aclCreateTensor(garr, "NCHW", stream=s)
    out_t = A.aclCreateTensor(shape=isz, dtype=np.float32, format="NCHW", stream=s)
    status, ws, ex = up_phase1(go_t, osz, isz, False, -1.0, -1.0, out_t)
    assert status == SUCCESS and A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    ref = R.upsample_bilinear2d_backward(garr.astype(np.float64), osz, isz, False, None, None)
    for _ in range(3):
        execute((SUCCESS, ws, ex), s, A.aclnnUpsampleBilinear2dBackwardV2)
        assert_close(out_t.numpy(), ref, np.float32)
    assert len(asked) == (1 if device == "local-task" else 0)
    A.aclDestroyAclOpExecutor(ex)
    A.aclrtDestroyStream(s)


def test_data_address_and_alignment_of_host_arrays():
    """Host arrays are imported where 16-byte aligned (the kernels' bindings say so) and copied
    otherwise; the address comes through ctypes' buffer protocol where it can (writable, at
    least a byte) and array.ctypes otherwise: the same number for every kind of array."""
    from aclnn_iree.core.tensors import aligned, data_address
    base = empty_aligned((64,), np.float32)
    ro = base.copy()
    ro.flags.writeable = False
    for a in (base, base[1:], base[4:], ro, np.zeros(0, np.float32), np.zeros((8, 8))[:, 1], base.reshape(8, 8)):
        assert data_address(a) == a.ctypes.data
    off = base[1:17]  # 4 bytes past a 64-byte boundary
    assert data_address(off) % 16 == 4
    fixed = aligned(off)
    assert fixed is not off and data_address(fixed) % 16 == 0 and np.array_equal(fixed, off)
    v16 = base[4:20]  # 16 bytes in: aligned, imported as it is
    assert aligned(v16) is v16 and aligned(base) is base
    # A call on the misaligned view gives the aligned copy's bits.
    go = np.random.default_rng(3).standard_normal((1, 2, 5, 7)).astype(np.float32)
    raw = empty_aligned((go.size + 1,), np.float32)
    view = raw[1:].reshape(go.shape)
    view[...] = go
    assert data_address(view) % 16 != 0
    a = api.upsample_bilinear2d_backward(view, (5, 7), (1, 2, 3, 4), False)
    b = api.upsample_bilinear2d_backward(go, (5, 7), (1, 2, 3, 4), False)
    assert_bitwise(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.dtype(np.float32), BF16], ids=["scalar type", "dtype", "bfloat16"])
def test_read_back_copies_device_memory(dtype):
    """tensors.read_back (how a layer reads an output the kernel wrote in device memory) copies
    the bytes for a Storage whose dtype is a NumPy dtype or a scalar type (the torch layer's
    DLPack storages carry the latter), and an empty one without touching its buffer."""
    from aclnn_iree.runtime.device import get_device
    from aclnn_iree.core.tensors import Storage, read_back
    dev = get_device("local-sync")
    want = np.arange(12, dtype=np.float32).reshape(3, 4).astype(dtype)
    got = read_back(Storage(dev.upload(want), None, None, (3, 4), dtype, "ND"), dev)
    assert got.dtype == np.dtype(dtype) and got.tobytes() == want.tobytes()
    assert read_back(Storage(dev.allocate(1), None, None, (0, 4), dtype, "ND"), dev).shape == (0, 4)


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_an_executor_cannot_be_copied(stream, how):
    """A copy of a single-use executor that already ran was accepted by phase 2 again (its
    `destroyed` flag was the copy's own): copying or pickling one is refused, and the ran
    executor itself stays refused (561102)."""
    import copy
    import pickle
    go, x, grid = gs_arrays()
    ts = gs_tensors(go, x, grid)
    res = gs_phase1(*ts)
    execute(res, stream, A.aclnnGridSampler2DBackward)
    ex = res[2]
    dup = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": pickle.dumps}[how]
    with pytest.raises(TypeError, match="cannot be copied"):
        dup(ex)
    assert A.aclnnGridSampler2DBackward(None, 0, ex, stream) == A.ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR


def test_repeated_inline_calls_take_the_synchronous_launch(monkeypatch):
    """A kept executor's launch on local-sync (every inline call of the layers) queues through
    Timeline.run_synchronous: one timeline step per call, nothing kept in flight, no duration
    estimate; each call computes its own data (the reference, within float32's bound), and a
    call whose queueing fails is ACLNN_ERR_RUNTIME_ERROR and leaves the timeline usable."""
    from aclnn_iree.runtime import kernels, timeline
    taken = []
    real = timeline.Timeline.run_synchronous
    monkeypatch.setattr(timeline.Timeline, "run_synchronous",
                        lambda self, enqueue: taken.append(self) or real(self, enqueue))
    monkeypatch.setattr(timeline.Timeline, "submit", lambda *a, **k: pytest.fail("submit on a synchronous device"))
    api.grid_sampler_2d_backward(*gs_arrays(C=2, seed=30), device="local-sync")  # phase 1, kept
    tl = api.thread_stream("local-sync").timeline
    for seed in range(31, 35):
        go, x, grid = gs_arrays(C=2, seed=seed)
        before = tl.value
        dx, dgrid = api.grid_sampler_2d_backward(go, x, grid, device="local-sync")
        assert tl.value == before + 1 and not tl._inflight and tl._expect is None
        want = R.grid_sampler_2d_backward(*(a.astype(np.float64) for a in (go, x, grid)), 0, 0, False)
        assert_close(dx, want[0], np.float32)
        assert_close(dgrid, want[1], np.float32)
    assert len(taken) == 5 and set(taken) == {tl}

    def refused(self, args, wait, signal):
        raise RuntimeError("queue refused")
    go, x, grid = gs_arrays(C=2, seed=35)
    with monkeypatch.context() as m:
        m.setattr(kernels.Kernel, "fenced_call", refused)
        with pytest.raises(api.AclnnError) as e:
            api.grid_sampler_2d_backward(go, x, grid, device="local-sync")
    assert e.value.status == A.ACLNN_ERR_RUNTIME_ERROR and "queue refused" in str(e.value)
    again = api.grid_sampler_2d_backward(go, x, grid, device="local-sync")  # the step was signalled
    want = R.grid_sampler_2d_backward(*(a.astype(np.float64) for a in (go, x, grid)), 0, 0, False)
    assert_close(again[0], want[0], np.float32)
