"""GPU targets (issue 8): Vulkan run for real (Mesa's lavapipe in CI), CUDA compiled.

The numerical suites (test_grid_sampler, test_dtypes, test_properties) already run
on every device of conftest.DEVICES.  This module adds what is specific to GPUs:
cross-device agreement within the dtype's bound, the deterministic mode and its
switch (aclrtCtxSetSysParamOpt / deterministic=), many contributions on few
pixels, every artifact compiling for vulkan-spirv and cuda, and the status a
missing CUDA driver gives.
"""
from __future__ import annotations

import collections
import itertools
import re
import shutil
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from aclnn_iree import aclnn as A
from aclnn_iree.core import api
from aclnn_iree.ops import reference as ref
from aclnn_iree.compiler.build import ArtifactStore
from aclnn_iree.compiler.reflect import ptx_images, ptxas_report
from aclnn_iree.compiler.specs import (DTYPES, GridSampler2dSpec, GridSamplerSpec, UpsampleBilinear2dSpec, UpsampleSpec,
                                       all_specs)
from aclnn_iree.compiler.targets import get_target
from aclnn_iree.core.errors import AclnnError
from aclnn_iree.runtime.store import cache_dir
from conftest import DEVICES, device_missing, is_gpu, prepare_modules, require_device
from grid_sampler_2d_backward.test_grid_sampler import error_bounds, random_case
from upsample_bilinear2d_backward.test_upsample_cpu_forms import W_FIRST_SHAPES

# The GPU devices under test: vulkan (lavapipe in CI), or what ACLNN_IREE_TEST_DEVICES names
# (scripts/gpu_check.sh: cuda).
GPUS = [d for d in DEVICES if is_gpu(d)] or ["vulkan"]
EPS32 = float(np.finfo(np.float32).eps)
COMBOS = list(itertools.product((0, 1, 2), (0, 1, 2), (False, True)))


@pytest.fixture(scope="module", params=GPUS)
def vulkan(request):
    """A GPU device (named for the one CI tests: Mesa's lavapipe Vulkan)."""
    require_device(request.param)
    prepare_modules(request.param)
    return request.param


def _bounded_equal(actual, expected, bound, what):
    err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), f"{what}: |diff| {err[worst]:.3e} > bound {bound[worst]:.3e} at {worst}"


# ----------------------------------------------------------------------------------------
# Host <-> GPU transfers: kernel memory is device-only (on CUDA a mappable device-local buffer
# is managed memory, which the host read and wrote at about 1 GB/s on the first GPU run), so
# bytes move by queued copies through staging memory; aclrtMalloc's memory stays mappable.
# ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[True, False], ids=["staged", "mapped"])
def gpu_memory(vulkan, request):
    """A device of the GPU under test whose kernel memory is device-only (`staged`: as on
    CUDA and discrete GPUs) or mapped (as where device memory is cached host memory)."""
    from aclnn_iree.runtime.device import Device
    return Device(vulkan, staged=request.param)


@pytest.mark.parametrize("nbytes", [1, 3, 4096, 1 << 20, (1 << 20) + 5])
def test_gpu_upload_and_download_round_trip(gpu_memory, nbytes):
    import iree.runtime as rt
    dev = gpu_memory
    want = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    buf = dev.upload(want)
    mappable = bool(int(buf.allowed_usage()) & int(rt.BufferUsage.MAPPING_SCOPED))
    assert mappable != dev.staged and mappable == bool(int(dev.allocate(nbytes).allowed_usage()) & int(rt.BufferUsage.MAPPING_SCOPED))
    assert dev.download(buf, nbytes).tobytes() == want.tobytes()
    assert dev.download(buf, nbytes - 1).tobytes() == want[:-1].tobytes()  # a prefix of it
    host_filled = dev.allocate_mappable(nbytes)  # aclrtMalloc's: the host fills it in place
    host_filled.map().asarray([nbytes], np.dtype(np.uint8))[...] = want
    assert dev.download(host_filled, nbytes).tobytes() == want.tobytes()


def test_staging_pool_lends_a_kept_buffer_again_and_keeps_at_most_its_bound(vulkan):
    """Staged transfers reuse their pinned host buffers: a size lent before comes back from
    the pool (no new pinning), two at once get two buffers, and no more than keep_bytes stay
    idle."""
    from aclnn_iree.runtime.device import Device, StagingPool, _STAGING_UPLOAD
    pool = StagingPool(Device(vulkan).allocator, _STAGING_UPLOAD, keep_bytes=3000)
    with pool.lend(1000) as a:
        with pool.lend(1000) as b:
            assert a is not b and a.byte_length() == b.byte_length() == 1000
    assert pool.idle_bytes == 2000
    with pool.lend(1000) as c:
        assert c is b or c is a
    with pool.lend(2500):
        pass
    assert pool.idle_bytes == 2000  # the 2500-byte buffer did not fit the bound
    with pool.lend(0) as empty:
        assert empty.byte_length() == 1


