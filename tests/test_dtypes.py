"""float16 / bfloat16 / float64 accuracy of both ops (the half-precision rule:
docs/semantics.md#half-precision-accumulates-in-float32).

Every dtype is compared with the float64 reference (aclnn_iree.ops.reference) run on
the *same, already rounded* inputs: the low-precision arrays are converted to
float64 for the reference, so only the op's own arithmetic is measured.

The error bound for float16 / bfloat16 (derived, not tuned)
------------------------------------------------------------
The half-precision rule: compute and accumulate in float32 (grid coordinates, weights,
the dgrid sums over C, the dx scatter sums), round once when storing.  Widening
float16/bfloat16 to float32 is exact, so an output element is a float32
evaluation y32 of  y = sum_i t_i  (n terms) followed by one rounding to the
storage dtype.  For every element:

    |stored - ref| <= BOUND_FACTOR * max(eps_d/2 * |ref|, tiny_d/2)      (1)
                      + gamma(n + K_TERM) * S                             (2)
                      + A                                                 (3)

(1) the final rounding: half an ulp of the stored value is at most
    eps_d/2 * |value| (eps_d = 2**-10 for float16, 2**-7 for bfloat16), with a
    floor of half the spacing of the smallest normal (= the smallest
    subnormal, tiny_d) for tiny values.  BOUND_FACTOR = 2: one half-ulp for the
    rounding itself plus one of slack for measuring the half-ulp at |ref|
    rather than at |y32| (they can straddle a binade boundary) and for the
    float32 error moving y32 across a rounding midpoint.
(2) the float32 evaluation (Higham, "Accuracy and Stability of Numerical
    Algorithms", eq. 3.5 / lemma 3.1): any summation order of n terms, each
    term carrying at most K_TERM further roundings (weight products, times
    grad_output, times input, times the unnormalise multiplier), is within
    gamma(n + K_TERM) * sum_i |t_i|, gamma(k) = k*eps32/(1 - k*eps32) with
    eps32 = 2**-23 (twice the unit roundoff, so already a safe over-estimate).
    S = sum_i |t_i| is computed by running the reference's own tap
    computation (reference._taps for the grid sampler, the reference forward
    on unit vectors for the upsample interpolation matrices) with |grad_output|,
    |input| and |weights|; n is the exact number of terms summed into that
    element (taps that land on it, times C for dgrid).
    The weights are not exact inputs but are themselves computed in float32
    from float32 coordinates, which gives an *absolute* weight error alpha:
    a term w_i * g_i is then off by alpha * |g_i| before any rounding, so
    (3) A = sum_i alpha * |g_i| (times |input| and the multiplier for dgrid)
    is added to the bound as it is (it is not a rounding of the sum, so it is
    not scaled by gamma; the roundings of the terms stay in (2)):
      * coordinate error delta <= 8 * u32 * (max|coordinate| + 2), u32 = 2**-24:
        unnormalise is 3 roundings ((x+1), *size, -1; /2 is exact),
        reflection adds at most 4 ((+0.5), floor(d/span)*span, d - that, -0.5);
        the upsample source index r*(dst+0.5)-0.5 with r = fl(in/out) has 3,
        bounded the same way by 4 * u32 * (in + 1);
      * bilinear: w = wx*wy with wx, wy in [0, 1] -> alpha_w = 2*delta;
        dgrid weights are +-wx / +-wy -> alpha_dw = delta;
      * nearest: w = 1 exactly, alpha = 0 (the pixel choice rint(ix) agrees
        because the test coordinates are exact in float32 or far from ties);
      * bicubic (A = -0.75): |c'(t)| <= 1.35, |c''(t)| <= 4.5, |c| <= 1, and
        the Horner evaluation of c and c' has an absolute error <= 32*u32
        (sum of the intermediate magnitudes < 32), so
        |d(cx*cy)| <= 2*(1.35*delta + 32*u32)       -> alpha_w = 3*delta + 72*u32,
        |d(cx'*cy)| <= 4.5*delta + 32*u32 + 1.35*(1.35*delta + 32*u32)
                                                    -> alpha_dw = 7*delta + 80*u32;
      * upsample: w = lambda_h * lambda_w in [0, 1] -> alpha = delta_h + delta_w,
        counted on every tap a float32 index could reach (the support of the
        interpolation matrix dilated by one pixel).
    The grid sampler's border/reflection gradient factors and the nearest
    rounding are discontinuous only at exact coordinates (borders, .5 ties);
    the test coordinates there are exactly representable, so float32 and
    float64 take the same branch.
Where |ref| is beyond the storage dtype's overflow threshold (float16: 65520)
by more than (2), the stored value must be +-inf with the reference's sign;
where it is below by more than (2) it must be finite and within the bound.

float64 must agree with the reference to F64_RTOL = 1e-12 relative to the
largest |ref| of that output.

PyTorch 2.13 CPU
----------------
torch.ops.aten.upsample_bilinear2d_backward supports float16 and bfloat16 on
CPU (accumulating in float).  grid_sampler_2d_backward does too in 2.13
(docs/semantics.md#pytorch-half-precision-kernels; an older reading said float32/float64 only, see
test_pytorch_cpu_supports_half_grid_sampler); it computes in the storage dtype,
and for inputs of about 200 x 200 and larger it writes out of bounds (heap
corruption), so it is not run there (TORCH_HALF_GRID_MAX_SIDE).
Our max error must be no larger than PyTorch's on the same rounded inputs,
case by case; `dtype_error_report` builds that comparison (reusable by a
benchmark) and `format_error_table` prints it (run with -s).
"""
from __future__ import annotations

