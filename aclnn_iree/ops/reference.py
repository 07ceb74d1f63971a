"""Float64 NumPy golden reference for the two ops of this project.

This module is the numerical oracle that the kernels are tested against.  It
is written directly from the formulas of PyTorch 2.13 (CPU):

* ``aten/src/ATen/native/GridSampler.h`` (unnormalize, clip / reflect with
  their ``*_set_grad`` variants, ``compute_coordinates``,
  ``get_value_bounded`` / ``add_value_bounded``, the cubic coefficient
  derivatives) and ``aten/src/ATen/native/GridSampler.cpp``
  (``_grid_sampler_2d_cpu_fallback`` and its backward);
* ``aten/src/ATen/native/UpSample.h`` (``area_pixel_compute_scale``,
  ``area_pixel_compute_source_index``, ``guard_index_and_lambda``,
  ``compute_source_index_and_lambda``) as used by the CPU
  ``upsample_bilinear2d`` / ``upsample_bilinear2d_backward`` kernels.

See ``docs/semantics.md`` (#grid-sampler, #bilinear-upsampling).  It deliberately
shares no code with the kernels.  Everything is computed in float64 whatever
the input dtype; all tensors are NumPy arrays in NCHW layout (the grid is
(N, H_out, W_out, 2) with the last dimension (x, y), x indexing W, y
indexing H).

Deviations from PyTorch, all for inputs where PyTorch has no usable answer
(docs/semantics.md#invalid-and-extreme-inputs, "never crash, never read out of bounds"):

* grid values that are NaN / +-inf (or that become so when unnormalized):
  with ``border`` padding NaN samples pixel 0 and +-inf clamps to the nearest
  border pixel; with ``reflection`` padding NaN and +-inf both sample pixel
  0; with ``zeros`` padding the point contributes nothing.  In every case the
  grid gradient of that coordinate is 0.  (PyTorch's CPU kernel segfaults for
  border / reflection and returns NaN grid gradients for zeros.)
* reflection of huge finite coordinates is computed exactly (``fmod`` by the
  full period ``2*span``) instead of through ``static_cast<int>`` of the
  number of flips, which is undefined behaviour in C++ beyond 2**31.  For
  ordinary coordinates both give the same result.  The unnormalised coordinate
  it reflects, (g + 1) * size - 1, is rounded once, as the fused multiply-add of
  PyTorch's vectorised CPU kernel rounds it (its scalar formula rounds twice, which
  from 2**52 pixels on can flip the reflection's sign).
* coordinates are clamped before any float -> int conversion; a coordinate
  far outside the image under zeros padding is simply out of bounds.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "grid_sampler_2d",
    "grid_sampler_2d_backward",
    "area_pixel_compute_scale",
    "upsample_bilinear2d",
    "upsample_bilinear2d_backward",
    "INTERP_BILINEAR",
    "INTERP_NEAREST",
    "INTERP_BICUBIC",
    "PAD_ZEROS",
    "PAD_BORDER",
    "PAD_REFLECTION",
]

# GridSamplerInterpolation / GridSamplerPadding enum order (GridSamplerUtils.h)
INTERP_BILINEAR, INTERP_NEAREST, INTERP_BICUBIC = 0, 1, 2
PAD_ZEROS, PAD_BORDER, PAD_REFLECTION = 0, 1, 2

_CUBIC_A = -0.75
# Out-of-image sentinel distance used under zeros padding: every tap of a
# coordinate clamped to [-_FAR, size - 1 + _FAR] is out of bounds when the
# coordinate was outside that range (bicubic taps reach floor(ix) - 1 .. + 2).
_FAR = 8.0


# --------------------------------------------------------------------------
# grid sampler: coordinate helpers (GridSampler.h)
# --------------------------------------------------------------------------
def _unnormalize(coord: np.ndarray, size: int, align_corners: bool):
    """grid_sampler_unnormalize_set_grad: returns (pixel coordinate, d/dcoord).

    Without align_corners, (coord + 1) * size - 1 is rounded once, as the fused
    multiply-add of PyTorch's vectorised CPU kernel (and ours) rounds it: two roundings
    differ by an ulp at most, which from 2**52 pixels on is a pixel or more and can flip
    a reflection's sign (the parity of its count)."""
    with np.errstate(invalid="ignore", over="ignore"):
        if align_corners:
            return ((coord + 1) / 2) * (size - 1), (size - 1) / 2.0
        return _fma_minus_one(coord + 1, size) / 2, size / 2.0


