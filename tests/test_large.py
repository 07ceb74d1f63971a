"""64-bit offsets: tensors of more than 2**31 (and 2**32) elements.  Slow: run with `-m slow`.

The reference cannot run at these sizes, so every check compares the few
sampled values with the float64 reference on a small *equivalent* problem: an
8 x 8 crop of the big input around one grid point, with the point's pixel
coordinate shifted by the crop offset (crops are clipped to the image, so a
tap that falls off the big image falls off the crop too).  Everything else of
the big tensors is zero.

Memory (24 GiB machine): big tensors are allocated with calloc (`lazy_zeros`,
64-byte aligned so the aclnn layer imports them without a copy); pages that
are never written cost nothing.  The Pythonic layer is not used here because it
copies a misaligned input and `.numpy()` copies every output; the aclnn layer
is called directly on the imported arrays, which alias the device buffers.

* dgrid only (mask (False, True)): the input is huge but only the pixels near
  the grid points are ever touched; reads past 2**31 (float32) and past 2**32
  elements (float16, C = 2) -> ~0 GiB resident.
* dx only (mask (True, False)): dx of 2.18e9 elements is written in full by the
  kernel; float32 -> 8.1 GiB; float16 -> 4.1 GiB dx + 8.1 GiB float32
  accumulation workspace.  The input (never read by the dx kernel) stays lazy.
* upsample, float16, align_corners: grad_input of 2.18e9 elements from a 3 x 3
  grad_output; the non-zero entries include the very last element.

Sizes: H = 40960 = 5 * 2**13, W = 53248 = 13 * 2**12 (H * W = 2_181_038_080 >
2**31): with few significant bits, the normalised grid values used below give
exactly representable pixel coordinates in float32 (and float16), so the kernel
and the small reference problem see the same coordinates.
"""
from __future__ import annotations

import gc
import resource
import time

import numpy as np
import pytest

import aclnn_iree.aclnn as A
from aclnn_iree.core.tensors import tensor_over
from aclnn_iree.ops import reference as ref

pytestmark = pytest.mark.slow

H, W = 40960, 53248
assert H * W > 2**31
CROP = 8
EPS32 = float(np.finfo(np.float32).eps)