import dataclasses
import itertools

import ml_dtypes
import numpy as np
import pytest

from aclnn_iree import aclnn as A
from aclnn_iree.core import api
from conftest import on_device
from aclnn_iree.ops import reference as ref
from aclnn_iree.core.errors import ACLNN_ERR_PARAM_INVALID, AclnnError


@pytest.fixture(autouse=True)
def _on_device(device, monkeypatch):
    """Every test of this module runs on each device of conftest.DEVICES."""
    gsb, usb = on_device(device)
    monkeypatch.setattr(api, "grid_sampler_2d_backward", gsb)
    monkeypatch.setattr(api, "upsample_bilinear2d_backward", usb)

try:
    import torch
except ImportError:  # the accuracy bounds are still checked without PyTorch
    torch = None

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
HALF_DTYPES = (F16, BF16)

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23
U32 = EPS32 / 2  # unit roundoff of float32
BOUND_FACTOR = 2  # half-ulp multiples allowed for the final rounding, see the module docstring
K_TERM = 8  # roundings inside one term (weights, products, multiplier), see (2)
F64_RTOL = 1e-12

MODES = (ref.INTERP_BILINEAR, ref.INTERP_NEAREST, ref.INTERP_BICUBIC)
PADS = (ref.PAD_ZEROS, ref.PAD_BORDER, ref.PAD_REFLECTION)
MODE_NAMES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
PAD_NAMES = {0: "zeros", 1: "border", 2: "reflection"}


def _name(dtype) -> str:
    return np.dtype(dtype).name


def _torch_dtype(dtype):
    return {F16: torch.float16, BF16: torch.bfloat16, F32: torch.float32, F64: torch.float64}[np.dtype(dtype)]


def _to_torch(a: np.ndarray, dtype):
    # Widening to float32 is exact for float16/bfloat16, so torch sees the same values.
    return torch.from_numpy(np.ascontiguousarray(a.astype(np.float32 if dtype != F64 else np.float64))).to(
        _torch_dtype(dtype))


# ----------------------------------------------------------------------------- the bound
def gamma(n):
    """gamma(n) = n*eps32 / (1 - n*eps32), elementwise."""
    n = np.asarray(n, dtype=np.float64)
    return n * EPS32 / (1.0 - n * EPS32)


def overflow_threshold(dtype) -> float:
    """The smallest |y| that rounds to inf in `dtype` (max + half an ulp of max)."""
    fi = ml_dtypes.finfo(dtype)
    top = 2.0 ** (int(fi.maxexp) - 1)  # the binade of max
    return float(fi.max) + float(fi.eps) * top / 2


def error_bound(ref_out, S, n, A, dtype):
    """Per-element bound (1) + (2) + (3) of the module docstring, and the float32 part (2) + (3) alone."""
    fi = ml_dtypes.finfo(dtype)
    half_ulp = np.maximum(float(fi.eps) / 2 * np.abs(ref_out), float(fi.smallest_subnormal) / 2)
    e32 = gamma(np.asarray(n) + K_TERM) * S + A
    return BOUND_FACTOR * half_ulp + e32, e32


def _classify(ref_out, e32, dtype):
    """(must_be_finite, must_be_inf) masks from the overflow threshold of `dtype`."""
    thr = overflow_threshold(dtype)
    a = np.abs(ref_out)
    return a + e32 < thr, a - e32 >= thr


def check_half(out, ref_out, S, n, A, dtype, what=""):
    """Asserts the float16/bfloat16 bound elementwise; returns max(error / bound) over finite elements."""
    assert out.dtype == np.dtype(dtype), f"{what}: result dtype {out.dtype}, expected {_name(dtype)}"
    assert out.shape == ref_out.shape, f"{what}: shape {out.shape} != {ref_out.shape}"
    o = out.astype(np.float64)
    bound, e32 = error_bound(ref_out, S, n, A, dtype)
    fin, inf = _classify(ref_out, e32, dtype)
    if inf.any():
        bad = ~(np.isinf(o) & (np.sign(o) == np.sign(ref_out))) & inf
        assert not bad.any(), (f"{what}: {int(bad.sum())} elements beyond the {_name(dtype)} range are not "
                               f"+-inf, e.g. ref {ref_out[bad][:3]} -> {o[bad][:3]}")
    if not fin.any():
        return 0.0
    err = np.where(fin, np.abs(o - ref_out), 0.0)
    assert np.all(np.isfinite(o[fin])), f"{what}: non-finite values where the reference is finite"
    ratio = np.where(fin, err / bound, 0.0)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    assert ratio[worst] <= 1.0, (
        f"{what}: error {err[worst]:.6g} exceeds the bound {bound[worst]:.6g} at {worst} "
        f"(ours {o[worst]!r}, ref {ref_out[worst]!r}, n={np.broadcast_to(n, ref_out.shape)[worst]}, "
        f"S={S[worst]:.6g}); max error {err.max():.6g}")
    return float(ratio[worst])


