"""Numerical tests of grid_sampler_2d, the forward grid sampler (aclnnGridSampler2D), on every
device of conftest.DEVICES: every mode x padding x align_corners x dtype against the float64
reference (aclnn_iree/ops/reference.py) within bounds derived from the dtype, and against
PyTorch's CPU kernel, bitwise where the kernels compute the same float expressions:

* CPU (llvm-cpu), float32 and float64, every mode: bitwise equal to PyTorch 2.13's
  vectorised CPU kernel (its unnormalize fma((g + 1), size, -1) / 2, its tap weights, its
  bicubic coefficients and its sums as its build contracts them, e.g. bilinear's
  fma(v_se, w_se, fma(v_sw, w_sw, fma(v_ne, w_ne, v_nw * w_nw)))), for finite grids whose
  reflections stay within a period of the float coordinate's precision.
* GPUs (Vulkan/lavapipe): fma may round twice there, so within the bound only.
* float16/bfloat16: computed in float32 and rounded once (PyTorch computes in the half
  type), so against the reference only.
Non-finite grid values follow the project's rule (zeros padding: out of bounds, 0; border and
reflection: clamped, NaN samples pixel 0), where PyTorch's CPU kernel gives NaN: against the
reference only.

The bound (per output element, compute precision eps, unit roundoff eps/2): the pixel
coordinate errs by <= 2 eps lam (lam = max(H, W) (2 + max|grid|) + 2, as the backward's
error_bounds), a tap weight by <= 7 eps lam, a term w * v by <= 8 eps lam |v|, and the sum
of T terms adds <= T eps sum |w v|; a float coordinate may floor one pixel away from the
exact one, so the taps are those of the footprint (the backward's _axis_footprint: every tap
a one-pixel shift could reach; a huge coordinate under reflection may land anywhere: there
the bound is 3 T max|x|).  So |out - ref| <= K eps (lam + T) V + (2 T + 4) tiny, V the
sum of |input| over the footprint, tiny the compute type's smallest subnormal (products of
subnormals round absolutely), then once more for the storage rounding (storage_bound).
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from aclnn_iree.core import api
from aclnn_iree.ops import reference as ref
from conftest import flushed, flushes_subnormals, is_gpu, torch_like_ours
from grid_sampler_2d_backward.test_grid_sampler import (STRUCTURED_SIZES, _axis_footprint, _coordinate_scale,
                                                        assert_within, storage_bound, structured_grid)

MODES = (0, 1, 2)
PADS = (0, 1, 2)
ACS = (False, True)
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
COMBOS = list(itertools.product(MODES, PADS, ACS))
K = 8.0
TAPS = {0: 4, 1: 1, 2: 16}
MODE_NAMES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
PAD_NAMES = {0: "zeros", 1: "border", 2: "reflection"}



@pytest.fixture(autouse=True)
def _each_form(kernel_form):
    """Every test of this module runs on the tuned kernels and on the linalg form (the same
    bounds, and PyTorch's bits on CPUs: both compute PyTorch's float expressions; the linalg
    form's subnormals flushed as IREE's CPU executors do, against PyTorch's flushing them)."""

def combo_id(c):
    m, p, ac = c[:3]
    return f"{MODE_NAMES[m]}-{PAD_NAMES[p]}-ac{int(ac)}" + "".join(f"-{np.dtype(d).name}" for d in c[3:])


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def run(device, x, grid, mode, pad, ac):
    out = api.grid_sampler_2d(x, grid, mode, pad, ac, device=device)
    assert out.dtype == x.dtype and out.shape == (x.shape[0], x.shape[1], *grid.shape[1:3])
    return out


def torch_forward(torch, x, grid, mode, pad, ac):
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (x, grid)]
    return torch.ops.aten.grid_sampler_2d(*t, mode, pad, ac).numpy()


def footprint_values(x, grid, mode, pad, ac):
    """(V, anywhere): V[n, c, i, j], the sum of |x[n, c]| over the pixels output point (i, j)
    may touch (with multiplicity), and whether the point may land anywhere (a huge coordinate
    under reflection: float32 cannot place it within a period), shape (N, 1, H_out, W_out)."""
    xa = np.abs(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0))
    N, C, H, W = x.shape
    px, ax = _axis_footprint(grid[..., 0], W, mode, pad, ac)
    py, ay = _axis_footprint(grid[..., 1], H, mode, pad, ac)
    anywhere = ax | ay
    x_t = xa.transpose(0, 2, 3, 1)  # (N, H, W, C)
    nidx = np.broadcast_to(np.arange(N)[:, None, None], anywhere.shape)
    V = np.zeros(anywhere.shape + (C,))
    for yi in py:
        for xi in px:
            ok = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H)
            V += np.where(ok[..., None], x_t[nidx, np.clip(yi, 0, H - 1), np.clip(xi, 0, W - 1)], 0.0)
    return V.transpose(0, 3, 1, 2), anywhere[:, None]