def test_gpu_transfers_from_many_threads_keep_their_own_bytes(gpu_memory):
    """Uploads and downloads on one device from 8 threads at once: each gets its own bytes
    back (every staged transfer waits on a semaphore of its own)."""
    from concurrent.futures import ThreadPoolExecutor
    dev = gpu_memory

    def round_trip(i):
        want = np.full(65536 + i, i, np.uint8)
        return dev.download(dev.upload(want), want.nbytes).tobytes() == want.tobytes()
    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(round_trip, range(64)))


@pytest.mark.parametrize("mode,pad,ac", [(0, 0, False), (2, 2, True)], ids=["bilinear_zeros", "bicubic_reflection_ac"])
def test_gpu_memory_kinds_compute_the_reference(gpu_memory, mode, pad, ac):
    """aclnnGridSampler2DBackward through the aclnn layer on the GPU with kernel memory of
    either kind: inputs uploaded (aclCreateTensor), outputs read back (aclTensor.numpy),
    within the float32 bound of the float64 reference."""
    go, x, grid = random_case(np.random.default_rng(4), (2, 3, 6, 7, 5, 4))
    status, stream = A.aclrtCreateStream(gpu_memory)
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    ts = [A.aclCreateTensor(v, stream=stream) for v in (go, x, grid)]
    ts += [A.aclCreateTensor(shape=v.shape, dtype=v.dtype, stream=stream) for v in (x, grid)]
    status, size, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(*ts[:3], mode, pad, ac,
                                                                      A.aclCreateBoolArray([True, True]), *ts[3:])
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    workspace = A.aclrtMalloc(size, stream)[1] if size else None
    assert A.aclnnGridSampler2DBackward(workspace, size, ex, stream) == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == A.ACLNN_SUCCESS
    want = ref.grid_sampler_2d_backward(go, x, grid, mode, pad, ac)
    for got, exact, bound, what in zip((ts[3].numpy(), ts[4].numpy()), want,
                                       error_bounds(go, x, grid, mode, pad, ac, EPS32), ("grad_input", "grad_grid")):
        _bounded_equal(got, exact, bound, what)
    A.aclrtDestroyStream(stream)


# ----------------------------------------------------------------------------------------
# Cross-device agreement: both modes on Vulkan against the CPU, within twice the f32 bound
# (each result is within the bound of the exact value).
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("mode,pad,ac", COMBOS, ids=[f"m{m}p{p}ac{int(a)}" for m, p, a in COMBOS])
def test_grid_sampler_vulkan_agrees_with_cpu(vulkan, mode, pad, ac, deterministic):
    rng = np.random.default_rng(mode * 10 + pad * 2 + ac)
    go, x, grid = random_case(rng, (2, 5, 9, 11, 7, 8))
    cpu = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac)
    gpu = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, device=vulkan, deterministic=deterministic)
    b_dx, b_dg = error_bounds(go, x, grid, mode, pad, ac, EPS32)
    _bounded_equal(gpu[0], cpu[0], 2 * b_dx, "grad_input")
    _bounded_equal(gpu[1], cpu[1], 2 * b_dg, "grad_grid")


POINTS_CASES = [(0, 0, False, "float32", (2, 6, 9, 11, 7, 8)), (0, 2, True, "float32", (1, 300, 5, 6, 4, 3)),
                (2, 1, False, "float32", (2, 6, 9, 11, 7, 8)), (2, 2, True, "float16", (2, 6, 9, 11, 7, 8)),
                (0, 1, True, "bfloat16", (1, 260, 4, 5, 3, 3)), (0, 0, False, "float32", (3, 5, 30, 31, 33, 34))]


@pytest.mark.parametrize("mode,pad,ac,dtype,shape", POINTS_CASES,
                         ids=[f"m{m}p{p}ac{int(a)}_{d}_{'x'.join(map(str, s))}" for m, p, a, d, s in POINTS_CASES])