def _fma_minus_one(a: np.ndarray, size: int) -> np.ndarray:
    """a * size - 1 rounded once.  Below 2**52 in magnitude a * size - 1 rounds like
    round(a * size) - 1 except for an ulp where the product crosses a power of two (a
    change far below every tolerance here); from 2**52 on, where the 1 is an ulp or
    less, each value is computed exactly (Fraction) and rounded once."""
    from fractions import Fraction
    a = np.asarray(a, dtype=np.float64)
    p = a * size
    out = p - 1
    for i in zip(*np.nonzero(np.isfinite(p) & (np.abs(p) >= 2.0 ** 52))):
        try:
            out[i] = float(Fraction(float(a[i])) * size - 1)  # correctly rounded, ties to even
        except OverflowError:  # beyond the largest double, as the product rounded
            out[i] = p[i]
    return out


def _clip(ix: np.ndarray, size: int) -> np.ndarray:
    """clip_coordinates (forward clip, no gradient)."""
    return np.minimum(float(size - 1), np.maximum(ix, 0.0))


def _clip_set_grad(ix: np.ndarray, size: int):
    """clip_coordinates_set_grad: ix <= 0 -> 0 (g=0); ix >= size-1 -> size-1 (g=0)."""
    out = ix.copy()
    g = np.ones_like(ix)
    lo = ix <= 0
    hi = ~lo & (ix >= size - 1)
    out[lo] = 0.0
    g[lo] = 0.0
    out[hi] = float(size - 1)
    g[hi] = 0.0
    return out, g


def _reflect_set_grad(ix: np.ndarray, twice_low: int, twice_high: int):
    """reflect_coordinates_set_grad (finite ix only).

    The parity of the number of flips is taken from ``fmod(d, 2*span)``,
    which equals PyTorch's ``floor(d / span) % 2`` whenever the latter is
    well defined, and stays exact for huge |ix|.
    """
    if twice_low == twice_high:
        return np.zeros_like(ix), np.zeros_like(ix)
    lo = twice_low / 2.0
    span = (twice_high - twice_low) / 2.0
    d = ix - lo
    sign = np.where(d < 0, -1.0, 1.0)
    d = np.abs(d)
    e = np.fmod(d, 2.0 * span)
    odd = e >= span  # floor(d/span) odd (e == span: one flip, PyTorch too)
    out = np.where(odd, 2.0 * span - e, e) + lo
    g = np.where(odd, -sign, sign)
    return out, g


def _reflect(ix: np.ndarray, twice_low: int, twice_high: int) -> np.ndarray:
    """reflect_coordinates (forward, no gradient)."""
    return _reflect_set_grad(ix, twice_low, twice_high)[0]


def _reflect_bounds(size: int, align_corners: bool):
    return (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)


def _compute_coordinates(x: np.ndarray, size: int, padding_mode: int,
                         align_corners: bool) -> np.ndarray:
    """compute_coordinates: per-tap padding used by bicubic (finite x)."""
    if padding_mode == PAD_BORDER:
        return _clip(x, size)
    if padding_mode == PAD_REFLECTION:
        return _clip(_reflect(x, *_reflect_bounds(size, align_corners)), size)
    return x