def error_bound(x, grid, mode, pad, ac, expected):
    """The per-element bound of the module docstring."""
    ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    fi = np.finfo(ct)
    lam = _coordinate_scale(grid, *x.shape[2:])
    T = TAPS[mode]
    V, anywhere = footprint_values(x, grid, mode, pad, ac)
    compute = K * float(fi.eps) * (lam + T) * V + (2 * T + 4) * float(fi.smallest_subnormal)
    # a point that may land anywhere: both results are sums of T weighted pixels of the plane
    # (|weight| <= 1.5), so they differ by at most 3 T max|x[n, c]|
    xmax = np.abs(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)).max(axis=(2, 3))
    compute = np.where(anywhere, 3 * T * xmax[:, :, None, None], compute)
    return storage_bound(expected, x.dtype, compute)


def check(device, torch, x, grid, mode, pad, ac, label=""):
    """The kernel's output against the reference (bound) and PyTorch (bitwise where
    established, else the bound); returns the output."""
    what = f"{combo_id((mode, pad, ac, x.dtype))} {label}"
    out = run(device, x, grid, mode, pad, ac)
    flush = flushes_subnormals(device)  # then inputs, products and outputs lose their subnormals
    with np.errstate(invalid="ignore", over="ignore"):  # the reference's inf * 0
        expected = ref.grid_sampler_2d(flushed(x) if flush else x, flushed(grid) if flush else grid, mode, pad, ac)
    if flush:
        expected = flushed(expected, np.float64 if x.dtype == np.float64 else np.float32)
    finite = np.isfinite(expected)
    o64 = out.astype(np.float64)
    assert np.array_equal(np.isnan(o64), np.isnan(expected)), f"{what}: NaN pattern"
    assert np.array_equal(o64[~finite & ~np.isnan(expected)], expected[~finite & ~np.isnan(expected)]), \
        f"{what}: infinities"
    bound = error_bound(x, grid, mode, pad, ac, np.where(finite, expected, 0.0))
    if flush:  # each of the T terms (and the sum) may lose up to the smallest normal
        bound = bound + (TAPS[mode] + 1) * float(np.finfo(np.float64 if x.dtype == np.float64 else np.float32).smallest_normal)
    assert_within(np.where(finite, o64, 0.0), np.where(finite, expected, 0.0), bound, what + " vs reference")
    if torch is not None and x.dtype in (np.float32, np.float64) and np.isfinite(grid).all():
        with torch_like_ours(torch, device):
            t = torch_forward(torch, x, grid, mode, pad, ac)
        if not is_gpu(device):
            assert np.array_equal(out, t, equal_nan=True), \
                f"{what}: not bitwise PyTorch's, {int(np.sum(out != t))} elements differ"
        else:
            tf = np.isfinite(t)
            assert_within(np.where(tf, o64, 0.0), np.where(tf, t.astype(np.float64), 0.0), 2 * bound,
                          what + " vs PyTorch")
    return out


# Shapes (N, C, H_in, W_in, H_out, W_out): W_out not a multiple of 8 (the CPU's lane tails),
# C over the GPU's channel block, H_in or W_in = 1 (align_corners: multiplier 0, reflection span 0).
SHAPES = [(2, 3, 5, 7, 4, 13), (1, 1, 6, 4, 3, 5), (1, 20, 4, 6, 2, 9), (2, 2, 1, 3, 2, 3), (1, 2, 4, 1, 3, 2)]


@pytest.mark.parametrize("mode,pad,ac,dtype", [c + (d,) for c in COMBOS for d in DTYPES],
                         ids=[combo_id(c + (d,)) for c in COMBOS for d in DTYPES])
def test_random_matches_reference_and_torch(device, torch, mode, pad, ac, dtype):
    rng = np.random.default_rng(hash((mode, pad, ac, dtype.name)) % 2**32)
    for shape in SHAPES:
        N, C, H, W, Ho, Wo = shape
        x = rng.standard_normal((N, C, H, W)).astype(dtype)
        grid = rng.uniform(-1.3, 1.3, (N, Ho, Wo, 2)).astype(dtype)
        check(device, torch, x, grid, mode, pad, ac, str(shape))