def test_the_cuda_shaped_one_pass_runs_on_vulkan(vulkan, monkeypatch, mode, pad, ac, dtype, shape):
    """`<kernel>_points` (CUDA's calls of both gradients: one invocation per output point walks
    its channels, dx by atomics and grad_grid in the same pass), chosen on Vulkan for this test:
    grad_grid has the bits of the two-dispatch form (@dgrid_points_gpu's ordered channel
    blocks, across a block boundary where C > 256), grad_input is within twice the float32
    bound of the CPU's (the half types': the two forms' float32 sums, each rounded once, an ulp
    of the dtype more).  Point counts that are not a multiple of the workgroup (lavapipe loses
    atomics in a loop its invocations leave at different steps) and several grid-stride steps."""
    import aclnn_iree.compiler.specs as specs
    rng = np.random.default_rng(mode * 10 + pad * 2 + ac + shape[1])
    go, x, grid = (a.astype(DTYPES[dtype].numpy) for a in random_case(rng, shape))
    two_pass = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, device=vulkan)
    chosen, real = [], GridSamplerSpec.function_name
    monkeypatch.setattr(specs, "GPU_POINTS_TARGETS", specs.GPU_POINTS_TARGETS + ("vulkan-spirv",))
    monkeypatch.setattr(GridSamplerSpec, "function_name",
                        lambda self, *a, **kw: chosen.append(real(self, *a, **kw)) or chosen[-1])
    monkeypatch.setattr(api._tls, "executors", collections.OrderedDict())  # phase 1 again: the new choice
    points = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, device=vulkan)
    assert chosen and chosen[-1].endswith("_points"), chosen
    assert points[1].tobytes() == two_pass[1].tobytes(), "grad_grid: not the two-dispatch form's bits"
    go32, x32, grid32 = (a.astype(np.float32) for a in (go, x, grid))
    bound = 2 * error_bounds(go32, x32, grid32, mode, pad, ac, EPS32)[0]  # two float32 sums of the same terms
    if dtype == "float32":
        _bounded_equal(points[0], api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac)[0], bound, "grad_input")
    else:
        a, b = points[0].astype(np.float64), two_pass[0].astype(np.float64)
        info = ml_dtypes.finfo(DTYPES[dtype].numpy)
        mag = np.maximum(np.maximum(np.abs(a), np.abs(b)), float(info.smallest_normal))
        _bounded_equal(a, b, bound + float(info.eps) * 2.0 ** np.floor(np.log2(mag)), "grad_input")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_upsample_same_size_vulkan_gives_the_cpu_bits(vulkan, layout):
    """Both axes keeping their size (`<kernel>_same_size`, an elementwise pass; on GPUs
    IREE's own dispatch): the CPU's bits, -0.0 made +0.0 (an add of 0.0 there was folded
    away by Mesa) and infinities and NaN passed through, in every dtype."""
    rng = np.random.default_rng(4)
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.float64):
        go = rng.standard_normal((2, 3, 37, 41)).astype(dtype)
        if layout == "NHWC":
            go = np.ascontiguousarray(go.transpose(0, 2, 3, 1))
        go.reshape(-1)[[5, 7, 9]] = np.array([-0.0, np.inf, np.nan]).astype(dtype)
        cpu = api.upsample_bilinear2d_backward(go, (37, 41), go.shape, False, memory_format=layout)
        gpu = api.upsample_bilinear2d_backward(go, (37, 41), go.shape, False, memory_format=layout, device=vulkan)
        assert gpu.view(np.uint8).tobytes() == cpu.view(np.uint8).tobytes(), np.dtype(dtype).name
        assert not np.signbit(cpu.reshape(-1)[5])


@pytest.mark.parametrize("ac,layout", list(itertools.product((False, True), ("NCHW", "NHWC"))))
@pytest.mark.parametrize("sizes", [((13, 17), (6, 5)), ((5, 6), (13, 17)), ((40, 1), (1, 3)), ((2, 90), (40, 3))],
                         ids=["down", "up", "mixed", "w_first"])