def _source_index_set_grad(coord: np.ndarray, size: int, padding_mode: int,
                           align_corners: bool):
    """grid_sampler_compute_source_index_set_grad, plus the non-finite rules.

    Returns (ix, multiplier) where ``multiplier`` is an array.  Under zeros
    padding the result may lie outside the image (clamped to a sentinel range
    so that it can be converted to an integer safely).
    """
    ix, m = _unnormalize(coord, size, align_corners)
    mult = np.full_like(ix, m)
    nonfinite = ~np.isfinite(ix)
    if padding_mode == PAD_BORDER:
        ix, g = _clip_set_grad(ix, size)  # +-inf clamps naturally, g = 0
        nan = np.isnan(ix)
        ix[nan] = 0.0
        g[nan] = 0.0
        mult = mult * g
    elif padding_mode == PAD_REFLECTION:
        safe = np.where(nonfinite, 0.0, ix)
        r, g_refl = _reflect_set_grad(safe, *_reflect_bounds(size, align_corners))
        ix, g_clip = _clip_set_grad(r, size)
        ix[nonfinite] = 0.0
        g = g_refl * g_clip
        g[nonfinite] = 0.0
        mult = mult * g
    else:  # zeros: out of range simply means out of bounds
        ix = np.where(nonfinite, -_FAR, ix)
        ix = np.clip(ix, -_FAR, size - 1 + _FAR)
        mult[nonfinite] = 0.0
    return ix, mult


def _bicubic_base_coordinate(coord: np.ndarray, size: int, padding_mode: int,
                             align_corners: bool):
    """Bicubic uses the unnormalized coordinate only (padding is per tap).

    Non-finite handling: border NaN -> 0, +-inf -> nearest border pixel;
    reflection NaN / +-inf -> 0; zeros -> far outside.  The multiplier of such
    a coordinate is 0.  An integer coordinate has t = 0, whose cubic weights
    are (0, 1, 0, 0), so it samples exactly that pixel.
    """
    ix, m = _unnormalize(coord, size, align_corners)
    mult = np.full_like(ix, m)
    nonfinite = ~np.isfinite(ix)
    mult[nonfinite] = 0.0
    if padding_mode == PAD_BORDER:
        ix = np.where(np.isnan(ix), 0.0, ix)
        ix = np.where(ix == np.inf, float(size - 1), ix)
        ix = np.where(ix == -np.inf, 0.0, ix)
    elif padding_mode == PAD_REFLECTION:
        ix = np.where(nonfinite, 0.0, ix)
    else:
        ix = np.where(nonfinite, -_FAR, ix)
        ix = np.clip(ix, -_FAR, size - 1 + _FAR)
    return ix, mult


def _cubic_coefficients(t: np.ndarray):
    """get_cubic_upsample_coefficients (UpSample.h), A = -0.75."""
    A = _CUBIC_A

    def conv1(x):  # |x| <= 1
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def conv2(x):  # 1 < |x| < 2
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    return [conv2(t + 1.0), conv1(t), conv1(1.0 - t), conv2(2.0 - t)]


def _cubic_coefficients_grad(t: np.ndarray):
    """get_cubic_coefficients_grad (GridSampler.h), A = -0.75."""
    A = _CUBIC_A
    x0 = -1 - t
    x1 = -t
    x2 = 1 - t
    x3 = 2 - t
    return [
        (-3 * A * x0 - 10 * A) * x0 - 8 * A,
        (-3 * (A + 2) * x1 - 2 * (A + 3)) * x1,
        (3 * (A + 2) * x2 - 2 * (A + 3)) * x2,
        (3 * A * x3 - 10 * A) * x3 + 8 * A,
    ]