@pytest.mark.parametrize("mode,pad,ac", COMBOS, ids=[combo_id(c) for c in COMBOS])
def test_structured_grid_borders_and_pixel_centres(device, torch, mode, pad, ac):
    """Grid points exactly on -1/+1, 0, pixel centres and pixel edges (nearest's ties), float32
    and float64."""
    rng = np.random.default_rng(7)
    for H, W in itertools.product(STRUCTURED_SIZES[ac], repeat=2):
        grid = structured_grid(2, H, W, ac)
        for dtype in (np.float32, np.float64):
            x = rng.standard_normal((2, 3, H, W)).astype(dtype)
            check(device, torch, x, grid.astype(dtype), mode, pad, ac, f"{H}x{W}")


@pytest.mark.parametrize("mode,pad,ac", COMBOS, ids=[combo_id(c) for c in COMBOS])
def test_far_and_non_finite_grid(device, torch, mode, pad, ac):
    """Grids far outside [-1, 1] (several reflections, huge values) and NaN/+-inf: compared
    with the reference (PyTorch's CPU kernel gives NaN for non-finite points)."""
    rng = np.random.default_rng(11)
    special = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 37.25, -12.5, 3.0, -3.0, 1e6 + 0.5, 0.0, 1.0])
    for dtype in (np.float32, np.float64, np.float16):
        H, W = 5, 6
        x = rng.standard_normal((1, 3, H, W)).astype(dtype)
        gx, gy = np.meshgrid(special, special)
        with np.errstate(over="ignore", invalid="ignore"):  # float16: 1e6 and 1e30 become inf
            grid = np.stack([gx, gy], -1)[None].astype(dtype)
            check(device, torch, x, grid, mode, pad, ac, "special grid")
        far = rng.uniform(-9.0, 9.0, (1, 4, 11, 2)).astype(dtype)
        check(device, torch, x, far, mode, pad, ac, "far grid")


@pytest.mark.parametrize("mode,pad,ac", COMBOS, ids=[combo_id(c) for c in COMBOS])
def test_non_finite_and_subnormal_inputs(device, torch, mode, pad, ac):
    """Input holding NaN, +-inf and subnormals, sampled at exact coordinates: the NaN and
    infinity pattern of the reference (an infinite tap with weight 0 gives NaN, as in PyTorch),
    subnormals not flushed (CPU: bitwise PyTorch's)."""
    H = W = STRUCTURED_SIZES[ac][0]
    grid = structured_grid(1, H, W, ac)
    for dtype in (np.float32, np.float64):
        tiny = np.finfo(dtype).smallest_subnormal
        x = np.full((1, 4, H, W), 0.5, dtype)
        x[0, 0, 1, 2] = np.inf
        x[0, 1, 2, 1] = np.nan
        x[0, 2] = tiny * np.arange(1, H * W + 1, dtype=dtype).reshape(H, W)
        x[0, 3, 0, 0] = -np.inf
        out = check(device, torch, x, grid.astype(dtype), mode, pad, ac, "special input")
        if mode == 1 and not is_gpu(device) and not flushes_subnormals(device):
            # nearest copies: the subnormal channel's outputs are its pixels, unflushed
            with np.errstate(invalid="ignore"):
                expected = ref.grid_sampler_2d(x, grid, mode, pad, ac)[0, 2]
            assert np.array_equal(out[0, 2].astype(np.float64), expected)


def test_large_channel_count(device, torch):
    """Many channels (the GPU's channel blocks, the CPU's channel loop) and an output wider
    than the input."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 300, 6, 5)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (1, 3, 19, 2)).astype(np.float32)
    for mode, pad in ((0, 0), (1, 2), (2, 1)):
        check(device, torch, x, grid, mode, pad, False, "C=300")


@pytest.mark.parametrize("N,Ho", [(1, 100), (3, 701)], ids=["64-workgroups", "32-row-blocks"])
def test_many_output_rows(device, torch, N, Ho):
    """More output rows than workgroups: the CPU form gives each workgroup a contiguous range
    of rows, at least 64 workgroups and at most 32 rows each; ranges that do not divide the rows
    evenly (100 rows over 64 workgroups; 2103 over 66) must still cover each row once."""
    rng = np.random.default_rng(Ho)
    x = rng.standard_normal((N, 2, 9, 7)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (N, Ho, 3, 2)).astype(np.float32)
    out = check(device, torch, x, grid, 0, 1, False, f"{N * Ho} rows")
    assert np.isfinite(out).all()