def test_upsample_vulkan_agrees_with_cpu(vulkan, ac, layout, sizes):
    (ho, wo), (h, w) = sizes
    rng = np.random.default_rng(ho * wo + h)
    n, c = 2, 3
    shape = (n, c, ho, wo) if layout == "NCHW" else (n, ho, wo, c)
    isz = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    go = rng.standard_normal(shape).astype(np.float32)
    cpu = api.upsample_bilinear2d_backward(go, (ho, wo), isz, ac, memory_format=layout)
    gpu = api.upsample_bilinear2d_backward(go, (ho, wo), isz, ac, memory_format=layout, device=vulkan)
    # Each dx element sums at most K_H * K_W terms |w dy| with |w| <= 1 (sum |terms| <= absum):
    # the sum adds <= K_H K_W eps absum; each 1-D weight comes from a source coordinate
    # src = r (o + 1/2) - 1/2 computed in float32, off by <= 3 eps max(H, W), which moves
    # the weight by as much: <= 2 * 2 * 3 eps max(H, W) per term for the product of two.
    k = (2 * -(-ho // h) + 2) * (2 * -(-wo // w) + 2) + 12 * max(h, w) + 4
    nchw = go if layout == "NCHW" else go.transpose(0, 3, 1, 2)
    exact = ref.upsample_bilinear2d_backward(nchw.astype(np.float64), (ho, wo), (n, c, h, w), ac)
    absum = ref.upsample_bilinear2d_backward(np.abs(nchw).astype(np.float64), (ho, wo), (n, c, h, w), ac)
    if layout == "NHWC":
        exact, absum = exact.transpose(0, 2, 3, 1), absum.transpose(0, 2, 3, 1)
    bound = k * EPS32 * absum
    _bounded_equal(cpu, exact, bound, "cpu upsample")
    _bounded_equal(gpu, exact, bound, "vulkan upsample")


def _upsample_workspace(device, go, out_hw, input_size):
    status, stream = A.aclrtCreateStream(device)
    assert status == A.ACLNN_SUCCESS
    out = A.aclCreateTensor(np.empty(input_size, go.dtype), "NCHW", stream=stream)
    status, ws, _ = A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        A.aclCreateTensor(go, "NCHW", stream=stream), A.aclCreateIntArray(list(out_hw)),
        A.aclCreateIntArray(list(input_size)), False, -1.0, -1.0, out)
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    return ws


def _table_bytes(n_in, n_out):
    """An axis table's bytes at most: an int64 start and K float32 weights per input index,
    K <= 2 (out + 1) / in + 2 (window_len), and 64-byte alignment on each of its two arrays."""
    k = min(n_out, 2 * (n_out + 1) // n_in + 2)
    return n_in * (8 + 4 * k) + 2 * 64


@pytest.mark.parametrize("shape", W_FIRST_SHAPES + [(2, 32, (1, 2000), (2000, 1)), (2, 3, (64, 48), (128, 96))],
                         ids=lambda s: f"{s[0]}x{s[1]}_{s[2]}to{s[3]}")
def test_upsample_gpu_takes_the_cheaper_pass_order(vulkan, shape):
    """The GPU passes meet in the workspace, t: N*C*H_out*W_in float32 values when the W pass
    goes first, N*C*H_in*W_out when the H pass does (plus the axis tables), so its size
    shows the order the template picked: W first for every shape of test_upsample_cpu_forms'
    W_FIRST_SHAPES (where the CPU forms take the same order), H first for the transposed
    2000x case and for an equal-ratio resize.  With H down-sampled 2000x and W up-sampled
    2000x, H first would need 1 GiB of workspace; W first needs less than the input."""
    N, C, (H, W), (Ho, Wo) = shape
    go = np.zeros((N, C, Ho, Wo), np.float32)
    ws = _upsample_workspace(vulkan, go, (Ho, Wo), (N, C, H, W))
    t_w, t_h = 4 * N * C * Ho * W, 4 * N * C * H * Wo
    tables = _table_bytes(H, Ho) + _table_bytes(W, Wo) + 256
    took_w = shape in W_FIRST_SHAPES
    assert (t_w if took_w else t_h) <= ws <= (t_w if took_w else t_h) + tables, (ws, t_w, t_h)
    if shape == (2, 32, (2000, 1), (1, 2000)):
        assert ws < go.nbytes < t_h


# ----------------------------------------------------------------------------------------
# Many contributions on few pixels: > 100,000 output points land on the same 2x2 pixels.
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("mode", [0, 2], ids=["bilinear", "bicubic"])
def test_more_than_100000_contributions_on_few_pixels(vulkan, mode, deterministic):
    n, c, h, w, ho, wo = 1, 2, 6, 6, 320, 330  # 105,600 points, several chunks of the ordered form
    rng = np.random.default_rng(3)
    go = rng.uniform(0.5, 1.5, (n, c, ho, wo)).astype(np.float32)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    grid = np.empty((n, ho, wo, 2), np.float32)
    grid[..., 0] = 0.05  # between pixels 2 and 3 (align_corners=False)
    grid[..., 1] = -0.1
    dx, dg = api.grid_sampler_2d_backward(go, x, grid, mode, 0, False, device=vulkan, deterministic=deterministic)
    rdx, rdg = ref.grid_sampler_2d_backward(go.astype(np.float64), x.astype(np.float64),
                                            grid.astype(np.float64), mode, 0, False)
    cnt = ho * wo
    absdx, _ = ref.grid_sampler_2d_backward(np.abs(go).astype(np.float64), x.astype(np.float64),
                                            grid.astype(np.float64), mode, 0, False)
    # summation in any order of cnt terms (recursive or chunked): <= cnt * eps * sum|terms|,
    # plus the weights' own rounding (a few eps relative).
    _bounded_equal(dx, rdx, (cnt + 16) * EPS32 * np.abs(absdx) + 1e-30, "grad_input")
    assert np.count_nonzero(dx) <= c * 16 and np.abs(rdx).max() > cnt * 0.1
    b_dx, b_dg = error_bounds(go, x, grid, mode, 0, False, EPS32)
    _bounded_equal(dg, rdg, b_dg, "grad_grid")


def test_deterministic_mode_is_bitwise_reproducible(vulkan):
    rng = np.random.default_rng(9)
    go, x, grid = random_case(rng, (2, 8, 5, 6, 64, 70))
    grid = (grid * 0.2).astype(np.float32)  # many points per pixel
    runs = [api.grid_sampler_2d_backward(go, x, grid, 0, 2, True, device=vulkan, deterministic=True)
            for _ in range(3)]
    for r in runs[1:]:
        for k in range(2):
            assert np.array_equal(r[k].view(np.uint32), runs[0][k].view(np.uint32))


# ----------------------------------------------------------------------------------------
# The switch: aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC) picks the exported function.
# ----------------------------------------------------------------------------------------
def _phase1_function(device, mask=(True, True)):
    go, x, grid = (np.ones(s, np.float32) for s in ((1, 1, 2, 2), (1, 1, 3, 3), (1, 2, 2, 2)))
    ts = [A.aclCreateTensor(a, device=device) for a in (go, x, grid, x, grid)]
    status, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(
        *ts[:3], 0, 0, False, A.aclCreateBoolArray(list(mask)), *ts[3:])
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    return ex.kernel.name


def test_context_option_selects_the_deterministic_kernel(vulkan):
    status, ctx = A.aclrtCreateContext(0)
    assert status == A.ACLNN_SUCCESS
    try:
        assert A.aclrtCtxGetSysParamOpt(A.ACL_OPT_DETERMINISTIC) == (A.ACLNN_SUCCESS, 0)
        assert not _phase1_function(vulkan).endswith("_deterministic")
        assert A.aclrtCtxSetSysParamOpt(A.ACL_OPT_DETERMINISTIC, 1) == A.ACLNN_SUCCESS
        assert A.aclrtCtxGetSysParamOpt(A.ACL_OPT_DETERMINISTIC) == (A.ACLNN_SUCCESS, 1)
        assert _phase1_function(vulkan).endswith("_bilinear_zeros_ac0_f32_deterministic")
        A.aclrtCtxSetSysParamOpt(A.ACL_OPT_DETERMINISTIC, 0)
        assert _phase1_function(vulkan).endswith("_bilinear_zeros_ac0_f32")
        A.aclrtCtxSetSysParamOpt(A.ACL_OPT_DETERMINISTIC, 1)
        assert _phase1_function(vulkan, (True, False)).endswith("_dx_deterministic")
        assert _phase1_function(vulkan, (False, True)).endswith("_dgrid")  # deterministic anyway
        # CPU kernels are deterministic: the same function either way.
        assert _phase1_function("local-task").endswith("_bilinear_zeros_ac0_f32")
    finally:
        assert A.aclrtDestroyContext(ctx) == A.ACLNN_SUCCESS
    # back on the default context, which was never changed
    assert A.aclrtCtxGetSysParamOpt(A.ACL_OPT_DETERMINISTIC) == (A.ACLNN_SUCCESS, 0)


def test_context_option_is_per_thread_current_context():
    import threading
    status, ctx = A.aclrtCreateContext(0)
    assert status == A.ACLNN_SUCCESS
    try:
        assert A.aclrtCtxSetSysParamOpt(A.ACL_OPT_DETERMINISTIC, 1) == A.ACLNN_SUCCESS
        seen = {}
        t = threading.Thread(target=lambda: seen.update(v=A.aclrtCtxGetSysParamOpt(A.ACL_OPT_DETERMINISTIC)))
        t.start()
        t.join()
        assert seen["v"] == (A.ACLNN_SUCCESS, 0)  # another thread: the default context
        assert A.aclrtSetCurrentContext(ctx) == A.ACLNN_SUCCESS
    finally:
        assert A.aclrtDestroyContext(ctx) == A.ACLNN_SUCCESS
    assert A.aclrtSetCurrentContext(ctx) == A.ACLNN_ERR_PARAM_INVALID  # destroyed
    assert "aclrtContext" in A.aclGetRecentErrMsg()


@pytest.mark.parametrize("opt,value", [(7, 1), (A.ACL_OPT_DETERMINISTIC, 2), (A.ACL_OPT_DETERMINISTIC, "1"),
                                       (A.ACL_OPT_DETERMINISTIC, True), ("ACL_OPT_DETERMINISTIC", 1)])
def test_bad_context_option_is_invalid(opt, value):
    assert A.aclrtCtxSetSysParamOpt(opt, value) == A.ACLNN_ERR_PARAM_INVALID
    assert A.aclGetRecentErrMsg()
    assert A.aclrtCtxGetSysParamOpt(A.ACL_OPT_DETERMINISTIC) == (A.ACLNN_SUCCESS, 0)


def test_pythonic_deterministic_argument_leaves_the_context_alone(vulkan):
    rng = np.random.default_rng(2)
    go, x, grid = random_case(rng, (1, 3, 5, 5, 4, 4))
    api.grid_sampler_2d_backward(go, x, grid, device=vulkan, deterministic=True)
    assert A.aclrtCtxGetSysParamOpt(A.ACL_OPT_DETERMINISTIC) == (A.ACLNN_SUCCESS, 0)


# ----------------------------------------------------------------------------------------
# Every specialisation compiles for both GPU targets; CUDA is absent here and says so.
# ----------------------------------------------------------------------------------------
def cuda_sample():
    """One CUDA module per (operator, mode, dtype) and per (operator, dtype, layout), with the
    paddings and align_corners rotating through them, so each mode meets every padding and
    both align_corners: 40 of the 176 (all take minutes: -m slow, and prepare_gpu_check.sh)."""
    grid = [cls(m, ("zeros", "border", "reflection")[(i + j) % 3], bool((i + j) % 2), dt)
            for cls in (GridSamplerSpec, GridSampler2dSpec)
            for i, m in enumerate(("bilinear", "nearest", "bicubic")) for j, dt in enumerate(DTYPES)]
    up = [cls(bool(j % 2), dt, lay) for cls in (UpsampleSpec, UpsampleBilinear2dSpec)
          for j, dt in enumerate(DTYPES) for lay in ("NCHW", "NHWC")]
    return grid + up


def _check_gpu_build(target, specs):
    """Into the suite's compile cache: the Vulkan suites load these modules (a module found
    valid there was compiled by this run too: the cache starts empty in CI)."""
    t = get_target(target)
    store = ArtifactStore(cache_dir())
    res = store.build(specs, [t], progress=False)
    assert res.failed == [] and res.compiled + res.reused == len(specs)
    manifest = store.manifest()["artifacts"]
    for s in specs:
        entry = manifest[f"{target}/{s.kernel_name}"]
        assert entry["flags"] == list(t.flags)
        assert set(s.function_names(t)) <= set(entry["functions"])
        assert not any(f.endswith("_deterministic") for f in entry["functions"]) or s.op == "grid_sampler_2d_backward"
    arch_flag = "--iree-cuda-target=sm_80" if target == "cuda" else "--iree-vulkan-target-features="
    assert any(f.startswith(arch_flag) for f in t.flags)


def test_every_vulkan_artifact_compiles():
    specs = list(all_specs())
    assert len(specs) == 176  # 72 grid sampler and 16 upsample specialisations, forward and backward
    _check_gpu_build("vulkan-spirv", specs)


def test_cuda_artifacts_compile_for_every_mode_padding_and_dtype():
    specs = cuda_sample()
    assert len({s.kernel_name for s in specs}) == 40
    for op in ("grid_sampler_2d_backward", "grid_sampler_2d"):
        grid = [s for s in specs if s.op == op]
        for m in ("bilinear", "nearest", "bicubic"):
            assert {s.dtype for s in grid if s.interpolation_mode == m} == set(DTYPES)
            assert {s.padding_mode for s in grid if s.interpolation_mode == m} == {"zeros", "border", "reflection"}
            assert {s.align_corners for s in grid if s.interpolation_mode == m} == {False, True}
    _check_gpu_build("cuda", specs)


# The register spills ptxas reports in all 176 CUDA modules, per arch: (kernel, function, the
# most bytes spilled), as measured.  Any other spill, or a larger one, fails the test below
# (the build notes each spill, and records it in the manifest).
KNOWN_SPILLS = {
    "sm_80": {("grid_sampler_2d_backward_bicubic_zeros_ac0_f64", "dgrid_points_gpu"): 8,
              ("grid_sampler_2d_backward_bicubic_zeros_ac0_f64", "dx_atomic"): 16,
              # the one-pass f64 bicubic (16 taps' weights and derivatives live across the channel walk)
              ("grid_sampler_2d_backward_bicubic_zeros_ac1_f64", "dx_dgrid_points"): 8,
              ("grid_sampler_2d_backward_bicubic_border_ac1_f64", "dx_dgrid_points"): 8,
              ("grid_sampler_2d_backward_bicubic_reflection_ac0_f64", "dx_dgrid_points"): 4,
              ("grid_sampler_2d_backward_bicubic_reflection_ac1_f64", "dx_dgrid_points"): 4,
              # the forward's per-point f64 kernel (16 channels per invocation): a double each
              ("grid_sampler_2d_bilinear_border_ac0_f64", "sample_gpu"): 8,
              ("grid_sampler_2d_bilinear_zeros_ac0_f64", "sample_gpu"): 8},
    "sm_90": {("grid_sampler_2d_bicubic_reflection_ac1_f64", "sample_gpu"): 4,
              ("grid_sampler_2d_backward_bicubic_zeros_ac0_f64", "dx_dgrid_points"): 24,
              ("grid_sampler_2d_backward_bicubic_border_ac0_f64", "dx_dgrid_points"): 24},
}


@pytest.mark.parametrize("which", ["sample", pytest.param("all", marks=pytest.mark.slow)])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_ptx_assembles_with_ptxas(arch, which):
    """NVIDIA's own assembler accepts the PTX of the CUDA modules (CI: the sample of 40 that
    covers every operator, mode, padding, align_corners, dtype and layout, which compile here
    into the suite's cache; -m slow: all 176, about 75 s more on 2 cores), for the sm_80 it was
    made for and for sm_90 (an H100/H200 JITs the sm_80 PTX, as ptxas does here); no kernel
    spills registers beyond KNOWN_SPILLS."""
    if shutil.which("ptxas") is None:
        pytest.skip("no ptxas on PATH (NVIDIA's CUDA toolkit)")
    store = ArtifactStore(cache_dir())
    t = get_target("cuda")
    specs = list(all_specs()) if which == "all" else cuda_sample()
    assert len(specs) == (176 if which == "all" else 40)
    assert store.build(specs, [t], progress=False).failed == []
    spills = {}
    for s in specs:
        vmfb = Path(store.paths(s, t)["vmfb"]).read_bytes()
        images = ptx_images(vmfb)
        assert images and all(".target sm_80" in p for p in images), s.kernel_name
        report = ptxas_report(vmfb, arch)  # raises with ptxas's message on an assembly error
        assert report["arch"] == arch
        entries = [e for e in report["kernels"].values()]
        assert entries and all(0 < e["registers"] <= 255 for e in entries), s.kernel_name
        for name in report["spills"]:
            k = report["kernels"][name]
            spills[(s.kernel_name, name)] = max(k["spill_store_bytes"], k["spill_load_bytes"])
    known = KNOWN_SPILLS[arch]
    assert all(key in known and n <= known[key] for key, n in spills.items()), spills


def _as_module(ptx: str) -> bytes:
    """A PTX text framed as ptx_images() finds it in a module."""
    return struct.pack("<I", len(ptx)) + ptx.encode() + b"\0"


def test_the_build_records_ptxas_and_the_report_sees_spills_and_errors(tmp_path):
    """A CUDA build records what ptxas says per kernel; the report sees spills where there
    are some (the same PTX capped at 24 registers by .maxnreg must spill) and a rejected
    image is an error, not a pass."""
    if shutil.which("ptxas") is None:
        pytest.skip("no ptxas on PATH (NVIDIA's CUDA toolkit)")
    spec, t = GridSamplerSpec("bicubic", "reflection", False, "float32"), get_target("cuda")
    store = ArtifactStore(str(tmp_path / "store"))
    res = store.build([spec], [t], progress=False)
    assert (res.compiled, res.failed, res.spills) == (1, [], [])
    vmfb = Path(store.paths(spec, t)["vmfb"]).read_bytes()
    free = ptxas_report(vmfb, "sm_80")
    assert store.manifest()["artifacts"][f"cuda/{spec.kernel_name}"]["ptxas"] == free
    ptx = ptx_images(vmfb)[0]
    assert ".maxntid 64, 1, 1\n" in ptx
    squeezed = ptxas_report(_as_module(re.sub(r"(\.maxntid [0-9, ]+\n)", r"\1.maxnreg 24\n", ptx)), "sm_80")
    assert set(squeezed["kernels"]) == set(free["kernels"])
    assert all(k["registers"] <= 24 for k in squeezed["kernels"].values())
    heavy = {n for n, k in free["kernels"].items() if k["registers"] > 64}
    assert heavy and heavy <= set(squeezed["spills"])
    assert all(squeezed["kernels"][n]["spill_store_bytes"] > 0 for n in squeezed["spills"])
    with pytest.raises(RuntimeError, match="ptxas -arch=sm_80 rejected"):
        ptxas_report(_as_module(ptx.replace("ret;", "not_an_instruction;", 1)), "sm_80")


@pytest.mark.slow
def test_every_cuda_artifact_compiles():
    _check_gpu_build("cuda", list(all_specs()))


def test_gpu_modules_export_both_modes():
    vk, cuda, cpu = get_target("vulkan-spirv"), get_target("cuda"), get_target("llvm-cpu")
    s = GridSamplerSpec("bilinear", "zeros", False)
    assert s.function_names(cpu) == (s.kernel_name, s.kernel_name + "_dx", s.kernel_name + "_dgrid",
                                     s.kernel_name + "_dgrid_points", s.kernel_name + "_points")
    assert set(s.function_names(vk)) - set(s.function_names(cpu)) == {
        s.kernel_name + "_deterministic", s.kernel_name + "_dx_deterministic"}
    # f64 atomics: CUDA has them, the portable Vulkan profile does not
    assert s.template_params(vk)["atomic_dx"] and s.template_params(cuda)["atomic_dx"]
    s64 = GridSamplerSpec("bilinear", "zeros", False, "float64")
    assert not s64.template_params(vk)["atomic_dx"] and s64.template_params(cuda)["atomic_dx"]
    assert not s.template_params(cpu)["gpu"]


@pytest.mark.skipif(device_missing("cuda") is None, reason="a CUDA device is present: see scripts/gpu_check.sh")
def test_missing_cuda_gives_a_runtime_error_status():
    status, stream = A.aclrtCreateStream("cuda")
    assert (status, stream) == (A.ACLNN_ERR_RUNTIME_ERROR, None)
    assert "cuda" in A.aclGetRecentErrMsg().lower()
    with pytest.raises(AclnnError) as e:
        api.grid_sampler_2d_backward(*random_case(np.random.default_rng(0), (1, 1, 2, 2, 2, 2)), device="cuda")
    assert e.value.status == A.ACLNN_ERR_RUNTIME_ERROR and "cuda" in str(e.value).lower()


def test_named_gpu_arch_builds_into_its_own_folder(tmp_path, capsys):
    from aclnn_iree import cli
    rc = cli.main(["build", "--target", "vulkan-spirv", "--gpu-arch", "ampere", "--kernel", "*bilinear_zeros_ac0_f32",
                   "--out", str(tmp_path), "--no-progress"])
    assert rc == 0, capsys.readouterr()
    entry = ArtifactStore(tmp_path).manifest()["artifacts"]["vulkan-spirv-ampere/grid_sampler_2d_backward_bilinear_zeros_ac0_f32"]
    assert entry["target_arch"] == "ampere" and "--iree-vulkan-target=ampere" in entry["flags"]
    assert not entry["template_params"]["atomic_dx"]  # IREE's named profiles have no float atomics
    assert (tmp_path / "vulkan-spirv-ampere" / "grid_sampler_2d_backward_bilinear_zeros_ac0_f32.vmfb").exists()


def test_large_reflection_coordinates_pick_the_cpu_pixels(vulkan):
    """(g + 1) * size - 1 is one fused multiply-add on CPUs (ours and PyTorch's); lavapipe
    evaluated it with two roundings, which moved coordinates of ~1e6 pixels by half a pixel."""
    x = np.arange(900, dtype=np.float32).reshape(1, 1, 30, 30)
    go = np.ones((1, 1, 1, 1), np.float32)
    g = np.array([336656.25, 0.0], np.float32).reshape(1, 1, 1, 2)
    cpu = api.grid_sampler_2d_backward(go, x, g, 0, 2, False)[0]
    gpu = api.grid_sampler_2d_backward(go, x, g, 0, 2, False, device=vulkan)[0]
    assert np.argwhere(cpu[0, 0]).tolist() == [[14, 18], [15, 18]]  # PyTorch's taps
    assert np.array_equal(gpu, cpu)
    # a sweep: 300 coordinates between 1e5 and 5e5 (pixel coordinates up to 7.5e6, where
    # integer tap offsets still add exactly in float32), every mode, both align_corners
    rng = np.random.default_rng(4)
    gs = (rng.choice([-1, 1], (1, 10, 30, 2)) * np.exp(rng.uniform(np.log(1e5), np.log(5e5), (1, 10, 30, 2))))
    gs = gs.astype(np.float32)
    go = rng.standard_normal((1, 2, 10, 30)).astype(np.float32)
    x = rng.standard_normal((1, 2, 30, 30)).astype(np.float32)
    for mode in (0, 1, 2):
        for ac in (False, True):
            c = api.grid_sampler_2d_backward(go, x, gs, mode, 2, ac)[0]
            v = api.grid_sampler_2d_backward(go, x, gs, mode, 2, ac, device=vulkan, deterministic=True)[0]
            assert np.array_equal(c != 0, v != 0), (mode, ac)  # the same pixels
            np.testing.assert_allclose(v, c, rtol=1e-5, atol=1e-5 * np.abs(c).max())


def test_far_reflection_coordinates_give_the_cpu_grad_input(vulkan):
    """Coordinates up to 1e7 image widths away under reflection: grad_input lands on the CPU's
    pixels with the CPU's values (bit for bit in the ordered mode, which reads the reflections
    from @coords_gpu's table: before, its chunk loop reran them per point and ran past
    lavapipe's loop budget; atomics may add in another order)."""
    rng = np.random.default_rng(4)
    gs = rng.choice([-1, 1], (1, 10, 30, 2)) * np.exp(rng.uniform(np.log(1e5), np.log(1e7), (1, 10, 30, 2)))
    gs = gs.astype(np.float32)
    x = np.arange(900, dtype=np.float32).reshape(1, 1, 30, 30)
    go = np.ones((1, 1, 10, 30), np.float32)
    for mode in (0, 1, 2):
        for ac in (False, True):
            cpu = api.grid_sampler_2d_backward(go, x, gs, mode, 2, ac, (True, False))[0]
            for det in (False, True):
                gpu = api.grid_sampler_2d_backward(go, x, gs, mode, 2, ac, (True, False), device=vulkan,
                                                   deterministic=det)[0]
                assert np.array_equal(gpu != 0, cpu != 0), (mode, ac, det)
                if det:
                    assert np.array_equal(gpu, cpu), (mode, ac)
                else:
                    np.testing.assert_allclose(gpu, cpu, rtol=8 * float(np.finfo(np.float32).eps))