def _taps(grid: np.ndarray, H: int, W: int, interpolation_mode: int,
          padding_mode: int, align_corners: bool):
    """The sampling taps of every grid point.

    Returns (taps, mult_x, mult_y) where taps is a list of
    (yi, xi, valid, weight, dweight_dix, dweight_diy): integer pixel indices
    (always safe to index with, 0 where invalid), an in-bounds mask and the
    tap weight with its derivatives w.r.t. the (padded, for bilinear) pixel
    coordinates.  The grid gradient is mult * sum(val * g * dweight).
    """
    x = grid[..., 0]
    y = grid[..., 1]
    taps = []
    if interpolation_mode in (INTERP_BILINEAR, INTERP_NEAREST):
        ix, mx = _source_index_set_grad(x, W, padding_mode, align_corners)
        iy, my = _source_index_set_grad(y, H, padding_mode, align_corners)
        if interpolation_mode == INTERP_NEAREST:
            xn = np.rint(ix)  # std::nearbyint: round half to even
            yn = np.rint(iy)
            zero = np.zeros_like(ix)
            taps.append((yn, xn, np.ones_like(ix), zero, zero))
            mx = np.zeros_like(mx)
            my = np.zeros_like(my)
        else:
            x0 = np.floor(ix)
            y0 = np.floor(iy)
            x1 = x0 + 1
            y1 = y0 + 1
            wx1, wx0 = ix - x0, x1 - ix
            wy1, wy0 = iy - y0, y1 - iy
            taps.append((y0, x0, wx0 * wy0, -wy0, -wx0))  # nw
            taps.append((y0, x1, wx1 * wy0, wy0, -wx1))   # ne
            taps.append((y1, x0, wx0 * wy1, -wy1, wx0))   # sw
            taps.append((y1, x1, wx1 * wy1, wy1, wx1))    # se
    elif interpolation_mode == INTERP_BICUBIC:
        ix, mx = _bicubic_base_coordinate(x, W, padding_mode, align_corners)
        iy, my = _bicubic_base_coordinate(y, H, padding_mode, align_corners)
        x0 = np.floor(ix)
        y0 = np.floor(iy)
        tx = ix - x0
        ty = iy - y0
        cx = _cubic_coefficients(tx)
        cy = _cubic_coefficients(ty)
        dcx = _cubic_coefficients_grad(tx)
        dcy = _cubic_coefficients_grad(ty)
        for i in range(4):
            xt = _compute_coordinates(x0 - 1 + i, W, padding_mode, align_corners)
            for j in range(4):
                yt = _compute_coordinates(y0 - 1 + j, H, padding_mode, align_corners)
                # PyTorch: gix -= val * dcx[i] * cy[j] * g; giy -= val * dcy[j] * cx[i] * g
                taps.append((yt, xt, cx[i] * cy[j], -dcx[i] * cy[j], -dcy[j] * cx[i]))
    else:
        raise ValueError(f"interpolation_mode must be 0, 1 or 2, got {interpolation_mode}")

    out = []
    for yf, xf, w, dwx, dwy in taps:
        # static_cast<int64_t> truncates; the coordinates are integral here
        # (floor / rint / clipped integers) and clamped to a small range.
        xf = np.clip(np.trunc(xf), -2 * _FAR - 2, W + 2 * _FAR + 2)
        yf = np.clip(np.trunc(yf), -2 * _FAR - 2, H + 2 * _FAR + 2)
        xi = xf.astype(np.int64)
        yi = yf.astype(np.int64)
        valid = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H)
        out.append((np.where(valid, yi, 0), np.where(valid, xi, 0), valid, w, dwx, dwy))
    return out, mx, my


def _check_grid_args(input, grid, interpolation_mode, padding_mode):
    if input.ndim != 4 or grid.ndim != 4:
        raise ValueError("input and grid must be 4-D")
    if grid.shape[-1] != 2:
        raise ValueError("grid.shape[-1] must be 2")
    if input.shape[0] != grid.shape[0]:
        raise ValueError("input and grid must have the same N")
    if input.shape[2] <= 0 or input.shape[3] <= 0:
        raise ValueError("input H and W must be > 0")
    if interpolation_mode not in (0, 1, 2):
        raise ValueError(f"interpolation_mode must be 0, 1 or 2, got {interpolation_mode}")
    if padding_mode not in (0, 1, 2):
        raise ValueError(f"padding_mode must be 0, 1 or 2, got {padding_mode}")


