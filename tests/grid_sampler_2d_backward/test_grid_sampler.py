"""aclnn_iree.grid_sampler_2d_backward (the Pythonic layer) against PyTorch, the float64
reference, finite differences and known hard cases (docs/semantics.md#grid-sampler,
docs/status-codes.md#grid-sampler-backward-checks).

Oracles
-------
* PyTorch 2.13 CPU (``torch.ops.aten.grid_sampler_2d_backward``), float32 and float64;
* ``aclnn_iree.ops.reference`` (float64 NumPy), which itself is checked against PyTorch;
* torch-independent: central differences of the float64 forward
  ``reference.grid_sampler_2d`` (grad_grid) and the adjoint identity
  ``<forward(z, grid), g> == <z, grad_input(g, grid)>`` (grad_input).

Tolerances are derived from the dtype (see ``error_bounds``), never tuned.

Kernels compile on first use (about 1 s each, cached on disk), so the tests reuse a
small set of specialisations: the 18 float32 ones, the 18 float64 ones and a few
float16 / bfloat16 ones.
"""
from __future__ import annotations

import itertools
import re
import threading

import ml_dtypes
import numpy as np
import pytest

from aclnn_iree import AclnnError
from aclnn_iree.core.errors import ACLNN_ERR_INNER_TILING_ERROR
from aclnn_iree.ops import reference as ref
from aclnn_iree.core.api import grid_sampler_2d_backward as gsb
from conftest import is_gpu, on_device

MODES = (0, 1, 2)  # bilinear, nearest, bicubic
PADS = (0, 1, 2)  # zeros, border, reflection
ACS = (False, True)
MODE_NAMES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
PAD_NAMES = {0: "zeros", 1: "border", 2: "reflection"}
ALL_COMBOS = list(itertools.product(MODES, PADS, ACS))


def combo_id(c):
    m, p, ac = c
    return f"{MODE_NAMES[m]}-{PAD_NAMES[p]}-ac{int(ac)}"


def combo_ids(combos):
    return [combo_id(c) for c in combos]


EPS32 = float(np.finfo(np.float32).eps)  # 2**-23
EPS64 = float(np.finfo(np.float64).eps)  # 2**-52
# The one constant of every bound below.  It covers the per-operation rounding counts
# derived in ``error_bounds`` (each rounding is at most eps/2; the counts are <= 8).
K = 8.0
TAPS = {0: 4, 1: 1, 2: 16}  # taps per grid point

NAN, INF = float("nan"), float("inf")

# (N, C, H_in, W_in, H_out, W_out): H != W, H_out != H_in, C=1, N=1, C=64 (6x5 spatial),
# H=1 (degenerate axis: align_corners multiplier 0, reflection span 0).
SHAPES = [
    (2, 3, 5, 7, 4, 6),
    (1, 1, 6, 4, 3, 5),
    (3, 2, 4, 4, 6, 2),
    (1, 64, 6, 5, 3, 4),
    (2, 1, 1, 3, 2, 2),
]


@pytest.fixture(autouse=True)
def _on_device(device, monkeypatch):
    """Every test of this module runs on each device of conftest.DEVICES."""
    monkeypatch.setitem(globals(), "gsb", on_device(device)[0])


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def torch_backward(torch, go, x, grid, mode, pad, ac):
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (go, x, grid)]
    dx, dg = torch.ops.aten.grid_sampler_2d_backward(*t, mode, pad, ac, [True, True])
    return dx.numpy(), dg.numpy()


def random_case(rng, shape, dtype=np.float32, lo=-1.3, hi=1.3):
    N, C, H, W, Ho, Wo = shape
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    grid = rng.uniform(lo, hi, (N, Ho, Wo, 2)).astype(dtype)
    go = rng.standard_normal((N, C, Ho, Wo)).astype(dtype)
    return go, x, grid


# ----------------------------------------------------------------------------------------
# Error bounds
# ----------------------------------------------------------------------------------------
def _unnormalize(c, size, ac):
    with np.errstate(invalid="ignore", over="ignore"):
        return (c + 1) / 2 * (size - 1) if ac else ((c + 1) * size - 1) / 2


def _reflect_clip(u, size, ac):
    """PyTorch's reflect_coordinates followed by clip (continuous, for the footprint only)."""
    lo, hi = (0.0, size - 1.0) if ac else (-0.5, size - 0.5)
    span = hi - lo
    if span <= 0:
        return np.zeros_like(u)
    d = np.fmod(np.abs(u - lo), 2 * span)
    return np.clip(np.where(d > span, 2 * span - d, d) + lo, 0, size - 1)


def _pad_int(k, size, pad, ac):
    """compute_coordinates of integer tap positions (bicubic pads per tap)."""
    if pad == 1:
        return np.clip(k, 0, size - 1)
    if pad == 2:
        return _reflect_clip(k, size, ac)
    return k


_HUGE = 2.0 ** 22  # |pixel coordinate| beyond which float32 cannot hold a fraction