def check_f64(out, ref_out, what=""):
    assert out.dtype == F64 and out.shape == ref_out.shape, what
    scale = float(np.max(np.abs(ref_out), initial=0.0))
    err = float(np.max(np.abs(out - ref_out), initial=0.0))
    assert err <= F64_RTOL * scale, f"{what}: float64 max error {err:.3g} > {F64_RTOL:g} * max|ref| {scale:.3g}"


# ----------------------------------------------------------------------------- grid sampler cases
# PyTorch 2.13 CPU grid_sampler_2d_backward in float16/bfloat16 corrupts the heap (writes out of
# bounds) for inputs of about 200 x 200 and larger (150 x 150 is clean; sentinel arrays allocated
# around the call get overwritten and the process later segfaults).  It is not called there.
TORCH_HALF_GRID_MAX_SIDE = 150


class TorchUnsafe(Exception):
    """PyTorch would be memory-unsafe on this case; no comparison."""


def _grid_alphas(mode, delta):
    """(alpha_w, alpha_dw): absolute errors of the float32 dx and dgrid weights (module docstring)."""
    if mode == ref.INTERP_BILINEAR:
        return 2 * delta, delta
    if mode == ref.INTERP_NEAREST:
        return 0.0, 0.0
    return 3 * delta + 72 * U32, 7 * delta + 80 * U32


def grid_abs_sums(go, x, grid, mode, pad, ac):
    """S, n and A of every dx and dgrid element: the reference taps run with |go|, |x| and
    |weights| (S), their count (n), and with the weight errors alpha instead of |weights| (A).

    Returns {"dx": (S, n, A), "dgrid": (S, n, A)} with float64 arrays shaped like the outputs.
    """
    go, x, grid = (np.asarray(a, np.float64) for a in (go, x, grid))
    N, C, H, W = x.shape
    Ho, Wo = grid.shape[1:3]
    taps, mx, my = ref._taps(grid, H, W, mode, pad, ac)
    finite = np.isfinite(grid)
    cmax = (float(np.max(np.abs(grid[finite]), initial=0.0)) + 1) * max(H, W) / 2 + 1
    delta = 8 * U32 * (cmax + 2)
    alpha_w, alpha_dw = _grid_alphas(mode, delta)
    ago = np.abs(go).transpose(0, 2, 3, 1)  # (N, Ho, Wo, C)
    ax = np.abs(x).transpose(0, 2, 3, 1)  # (N, H, W, C)
    nb = np.broadcast_to(np.arange(N).reshape(N, 1, 1), (N, Ho, Wo))
    s_dx = np.zeros((N, H, W, C))
    a_dx = np.zeros((N, H, W, C))
    n_dx = np.zeros((N, H, W))
    s_dg = np.zeros((N, Ho, Wo, 2))
    a_dg = np.zeros((N, Ho, Wo, 2))
    n_dg = np.zeros((N, Ho, Wo))
    for yi, xi, valid, w, dwx, dwy in taps:
        idx = (nb[valid], yi[valid], xi[valid])
        np.add.at(s_dx, idx, np.abs(w[valid])[:, None] * ago[valid])
        np.add.at(a_dx, idx, alpha_w * ago[valid])
        np.add.at(n_dx, idx, 1.0)
        vg = np.where(valid, np.einsum("nhwc,nhwc->nhw", ax[nb, yi, xi], ago), 0.0)
        s_dg[..., 0] += np.abs(dwx) * vg
        s_dg[..., 1] += np.abs(dwy) * vg
        a_dg += alpha_dw * vg[..., None]
        n_dg += valid
    for d, m in ((0, mx), (1, my)):
        s_dg[..., d] *= np.abs(m)
        a_dg[..., d] *= np.abs(m)
    return {"dx": (s_dx.transpose(0, 3, 1, 2), n_dx[:, None], a_dx.transpose(0, 3, 1, 2)),
            "dgrid": (s_dg, (n_dg * C)[..., None], a_dg)}


@dataclasses.dataclass
class GridCase:
    """One grid_sampler_2d_backward input set in float64; `inputs(dtype)` rounds it."""

    name: str
    go: np.ndarray
    x: np.ndarray
    grid: np.ndarray
    mode: int
    pad: int
    ac: bool

    op = "grid_sampler_2d_backward"
    outputs = ("dx", "dgrid")

    @property
    def label(self):
        return f"{MODE_NAMES[self.mode]}/{PAD_NAMES[self.pad]}/ac{int(self.ac)}/{self.name}"

    def inputs(self, dtype):
        return tuple(a.astype(dtype) for a in (self.go, self.x, self.grid))

    def ours(self, dtype):
        dx, dg = api.grid_sampler_2d_backward(*self.inputs(dtype), self.mode, self.pad, self.ac)
        return {"dx": dx, "dgrid": dg}

    def reference(self, dtype):
        dx, dg = ref.grid_sampler_2d_backward(*(a.astype(np.float64) for a in self.inputs(dtype)),
                                              self.mode, self.pad, self.ac)
        return {"dx": dx, "dgrid": dg}

    def torch(self, dtype):
        if dtype in HALF_DTYPES and max(self.x.shape[2:]) > TORCH_HALF_GRID_MAX_SIDE:
            raise TorchUnsafe("skipped: torch half grid sampler writes out of bounds at this size")
        go, x, g = (_to_torch(a, dtype) for a in self.inputs(dtype))
        dx, dg = torch.ops.aten.grid_sampler_2d_backward(go, x, g, self.mode, self.pad, self.ac, [True, True])
        return {"dx": dx.double().numpy(), "dgrid": dg.double().numpy()}

    def abs_sums(self, dtype):
        return grid_abs_sums(*(a.astype(np.float64) for a in self.inputs(dtype)), self.mode, self.pad, self.ac)