# --------------------------------------------------------------------------- plumbing
def lazy_zeros(shape, dtype) -> np.ndarray:
    """A zero-filled, C-contiguous, 64-byte aligned array whose pages are only allocated when written."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.zeros(nbytes + 64, np.uint8)  # calloc: fresh zero pages
    start = (-raw.ctypes.data) % 64
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def rss_peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@pytest.fixture(scope="module")
def stream():
    status, s = A.aclrtCreateStream("local-task")
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    return s


@pytest.fixture(autouse=True)
def _report(request):
    gc.collect()
    t0 = time.perf_counter()
    yield
    gc.collect()
    print(f"\n[{request.node.name}] {time.perf_counter() - t0:.1f} s, process peak RSS {rss_peak_gib():.2f} GiB")


def _tensor(stream, array, fmt="ND"):
    """An aclTensor over `array` itself (aligned and contiguous: imported without a copy, so it aliases
    the array; small unaligned arrays are copied).  aclCreateTensor would copy every array."""
    return tensor_over(stream.device, np.ascontiguousarray(array), fmt)


def _run(stream, phase1, phase2, *args):
    status, ws_size, executor = phase1(*args)
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    workspace = None
    if ws_size:
        status, workspace = A.aclrtMalloc(ws_size, stream)
        assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    assert phase2(workspace, ws_size, executor, stream) == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(stream) == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    del workspace
    return ws_size


def grid_sampler(stream, go, x, grid, mask, dx_out, dg_out):
    """bilinear / zeros / align_corners=False through the aclnn layer; outputs land in dx_out / dg_out."""
    tensors = [_tensor(stream, a) for a in (go, x, grid, dx_out, dg_out)]
    return _run(stream, A.aclnnGridSampler2DBackwardGetWorkspaceSize, A.aclnnGridSampler2DBackward,
                *tensors[:3], 0, 0, False, A.aclCreateBoolArray(list(mask)), *tensors[3:])


# --------------------------------------------------------------------------- grid points
# float32 lattice: g = -1 + k / 2**19 (k <= 2**20) -> u_x = (13 k / 128 - 1) / 2, u_y = (5 k / 64 - 1) / 2,
# both exact in float32 whatever the evaluation order (<= 24 significant bits).
# float16 lattice: g = -1 + k / 2**11 (k <= 2**12) -> u_x = 13 k - 1/2, u_y = 10 k - 1/2.
LATTICE = {np.float32: (2**19, 13 / 128, 5 / 64), np.float16: (2**11, 26.0, 20.0)}


def lattice_points(dtype, targets):
    """(grid (1, 1, K, 2) in `dtype`, exact pixel coordinates (K, 2) float64) near the target pixel coordinates."""
    den, fx, fy = LATTICE[dtype]
    kx = np.clip(np.round((2 * targets[:, 0] + 1) / fx), 0, 2 * den)
    ky = np.clip(np.round((2 * targets[:, 1] + 1) / fy), 0, 2 * den)
    grid = np.stack([-1 + kx / den, -1 + ky / den], axis=-1)
    u = np.stack([(fx * kx - 1) / 2, (fy * ky - 1) / 2], axis=-1)
    g = grid.astype(dtype)
    assert np.array_equal(g.astype(np.float64), grid), "grid values must be exact in the storage dtype"
    # the float32 evaluation ((g + 1) * size - 1) / 2 is exact (plain and fused alike)
    for d, size in ((0, W), (1, H)):
        a = g[:, d].astype(np.float32) + np.float32(1)
        assert np.array_equal(((a * np.float32(size) - np.float32(1)) / np.float32(2)).astype(np.float64), u[:, d])
    return g.reshape(1, 1, -1, 2), u


def target_coordinates(rng):
    """Pixel coordinates (x, y): the very end of the image (offsets past 2**31 / 2**32), its borders,
    and a few controls at small offsets."""
    t = [
        (W - 0.5, H - 0.5),            # g = (1, 1): one tap, the very last element
        (W - 1.6, H - 1.3),            # inside the last 2 x 2 block
        (W - 0.8, H - 1.7),            # x straddles the right border (x1 = W is out of bounds)
        (W - 1.4, H - 0.7),            # y straddles the bottom border
        (0.3, 0.6),                    # control: the first pixels
        (W / 2 + 0.37, H / 2 + 0.21),  # control: the middle
    ]
    for _ in range(6):                 # rows whose offsets are past 2**31 (and 2**32 in channel 1)
        t.append((rng.uniform(0, W - 1), rng.uniform(H - 600, H - 1)))
    return np.array(t)


def crop_origin(u, size):
    return int(np.clip(np.floor(u) - CROP // 2 + 1, 0, size - CROP))


def small_equivalent(u):
    """(crop origin (oy, ox), small float64 grid (1, 1, 1, 2)) for one pixel coordinate (u_x, u_y)."""
    ox, oy = crop_origin(u[0], W), crop_origin(u[1], H)
    us = np.array([u[0] - ox, u[1] - oy])
    gs = (2 * us + 1) / CROP - 1  # exact: CROP is a power of two
    assert np.array_equal(((gs + 1) * CROP - 1) / 2, us)
    return (oy, ox), gs.reshape(1, 1, 1, 2)


def fill_patches(x, u, rng, values):
    """Writes random values (from `values`) into the 4 x 4 tap neighbourhood of every point, all channels."""
    for ux, uy in u:
        x0, y0 = int(np.floor(ux)), int(np.floor(uy))
        ys = slice(max(y0 - 1, 0), min(y0 + 3, H))
        xs = slice(max(x0 - 1, 0), min(x0 + 3, W))
        shape = x[:, :, ys, xs].shape
        x[:, :, ys, xs] = rng.choice(values, size=shape).astype(x.dtype)


# --------------------------------------------------------------------------- dgrid: reads
@pytest.mark.parametrize("dtype,channels", [(np.float32, 1), (np.float16, 2)], ids=["f32-past-2^31", "f16-past-2^32"])
def test_grid_sampler_dgrid_reads_past_2_31_elements(stream, dtype, channels):
    """mask (False, True): only grad_grid; the kernel reads input pixels at offsets > 2**31
    (float32, 2.18e9 elements) and > 2**32 (float16, C = 2: 4.36e9 elements)."""
    rng = np.random.default_rng(7)
    grid, u = lattice_points(dtype, target_coordinates(rng))
    K = grid.shape[2]
    x = lazy_zeros((1, channels, H, W), dtype)
    assert x.size > (2**32 if channels == 2 else 2**31)
    # values keep |grad_grid| = (size/2) * |...| inside float16's range: multiples of 1/8 and of 1/16
    fill_patches(x, u, rng, np.r_[np.arange(-8, 0), np.arange(1, 9)] / 8)
    go = (rng.choice(np.r_[np.arange(-4, 0), np.arange(1, 5)], size=(1, channels, 1, K)) / 16).astype(dtype)
    dx_unused = lazy_zeros(x.shape, dtype)  # masked out: never written, never resident
    dg = lazy_zeros(grid.shape, dtype)
    grid_sampler(stream, go, x, grid, (False, True), dx_unused, dg)

    for k in range(K):
        (oy, ox), gs = small_equivalent(u[k])
        xs = np.asarray(x[:, :, oy:oy + CROP, ox:ox + CROP], np.float64)
        _, rdg = ref.grid_sampler_2d_backward(go[:, :, :, k:k + 1], xs, gs, 0, 0, False)
        # grad_grid = (size / 2) * sum(...); the small problem has size CROP, the big one W / H
        expected = rdg[0, 0, 0] * np.array([W / CROP, H / CROP])
        scale = np.array([W / 2, H / 2]) * np.abs(xs).max() * np.abs(go[..., k]).sum() * 4
        tol = 16 * EPS32 * scale + (2.0**-11 * np.abs(expected) if dtype == np.float16 else 0)
        got = dg[0, 0, k].astype(np.float64)
        assert np.all(np.abs(got - expected) <= tol), (k, u[k], got, expected, tol)
    # the points at the end really sample non-zero data past 2**31 (past 2**32 in channel 1)
    last = (channels * H * W) - 1
    assert np.flatnonzero(x[0, -1, -1, -1:]).size == 1 and last >= 2**31
    assert np.any(dg[0, 0, 0] != 0)


# --------------------------------------------------------------------------- dx: writes
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16-f32-workspace"])
def test_grid_sampler_dx_writes_past_2_31_elements(stream, dtype):
    """mask (True, False): grad_input of 2.18e9 elements; the scatter writes at offsets up to the very
    last element, and nothing else in the 2.18e9 elements is touched (counted)."""
    rng = np.random.default_rng(11)
    grid, u = lattice_points(dtype, target_coordinates(rng))
    K = grid.shape[2]
    x = lazy_zeros((1, 1, H, W), dtype)  # shape only: the dx kernel never reads it
    go = rng.integers(1, 9, size=(1, 1, 1, K)).astype(dtype)  # positive: no cancellation in dx
    dx = lazy_zeros(x.shape, dtype)
    dg_unused = lazy_zeros(grid.shape, dtype)
    ws = grid_sampler(stream, go, x, grid, (True, False), dx, dg_unused)
    if dtype == np.float16:
        assert ws >= 4 * x.size  # the float32 accumulation buffer of dx

    expected = {}
    for k in range(K):
        (oy, ox), gs = small_equivalent(u[k])
        rdx, _ = ref.grid_sampler_2d_backward(go[:, :, :, k:k + 1], np.zeros((1, 1, CROP, CROP)), gs, 0, 0, False)
        for i, j in zip(*np.nonzero(rdx[0, 0])):
            expected[(oy + i, ox + j)] = expected.get((oy + i, ox + j), 0.0) + rdx[0, 0, i, j]
    assert (H - 1, W - 1) in expected  # the very last element, offset H * W - 1 > 2**31
    assert (H - 1) * W + (W - 1) > 2**31
    ys, xs = np.array(list(expected)).T
    want = np.array(list(expected.values()))
    got = dx[0, 0, ys, xs].astype(np.float64)
    rtol = 2.0**-11 if dtype == np.float16 else 8 * EPS32
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0)
    # nothing was written anywhere else (a wrapped 32-bit offset would land elsewhere)
    assert np.count_nonzero(dx) == len(expected)


# --------------------------------------------------------------------------- upsample
def test_upsample_grad_input_past_2_31_elements(stream):
    """float16 grad_input (1, 1, 40960, 53248) from a 3 x 3 grad_output, align_corners=True:
    the scale (size - 1) / 2 ends in .5, exactly like a 4 x 4 input, so the 16 non-zero entries are
    rows/cols {0, (size-1)/2 -+ 1/2, size - 1}: the 4 x 4 reference problem, placed there."""
    go = np.arange(1, 10, dtype=np.float16).reshape(1, 1, 3, 3)
    out = lazy_zeros((1, 1, H, W), np.float16)
    got_t, go_t = _tensor(stream, out, "NCHW"), _tensor(stream, go, "NCHW")
    _run(stream, A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize, A.aclnnUpsampleBilinear2dBackwardV2,
         go_t, A.aclCreateIntArray([3, 3]), A.aclCreateIntArray([1, 1, H, W]), True, -1.0, -1.0, got_t)
    small = ref.upsample_bilinear2d_backward(go, (3, 3), (1, 1, 4, 4), True)
    rows = [0, (H - 1) // 2, (H - 1) // 2 + 1, H - 1]
    cols = [0, (W - 1) // 2, (W - 1) // 2 + 1, W - 1]
    got = out[0, 0][np.ix_(rows, cols)].astype(np.float64)
    np.testing.assert_array_equal(got, small[0, 0])  # sums of k/2, k/4 with small k: exact in float16
    assert out[0, 0, -1, -1] == go[0, 0, -1, -1] and (H * W - 1) > 2**31
    assert np.count_nonzero(out) == 16