def _axis_footprint(c, size, mode, pad, ac):
    """Pixel positions one axis of every grid point may touch, in float32 or float64.

    Returns (positions, anywhere): a list of integer arrays (one per tap slot, with
    multiplicity: several slots may clamp onto one pixel, and then several taps add
    into it) and a bool array of points that may touch any pixel of the axis.

    A float32 coordinate differs from the float64 one by less than a pixel, so its
    floor moves by at most one: bilinear/nearest taps lie in floor(p)-1 .. floor(p)+2
    of the padded coordinate p (clip and reflect are 1-Lipschitz), bicubic taps in
    floor(u)-2 .. floor(u)+3 of the unpadded one, each padded.  Non-finite coordinates
    follow the reference's rules (border: NaN/-inf -> 0, +inf -> size-1; reflection:
    0; zeros: nothing); huge finite ones under reflection may land anywhere.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        u = _unnormalize(c.astype(np.float64), size, ac)
        fin = np.isfinite(u)
        huge = fin & (np.abs(u) > _HUGE)
        anywhere = huge & (pad == 2)
        if pad == 1:
            base_u = np.where(np.isnan(u), 0.0, np.clip(u, -1e9, 1e9))
        elif pad == 2:
            base_u = np.where(fin & ~huge, u, 0.0)
        else:  # zeros: non-finite and huge are far outside
            base_u = np.where(fin & ~huge, u, -1e9)
        if mode == 2:
            b = np.floor(base_u)
            pos = [_pad_int(b + o, size, pad, ac) for o in range(-2, 4)]
        else:
            p = {0: base_u, 1: np.clip(base_u, 0, size - 1), 2: _reflect_clip(base_u, size, ac)}[pad]
            b = np.floor(p)
            pos = [b + o for o in range(-1, 3)]
    return [np.clip(q, -1, size).astype(np.int64) for q in pos], anywhere


def _coordinate_scale(grid, H, W):
    """lam: a bound on |pixel coordinate| + size over the points with ordinary coordinates."""
    g = np.abs(grid.astype(np.float64))
    g = g[np.isfinite(g) & (g * max(H, W) < _HUGE)]
    return max(H, W) * (2.0 + (float(g.max()) if g.size else 0.0)) + 2.0


def footprint_sums(go, x, grid, mode, pad, ac):
    """(FM, CNT, V) over every pixel a point may touch (see _axis_footprint):

    FM[n, c, y, x] = sum of |g[n, c, p]| over the points p (and tap slots) touching (y, x);
    CNT[n, y, x]   = the number of those (point, tap) pairs;
    V[n, p]        = sum_c |g[n, c, p]| * sum of |x[n, c, tap]| over p's tap slots.
    """
    go = np.abs(go.astype(np.float64))
    xa = np.abs(x.astype(np.float64))
    N, C, H, W = x.shape
    Ho, Wo = grid.shape[1:3]
    px, ax = _axis_footprint(grid[..., 0], W, mode, pad, ac)
    py, ay = _axis_footprint(grid[..., 1], H, mode, pad, ac)
    anywhere = ax | ay
    g_t = go.transpose(0, 2, 3, 1)  # (N, Ho, Wo, C)
    x_t = xa.transpose(0, 2, 3, 1)  # (N, H, W, C)
    FM = np.zeros((N, H, W, C))
    CNT = np.zeros((N, H, W))
    V = np.zeros((N, Ho, Wo))
    nidx = np.broadcast_to(np.arange(N)[:, None, None], (N, Ho, Wo))
    for yi in py:
        for xi in px:
            ok = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & ~anywhere
            n, y_, x_ = nidx[ok], yi[ok], xi[ok]
            np.add.at(FM, (n, y_, x_), g_t[ok])
            np.add.at(CNT, (n, y_, x_), 1.0)
            vals = np.where(ok[..., None], x_t[nidx, np.clip(yi, 0, H - 1), np.clip(xi, 0, W - 1)], 0.0)
            V += np.einsum("nhwc,nhwc->nhw", vals, g_t)
    if anywhere.any():
        slots = len(px) * len(py)
        for n in range(N):
            m = anywhere[n]
            FM[n] += slots * g_t[n][m].sum(axis=0)
            CNT[n] += slots * m.sum()
            V[n][m] += slots * np.einsum("pc,c->p", g_t[n][m], x_t[n].sum(axis=(0, 1)))
    return FM.transpose(0, 3, 1, 2), CNT, V


def error_bounds(go, x, grid, mode, pad, ac, eps):
    """Per-element bounds on |computed - exact| for a kernel computing in precision eps.

    Error model (standard rounding analysis, every operation rounds to nearest, |d| <= eps/2):
    * the pixel coordinate (unnormalize, clip / reflect) takes <= 6 roundings of numbers
      <= lam = max(H, W) * (2 + max|grid|) + 2, so |d ix| <= 3 * eps * lam / 2 <= 2 eps lam;
    * a tap weight is a product of two 1-D weights with |w| <= 1 and |dw/dix| <= 1.5
      (bilinear: 1; bicubic: max |cubic coefficient'| = 1.35): |d w| <= 2 * 1.5 * 2 eps lam
      + 3 eps/2 <= 7 eps lam, so each term w * g is off by <= 8 eps lam |g|;
    * recursive summation of cnt terms adds <= cnt * eps * sum |terms|  (|w| <= 1).
    grad_input[e] therefore errs by <= K eps (lam + cnt_e) FM_e with FM_e the sum of |g|
    over every (point, tap) that may touch e (footprint_sums; the footprint includes the
    taps a one-pixel coordinate shift could reach, so a weight that is 0 in float64 and
    tiny in float32 is covered).
    grad_grid[p] = m * sum_c g sum_taps v dw/dix with m = W/2 or (W-1)/2 exact: the
    derivative weights have |d(dw/dix)| <= (4.5 + 1.5 * 1.5) * 2 eps lam <= 14 eps lam
    (bicubic: max |coefficient''| = 4.5), the value differences, products and the sums over
    T taps and C channels add <= (T + C + 3) eps * sum |terms|, so
    |d grad_grid[p]| <= K eps (2 lam + T + C) m V_p, V_p = sum_c |g| sum_taps |v|.
    Nearest has a zero grid gradient, computed exactly.
    Returns (bound_dx (N, C, H, W), bound_dgrid (N, H_out, W_out, 2)).
    """
    N, C, H, W = x.shape
    lam = _coordinate_scale(grid, H, W)
    FM, CNT, V = footprint_sums(go, x, grid, mode, pad, ac)
    b_dx = K * eps * (lam + CNT[:, None]) * FM
    mx = (W - 1) / 2 if ac else W / 2
    my = (H - 1) / 2 if ac else H / 2
    b_dg = np.zeros(grid.shape)
    if mode != 1:
        common = K * eps * (2 * lam + TAPS[mode] + C + 3) * V
        b_dg[..., 0] = mx * common
        b_dg[..., 1] = my * common
    return b_dx, b_dg


def storage_bound(expected, dtype, compute_bound):
    """Bound for a result computed in float32 (or float64) and rounded once to `dtype`:
    2 * half an ulp of the stored value (eps_dtype/2 * |ref| relative, with a floor of half
    the smallest subnormal) plus the compute-precision bound."""
    fi = ml_dtypes.finfo(dtype)
    half_ulp = 0.5 * float(fi.eps) * np.abs(expected) + 0.5 * float(fi.smallest_subnormal)
    return 2 * half_ulp + compute_bound


def assert_within(actual, expected, bound, what):
    actual = np.asarray(actual).astype(np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected)
    bad = ~(err <= bound)  # NaN-safe
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements outside the bound; first at {i}: "
            f"actual {actual[i]!r}, expected {expected[i]!r}, |err| {err[i]:.3e} > bound {bound[i]:.3e}")


def check_against(torch, go, x, grid, mode, pad, ac, label=""):
    """Float32 kernel vs float64 reference (bound B) and vs torch float32 (bound 2B: both err)."""
    dx, dg = gsb(go, x, grid, mode, pad, ac)
    assert dx.dtype == np.float32 and dg.dtype == np.float32
    rdx, rdg = ref.grid_sampler_2d_backward(go, x, grid, mode, pad, ac)
    bdx, bdg = error_bounds(go, x, grid, mode, pad, ac, EPS32)
    assert_within(dx, rdx, bdx, f"{label} grad_input vs reference")
    assert_within(dg, rdg, bdg, f"{label} grad_grid vs reference")
    if mode == 1:
        assert not np.any(dg), "nearest: grad_grid must be exactly 0"
    if torch is not None:
        tdx, tdg = torch_backward(torch, go, x, grid, mode, pad, ac)
        assert_within(dx, tdx, 2 * bdx, f"{label} grad_input vs torch float32")
        assert_within(dg, tdg, 2 * bdg, f"{label} grad_grid vs torch float32")
    return dx, dg, rdx, rdg


# ----------------------------------------------------------------------------------------
# Against PyTorch (float32) and the float64 reference
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,pad,ac", ALL_COMBOS, ids=combo_ids(ALL_COMBOS))
def test_random_shapes_match_torch_and_reference(torch, mode, pad, ac, kernel_form):
    rng = np.random.default_rng(1000 + 100 * mode + 10 * pad + ac)
    for shape in SHAPES:
        go, x, grid = random_case(rng, shape)
        check_against(torch, go, x, grid, mode, pad, ac, label=str(shape))


def _special_coords(size, ac):
    """-1, +1, 0, every pixel centre and every pixel edge (nearest's ties), all exact
    dyadic numbers for the sizes used below (so float32 coordinates are exact)."""
    k = np.arange(size, dtype=np.float64)
    if ac:
        centres = -1 + 2 * k / (size - 1)
        edges = -1 + (2 * k[:-1] + 1) / (size - 1)
    else:
        centres = (2 * k + 1) / size - 1
        edges = 2 * k / size - 1
    return np.unique(np.concatenate([[-1.0, 1.0, 0.0], centres, edges]))


def structured_grid(N, H, W, ac):
    sx = _special_coords(W, ac)
    sy = _special_coords(H, ac)
    gx, gy = np.meshgrid(sx, sy)  # (len(sy), len(sx))
    grid = np.stack([gx, gy], -1)[None].repeat(N, 0)
    assert np.array_equal(grid.astype(np.float32).astype(np.float64), grid)  # exact in float32
    return grid.astype(np.float32)


# Sizes whose pixel centres and edges are dyadic: W = 2^k (align_corners False) and
# W - 1 = 2^k (align_corners True).
STRUCTURED_SIZES = {False: (4, 8), True: (5, 9)}


@pytest.mark.parametrize("mode,pad,ac", ALL_COMBOS, ids=combo_ids(ALL_COMBOS))
def test_structured_grid_borders_and_pixel_centres(torch, mode, pad, ac, kernel_form):
    """Grid points exactly on -1/+1, 0, pixel centres and pixel edges (both conventions)."""
    rng = np.random.default_rng(7 + 100 * mode + 10 * pad + ac)
    H, W = STRUCTURED_SIZES[ac]
    grid = structured_grid(2, H, W, ac)
    N, Ho, Wo, _ = grid.shape
    C = 3
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    go = rng.standard_normal((N, C, Ho, Wo)).astype(np.float32)
    check_against(torch, go, x, grid, mode, pad, ac, label="structured")

    # The float64 reference against torch float64 on the same structured data (both err
    # by at most the float64 bound).
    go64, x64, grid64 = (a.astype(np.float64) for a in (go, x, grid))
    rdx, rdg = ref.grid_sampler_2d_backward(go64, x64, grid64, mode, pad, ac)
    tdx, tdg = torch_backward(torch, go64, x64, grid64, mode, pad, ac)
    bdx, bdg = error_bounds(go64, x64, grid64, mode, pad, ac, EPS64)
    assert_within(rdx, tdx, 2 * bdx, "reference grad_input vs torch float64")
    assert_within(rdg, tdg, 2 * bdg, "reference grad_grid vs torch float64")


@pytest.mark.parametrize("mode,pad,ac", ALL_COMBOS, ids=combo_ids(ALL_COMBOS))
def test_single_one_in_zero_grad_output(torch, mode, pad, ac, kernel_form):
    """grad_output with a single 1: grad_input is that point's tap weights in its plane
    only, grad_grid is non-zero at that point only."""
    rng = np.random.default_rng(55 + 100 * mode + 10 * pad + ac)
    shape = (2, 3, 5, 7, 4, 6)
    _, x, grid = random_case(rng, shape)
    go = np.zeros((2, 3, 4, 6), np.float32)
    n, c, i, j = 1, 2, 3, 1
    go[n, c, i, j] = 1.0
    dx, dg, rdx, rdg = check_against(torch, go, x, grid, mode, pad, ac, label="one-hot")
    others = np.ones(dx.shape, bool)
    others[n, c] = False
    assert not np.any(dx[others]), "grad_input outside the plane of the single 1 must be 0"
    pts = np.ones(dg.shape[:3], bool)
    pts[n, i, j] = False
    assert not np.any(dg[pts]), "grad_grid away from the point of the single 1 must be 0"
    # grad_input of a one-hot grad_output is the forward's tap weights for that point.
    if mode != 2:  # bilinear / nearest weights are >= 0 and sum to <= 1
        assert np.all(dx[n, c] >= 0) and dx[n, c].sum() <= 1 + 1e-6


# ----------------------------------------------------------------------------------------
# Torch-independent oracles (float64 kernels)
# ----------------------------------------------------------------------------------------
def _grid_away_from_kinks(rng, N, Ho, Wo, H, W, ac):
    """Grid points whose pixel coordinates stay >= 0.1 px from integers and half-integers
    (where bilinear / bicubic / clip / reflect have kinks), inside and outside the image."""

    def axis(size):
        k = rng.integers(-2, size + 2, (N, Ho, Wo))
        frac = rng.uniform(0.1, 0.4, (N, Ho, Wo)) + 0.5 * rng.integers(0, 2, (N, Ho, Wo))
        u = k + frac
        if ac:
            return 2 * u / (size - 1) - 1
        return (2 * u + 1) / size - 1

    return np.stack([axis(W), axis(H)], -1)


FD_COMBOS = [c for c in ALL_COMBOS if c[0] != 1]


@pytest.mark.parametrize("mode,pad,ac", FD_COMBOS, ids=combo_ids(FD_COMBOS))
def test_grad_grid_matches_central_differences_of_forward(mode, pad, ac):
    """grad_grid (float64 kernel) vs central differences of the float64 forward.

    L_p(grid) = sum_c g[n, c, p] * forward(x, grid)[n, c, p] depends on point p only, so
    one forward per shifted grid gives every point's difference quotient.
    Error of the quotient: rounding K eps64 S_p / h (S_p = sum_c |g| sum_taps |v| bounds
    the forward's terms) plus truncation: 0 for bilinear (linear between kinks, and the
    points stay 0.1 px away from them) and h^2 / 6 * max|d^3 L / dgrid^3| for bicubic: a
    pixel is 1/m grid units (m = W/2 or (W-1)/2) and |cubic coefficient'''| <= 7.5, |cy| <= 1,
    so (h m)^2 / 6 * m * 7.5 * S_p (with a spare factor 1.5); plus the kernel's own float64
    error (error_bounds).
    """
    rng = np.random.default_rng(300 + 100 * mode + 10 * pad + ac)
    N, C, H, W, Ho, Wo = 2, 3, 5, 6, 3, 4
    x = rng.standard_normal((N, C, H, W))
    go = rng.standard_normal((N, C, Ho, Wo))
    grid = _grid_away_from_kinks(rng, N, Ho, Wo, H, W, ac)
    _, dg = gsb(go, x, grid, mode, pad, ac)
    assert dg.dtype == np.float64
    _, _, V = footprint_sums(go, x, grid, mode, pad, ac)
    _, b_kernel = error_bounds(go, x, grid, mode, pad, ac, EPS64)  # the kernel's own error
    h = 1e-5
    for axis, size in ((0, W), (1, H)):
        m = (size - 1) / 2 if ac else size / 2
        e = np.zeros_like(grid)
        e[..., axis] = h
        fp = ref.grid_sampler_2d(x, grid + e, mode, pad, ac)
        fm = ref.grid_sampler_2d(x, grid - e, mode, pad, ac)
        fd = np.einsum("nchw,nchw->nhw", go, fp - fm) / (2 * h)
        trunc = 0.0 if mode == 0 else (h * m) ** 2 / 6 * 7.5 * 1.5 * m * V
        bound = K * EPS64 * V / h + trunc + b_kernel[..., axis]
        assert_within(dg[..., axis], fd, bound, f"grad_grid[..., {axis}] vs central differences")
        assert np.abs(fd).max() > 0.1  # not vacuous


@pytest.mark.parametrize("mode,pad,ac", ALL_COMBOS, ids=combo_ids(ALL_COMBOS))
def test_grad_input_adjoint_identity(mode, pad, ac, kernel_form):
    """<forward(z, grid), g> == <z, grad_input(g, grid)> (the forward is linear in its input).

    Both sides sum the same P*T*C products w * g * z; |w| <= 1, so each side errs by
    <= K eps64 (lam + number of terms) * A, A = sum |g| |z| over the footprint.
    """
    rng = np.random.default_rng(400 + 100 * mode + 10 * pad + ac)
    N, C, H, W, Ho, Wo = 2, 3, 5, 6, 4, 5
    z = rng.standard_normal((N, C, H, W))
    go = rng.standard_normal((N, C, Ho, Wo))
    grid = rng.uniform(-1.3, 1.3, (N, Ho, Wo, 2))
    dx, _ = gsb(go, z, grid, mode, pad, ac)
    assert dx.dtype == np.float64
    lhs = float(np.sum(ref.grid_sampler_2d(z, grid, mode, pad, ac) * go))
    rhs = float(np.sum(z * dx))
    _, _, A = footprint_sums(go, z, grid, mode, pad, ac)
    terms = N * Ho * Wo * TAPS[mode] * C + z.size
    bound = 2 * K * EPS64 * (_coordinate_scale(grid, H, W) + terms) * A.sum()
    assert abs(lhs - rhs) <= bound, (lhs, rhs, bound)
    assert abs(lhs) > 1e-3  # not vacuous


# ----------------------------------------------------------------------------------------
# output_mask
# ----------------------------------------------------------------------------------------
MASK_SPECS = [(0, 0, False), (1, 2, True), (2, 1, False)]


@pytest.mark.parametrize("mode,pad,ac", MASK_SPECS, ids=combo_ids(MASK_SPECS))
@pytest.mark.parametrize("mask", [(True, False), (False, True)], ids=["dx_only", "dgrid_only"])
def test_output_mask_single_output_is_bitwise_equal(mode, pad, ac, mask, kernel_form):
    rng = np.random.default_rng(11)
    go, x, grid = random_case(rng, (2, 5, 4, 6, 3, 5))
    both = gsb(go, x, grid, mode, pad, ac, (True, True), deterministic=True)
    one = gsb(go, x, grid, mode, pad, ac, mask, deterministic=True)
    for k in range(2):
        if mask[k]:
            assert one[k] is not None and one[k].dtype == both[k].dtype
            assert np.array_equal(one[k].view(np.uint32), both[k].view(np.uint32))
        else:
            assert one[k] is None


def in_fresh_thread(fn, *args):
    """Runs fn in a new thread and returns its result (re-raising its exception).

    The Pythonic layer keeps one stream per thread; a failed launch fails that stream's
    timeline for good, so calls that may hit a launch failure run on
    a thread of their own and cannot break the tests that follow.
    """
    out = {}

    def target():
        try:
            out["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_output_mask_false_false_returns_none_none():
    rng = np.random.default_rng(12)
    go, x, grid = random_case(rng, (1, 2, 3, 3, 2, 2))
    assert in_fresh_thread(gsb, go, x, grid, 0, 0, False, (False, False)) == (None, None)


def test_output_mask_false_false_still_validates():
    """docs/status-codes.md#where-aclnn-skips-its-checks: an all-False mask still checks every argument."""
    rng = np.random.default_rng(13)
    go, x, grid = random_case(rng, (1, 2, 3, 3, 2, 2))
    with pytest.raises(AclnnError) as e:
        gsb(go, x, grid, 3, 0, False, (False, False))
    assert e.value.status == 161002
    with pytest.raises(AclnnError) as e:
        gsb(go[:, :1], x, grid, 0, 0, False, (False, False))
    assert e.value.status == 161002


# ----------------------------------------------------------------------------------------
# Validation: one test per check (docs/status-codes.md#grid-sampler-backward-checks,
# aclnn_iree/core/validation.py)
# ----------------------------------------------------------------------------------------
def _base_args():
    f = np.float32
    return dict(grad_output=np.zeros((1, 2, 3, 4), f), input=np.zeros((1, 2, 5, 6), f),
                grid=np.zeros((1, 3, 4, 2), f), interpolation_mode=0, padding_mode=0,
                align_corners=False, output_mask=(True, True))


def _with(**changes):
    def make():
        a = _base_args()
        for k, v in changes.items():
            a[k] = v(a) if callable(v) else v
        return a
    return make


f32, f64 = np.float32, np.float64
VALIDATION_CASES = [
    # id, args, status, pattern the message must contain (the offending argument)
    ("grad_output_none", _with(grad_output=None), 161001, r"grad_?output"),
    ("input_none", _with(input=None), 161001, r"\binput\b"),
    ("grid_none", _with(grid=None), 161001, r"\bgrid\b"),
    ("output_mask_none", _with(output_mask=None), 161001, r"output_?mask"),
    ("grid_dtype_mismatch", _with(grid=lambda a: a["grid"].astype(f64)), 161002, r"\bgrid\b.*float64"),
    ("grad_output_dtype_mismatch", _with(grad_output=lambda a: a["grad_output"].astype(f64)), 161002,
     r"grad_?output.*float64"),
    ("unsupported_dtype_int32",
     _with(**{k: (lambda a, k=k: a[k].astype(np.int32)) for k in ("grad_output", "input", "grid")}),
     161002, r"\binput\b.*int32"),
    ("interpolation_mode_3", _with(interpolation_mode=3), 161002, r"interpolation_?mode"),
    ("interpolation_mode_minus_1", _with(interpolation_mode=-1), 161002, r"interpolation_?mode"),
    ("padding_mode_3", _with(padding_mode=3), 161002, r"padding_?mode"),
    ("interpolation_mode_bool", _with(interpolation_mode=True), 161002, r"interpolation_?mode"),
    ("interpolation_mode_name_linear", _with(interpolation_mode="linear"), 161002, r"interpolation_?mode"),
    ("padding_mode_name_reflect", _with(padding_mode="reflect"), 161002, r"padding_?mode"),
    ("input_rank_3", _with(input=lambda a: a["input"][0]), 161002, r"\binput\b.*4-D"),
    ("grid_rank_3", _with(grid=lambda a: a["grid"][0]), 161002, r"\bgrid\b.*4-D"),
    ("grad_output_rank_5", _with(grad_output=lambda a: a["grad_output"][None]), 161002, r"grad_?output.*4-D"),
    ("grid_n_mismatch", _with(grid=np.zeros((2, 3, 4, 2), f32)), 161002, r"\bgrid\b.*N=2"),
    ("grad_output_n_mismatch", _with(grad_output=np.zeros((2, 2, 3, 4), f32)), 161002, r"grad_?output"),
    ("grad_output_c_mismatch", _with(grad_output=np.zeros((1, 3, 3, 4), f32)), 161002,
     r"grad_?output.*\(1, 2, 3, 4\)"),
    ("grid_last_dim_3", _with(grid=np.zeros((1, 3, 4, 3), f32)), 161002, r"\bgrid\b.*last dim"),
    ("input_h_0", _with(input=np.zeros((1, 2, 0, 6), f32)), 161002, r"\binput\b.*\bH\b"),
    ("input_w_0", _with(input=np.zeros((1, 2, 5, 0), f32)), 161002, r"\binput\b.*\bW\b"),
    ("grad_output_wrong_h_out", _with(grad_output=np.zeros((1, 2, 4, 4), f32)), 161002,
     r"grad_?output.*\(1, 2, 3, 4\)"),
    ("grad_output_wrong_w_out", _with(grad_output=np.zeros((1, 2, 3, 5), f32)), 161002,
     r"grad_?output.*\(1, 2, 3, 4\)"),
    ("output_mask_length_1", _with(output_mask=(True,)), 161002, r"output_?mask"),
    ("output_mask_length_3", _with(output_mask=(True, True, False)), 161002, r"output_?mask"),
]


@pytest.mark.parametrize("make,status,pattern", [c[1:] for c in VALIDATION_CASES],
                         ids=[c[0] for c in VALIDATION_CASES])
def test_validation(make, status, pattern):
    with pytest.raises(AclnnError) as e:
        gsb(**make())
    assert e.value.status == status, str(e.value)
    assert isinstance(e.value, ValueError)
    assert re.search(pattern, str(e.value), re.IGNORECASE), str(e.value)


def test_validation_check_order():
    """With two invalid arguments the earlier check of aclnn's order reports
    (docs/status-codes.md#grid-sampler-backward-checks):
    None, then dtypes, then attributes, then shapes (rank before N / C / sizes)."""
    f = np.float32
    cases = [
        (_with(grid=None, interpolation_mode=3), 161001, r"\bgrid\b"),
        (_with(grid=lambda a: a["grid"].astype(np.float64), interpolation_mode=3), 161002, r"float64"),
        (_with(interpolation_mode=3, input=np.zeros((2, 5, 6), f)), 161002, r"interpolation_?mode"),
        (_with(padding_mode=3, grad_output=np.zeros((1, 2, 9, 9), f)), 161002, r"padding_?mode"),
        (_with(grid=np.zeros((2, 3, 4), f), grad_output=np.zeros((1, 3, 3, 4), f)), 161002, r"\bgrid\b.*4-D"),
        (_with(grid=np.zeros((2, 3, 4, 3), f), input=np.zeros((1, 2, 0, 6), f)), 161002, r"\bgrid\b.*N=2"),
        (_with(input=np.zeros((1, 2, 0, 6), f), grad_output=np.zeros((1, 3, 3, 4), f)), 161002, r"\binput\b.*\bH\b"),
    ]
    for make, status, pattern in cases:
        with pytest.raises(AclnnError) as e:
            gsb(**make())
        assert e.value.status == status, str(e.value)
        assert re.search(pattern, str(e.value), re.IGNORECASE), str(e.value)


def test_validation_known_case_grad_output_shape():
    f = np.float32
    with pytest.raises(AclnnError) as e:
        gsb(np.zeros((1, 1, 1, 1), f), np.zeros((1, 1, 4, 4), f), np.zeros((1, 3, 3, 2), f), 0, 0, False)
    assert e.value.status == 161002
    msg = str(e.value)
    assert "grad_output" in msg and "(1, 1, 3, 3)" in msg, msg  # the Pythonic layer uses PyTorch's names
    # the aclnn layer names the aclnn parameter
    from aclnn_iree import aclnn as A
    ts = [A.aclCreateTensor(np.zeros(sh, f)) for sh in ((1, 1, 1, 1), (1, 1, 4, 4), (1, 3, 3, 2), (1, 1, 4, 4),
                                                        (1, 3, 3, 2))]
    status, _, _ = A.aclnnGridSampler2DBackwardGetWorkspaceSize(*ts[:3], 0, 0, False,
                                                                A.aclCreateBoolArray([True, True]), *ts[3:])
    assert status == 161002
    assert "gradOutput" in A.aclGetRecentErrMsg() and "(1, 1, 3, 3)" in A.aclGetRecentErrMsg()


def test_validation_valid_base_args_succeed():
    """The base arguments of the validation cases are valid (each case changes one thing)."""
    dx, dg = gsb(**_base_args())
    assert dx.shape == (1, 2, 5, 6) and dg.shape == (1, 3, 4, 2)


def test_string_mode_names_work_like_ints():
    rng = np.random.default_rng(21)
    go, x, grid = random_case(rng, (1, 2, 4, 5, 3, 3))
    for (m, mn), (p, pn) in itertools.product(MODE_NAMES.items(), PAD_NAMES.items()):
        a = gsb(go, x, grid, m, p, True)
        b = gsb(go, x, grid, mn, pn, True)
        c = gsb(go, x, grid, mn, p, True)
        for k in range(2):
            assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), (mn, pn)
            assert np.array_equal(a[k].view(np.uint32), c[k].view(np.uint32)), (mn, p)


# ----------------------------------------------------------------------------------------
# Known hard cases
# ----------------------------------------------------------------------------------------
def _ramp_identity_case():
    x = np.tile(np.arange(5, dtype=np.float32), (5, 1)).reshape(1, 1, 5, 5)  # every row 0..4
    v = np.array([-1, -0.5, 0, 0.5, 1], np.float32)
    gx, gy = np.meshgrid(v, v)
    grid = np.stack([gx, gy], -1)[None].astype(np.float32)  # identity, align_corners=True
    go = np.ones((1, 1, 5, 5), np.float32)
    return go, x, grid


@pytest.mark.parametrize("pad", [1, 2], ids=["border", "reflection"])
def test_known_identity_grid_border_and_reflection(pad, kernel_form):
    go, x, grid = _ramp_identity_case()
    dx, dg = gsb(go, x, grid, 0, pad, True)
    for row in range(5):
        np.testing.assert_array_equal(dg[0, row, :, 0], [0, 2, 2, 2, 0])
    np.testing.assert_array_equal(dg[0, ..., 1], np.zeros((5, 5)))
    np.testing.assert_array_equal(dx, np.ones((1, 1, 5, 5)))  # identity: each pixel once


def test_known_identity_grid_zeros(kernel_form):
    go, x, grid = _ramp_identity_case()
    _, dg = gsb(go, x, grid, 0, 0, True)
    np.testing.assert_array_equal(dg[0, :, 4, 0], [-8] * 5)
    np.testing.assert_array_equal(dg[0, :, :4, 0], np.full((5, 4), 2.0))
    np.testing.assert_array_equal(dg[0, 4, :, 1], [0, -2, -4, -6, -8])
    np.testing.assert_array_equal(dg[0, :4, :, 1], np.zeros((4, 5)))


@pytest.mark.parametrize("gx,expected", [(0.0, [1, 0]), (-1.0, [1, 0]), (1.0, [0, 0])])
def test_known_nearest_1x2(gx, expected):
    """x = 0 is pixel coordinate 0.5: round half to even -> pixel 0; x = -1 -> -0.5 -> 0
    (-0 is in bounds); x = +1 -> 1.5 -> 2, out of bounds."""
    x = np.array([10, 20], np.float32).reshape(1, 1, 1, 2)
    grid = np.array([gx, 0], np.float32).reshape(1, 1, 1, 2)
    go = np.ones((1, 1, 1, 1), np.float32)
    dx, dg = gsb(go, x, grid, 1, 0, False)
    np.testing.assert_array_equal(dx.ravel(), expected)
    np.testing.assert_array_equal(dg.ravel(), [0, 0])


NONFINITE_KNOWN = [
    (NAN, 1, [1, 0]), (NAN, 2, [1, 0]),
    (INF, 1, [0, 1]), (-INF, 1, [1, 0]),
    (INF, 2, [1, 0]), (-INF, 2, [1, 0]),
    (NAN, 0, [0, 0]), (INF, 0, [0, 0]), (-INF, 0, [0, 0]),
]


@pytest.mark.parametrize("ac", ACS, ids=["ac0", "ac1"])
@pytest.mark.parametrize("gx,pad,expected", NONFINITE_KNOWN,
                         ids=[f"{g}-{PAD_NAMES[p]}" for g, p, _ in NONFINITE_KNOWN])
def test_known_nonfinite_grid(gx, pad, expected, ac, kernel_form):
    x = np.array([10, 20], np.float32).reshape(1, 1, 1, 2)
    grid = np.array([gx, 0], np.float32).reshape(1, 1, 1, 2)
    go = np.ones((1, 1, 1, 1), np.float32)
    dx, dg = gsb(go, x, grid, 0, pad, ac)
    np.testing.assert_array_equal(dx.ravel(), expected)
    np.testing.assert_array_equal(dg.ravel(), [0, 0])


def _exact_sweep_case(specials):
    """Small-integer data and dyadic ordinary grid values: every product and sum is exact
    in float32 and float64 for H=4, W=5, so kernel and reference must agree exactly."""
    rng = np.random.default_rng(31)
    vals = np.array(specials + [0.25, -0.5, 1.0], np.float64)
    pts = np.array(list(itertools.product(vals, vals)))
    n = len(vals)
    grid = pts.reshape(1, n, n, 2)
    x = rng.integers(-4, 5, (1, 2, 4, 5)).astype(np.float64)
    go = rng.integers(-4, 5, (1, 2, n, n)).astype(np.float64)
    return go, x, grid


def _sweep(specials, mode, pad, ac, dtype):
    go, x, grid = (a.astype(dtype) for a in _exact_sweep_case(specials))
    dx, dg = gsb(go, x, grid, mode, pad, ac)
    assert np.isfinite(dx).all() and np.isfinite(dg).all()
    rdx, rdg = ref.grid_sampler_2d_backward(go, x, grid, mode, pad, ac)
    np.testing.assert_array_equal(dx, rdx)
    np.testing.assert_array_equal(dg, rdg)


@pytest.mark.parametrize("mode,pad,ac", ALL_COMBOS, ids=combo_ids(ALL_COMBOS))
def test_nonfinite_grid_sweep_equals_reference(mode, pad, ac, kernel_form):
    """NaN / +-inf grid values (paired with each other and with ordinary ones) never crash,
    give finite outputs, and equal the reference exactly."""
    _sweep([NAN, INF, -INF], mode, pad, ac, np.float32)


# Reflection with align_corners multiplies the coordinate by (size - 1) / 2, which rounds in
# float32 at 1e38 (the float64 reference does not), and an exact reflection of two different
# huge numbers lands on unrelated pixels.  Those cases are checked by conservation instead.
EXACT_HUGE32 = [c for c in ALL_COMBOS if not (c[1] == 2 and c[2])]
REFLECT_AC_HUGE32 = [c for c in ALL_COMBOS if c[1] == 2 and c[2]]


@pytest.mark.parametrize("mode,pad,ac", EXACT_HUGE32, ids=combo_ids(EXACT_HUGE32))
def test_huge_grid_sweep_equals_reference(mode, pad, ac, kernel_form):
    """+-1e38 grid values (float32): never crash, finite outputs equal to the reference."""
    _sweep([1e38, -1e38], mode, pad, ac, np.float32)


@pytest.mark.parametrize("mode,pad,ac", REFLECT_AC_HUGE32, ids=combo_ids(REFLECT_AC_HUGE32))
def test_huge_grid_reflection_conserves_mass(mode, pad, ac):
    """+-1e38 under reflection (float32): every point lands inside the image and its
    weights sum to 1, so each channel of grad_input sums to that of grad_output."""
    go, x, grid = (a.astype(np.float32) for a in _exact_sweep_case([1e38, -1e38]))
    dx, dg = gsb(go, x, grid, mode, pad, ac)
    assert np.isfinite(dx).all() and np.isfinite(dg).all()
    np.testing.assert_allclose(dx.sum(axis=(2, 3)), go.sum(axis=(2, 3)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("mode,pad,ac", ALL_COMBOS, ids=combo_ids(ALL_COMBOS))
def test_nonfinite_grid_sweep_float64(mode, pad, ac, kernel_form):
    _sweep([NAN, INF, -INF], mode, pad, ac, np.float64)


@pytest.mark.parametrize("mode,pad,ac", ALL_COMBOS, ids=combo_ids(ALL_COMBOS))
def test_huge_grid_sweep_float64(mode, pad, ac, kernel_form):
    _sweep([1e38, -1e38], mode, pad, ac, np.float64)


@pytest.mark.parametrize("ac", ACS, ids=["ac0", "ac1"])
def test_huge_grid_never_crashes_all_modes(ac):
    """Whatever the values, every mode and padding returns finite outputs of the right shape."""
    go, x, grid = (a.astype(np.float32) for a in _exact_sweep_case([NAN, INF, -INF, 1e38, -1e38, 3e38]))
    for mode, pad in itertools.product(MODES, PADS):
        dx, dg = gsb(go, x, grid, mode, pad, ac)
        assert dx.shape == x.shape and dg.shape == grid.shape
        assert np.isfinite(dx).all() and np.isfinite(dg).all(), (mode, pad)


def test_known_mask_grad_grid_only():
    x = np.array([[-0.6, 0.8, -0.5], [-0.5, 0.2, 1.2], [1.4, 0.3, -0.2]], np.float32).reshape(1, 1, 3, 3)
    grid = np.array([
        [(0.2, 0.3), (-0.4, -0.3), (-0.9, 0.3), (-0.9, -0.6)],
        [(0.4, 0.1), (0.9, -0.8), (0.4, 0.5), (0.5, -0.2)],
        [(0.1, -0.8), (-0.3, -1.0), (0.7, 0.4), (0.2, 0.8)]], np.float32)[None]
    go = np.full((1, 1, 3, 4), 1 / 12, np.float32)
    expected = np.array([
        [[0.0458, -0.0167], [0.0758, -0.0267], [0.0133, 0.1433], [0.0933, 0.0025]],
        [[0.0708, -0.0417], [-0.0700, 0.1225], [0.0208, -0.0417], [0.0450, 0.0458]],
        [[-0.0700, -0.0308], [0.1167, 0.0000], [0.0333, -0.0792], [-0.0167, -0.0167]]])[None]
    dx, dg = gsb(go, x, grid, "bilinear", "border", True, (False, True))
    assert dx is None
    np.testing.assert_allclose(dg, expected, rtol=0, atol=6e-5)


EMPTY_CASES = {
    "N0": (0, 2, 3, 4, 2, 5),
    "C0": (2, 0, 3, 4, 2, 5),
    "Hout0": (2, 3, 3, 4, 0, 5),
    "Wout0": (2, 3, 3, 4, 2, 0),
}


@pytest.mark.parametrize("mode", MODES, ids=list(MODE_NAMES.values()))
@pytest.mark.parametrize("name", EMPTY_CASES)
def test_empty_tensors(name, mode, kernel_form):
    N, C, H, W, Ho, Wo = EMPTY_CASES[name]
    go, x, grid = random_case(np.random.default_rng(3), (N, C, H, W, Ho, Wo))
    dx, dg = in_fresh_thread(gsb, go, x, grid, mode, 2, False)
    assert dx.shape == x.shape and dg.shape == grid.shape
    assert dx.dtype == np.float32 and dg.dtype == np.float32
    assert not np.any(dx) and not np.any(dg)  # all zeros (non-empty ones included)
    if name == "Hout0":
        assert dx.size > 0
    if name == "C0":
        assert dg.size > 0


def _run_aclnn(go, x, grid, mask, fill=7.0):
    """The aclnn two-phase API on its own stream, outputs pre-filled with `fill`."""
    from aclnn_iree import aclnn as A

    dx_t = A.aclCreateTensor(np.full(x.shape, fill, x.dtype))
    dg_t = A.aclCreateTensor(np.full(grid.shape, fill, grid.dtype))
    ins = [A.aclCreateTensor(a) for a in (go, x, grid)]
    st, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(*ins, 0, 0, False, A.aclCreateBoolArray(mask),
                                                               dx_t, dg_t)
    assert st == 0, A.aclGetRecentErrMsg()
    st, stream = A.aclrtCreateStream("local-task")
    assert st == 0, A.aclGetRecentErrMsg()
    wsb = None
    if ws > 0:
        st, wsb = A.aclrtMalloc(ws, stream)
        assert st == 0, A.aclGetRecentErrMsg()
    st = A.aclnnGridSampler2DBackward(wsb, ws, ex, stream)
    if st != 0:
        raise AclnnError(st, A.aclGetRecentErrMsg())
    st = A.aclrtSynchronizeStream(stream)
    if st != 0:
        raise AclnnError(st, A.aclGetRecentErrMsg())
    return dx_t.numpy(), dg_t.numpy()


def test_aclnn_empty_grid_zero_fills_requested_output():
    """docs/semantics.md#empty-tensors: a requested output is written (zeros when nothing contributes) even
    when the caller's tensor held other data (aclnn leaves it stale)."""
    go, x, grid = random_case(np.random.default_rng(4), (1, 2, 3, 4, 0, 5))  # H_out = 0
    dx, _ = in_fresh_thread(_run_aclnn, go, x, grid, [True, True])
    assert dx.size and not np.any(dx)


def test_aclnn_masked_out_output_is_left_untouched():
    """docs/semantics.md#output-mask: an output whose mask entry is False is not written."""
    go, x, grid = random_case(np.random.default_rng(4), (1, 2, 3, 4, 2, 5))
    dx, dg = _run_aclnn(go, x, grid, [True, False])
    np.testing.assert_array_equal(dg, np.full(grid.shape, 7.0))
    assert np.any(dx != 7.0)
    dx, dg = _run_aclnn(go, x, grid, [False, True])
    np.testing.assert_array_equal(dx, np.full(x.shape, 7.0))
    assert np.any(dg != 7.0)


DETERMINISM_SPECS = [(0, 2, False), (2, 0, True), (1, 1, False)]


@pytest.mark.parametrize("mode,pad,ac", DETERMINISM_SPECS, ids=combo_ids(DETERMINISM_SPECS))
def test_deterministic(mode, pad, ac, kernel_form):
    rng = np.random.default_rng(5)
    go, x, grid = random_case(rng, (2, 64, 6, 5, 7, 6))
    # Many points on few pixels: the scatter-add order matters for the bits.
    grid = (grid * 0.3).astype(np.float32)
    # deterministic=True: GPUs would otherwise add dx with float atomics (CPUs ignore it).
    try:
        a = gsb(go, x, grid, mode, pad, ac, deterministic=True)
    except AclnnError as e:  # the linalg form's serial scatter past lavapipe's loop budget: refused
        assert kernel_form == "linalg" and e.status == ACLNN_ERR_INNER_TILING_ERROR, e
        return
    b = gsb(go, x, grid, mode, pad, ac, deterministic=True)
    for k in range(2):
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))


# IREE fixes a process's local-task worker count when it creates the driver (later devices
# of the process share it), so each worker count runs in its own process.
WORKER_COUNTS = ("local-sync", 1, 2, 3)
MASKS = [(True, True), (True, False), (False, True)]
_WORKER_CHILD = """
import sys, numpy as np
from aclnn_iree import aclnn as A
from aclnn_iree.core.api import grid_sampler_2d_backward as gsb
from aclnn_iree.runtime.device import Device
src, dst, which, specs, masks = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4]), eval(sys.argv[5])
dev = which if which == "local-sync" else Device("local-task", threads=int(which))
d = np.load(src)
go, x, grid = d["go"], d["x"], d["grid"]
res = {}
for mode, pad, ac in specs:
    for mask in masks:
        key = f"{mode}{pad}{int(ac)}_{int(mask[0])}{int(mask[1])}"
        for k, out in enumerate(gsb(go, x, grid, mode, pad, ac, mask, device=dev)):
            if out is not None:
                res[f"{key}_{k}"] = out
        status, stream = A.aclrtCreateStream(dev)
        t = [A.aclCreateTensor(a, stream=stream) for a in (go, x, grid)]
        outs = [A.aclCreateTensor(shape=a.shape, dtype=a.dtype, stream=stream) for a in (x, grid)]
        status, ws, _ = A.aclnnGridSampler2DBackwardGetWorkspaceSize(
            *t, mode, pad, ac, A.aclCreateBoolArray(list(mask)), *outs)
        assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
        res[f"{key}_ws"] = np.array(ws)
np.savez(dst, **res)
"""


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory):
    """{worker count: outputs and workspace sizes of every DETERMINISM_SPECS x mask}.
    3 x 20 channels = 9 blocks of 8 (the last of 4); many points per pixel."""
    import subprocess
    import sys
    d = tmp_path_factory.mktemp("workers")
    rng = np.random.default_rng(11)
    go, x, grid = random_case(rng, (3, 20, 9, 7, 8, 6))
    np.savez(d / "in.npz", go=go, x=x, grid=(grid * 0.5).astype(np.float32))
    runs = {}
    for which in WORKER_COUNTS:
        out = d / f"out_{which}.npz"
        subprocess.run([sys.executable, "-W", "ignore", "-c", _WORKER_CHILD, str(d / "in.npz"), str(out), str(which),
                        repr(DETERMINISM_SPECS), repr(MASKS)], check=True, timeout=600)
        runs[which] = dict(np.load(out))
    return runs


@pytest.mark.parametrize("mode,pad,ac", DETERMINISM_SPECS, ids=combo_ids(DETERMINISM_SPECS))
@pytest.mark.parametrize("mask", MASKS)
def test_same_bits_for_every_worker_count(worker_runs, mode, pad, ac, mask):
    """The CPU pass runs one workgroup per worker, each over a share of the channel blocks:
    the bits must not depend on how many workers there are (the performance issue's rule).
    1, 2 and 3 workers and the synchronous device, each in its own process."""
    key = f"{mode}{pad}{int(ac)}_{int(mask[0])}{int(mask[1])}"
    first = worker_runs[WORKER_COUNTS[0]]
    for k in range(2):
        name = f"{key}_{k}"
        if not mask[k]:
            assert all(name not in r for r in worker_runs.values())
            continue
        assert np.any(first[name] != 0) or (mode == 1 and k == 1)  # nearest: grad_grid is 0
        for which in WORKER_COUNTS[1:]:
            assert np.array_equal(worker_runs[which][name].view(np.uint32), first[name].view(np.uint32)), which


def test_one_slot_per_worker(worker_runs):
    """The workspace holds one accumulation slot per worker thread (each workgroup keeps
    one), not more: dx alone of 9 blocks, whose input (15120 B) has room for 7 slots of
    9 x 7 pixels x 8 channels (2016 B), takes 1, 2 and 3 slots on 1, 2 and 3 workers
    (IREE rounds a transient allocation up to 64 bytes); the synchronous device runs
    one workgroup at a time and gets one slot.  A nearest slot also holds the table of
    the 8 x 6 output points' pixels (8 bytes each)."""
    for which in WORKER_COUNTS:
        slots = 1 if which == "local-sync" else which
        for spec in DETERMINISM_SPECS:
            slot = 9 * 7 * 8 * 4 + (8 * 6 * 8 if spec[0] == 1 else 0)
            key = f"{spec[0]}{spec[1]}{int(spec[2])}_10_ws"
            assert int(worker_runs[which][key]) == -(-slots * slot // 64) * 64, (which, spec)


# ----------------------------------------------------------------------------------------
# Other dtypes
# ----------------------------------------------------------------------------------------
DTYPE_VARIANTS = [(0, 0, False), (2, 2, True), (1, 1, False)]
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float64": np.float64}


@pytest.mark.parametrize("mode,pad,ac", DTYPE_VARIANTS, ids=combo_ids(DTYPE_VARIANTS))
@pytest.mark.parametrize("dtname", DTYPES)
def test_other_dtypes_against_reference(dtname, mode, pad, ac, kernel_form):
    """float16 / bfloat16 compute in float32 and round once: |err| <= 2 * half an ulp of the
    stored value + the float32 bound; float64 uses the float64 bound (~1e-14 relative)."""
    dt = DTYPES[dtname]
    rng = np.random.default_rng(600 + 100 * mode + 10 * pad + ac)
    for shape in ((2, 3, 5, 7, 4, 6), (1, 64, 6, 5, 3, 4)):
        go, x, grid = random_case(rng, shape, dtype=dt)
        dx, dg = gsb(go, x, grid, mode, pad, ac)
        assert dx.dtype == np.dtype(dt) and dg.dtype == np.dtype(dt)
        go64, x64, grid64 = (a.astype(np.float64) for a in (go, x, grid))
        rdx, rdg = ref.grid_sampler_2d_backward(go64, x64, grid64, mode, pad, ac)
        if dt is np.float64:
            bdx, bdg = error_bounds(go64, x64, grid64, mode, pad, ac, EPS64)
        else:
            bdx, bdg = error_bounds(go64, x64, grid64, mode, pad, ac, EPS32)
            bdx, bdg = storage_bound(rdx, dt, bdx), storage_bound(rdg, dt, bdg)
        assert_within(dx, rdx, bdx, f"{dtname} grad_input")
        assert_within(dg, rdg, bdg, f"{dtname} grad_grid")


# ----------------------------------------------------------------------------------------
# The reference itself
# ----------------------------------------------------------------------------------------
def test_reference_grad_input_is_float64_when_nothing_is_in_bounds():
    go = np.ones((1, 1, 1, 1))
    x = np.array([10.0, 20.0]).reshape(1, 1, 1, 2)
    grid = np.array([5.0, 0.0]).reshape(1, 1, 1, 2)
    dx, dg = ref.grid_sampler_2d_backward(go, x, grid, 0, 0, False)
    assert dg.dtype == np.float64
    assert dx.dtype == np.float64


# ----------------------------------------------------------------------------------------
# Reflection far outside the image: the sign of the grid gradient
# ----------------------------------------------------------------------------------------
def _round_to(q, compute):
    """The exact Fraction `q` rounded once to nearest-even in `compute` (float32 or float64);
    None where it overflows to an infinity."""
    from fractions import Fraction
    if compute == np.float64:
        try:
            return Fraction(float(q))  # int / int true division: correctly rounded
        except OverflowError:
            return None
    if q == 0:
        return Fraction(0)
    sign, a = (-1 if q < 0 else 1), abs(Fraction(q))
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += (a >= Fraction(2) ** (e + 1)) - (a < Fraction(2) ** e)
    ulp = Fraction(2) ** (max(e, -126) - 23)
    m = a / ulp
    fl = m.numerator // m.denominator
    if m - fl > Fraction(1, 2) or (m - fl == Fraction(1, 2) and fl % 2):
        fl += 1
    return None if fl * ulp > float(np.finfo(np.float32).max) else sign * fl * ulp


def _exact_reflected_dgrid_x(g, W, ac, compute):
    """grad_grid x of one point (g, 0) on a ramp input x[.., w] = w under bilinear reflection
    padding, with grad_output 1: +-m_x (the reflection's sign) where the reflected coordinate
    lies strictly inside (0, W - 1), else 0.  Every step in exact arithmetic, rounded where
    the kernel rounds (the unnormalisation: one rounding of (g + 1) * W - 1, as a fused
    multiply-add; then the exact fmod of the reflection)."""
    from fractions import Fraction
    R = lambda q: None if q is None else _round_to(q, compute)  # noqa: E731
    a = R(Fraction(float(g)) + 1)
    if ac:
        d0, span, m = R(R(a / 2) * (W - 1)), W - 1, Fraction(W - 1, 2)
    else:
        c = R(a * W - 1)
        d0, span, m = R(c / 2 + Fraction(1, 2)) if c is not None else None, W, Fraction(W, 2)
    if d0 is None:
        return 0.0  # an infinite coordinate gets no grid gradient (docs/aclnn.md#behaviour-on-bad-input)
    sign = -1 if d0 < 0 else 1
    d = abs(d0)
    e = d % (2 * span)
    odd = e >= span
    r = (2 * span - e if odd else e) - (0 if ac else Fraction(1, 2))
    return float(sign * (-1 if odd else 1) * m) if 0 < r < W - 1 else 0.0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("ac", ACS, ids=["ac0", "ac1"])
def test_reflection_sign_far_outside_matches_an_exact_reflection_count(device, dtype, ac):
    """Bilinear, reflection, coordinates up to the dtype's range: the sign of grad_grid (the
    parity of the number of reflections) equals an exact count, point by point.  Found by
    an attack: Vulkan rounded (g + 1) * W - 1 twice (an f64 product, then f64 - 1 and f32),
    and where a * W was a tie in float32 the coordinate moved by an ulp and the count's
    parity with it (~12 % of points beyond 1e15).  The CPU was right all along.  float64 on
    Vulkan still rounds twice (docs/targets.md): expected to differ."""
    st = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}.get(dtype, np.dtype(dtype).type)
    compute = np.float64 if dtype == "float64" else np.float32
    top = {"float16": 4.8, "bfloat16": 38.3, "float32": 38.3, "float64": 300.0}[dtype]
    rng = np.random.default_rng(16)
    mags = 10.0 ** rng.uniform(0, top, 320)
    vals = mags * rng.choice([-1, 1], 320)
    if top > 17:  # the attack's cases: a * W a tie in float32
        vals = np.concatenate([[1e16, -1e16, 3.6136936e16, -1.4073212e16], vals])
    g = vals.astype(st)
    W = 7
    x = np.tile(np.arange(W), (5, 1)).reshape(1, 1, 5, W).astype(st)
    grid = np.stack([g, np.zeros_like(g)], -1).reshape(1, 1, -1, 2)
    go = np.ones((1, 1, 1, len(g)), st)
    _, dg = gsb(go, x, grid, 0, 2, ac, (False, True))
    got = dg[0, 0, :, 0].astype(np.float64)
    want = np.array([_exact_reflected_dgrid_x(v, W, ac, compute) for v in g])
    wrong = np.nonzero(got != want)[0]
    if dtype == "float64" and device == "vulkan" and not ac:  # a known limit (align_corners has no fma)
        assert len(wrong) > 0, "Vulkan float64 is exact now: update docs/targets.md"
        pytest.xfail(f"{len(wrong)} of {len(g)} points: Vulkan's fma may round twice, and float64 "
                     "has no wider type to emulate it in")
    assert len(wrong) == 0, (f"{len(wrong)} of {len(g)} points differ, e.g. "
                             + ", ".join(f"g={float(g[i])!r}: {got[i]} != {want[i]}" for i in wrong[:5]))
    assert np.count_nonzero(want) > len(g) // 8  # not vacuous (coarse bf16 values often land on a border)


# ----------------------------------------------------------------------------------------
# grad_grid alone: the point-parallel pass and the slot pass give the same bits
# ----------------------------------------------------------------------------------------
POINT_PASS_CASES = ([(m, p, ac, "float32") for m in (0, 2) for p in PADS for ac in ACS]
                    + [(m, p, ac, "float64") for m in (0, 2) for p in PADS for ac in ACS]
                    + [(0, 2, False, "float16"), (2, 1, True, "bfloat16")])


def _choose(monkeypatch, specs, name, value):
    """Sets the specs constant `name` that picks a call's function, and drops the executors
    the Pythonic layer keeps per call signature (each holds the function picked before)."""
    from aclnn_iree.runtime import kernels
    monkeypatch.setattr(specs, name, value)
    monkeypatch.setattr(kernels, "generation", kernels.generation + 1)


def _point_pass_cases(mode, pad, ac, dtype):
    """(grad_output, input, grid) cases in `dtype` for the point-parallel pass: random grids
    of 1-17 channels, warps (vector loads of consecutive taps), rows longer than its chunk
    and an input past its streaming threshold; each grid's first points far out, NaN and a
    corner."""
    st = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}.get(dtype, np.dtype(dtype).type)
    rng = np.random.default_rng(40 + mode + 3 * pad + 7 * ac)
    cases = [random_case(rng, (2, C, 6, 7, 5, 9), np.float64, -1.3, 1.3) for C in (1, 3, 4, 6, 8, 9, 17)]
    # a warp: lanes of 8 points reading consecutive pixels of a row take vector loads there
    cases += [_warp_case(rng, (2, C, 7, 26, 6, 21), ac) for C in (1, 3, 8, 11)]
    # output rows longer than dgrid_points' chunk (256 points), with a partial last group, an
    # input just under its 2097152 elements (the blocks inside each group) and one over them,
    # where it walks the channel blocks outside the points
    cases += [_warp_case(rng, (1, 11, 4, 310, 3, 300), ac), random_case(rng, (1, 9, 5, 30, 2, 263), np.float64, -1.3, 1.3),
              _warp_case(rng, (1, 3, 800, 870, 3, 300), ac), _warp_case(rng, (1, 11, 440, 440, 3, 300), ac)]
    for go, x, grid in cases:
        go, x, grid = (a.astype(st) for a in (go, x, grid))
        grid[0, 0, :3] = [[6e4, -2.5], [np.nan, 0.5], [-1.0, 1.0]]  # far out (fits f16), NaN, a corner
        yield go, x, grid


def _warp_case(rng, shape, ac):
    """(grad_output, input, grid) whose grid samples each row at x + 0.37 px and y + 0.21 px
    (pixel coordinates, `ac`'s convention) over the first 13 columns, then in steps of 1.25
    px: runs of consecutive pixels of one row (one vector load per tap), then gathers."""
    N, C, H, W, Ho, Wo = shape
    j = np.arange(Wo, dtype=np.float64)
    xs = (j + 0.37 + 0.25 * (j > 12) * j)[None, :]
    ys = np.arange(Ho, dtype=np.float64)[:, None] + 0.21 + 0 * xs
    xs = np.broadcast_to(xs, ys.shape)
    if ac:
        gx, gy = 2 * xs / (W - 1) - 1, 2 * ys / (H - 1) - 1
    else:
        gx, gy = (2 * xs + 1) / W - 1, (2 * ys + 1) / H - 1
    grid = np.broadcast_to(np.stack([gx, gy], -1), (N, Ho, Wo, 2)).copy()
    return rng.standard_normal((N, C, Ho, Wo)), rng.standard_normal((N, C, H, W)), grid


@pytest.mark.parametrize("mode,pad,ac,dtype", POINT_PASS_CASES,
                         ids=[f"{MODE_NAMES[m]}-{PAD_NAMES[p]}-ac{int(ac)}-{dt}" for m, p, ac, dt in POINT_PASS_CASES])
def test_dgrid_point_pass_has_the_slot_pass_bits(device, monkeypatch, mode, pad, ac, dtype):
    """CPUs compute grad_grid alone with few channels or few elements (bilinear) in the point-parallel pass,
    dgrid_points (a point per lane, no workspace), and otherwise in the slot pass; the same block order, the same channel
    order, the same roundings: the same bits, also as the two-output call's grad_grid."""
    if is_gpu(device):
        pytest.skip("the point-parallel pass is the CPU's")
    from aclnn_iree.compiler import specs
    for go, x, grid in _point_pass_cases(mode, pad, ac, dtype):
        C = x.shape[1]
        outs = {}
        for limit, path in ((0, "slots"), (10 ** 6, "points")):
            _choose(monkeypatch, specs, "DGRID_POINTS_MAX_CHANNELS", limit)
            _choose(monkeypatch, specs, "DGRID_POINTS_MAX_ELEMENTS", {} if limit == 0 else {"bilinear": 1 << 62})
            outs[path] = gsb(go, x, grid, mode, pad, ac, (False, True))[1]
        both = gsb(go, x, grid, mode, pad, ac, (True, True))[1]
        for a in (outs["points"], both):
            assert a.tobytes() == outs["slots"].tobytes(), (C, np.abs(a.astype(np.float64) - outs["slots"]).max())


@pytest.mark.parametrize("mode,pad,ac,dtype", POINT_PASS_CASES,
                         ids=[f"{MODE_NAMES[m]}-{PAD_NAMES[p]}-ac{int(ac)}-{dt}" for m, p, ac, dt in POINT_PASS_CASES])
def test_split_two_output_call_has_the_fused_bits(device, monkeypatch, mode, pad, ac, dtype):
    """Both gradients on CPUs with SPLIT_POINTS_CHANNELS channels: dx by the block pass alone and
    grad_grid point-parallel (`<kernel>_points`); every channel count either way: the bits of the
    fused pass, in both outputs."""
    if is_gpu(device):
        pytest.skip("the point-parallel pass is the CPU's")
    from aclnn_iree.compiler import specs
    for go, x, grid in _point_pass_cases(mode, pad, ac, dtype):
        outs = {}
        for channels, path in ((range(0), "fused"), (range(10 ** 6), "split")):
            _choose(monkeypatch, specs, "SPLIT_POINTS_CHANNELS", channels)
            outs[path] = gsb(go, x, grid, mode, pad, ac, (True, True))
        for k, name in enumerate(("dx", "dgrid")):
            a, b = outs["split"][k], outs["fused"][k]
            assert a.tobytes() == b.tobytes(), (x.shape, name, np.abs(a.astype(np.float64) - b).max())