def _special_coords(size, ac):
    """Pixel centres, pixel edges (nearest ties), -1, 0, +1 and points outside; exact in bfloat16
    for the power-of-two shapes used below."""
    k = np.arange(size + 1, dtype=np.float64)
    if ac:
        centres = -1 + 2 * k[:size] / (size - 1)
        edges = -1 + (2 * k[:size - 1] + 1) / (size - 1)
    else:
        centres = (2 * k[:size] + 1) / size - 1
        edges = 2 * k / size - 1
    return np.concatenate([[-1.0, 0.0, 1.0, -1.25, 1.25, -1.5, 1.5, -2.0], centres, edges])


GRID_SHAPE = (2, 5, 6, 7, 5, 4)  # N, C, H, W, Ho, Wo: random and large-magnitude inputs
# Structured inputs use power-of-two friendly shapes so that centres, edges and borders are exact.
GRID_STRUCT_SHAPE = {False: (2, 5, 4, 8, 5, 6), True: (2, 5, 5, 9, 5, 6)}


def grid_case(mode, pad, ac, kind) -> GridCase:
    seed = 1000 + 100 * mode + 10 * pad + int(ac) + {"random": 0, "structured": 3, "large": 7}[kind]
    rng = np.random.default_rng(seed)
    if kind == "structured":
        N, C, H, W, Ho, Wo = GRID_STRUCT_SHAPE[ac]
        sx, sy = _special_coords(W, ac), _special_coords(H, ac)
        m = N * Ho * Wo
        grid = np.stack([sx[np.arange(m) % len(sx)], sy[(3 * np.arange(m) + 1) % len(sy)]], -1)
        grid = grid.reshape(N, Ho, Wo, 2)
        go = (((np.arange(N * C * Ho * Wo) % 7) - 3) * 0.5).reshape(N, C, Ho, Wo)
        go[0, 0, 0, 0] = 8.0
        x = (((np.arange(N * C * H * W) % 11) - 5) * 0.25).reshape(N, C, H, W)
        x[..., 0, :] = 0.0  # a zero row: a single 1 in zeros-like patterns near a border
        x[0, 0, H // 2, W // 2] = 1.0
        return GridCase(kind, go, x, grid, mode, pad, ac)
    N, C, H, W, Ho, Wo = GRID_SHAPE
    grid = rng.uniform(-1.2, 1.2, size=(N, Ho, Wo, 2))
    if kind == "large":
        go = rng.uniform(-1000, 1000, size=(N, C, Ho, Wo))
        x = rng.uniform(-1000, 1000, size=(N, C, H, W))
    else:
        go = rng.standard_normal((N, C, Ho, Wo))
        x = rng.standard_normal((N, C, H, W))
    return GridCase(kind, go, x, grid, mode, pad, ac)


def big_grid_case(mode, pad, ac) -> GridCase:
    """H = W = 300: a float16 coordinate (spacing 0.25 above 256) would be wrong, a float32 one is right."""
    rng = np.random.default_rng(300 + 10 * pad + int(ac))
    N, C, H, W, Ho, Wo = 1, 2, 300, 300, 16, 16
    grid = rng.uniform(-1.2, 1.2, size=(N, Ho, Wo, 2))
    go = rng.uniform(-1000, 1000, size=(N, C, Ho, Wo))
    x = rng.uniform(-1000, 1000, size=(N, C, H, W))
    return GridCase("300x300", go, x, grid, mode, pad, ac)


# ----------------------------------------------------------------------------- upsample cases
def _axis_matrix(in_size, out_size, ac):
    """The reference's (out, in) interpolation matrix of one axis: the one its forward applies
    (building it from the forward on unit vectors costs out x in x in, minutes for 4000-wide rows)."""
    return ref._linear_axis_matrix(in_size, out_size, ac, None)


def _dilated_support(Amat):
    """Every (out, in) pair a float32 source index could reach: the support dilated by one input pixel."""
    b = Amat != 0
    d = b.copy()
    d[:, 1:] |= b[:, :-1]
    d[:, :-1] |= b[:, 1:]
    return d.astype(np.float64)


@dataclasses.dataclass
class UpsampleCase:
    """One upsample_bilinear2d_backward input set (grad_output NCHW float64) and its layout."""

    name: str
    go: np.ndarray
    input_hw: tuple
    ac: bool
    layout: str = "NCHW"

    op = "upsample_bilinear2d_backward"
    outputs = ("dx",)

    @property
    def label(self):
        N, C, Ho, Wo = self.go.shape
        return f"{self.layout}/ac{int(self.ac)}/fwd {self.input_hw[0]}x{self.input_hw[1]}->{Ho}x{Wo}/{self.name}"

    @property
    def sizes(self):
        N, C, Ho, Wo = self.go.shape
        return (Ho, Wo), (N, C) + tuple(self.input_hw)

    def inputs(self, dtype):
        return (self.go.astype(dtype),)

    def ours(self, dtype):
        (go,) = self.inputs(dtype)
        osz, isz = self.sizes
        if self.layout == "NHWC":
            N, C, H, W = isz
            out = api.upsample_bilinear2d_backward(go.transpose(0, 2, 3, 1), osz, (N, H, W, C), self.ac,
                                                   memory_format="NHWC")
            assert out.shape == (N, H, W, C)
            return {"dx": out.transpose(0, 3, 1, 2)}
        return {"dx": api.upsample_bilinear2d_backward(go, osz, isz, self.ac)}

    def reference(self, dtype):
        (go,) = self.inputs(dtype)
        osz, isz = self.sizes
        return {"dx": ref.upsample_bilinear2d_backward(go.astype(np.float64), osz, isz, self.ac)}

    def torch(self, dtype):
        (go,) = self.inputs(dtype)
        osz, isz = self.sizes
        if self.layout == "NHWC":  # a channels_last tensor: PyTorch's NHWC kernel
            t = _to_torch(go.transpose(0, 2, 3, 1), dtype).permute(0, 3, 1, 2)
        else:
            t = _to_torch(go, dtype)
        out = torch.ops.aten.upsample_bilinear2d_backward(t, list(osz), list(isz), self.ac, None, None)
        return {"dx": out.double().numpy()}

    def matrices(self):
        (Ho, Wo), (_, _, H, W) = self.sizes
        return _axis_matrix(H, Ho, self.ac), _axis_matrix(W, Wo, self.ac)

    def abs_sums(self, dtype):
        (go,) = self.inputs(dtype)
        ag = np.abs(go.astype(np.float64))
        osz, isz = self.sizes
        H, W = isz[2:]
        Ah, Aw = self.matrices()
        Mh, Mw = _dilated_support(Ah), _dilated_support(Aw)
        delta_h, delta_w = 4 * U32 * (H + 1), 4 * U32 * (W + 1)
        S = ref.upsample_bilinear2d_backward(ag, osz, isz, self.ac)
        A = (delta_h + delta_w) * np.einsum("oh,ncop,pw->nchw", Mh, ag, Mw, optimize=True)
        n = Mh.sum(0)[:, None] * Mw.sum(0)[None, :]
        return {"dx": (S, n, A)}


UPSAMPLE_SIZES = {  # direction -> kind -> (input_hw, output_hw)
    "up": {"random": ((5, 6), (9, 13)), "structured": ((4, 5), (8, 10))},
    "down": {"random": ((9, 11), (4, 5)), "structured": ((8, 10), (4, 5))},
}


def upsample_case(direction, kind, ac, layout) -> UpsampleCase:
    (ih, iw), (oh, ow) = UPSAMPLE_SIZES[direction][kind]
    N, C = 2, 3
    rng = np.random.default_rng(77 + 10 * (direction == "up") + 2 * ac + (layout == "NHWC"))
    if kind == "structured":
        go = (((np.arange(N * C * oh * ow) % 9) - 4) * 0.5).reshape(N, C, oh, ow)
        go[0, 0] = 0.0
        go[0, 0, oh // 2, ow // 2] = 1.0  # a single 1 in zeros
        go[1, 2, -1, -1] = 8.0  # the last row/column (h1p = w1p = 0)
    else:
        go = rng.standard_normal((N, C, oh, ow))
    return UpsampleCase(f"{direction}-{kind}", go, (ih, iw), ac, layout)


def many_contributions_case(ac, layout, pattern="positive") -> UpsampleCase:
    """H 1000 -> 10, W 8 -> 4: up to ~200 x 4 contributions per grad_input pixel.

    pattern "positive": grad_output uniform in [150, 250], so every pixel's sum is ~4e4, near the
    top of float16's range (ulp 32) while most terms are far smaller: accumulating in the storage
    dtype rounds most of them away; "random": uniform in [-1000, 1000].
    """
    rng = np.random.default_rng(5 + 2 * ac + (layout == "NHWC") + 10 * (pattern == "random"))
    N, C, Ho, Wo = 1, 2, 1000, 8
    if pattern == "positive":
        go = rng.uniform(150, 250, size=(N, C, Ho, Wo))
    else:
        go = rng.uniform(-1000, 1000, size=(N, C, Ho, Wo))
    return UpsampleCase(f"many-{pattern}", go, (10, 4), ac, layout)


# ----------------------------------------------------------------------------- the report
def _torch_outputs(case, dtype):
    """PyTorch's outputs, or (None, reason) when PyTorch is absent or does not support the dtype."""
    if torch is None:
        return None, "torch not installed"
    try:
        return case.torch(dtype), ""
    except (RuntimeError, NotImplementedError, TorchUnsafe) as e:  # "... not implemented for 'Half'"
        return None, str(e).splitlines()[0][:80]


def dtype_error_report(cases, dtypes=HALF_DTYPES, *, with_torch=True) -> list[dict]:
    """Max abs error of ours and of PyTorch CPU against the float64 reference, per case, dtype and output.

    Each case provides op, label, outputs, ours(dtype), torch(dtype), reference(dtype) and
    abs_sums(dtype) (GridCase, UpsampleCase).  All three are computed from the same rounded
    inputs.  Elements that overflow the storage dtype (|ref| beyond the threshold, up to the
    float32 bound) are left out of both maxima and counted in "overflow".
    Returns one dict per (case, dtype, output) with keys: op, case, dtype, output, max_ref,
    ours, torch (None if unavailable), torch_note, bound_ratio (ours' max error / bound,
    None for float64), overflow.
    """
    rows = []
    for case in cases:
        for dtype in dtypes:
            dtype = np.dtype(dtype)
            ours, refs = case.ours(dtype), case.reference(dtype)
            theirs, note = _torch_outputs(case, dtype) if with_torch else (None, "not requested")
            sums = case.abs_sums(dtype) if dtype != F64 else None
            for out in case.outputs:
                r = refs[out]
                if sums is not None:
                    S, n, A = sums[out]
                    bound, e32 = error_bound(r, S, n, A, dtype)
                    keep, _ = _classify(r, e32, dtype)
                else:
                    bound, keep = None, np.ones(r.shape, bool)

                def max_err(a):
                    d = np.abs(a.astype(np.float64) - r)
                    d[np.isnan(d)] = np.inf  # a NaN where the reference is finite is an infinite error
                    return float(np.max(np.where(keep, d, 0.0), initial=0.0))

                o = ours[out].astype(np.float64)
                rows.append(dict(
                    op=case.op, case=case.label, dtype=dtype.name, output=out,
                    max_ref=float(np.max(np.abs(np.where(keep, r, 0.0)), initial=0.0)),
                    ours=max_err(o),
                    torch=None if theirs is None else max_err(theirs[out]),
                    torch_note=note,
                    bound_ratio=None if bound is None else float(np.max(
                        np.where(keep, np.abs(o - r) / bound, 0.0), initial=0.0)),
                    overflow=int((~keep).sum()),
                ))
    return rows


def format_error_table(rows) -> str:
    """A fixed-width table of dtype_error_report rows."""
    head = f"{'op':<9} {'case':<44} {'dtype':<8} {'out':<5} {'max|ref|':>9} {'ours':>10} {'torch':>10} " \
           f"{'torch/ours':>10} {'err/bound':>9} {'ovf':>4}"
    lines = [head, "-" * len(head)]
    for r in rows:
        t = "n/a" if r["torch"] is None else f"{r['torch']:.3g}"
        if r["torch"] is None:
            ratio = "n/a"
        elif r["ours"] == r["torch"]:
            ratio = "1"
        else:
            ratio = "inf" if r["ours"] == 0 else f"{r['torch'] / r['ours']:.3g}"
        b = "" if r["bound_ratio"] is None else f"{r['bound_ratio']:.3f}"
        op = "grid" if r["op"].startswith("grid") else "upsample"
        lines.append(f"{op:<9} {r['case']:<44} {r['dtype']:<8} {r['output']:<5} {r['max_ref']:>9.3g} "
                     f"{r['ours']:>10.3g} {t:>10} {ratio:>10} {b:>9} {r['overflow']:>4}")
    return "\n".join(lines)


def check_case(case, dtype):
    """Runs one case in one dtype and checks every output against the reference."""
    dtype = np.dtype(dtype)
    ours, refs = case.ours(dtype), case.reference(dtype)
    if dtype == F64:
        for out in case.outputs:
            check_f64(ours[out], refs[out], f"{case.label} {out}")
        return {}
    sums = case.abs_sums(dtype)
    return {out: check_half(ours[out], refs[out], *sums[out], dtype, f"{case.label} {dtype.name} {out}")
            for out in case.outputs}


# ============================================================================= tests
GRID_VARIANTS = list(itertools.product(MODES, PADS, (False, True)))


def _grid_id(v):
    m, p, ac = v
    return f"{MODE_NAMES[m]}-{PAD_NAMES[p]}-ac{int(ac)}"


@pytest.mark.parametrize("kind", ["random", "structured", "large"])
@pytest.mark.parametrize("dtype", [F16, BF16, F64], ids=_name)
@pytest.mark.parametrize("variant", GRID_VARIANTS, ids=_grid_id)
def test_grid_sampler_dtype_accuracy(variant, dtype, kind, kernel_form):
    """All 3 modes x 3 paddings x 2 align_corners; float16/bfloat16 within the derived bound,
    float64 to 1e-12 relative.  'large' (+-1000 in grad_output and input) overflows dgrid in
    float16: those elements must be +-inf."""
    check_case(grid_case(*variant, kind), dtype)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=_name)
@pytest.mark.parametrize("pad,ac", [(ref.PAD_ZEROS, False), (ref.PAD_BORDER, True)])
def test_grid_sampler_half_coordinates_need_float32(pad, ac, dtype):
    """H = W = 300: unnormalising in the storage dtype would misplace the samples by up to an ulp of
    ~300 (float16: 0.25, bfloat16: 2); the float32 coordinates of the kernel are right.

    The would-be half-precision kernel is emulated exactly: the reference is run on a grid whose
    float64 unnormalised coordinate equals the one computed step by step in the storage dtype.
    Its dx violates the bound, ours does not."""
    case = big_grid_case(ref.INTERP_BILINEAR, pad, ac)
    check_case(case, dtype)

    go, x, grid = (a.astype(np.float64) for a in case.inputs(dtype))
    H, W = x.shape[2:]

    def unnormalise_in(dt, g, size):
        """((g + 1) * size - 1) / 2, or (g + 1) / 2 * (size - 1), rounding every step to dt."""
        c = lambda v: np.array(v, dt)  # noqa: E731
        a = (g.astype(dt) + c(1)).astype(dt)
        if ac:
            return ((a / c(2)).astype(dt) * c(size - 1)).astype(dt).astype(np.float64)
        b = (a * c(size)).astype(dt)
        return ((b - c(1)).astype(dt) / c(2)).astype(dt).astype(np.float64)

    def normalise(ix, size):  # the float64 grid value whose unnormalised coordinate is ix
        return 2 * ix / (size - 1) - 1 if ac else (2 * ix + 1) / size - 1

    ix_h = unnormalise_in(dtype, grid[..., 0], W)
    iy_h = unnormalise_in(dtype, grid[..., 1], H)
    ix_true = (grid[..., 0] + 1) / 2 * (W - 1) if ac else ((grid[..., 0] + 1) * W - 1) / 2
    assert np.max(np.abs(ix_h - ix_true)) > 0.01, "the half-precision coordinate should be visibly off"
    grid_h = np.stack([normalise(ix_h, W), normalise(iy_h, H)], -1)
    dx_h, _ = ref.grid_sampler_2d_backward(go, x, grid_h, ref.INTERP_BILINEAR, pad, ac)
    dx_ref = case.reference(dtype)["dx"]
    S, n, A = case.abs_sums(dtype)["dx"]
    bound, _ = error_bound(dx_ref, S, n, A, dtype)
    assert np.any(np.abs(dx_h - dx_ref) > bound), "a half-precision coordinate should break the bound"


UPSAMPLE_VARIANTS = list(itertools.product((False, True), ("NCHW", "NHWC")))


@pytest.mark.parametrize("kind", ["random", "structured"])
@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("dtype", [F16, BF16, F64], ids=_name)
@pytest.mark.parametrize("ac,layout", UPSAMPLE_VARIANTS, ids=lambda v: str(v))
def test_upsample_dtype_accuracy(ac, layout, dtype, direction, kind, kernel_form):
    """Both align_corners x NCHW/NHWC x float16/bfloat16/float64, up- and down-sampling, on
    the tuned kernels and the linalg form (the same bound: both accumulate in float32)."""
    check_case(upsample_case(direction, kind, ac, layout), dtype)


def _emulate_storage_accumulation(go, Ah, Aw, dtype):
    """dx accumulated in the storage dtype, output pixels in row-major order:
    acc = rnd(acc + rnd(rnd(lambda_h * lambda_w) * g)) -- what the half-precision rule rules out."""
    N, C, Ho, Wo = go.shape
    acc = np.zeros((N, C, Ah.shape[1], Aw.shape[1]), dtype)
    ah, aw, g = Ah.astype(dtype), Aw.astype(dtype), go.astype(dtype)
    for oh in range(Ho):
        rows = np.nonzero(Ah[oh])[0]
        for ow in range(Wo):
            cols = np.nonzero(Aw[ow])[0]
            w = (ah[oh, rows][:, None] * aw[ow, cols][None, :]).astype(dtype)
            term = (w[None, None] * g[:, :, oh, ow][:, :, None, None]).astype(dtype)
            sub = acc[:, :, rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
            sub[...] = (sub + term).astype(dtype)
    return acc.astype(np.float64)


@pytest.mark.parametrize("dtype", [F16, BF16, F64], ids=_name)
@pytest.mark.parametrize("ac,layout", UPSAMPLE_VARIANTS, ids=lambda v: str(v))
def test_upsample_many_contributions(ac, layout, dtype):
    """H 1000 -> 10: hundreds of terms per grad_input pixel, sums ~4e4 (positive) or terms up to
    +-1000 (random).  Accumulating in the storage dtype (emulated) breaks the bound by a wide
    margin; the float32 accumulation of the kernel stays within it."""
    case = many_contributions_case(ac, layout)
    check_case(case, dtype)
    check_case(many_contributions_case(ac, layout, "random"), dtype)
    if dtype == F64 or layout == "NHWC":
        return  # the emulation does not depend on the layout
    (go,) = case.inputs(dtype)
    dx_ref = case.reference(dtype)["dx"]
    assert np.max(np.abs(dx_ref)) > 3e4 and np.max(np.abs(dx_ref)) < 65504
    Ah, Aw = case.matrices()
    emulated = _emulate_storage_accumulation(go.astype(np.float64), Ah, Aw, dtype)
    S, n, A = case.abs_sums(dtype)["dx"]
    bound, _ = error_bound(dx_ref, S, n, A, dtype)
    assert np.max(np.abs(emulated - dx_ref) / bound) > 2, f"{dtype.name} accumulation should break the bound"


# ----------------------------------------------------------------------------- PyTorch comparison
def _grid_report_cases():
    cases = [grid_case(*v, kind) for v in GRID_VARIANTS for kind in ("random", "structured", "large")]
    cases += [big_grid_case(ref.INTERP_BILINEAR, ref.PAD_ZEROS, False),
              big_grid_case(ref.INTERP_BILINEAR, ref.PAD_BORDER, True)]
    return cases


def _upsample_report_cases():
    cases = [upsample_case(d, k, ac, lay) for ac, lay in UPSAMPLE_VARIANTS for d in ("up", "down")
             for k in ("random", "structured")]
    cases += [many_contributions_case(ac, lay, p) for ac, lay in UPSAMPLE_VARIANTS for p in ("positive", "random")]
    return cases


@pytest.mark.skipif(torch is None, reason="needs PyTorch")
def test_pytorch_cpu_supports_half_grid_sampler():
    """An older reading of PyTorch's source said its CPU grid_sampler_2d_backward accepts only float32
    and float64; PyTorch 2.13 CPU accepts float16 and bfloat16 too, so it is compared with below
    (docs/semantics.md#pytorch-half-precision-kernels)."""
    case = grid_case(ref.INTERP_BILINEAR, ref.PAD_ZEROS, False, "random")
    for dtype in HALF_DTYPES:
        out, note = _torch_outputs(case, dtype)
        assert out is not None, f"torch CPU grid_sampler_2d_backward {dtype.name}: {note}"


@pytest.mark.skipif(torch is None, reason="needs PyTorch")
@pytest.mark.parametrize("op", ["grid_sampler_2d_backward", "upsample_bilinear2d_backward"])
def test_no_less_accurate_than_pytorch(op):
    """Case by case, our max error against the float64 reference is no larger than PyTorch CPU's at
    the same dtype on the same inputs (printed as a table with -s)."""
    cases = _grid_report_cases() if op.startswith("grid") else _upsample_report_cases()
    rows = dtype_error_report(cases)
    print(f"\n{op}: max abs error vs the float64 reference on the same rounded inputs")
    print(format_error_table(rows))
    missing = [r for r in rows if r["torch"] is None and not r["torch_note"].startswith("skipped")]
    assert not missing, f"no PyTorch result: {missing[0]['case']} {missing[0]['dtype']}: {missing[0]['torch_note']}"
    worse = [r for r in rows if r["torch"] is not None and r["ours"] > r["torch"]]
    assert not worse, "less accurate than PyTorch:\n" + format_error_table(worse)
    assert all(r["bound_ratio"] <= 1.0 for r in rows)


# ----------------------------------------------------------------------------- dtype errors
def _small_grid_inputs(dtype):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((1, 2, 3, 4)).astype(dtype), rng.standard_normal((1, 2, 5, 6)).astype(dtype),
            rng.uniform(-1, 1, (1, 3, 4, 2)).astype(dtype))


@pytest.mark.parametrize("which,base,other", [
    ("grad_output", F16, F32), ("grid", F16, BF16), ("grid", BF16, F64), ("grad_output", F64, F16),
    ("input", F32, BF16), ("input", F16, F64),
], ids=lambda v: v if isinstance(v, str) else _name(v))
def test_grid_sampler_mixed_dtypes(which, base, other):
    """All arrays of one call share one dtype: 161002 naming both dtypes."""
    go, x, grid = _small_grid_inputs(base)
    args = {"grad_output": go, "input": x, "grid": grid}
    args[which] = args[which].astype(other)
    with pytest.raises(AclnnError) as ei:
        api.grid_sampler_2d_backward(args["grad_output"], args["input"], args["grid"])
    assert ei.value.status == ACLNN_ERR_PARAM_INVALID
    msg = str(ei.value)
    assert _name(base) in msg and _name(other) in msg, msg


@pytest.mark.parametrize("out_dtype", [F32, BF16, F64], ids=_name)
def test_upsample_mixed_dtypes(out_dtype):
    """The Pythonic layer creates `out` itself; through the aclnn layer an `out` of another dtype
    than gradOut is 161002 naming both dtypes."""
    go = A.aclCreateTensor(np.ones((1, 2, 4, 4), np.float16), "NCHW")
    out = A.aclCreateTensor(shape=(1, 2, 2, 2), dtype=out_dtype, format="NCHW")
    status, _, _ = A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        go, A.aclCreateIntArray([4, 4]), A.aclCreateIntArray([1, 2, 2, 2]), False, -1.0, -1.0, out)
    assert status == ACLNN_ERR_PARAM_INVALID
    msg = A.aclGetRecentErrMsg()
    assert "float16" in msg and _name(out_dtype) in msg, msg


UNSUPPORTED = [np.dtype(np.int32)] + ([np.dtype(np.float128)] if hasattr(np, "float128") else [])


def _assert_lists_supported(err, dtype):
    assert err.status == ACLNN_ERR_PARAM_INVALID
    msg = str(err)
    assert _name(dtype) in msg, msg
    for name in ("float16", "bfloat16", "float32", "float64"):
        assert name in msg, f"{name} missing from: {msg}"


@pytest.mark.parametrize("dtype", UNSUPPORTED, ids=_name)
def test_unsupported_dtype_lists_supported(dtype):
    go, x, grid = (a.astype(dtype) for a in _small_grid_inputs(np.float64))
    with pytest.raises(AclnnError) as ei:
        api.grid_sampler_2d_backward(go, x, grid)
    _assert_lists_supported(ei.value, dtype)
    with pytest.raises(AclnnError) as ei:
        api.upsample_bilinear2d_backward(np.ones((1, 2, 4, 4), dtype), (4, 4), (1, 2, 2, 2))
    _assert_lists_supported(ei.value, dtype)