def grid_sampler_2d(input, grid, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> np.ndarray:
    """Float64 forward of ``torch.ops.aten.grid_sampler_2d`` (PyTorch 2.13 CPU).

    Args:
        input: (N, C, H, W) array, NCHW; cast to float64.
        grid: (N, H_out, W_out, 2) array, last dim (x, y) normalised to
            [-1, 1]; cast to float64.
        interpolation_mode: 0 bilinear, 1 nearest (round half to even),
            2 bicubic (A = -0.75).
        padding_mode: 0 zeros, 1 border, 2 reflection.
        align_corners: as in PyTorch.

    Returns:
        (N, C, H_out, W_out) float64 array.

    Semantics: GridSampler.h / GridSampler.cpp; non-finite grid values as
    described in the module docstring.
    """
    input = np.asarray(input, dtype=np.float64)
    grid = np.asarray(grid, dtype=np.float64)
    _check_grid_args(input, grid, interpolation_mode, padding_mode)
    N, C, H, W = input.shape
    Ho, Wo = grid.shape[1], grid.shape[2]
    taps, _, _ = _taps(grid, H, W, interpolation_mode, padding_mode, align_corners)
    inp_t = input.transpose(0, 2, 3, 1)  # (N, H, W, C)
    n_idx = np.arange(N).reshape(N, 1, 1)
    out = np.zeros((N, Ho, Wo, C), dtype=np.float64)
    for yi, xi, valid, w, _, _ in taps:
        vals = np.where(valid[..., None], inp_t[n_idx, yi, xi], 0.0)
        out += np.where(valid, w, 0.0)[..., None] * vals
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode: int,
                             padding_mode: int, align_corners: bool
                             ) -> Tuple[np.ndarray, np.ndarray]:
    """Float64 ``torch.ops.aten.grid_sampler_2d_backward`` (PyTorch 2.13 CPU).

    Args:
        grad_output: (N, C, H_out, W_out) array (dY); cast to float64.
        input: (N, C, H, W) array, NCHW (X); cast to float64.
        grid: (N, H_out, W_out, 2) array, last dim (x, y); cast to float64.
        interpolation_mode: 0 bilinear, 1 nearest (np.rint, round half to
            even, as std::nearbyint), 2 bicubic (A = -0.75).
        padding_mode: 0 zeros, 1 border, 2 reflection.
        align_corners: as in PyTorch.

    Returns:
        (grad_input, grad_grid): float64 arrays of shapes (N, C, H, W) and
        (N, H_out, W_out, 2).  Both are always computed (output_mask is the
        caller's business).

    Semantics (GridSampler.h / GridSampler.cpp): bilinear and nearest use
    grid_sampler_compute_source_index_set_grad (the multiplier is the
    unnormalize factor times the clip / reflect gradients, so points exactly
    on a border get zero gradient); bicubic uses the unnormalize multiplier
    only, applies the padding per tap with compute_coordinates, and uses
    get_cubic_coefficients_grad.  Corners outside the image are dropped
    (safe_add_2d).  Nearest has a zero grid gradient.  Non-finite grid
    values: see the module docstring.
    """
    grad_output = np.asarray(grad_output, dtype=np.float64)
    input = np.asarray(input, dtype=np.float64)
    grid = np.asarray(grid, dtype=np.float64)
    _check_grid_args(input, grid, interpolation_mode, padding_mode)
    N, C, H, W = input.shape
    Ho, Wo = grid.shape[1], grid.shape[2]
    if grad_output.shape != (N, C, Ho, Wo):
        raise ValueError(
            f"grad_output shape {grad_output.shape} != {(N, C, Ho, Wo)}")
    taps, mx, my = _taps(grid, H, W, interpolation_mode, padding_mode, align_corners)
    inp_t = input.transpose(0, 2, 3, 1)       # (N, H, W, C)
    go_t = grad_output.transpose(0, 2, 3, 1)  # (N, Ho, Wo, C)
    n_idx = np.arange(N).reshape(N, 1, 1)
    c_idx = np.arange(C)

    gix = np.zeros((N, Ho, Wo), dtype=np.float64)
    giy = np.zeros((N, Ho, Wo), dtype=np.float64)
    flat_idx = []
    flat_val = []
    need_grid_grad = interpolation_mode != INTERP_NEAREST
    for yi, xi, valid, w, dwx, dwy in taps:
        vm = valid[..., None]
        # scatter into grad_input: dX[n, c, yi, xi] += w * g
        base = ((n_idx * H + yi) * W + xi)[valid]  # (K,)
        flat_idx.append((base[:, None] * C + c_idx[None, :]).ravel())
        flat_val.append((w[valid][:, None] * go_t[valid]).ravel())
        if need_grid_grad:
            vals = np.where(vm, inp_t[n_idx, yi, xi], 0.0)
            vg = np.where(valid, np.einsum("nhwc,nhwc->nhw", vals, go_t), 0.0)
            gix += np.where(valid, dwx, 0.0) * vg
            giy += np.where(valid, dwy, 0.0) * vg
    size = N * H * W * C
    if flat_idx and size > 0:
        idx = np.concatenate(flat_idx)
        val = np.concatenate(flat_val)
        gi_t = np.bincount(idx, weights=val, minlength=size).astype(np.float64).reshape(N, H, W, C)  # bincount of nothing is int64
    else:
        gi_t = np.zeros((N, H, W, C), dtype=np.float64)
    grad_input = np.ascontiguousarray(gi_t.transpose(0, 3, 1, 2))
    grad_grid = np.empty((N, Ho, Wo, 2), dtype=np.float64)
    if need_grid_grad:
        grad_grid[..., 0] = mx * gix
        grad_grid[..., 1] = my * giy
    else:
        grad_grid[...] = 0.0
    return grad_input, grad_grid


# --------------------------------------------------------------------------
# upsample bilinear 2d (UpSample.h, UpSampleKernel.cpp)
# --------------------------------------------------------------------------
def area_pixel_compute_scale(in_size: int, out_size: int, align_corners: bool,
                             scale: Optional[float] = None) -> float:
    """area_pixel_compute_scale (UpSample.h, PyTorch 2.13; docs/semantics.md#scale-rules).

    align_corners: (in - 1) / (out - 1) if out > 1 else 0.
    otherwise: 1 / scale if a scale is given and > 0, else in / out.
    ``scale`` is the forward multiplier (output / input), as in aten.
    """
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    if scale is not None and scale > 0:
        return 1.0 / scale
    return in_size / out_size


def _linear_axis_matrix(in_size: int, out_size: int, align_corners: bool,
                        scale: Optional[float]) -> np.ndarray:
    """(out_size, in_size) interpolation matrix of one axis.

    compute_source_index_and_lambda (UpSample.h): identity when
    in_size == out_size (whatever the scale); otherwise
    src = ac ? r*dst : max(0, r*(dst+0.5) - 0.5), then guard_index_and_lambda:
    i0 = min(floor(src), in-1), lambda1 = clamp(src - i0, 0, 1),
    i1 = i0 + (i0 < in-1), lambda0 = 1 - lambda1.

    Quirk kept on purpose: guard_index_and_lambda calls ``floorf`` (float32)
    even for float64, so floor() is taken of float32(src).  When src lies
    just below an integer k (within float32 rounding) PyTorch uses i0 = k
    with lambda1 = 0 rather than i0 = k-1 with lambda1 ~ 1.
    """
    A = np.zeros((out_size, in_size), dtype=np.float64)
    if out_size == 0 or in_size == 0:
        return A
    dst = np.arange(out_size)
    if in_size == out_size:
        A[dst, dst] = 1.0
        return A
    r = area_pixel_compute_scale(in_size, out_size, align_corners, scale)
    d = dst.astype(np.float64)
    if align_corners:
        src = r * d
    else:
        src = r * (d + 0.5) - 0.5
        src = np.where(src < 0, 0.0, src)
    i0 = np.minimum(np.floor(src.astype(np.float32)).astype(np.int64), in_size - 1)
    lam1 = np.minimum(np.maximum(src - i0, 0.0), 1.0)
    lam0 = 1.0 - lam1
    i1 = i0 + (i0 < in_size - 1).astype(np.int64)
    np.add.at(A, (dst, i0), lam0)
    np.add.at(A, (dst, i1), lam1)
    return A


def _opt_scale(s):
    return None if s is None else float(s)


def upsample_bilinear2d(input, output_size: Sequence[int], align_corners: bool,
                        scales_h: Optional[float] = None,
                        scales_w: Optional[float] = None) -> np.ndarray:
    """Float64 forward of ``torch.ops.aten.upsample_bilinear2d`` (2.13 CPU).

    Args:
        input: (N, C, H_in, W_in) array, NCHW; cast to float64.
        output_size: (H_out, W_out).
        align_corners: as in PyTorch.
        scales_h, scales_w: optional forward multipliers (out / in); a value
            <= 0 or None means "not given" (compute_scales_value).

    Returns:
        (N, C, H_out, W_out) float64 array, y = Ah @ x @ Aw^T per (n, c) with
        the per-axis matrices of ``_linear_axis_matrix`` (UpSample.h rules).
    """
    x = np.asarray(input, dtype=np.float64)
    if x.ndim != 4:
        raise ValueError("input must be 4-D")
    out_h, out_w = (int(v) for v in output_size)
    _, _, in_h, in_w = x.shape
    if min(in_h, in_w, out_h, out_w) <= 0:
        raise ValueError("input and output sizes must be > 0")
    Ah = _linear_axis_matrix(in_h, out_h, align_corners, _opt_scale(scales_h))
    Aw = _linear_axis_matrix(in_w, out_w, align_corners, _opt_scale(scales_w))
    return np.einsum("oh,nchw,pw->ncop", Ah, x, Aw, optimize=True)


def upsample_bilinear2d_backward(grad_output, output_size: Sequence[int],
                                 input_size: Sequence[int], align_corners: bool,
                                 scales_h: Optional[float] = None,
                                 scales_w: Optional[float] = None) -> np.ndarray:
    """Float64 ``torch.ops.aten.upsample_bilinear2d_backward`` (2.13 CPU).

    Args:
        grad_output: (N, C, H_out, W_out) array, NCHW (dY); cast to float64.
        output_size: (H_out, W_out).
        input_size: (N, C, H_in, W_in), the shape of the result.
        align_corners: as in PyTorch.
        scales_h, scales_w: optional forward multipliers (out / in); None or
            <= 0 means "not given".

    Returns:
        grad_input (N, C, H_in, W_in) float64 = Ah^T @ dY @ Aw per (n, c).

    Rules (UpSample.h): area_pixel_compute_scale; an axis with
    in == out is an identity copy even when a scale is given; source index
    ac ? r*dst : max(0, r*(dst+0.5)-0.5); h1 = floor, h1p = 1 if h1 < in-1
    else 0; lambdas clamped to [0, 1]; see ``_linear_axis_matrix``.
    """
    g = np.asarray(grad_output, dtype=np.float64)
    if len(output_size) != 2 or len(input_size) != 4:
        raise ValueError("output_size must have 2 elements and input_size 4")
    out_h, out_w = (int(v) for v in output_size)
    n, c, in_h, in_w = (int(v) for v in input_size)
    if min(in_h, in_w, out_h, out_w) <= 0:
        raise ValueError("input and output sizes must be > 0")
    if g.shape != (n, c, out_h, out_w):
        raise ValueError(f"grad_output shape {g.shape} != {(n, c, out_h, out_w)}")
    Ah = _linear_axis_matrix(in_h, out_h, align_corners, _opt_scale(scales_h))
    Aw = _linear_axis_matrix(in_w, out_w, align_corners, _opt_scale(scales_w))
    return np.einsum("oh,ncop,pw->nchw", Ah, g, Aw, optimize=True)
